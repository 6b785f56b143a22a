/* vagent view: the trajectory viewer page. Plain JS written for vagent (no library, no CDN).
 *
 * Data comes from the loopback JSON API (vagent/viewer/server.py) or, in a page written with
 * --out, from the <script id="vagent-data"> block. Episode lists are filtered, sorted and paged
 * here (PAGE rows in the DOM at a time); an episode is fetched when it is opened.
 */
"use strict";

const PAGE = 50;
const EMBED = document.getElementById("vagent-data");
const STATIC = EMBED ? JSON.parse(EMBED.textContent) : null;

const S = {            // page state
  index: null,
  group: null,         // current group id (a run's step_000010-style name or an eval cell)
  episodes: [],        // summaries of the current group
  other: null,         // compare: the other group's id
  otherEpisodes: [],
  filters: { failed: false, format: false, judge: false, error: false, topadv: false },
  sort: "index", search: "", page: 0,
  selected: null,      // summary index (or pair index in compare mode)
  shown: {},           // episode key -> episode document (for the token tooltip)
  advScale: 1,
  seq: 0,              // the latest episode request: an older answer arriving late is dropped
};

// ---------------------------------------------------------------- data access
async function getJSON(path, params) {
  if (STATIC) {
    if (path === "index") return STATIC.index;
    if (path === "episodes") return STATIC.episodes[params.group] || [];
    if (path === "episode") return STATIC.details[params.group][String(params.i)];
  }
  const q = new URLSearchParams(params || {}).toString();
  const r = await fetch(`api/${path}${q ? "?" + q : ""}`);
  const body = await r.json();
  if (!r.ok) throw Object.assign(new Error(body.error || r.statusText), { fromServer: true });
  return body;
}
function fileUrl(rel) {
  if (STATIC) return STATIC.files[rel] || null;
  return "files/" + rel.split("/").map(encodeURIComponent).join("/");
}

// ---------------------------------------------------------------- small helpers
/* a request that failed (the server's one-line error: a file it cannot read, say) shown in the episode pane */
function shownErrors(promise) {
  return promise.catch((err) => document.getElementById("episode-pane").replaceChildren(
    el("pre", { class: "note error", text: String(err.message || err) })));
}
const fmt = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x) ? "—" : Number(x).toFixed(d));
const sci = (x) => (x === null || x === undefined || Number.isNaN(x) ? "—" : Number(x).toExponential(1));
const signed = (x, d = 3) => (x === null || x === undefined ? "—" : (x >= 0 ? "+" : "") + Number(x).toFixed(d));
function pieceText(p) {
  if (p === "") return "∅";
  return p.replace(/\n/g, "↵\n").replace(/\t/g, "⇥");
}
/* diverging scale: negative advantage red (pushed down), positive blue (pushed up), 0 white */
function advColor(a) {
  if (a === null || a === undefined) return "transparent";
  const t = Math.min(1, Math.abs(a) / (S.advScale || 1));
  const [r, g, b] = a < 0 ? [178, 24, 43] : [33, 102, 172];
  const mix = (c) => Math.round(255 + (c - 255) * t);
  return `rgb(${mix(r)},${mix(g)},${mix(b)})`;
}

// ---------------------------------------------------------------- overview
function chart(steps, val) {
  const W = 360, H = 140, P = 26;
  const xs = steps.map((s) => s.step).concat(val.map((v) => v.step));
  if (!xs.length) return null;
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const X = (x) => P + ((x - x0) / (x1 - x0)) * (W - 2 * P);
  const Y = (y) => H - P + -y * (H - 2 * P);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "chart"); svg.setAttribute("width", W); svg.setAttribute("height", H);
  const add = (tag, attrs) => {
    const n = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    svg.append(n); return n;
  };
  add("line", { x1: P, y1: Y(0), x2: W - P, y2: Y(0), stroke: "#d0d7de" });
  add("line", { x1: P, y1: Y(1), x2: W - P, y2: Y(1), stroke: "#eef1f4" });
  const series = [
    [steps, "success", "#0969da", "train success"], [steps, "format", "#8250df", "train format"],
    [val, "success", "#1a7f37", "val success"],
  ];
  series.forEach(([pts, key, color, label], k) => {
    const ok = pts.filter((p) => p[key] !== null && p[key] !== undefined);
    if (ok.length) {
      add("polyline", { points: ok.map((p) => `${X(p.step)},${Y(p[key])}`).join(" "), fill: "none", stroke: color,
        "stroke-width": 1.5 });
      ok.forEach((p) => add("circle", { cx: X(p.step), cy: Y(p[key]), r: 2, fill: color }));
    }
    add("text", { x: P + k * 110, y: 12, fill: color }).textContent = label;
  });
  add("text", { x: 2, y: Y(0) + 3 }).textContent = "0";
  add("text", { x: 2, y: Y(1) + 3 }).textContent = "1";
  add("text", { x: P, y: H - 6 }).textContent = `step ${x0}`;
  add("text", { x: W - P - 40, y: H - 6 }).textContent = `step ${x1}`;
  return svg;
}

function table(head, rows, onRow) {
  const t = el("table", {}, el("tr", {}, head.map((h, i) => el("th", { class: i ? null : "l", text: h }))));
  rows.forEach((r) => {
    const tr = el("tr", { class: onRow ? "group" : null, onclick: onRow ? () => onRow(r) : null },
      r.cells.map((c, i) => el("td", { class: i ? null : "l", text: c })));
    if (r.id) tr.dataset.group = r.id;
    if (r.warmup) { tr.dataset.actorUpdated = "0"; tr.classList.add("warmup"); }
    t.append(tr);
  });
  return t;
}

function renderOverview() {
  const ix = S.index, ov = document.getElementById("overview");
  document.getElementById("title").textContent = `${ix.kind === "run" ? "run" : "evaluation"} ${ix.path}`;
  if (ix.back && !document.getElementById("back")) {  // a sweep's trial (server.py): a link back to the sweep page
    document.getElementById("title").before(el("a", { id: "back", class: "back", href: ix.back.href,
      text: `← ${ix.back.label}` }), el("span", { class: "meta", text: `trial ${ix.back.trial}` }));
  }
  const groupHead = ix.training
    ? ["step / validation point", "success", "return", "format", "loss/policy", "expl. var.", "tokens"]
    : ["cell (model/env/format)", "success", "return", "format", "episodes"];
  const groupRows = ix.groups.map((g) => ({
    id: g.id, warmup: g.actor_updated === false,
    cells: ix.training
      ? [g.label + (g.actor_updated === false ? " · critic warm-up: actor not updated" : ""), fmt(g.success),
        fmt(g.return), fmt(g.format), fmt(g.loss_policy), fmt(g.explained_variance), g.tokens]
      : [g.label, fmt(g.success), fmt(g.return), fmt(g.format), g.episodes ?? "—"],
  }));
  const parts = [el("div", {}, el("h2", { text: ix.training ? "Steps and validation points with saved episodes (click one)"
    : "Cells (click one)" }),
    table(groupHead, groupRows, (r) => shownErrors(openGroup(r.id))))];
  if (ix.training) {
    parts.push(el("div", {}, el("h2", { text: "RL steps (metrics.jsonl)" }),
      table(["step", "success", "return", "format", "mismatch KL", "canary |Δ log p|"], ix.steps.map((s) => ({
        cells: [String(s.step), fmt(s.success), fmt(s.return), fmt(s.format), sci(s.mismatch_kl),
          sci(s.canary_gap)] })))));
    parts.push(el("div", {}, el("h2", { text: "Validation (greedy, val split)" }),
      table(["step", "success", "return", "format"], ix.val.map((v) => ({
        cells: [String(v.step), fmt(v.success), fmt(v.return), fmt(v.format)] })))));
    const c = chart(ix.steps, ix.val);
    if (c) parts.push(el("div", {}, el("h2", { text: "Rates by step" }), c));
  }
  ov.replaceChildren(el("div", { class: "overview-grid" }, parts));
}

// ---------------------------------------------------------------- episode list
function renderControls() {
  const ix = S.index;
  const box = (key, label) => el("label", {}, el("input", { type: "checkbox", "data-filter": key,
    checked: S.filters[key], onchange: (e) => { S.filters[key] = e.target.checked; S.page = 0; renderList(); } }), " " + label);
  const sort = el("select", { id: "sort", onchange: (e) => { S.sort = e.target.value; S.page = 0; renderList(); } },
    [["index", "order saved"], ["return_asc", "return ↑"], ["return_desc", "return ↓"], ["adv_desc", "largest |advantage|"],
     ["turns_desc", "most turns"], ["seed", "seed"]].map(([v, t]) => el("option", { value: v, text: t, selected: S.sort === v })));
  const search = el("input", { type: "text", id: "search", placeholder: "env, seed or reply text", value: S.search,
    oninput: (e) => { S.search = e.target.value.toLowerCase(); S.page = 0; renderList(); } });
  const other = el("select", { id: "compare", onchange: (e) => shownErrors(setCompare(e.target.value || null)) },
    el("option", { value: "", text: "— none —" }),
    ix.groups.filter((g) => g.id !== S.group).map((g) => el("option", { value: g.id, text: g.label, selected: S.other === g.id })));
  document.getElementById("controls").replaceChildren(
    el("div", {}, el("b", { text: ix.groups.find((g) => g.id === S.group)?.label || "" }), " — show only: "),
    el("div", {}, box("failed", "failed"), box("format", "format errors"), box("judge", "judge penalties"),
      box("error", "errored"), ix.training ? box("topadv", "largest |advantage| (top 10%)") : null),
    el("div", {}, "sort ", sort, search),
    el("div", {}, `compare side by side with ${ix.training ? "step / validation" : "cell"} `, other));
}

function visibleEpisodes() {
  let eps = S.episodes.slice();
  const f = S.filters;
  if (f.failed) eps = eps.filter((e) => !e.success);
  if (f.format) eps = eps.filter((e) => e.format_errors > 0);
  if (f.judge) eps = eps.filter((e) => e.judge_penalties > 0);
  if (f.error) eps = eps.filter((e) => e.error);
  if (S.search) eps = eps.filter((e) => `${e.env} ${e.seed} ${e.first_reply}`.toLowerCase().includes(S.search));
  if (f.topadv) {
    const withAdv = eps.filter((e) => e.max_abs_adv !== null).sort((a, b) => b.max_abs_adv - a.max_abs_adv);
    eps = withAdv.slice(0, Math.max(1, Math.ceil(withAdv.length * 0.1)));
  }
  const by = {
    index: (a, b) => a.i - b.i, return_asc: (a, b) => (a.total_reward ?? 0) - (b.total_reward ?? 0),
    return_desc: (a, b) => (b.total_reward ?? 0) - (a.total_reward ?? 0),
    adv_desc: (a, b) => (b.max_abs_adv ?? -1) - (a.max_abs_adv ?? -1), turns_desc: (a, b) => b.n_turns - a.n_turns,
    seed: (a, b) => (a.seed ?? 0) - (b.seed ?? 0) || a.i - b.i,
  };
  return eps.sort(by[S.sort]);
}

/* compare: pair the two groups' episodes on (env, seed, k-th occurrence of that seed); the episodes
 * left over (training steps draw fresh seeds every step) are paired by position, marked as such */
function pairs() {
  const key = (list) => {
    const seen = {}, out = new Map();
    list.forEach((e) => { const k = `${e.env}|${e.seed}`; seen[k] = (seen[k] || 0) + 1; out.set(`${k}|${seen[k]}`, e); });
    return out;
  };
  const a = key(S.episodes), b = key(S.otherEpisodes);
  const map = new Map(), taken = new Set();
  for (const [k, e] of a) {
    if (b.has(k)) { map.set(e.i, { e: b.get(k), sameSeed: true }); taken.add(b.get(k).i); }
  }
  const bySeed = map.size;
  const restB = S.otherEpisodes.filter((e) => !taken.has(e.i));
  S.episodes.filter((e) => !map.has(e.i)).forEach((e, n) => {
    if (n < restB.length) map.set(e.i, { e: restB[n], sameSeed: false });
  });
  return { map, bySeed, byPosition: map.size - bySeed };
}

function pairingNote(pr) {
  const other = S.index.groups.find((g) => g.id === S.other)?.label || S.other;
  if (!pr.byPosition) {
    return el("div", { class: "note pairing", "data-pairing": "seed",
      text: `Paired by env seed: all ${pr.bySeed} pairs show the same board in ${other}.` });
  }
  const why = "training steps draw fresh seeds every step; validation points replay the same val seeds";
  return el("div", { class: "note pairing", "data-pairing": pr.bySeed ? "mixed" : "position",
    text: `${pr.bySeed} pair(s) share the env seed with ${other} (same board); ${pr.byPosition} episode(s) have no ` +
      `episode on the same seed there (${why}), so they are paired by position: different boards, marked ≠ seed.` });
}

function badges(e) {
  return [e.format_errors ? el("span", { class: "badge warn", text: `format ×${e.format_errors}` }) : null,
    e.judge_penalties ? el("span", { class: "badge warn", text: `judge ×${e.judge_penalties}` }) : null,
    e.error ? el("span", { class: "badge err", text: "error" }) : null];
}

function renderList() {
  const eps = visibleEpisodes();
  let pr = null;
  let shown = eps;
  if (S.other) {
    pr = pairs();
    shown = eps.filter((e) => pr.map.has(e.i));
  }
  const n = shown.length, pages = Math.max(1, Math.ceil(n / PAGE));
  S.page = Math.min(S.page, pages - 1);
  const slice = shown.slice(S.page * PAGE, S.page * PAGE + PAGE);
  const pager = document.getElementById("pager");
  pager.replaceChildren(...[
    el("button", { disabled: S.page === 0, onclick: () => { S.page--; renderList(); } }, "‹ prev"),
    el("span", { id: "count", text: ` ${n ? S.page * PAGE + 1 : 0}–${S.page * PAGE + slice.length} of ${n} episodes` +
      (n !== S.episodes.length ? ` (${S.episodes.length} in all)` : "") + " " }),
    el("button", { disabled: S.page >= pages - 1, onclick: () => { S.page++; renderList(); } }, "next ›"),
    pr ? pairingNote(pr) : null].filter(Boolean));
  const head = el("tr", {}, ["#", "env", "seed", "ok", "return", "turns", "", S.index.training ? "max|A|" : null,
    pr ? "partner" : null].filter((h) => h !== null).map((h, i) => el("th", { class: i === 1 ? "l" : null, text: h })));
  const partner = (e) => {
    const p = pr.map.get(e.i);
    return el("td", { class: "l pair " + (p.sameSeed ? "same" : "diff"), "data-same-seed": p.sameSeed ? "1" : "0",
      text: p.sameSeed ? `#${p.e.i}, = seed` : `#${p.e.i}, ≠ seed ${p.e.seed}` });
  };
  const rows = slice.map((e) => el("tr", {
    class: "ep" + (S.selected === e.i ? " current" : ""), "data-i": e.i, onclick: () => shownErrors(openEpisode(e.i)) },
    el("td", { text: String(e.i) }), el("td", { class: "l", text: e.env || "" }), el("td", { text: String(e.seed) }),
    el("td", {}, el("span", { class: e.success ? "ok" : "bad", text: e.success ? "✓" : "✗" })),
    el("td", { text: fmt(e.total_reward, 2) }), el("td", { text: String(e.n_turns) }),
    el("td", { class: "l" }, badges(e)),
    S.index.training ? el("td", { text: e.max_abs_adv === null ? "—" : fmt(e.max_abs_adv, 2) }) : null,
    pr ? partner(e) : null));
  document.getElementById("episodes").replaceChildren(head, ...rows);
}

// ---------------------------------------------------------------- one episode
function tokenSpan(key, td, r, p, extra) {
  const row = td.rows[r], m = row.mask[p];
  const span = el("span", { class: `tok m${m}${extra || ""}`, "data-k": key, "data-r": r, "data-p": p,
    text: pieceText(td.pieces[String(row.ids[p])] ?? `<${row.ids[p]}>`) });
  if (m && S.shown[key]?.actor_updated === false) span.classList.add("frozen");  // sampled, not trained
  else if (m && row.advantages) span.style.background = advColor(row.advantages[p]);
  return span;
}

/* tokens [a, b) of row r, image-token runs collapsed into one chip */
function tokenRun(key, td, r, a, b) {
  const row = td.rows[r], out = [];
  for (let p = a; p < b; p++) {
    if (td.image_token_id !== null && row.ids[p] === td.image_token_id && !row.mask[p]) {
      let q = p;
      while (q < b && row.ids[q] === td.image_token_id) q++;
      out.push(el("span", { class: "tok m0 img", "data-k": key, "data-r": r, "data-p": p, text: `[image: ${q - p} tokens]` }));
      p = q - 1;
    } else out.push(tokenSpan(key, td, r, p));
  }
  return out;
}

function rewardTable(t) {
  const rp = t.reward_parts;
  const rows = [
    el("tr", {}, el("th", { class: "l", text: "reward" }), el("th", { text: "env" }), el("th", { text: "format" }),
      el("th", { text: "judge" }), el("th", { text: "turn total" })),
    el("tr", {}, el("td", { class: "l", text: "" }), el("td", { text: signed(rp.env) }),
      el("td", { text: rp.format === null ? "(in env)" : signed(rp.format) }), el("td", { text: signed(rp.judge) }),
      el("td", {}, el("b", { text: signed(t.reward) }))),
  ];
  t.judge.forEach((j) => rows.push(el("tr", {}, el("td", { class: "l", text: `judge: ${j.kind}` }),
    el("td", { text: `score ${fmt(j.score, 2)}` }), el("td", { text: "" }), el("td", { text: signed(j.reward) }),
    el("td", { class: "reason", text: j.reason }))));
  return el("div", { class: "rewards-wrap" }, el("table", { class: "rewards" }, rows));
}

function renderTurn(key, ep, t) {
  const td = ep.token_data;
  const frames = el("div", { class: "frames" }, t.images.map((rel) => {
    const src = fileUrl(rel);
    return src ? el("img", { src, alt: `turn ${t.index} image`, title: `${rel} (click to enlarge)`,
      onclick: (e) => e.target.classList.toggle("big") })
      : el("div", { class: "missing", text: "frame not saved (rollouts_max_mb reached)" });
  }));
  const head = el("h3", {}, `turn ${t.index} `, t.format_ok ? el("span", { class: "badge", text: "format ok" })
    : el("span", { class: "badge warn", text: `format error${t.format_error ? ": " + t.format_error : ""}` }),
  t.actions.length ? el("span", { class: "badge", text: "actions: " + t.actions.join(", ") }) : null,
  t.finish_reason && t.finish_reason !== "stop" ? el("span", { class: "badge warn", text: `finish: ${t.finish_reason}` }) : null,
  t.token_versions ? el("span", { class: "badge warn", text: `weights v${t.token_versions[0]}→v${t.token_versions[t.token_versions.length - 1]}, split at token ${t.token_versions.findIndex((v) => v !== t.token_versions[0])}`,
    title: "a weight push stopped this reply and it continued on the new weights (rollout.interrupt): hover a reply token for the version that sampled it" })
    : t.weights_version != null ? el("span", { class: "badge", text: `weights v${t.weights_version}`,
      title: "the weights version that sampled every token of this reply (engines with pushed weights)" }) : null);
  let body;
  // a text env's board is in its observation: shown in full, not only inside the collapsed prompt
  const seen = !t.images.length && t.observation
    ? el("div", { class: "observation" }, el("div", { class: "meta", text: "observation (what the model read)" }),
      el("pre", { class: "plain", text: t.observation }))
    : null;
  if (td && t.tokens) {
    const { row: r, ctx, reply } = t.tokens;
    const ids = td.rows[r].ids;
    let cut = ctx[0];  // the prompt's tail after its last image token stays visible before the reply
    for (let p = ctx[0]; p < ctx[1]; p++) if (ids[p] === td.image_token_id) cut = p + 1;
    cut = Math.max(cut, ctx[1] - 8);
    const nImg = ids.slice(ctx[0], ctx[1]).filter((x) => x === td.image_token_id).length;
    const det = el("details", { class: "prompt" },
      el("summary", { text: `prompt: ${ctx[1] - ctx[0]} tokens (${nImg} image tokens), loss mask 0, not trained` }));
    det.addEventListener("toggle", () => {  // built when opened: long prompts stay out of the DOM
      if (det.open && det.childElementCount === 1) det.append(el("div", { class: "tokens" }, tokenRun(key, td, r, ctx[0], cut)));
    }, { once: false });
    const replyToks = tokenRun(key, td, r, reply[0], reply[1]);
    replyToks.forEach((s, i) => {  // the version that sampled each reply token (engines with pushed weights)
      const v = t.token_versions ? t.token_versions[i] : t.weights_version;
      if (v != null && td.rows[r].mask[reply[0] + i]) s.dataset.v = v;
    });
    body = [det, el("div", { class: "tokens reply-block" }, tokenRun(key, td, r, cut, ctx[1]), replyToks)];
  } else {
    body = [el("details", { class: "prompt" }, el("summary", { text: "prompt (text)" }), el("pre", { text: t.prompt })),
      el("pre", { class: "plain reply-block", text: t.reply })];
  }
  return el("div", { class: "turn", "data-turn": t.index }, frames, el("div", {}, head, seen, body, rewardTable(t)));
}

function renderEpisode(ep, label) {
  const key = `${ep.group}#${ep.i}`;
  S.shown[key] = ep;
  const td = ep.token_data;
  const head = el("h2", {}, `${label || ""}${ep.env} seed ${ep.seed} · episode ${ep.i} · `,
    el("span", { class: ep.success ? "ok" : "bad", text: ep.success ? "success" : "failed" }),
    ` · return ${fmt(ep.env_return, 2)} (total reward ${fmt(ep.total_reward, 2)}) · ${ep.n_turns} turns` +
    (ep.terminated ? " · terminated" : "") + (ep.truncated ? " · truncated (turn limit)" : ""));
  const info = [];
  if (td && ep.actor_updated === false) {
    info.push(el("div", { class: "note warmup", "data-actor-updated": "0",
      text: `Actor not updated at this step (critic warm-up, ppo.critic_warmup_steps): the policy trained on none ` +
        `of its ${td.n_loss} sampled tokens (outlined, uncoloured); only the critic was fitted on them. The ` +
        `advantages (hover a token) were computed but not applied.` }));
  } else if (td) {
    info.push(el("div", { class: "legend" }, `advantage  −${fmt(S.advScale, 2)}`, el("span", { class: "bar" }),
      `+${fmt(S.advScale, 2)}   red: pushed down · blue: pushed up · striped grey: loss mask 0 (not trained) · ` +
      `${td.n_loss} trained tokens`));
  } else {
    info.push(el("div", { class: "note", text: `No token data: ${ep.no_tokens_reason}` }));
  }
  if (ep.error) info.push(el("pre", { class: "note", text: ep.error }));
  if (ep.legend && ep.legend.length) {  // what the board's symbols (text) and tiles (image) mean
    info.push(el("div", { class: "env-legend" }, el("span", { class: "meta", text: `${ep.env} board: ` }),
      ep.legend.map((x) => el("span", { class: "sym", "data-symbol": x.symbol },
        x.tile ? el("img", { src: x.tile, alt: x.meaning }) : null, el("code", { text: x.symbol }), " " + x.meaning))));
  }
  const turns = ep.turns.map((t) => renderTurn(key, ep, t));
  const tail = [];
  if (td && td.after.length) {
    td.after.forEach(({ row, span }) => {
      const det = el("details", { class: "prompt" }, el("summary", {
        text: `after the last reply${td.rows.length > 1 ? ` of row ${row}` : ""}: ${span[1] - span[0]} tokens (closing template${ep.truncated ? ", final observation for the bootstrap value" : ""})` }));
      det.addEventListener("toggle", () => { if (det.open && det.childElementCount === 1) det.append(el("div", { class: "tokens" }, tokenRun(key, td, row, span[0], span[1]))); });
      tail.push(det);
    });
  }
  if (ep.final_images.length) {
    tail.push(el("div", { class: "final" }, el("div", { class: "meta", text: "final observation" }),
      ep.final_images.map((rel) => (fileUrl(rel) ? el("img", { src: fileUrl(rel), alt: "final observation" }) : null))));
  }
  return el("div", { class: "episode", "data-episode": key }, head, info, turns, tail);
}

async function openEpisode(i) {
  const seq = ++S.seq;
  S.selected = i;
  location.hash = `group=${encodeURIComponent(S.group)}&i=${i}` + (S.other ? `&other=${encodeURIComponent(S.other)}` : "");
  renderList();
  const pane = document.getElementById("episode-pane");
  pane.replaceChildren(el("p", { class: "meta", text: "loading…" }));
  const ep = await getJSON("episode", { group: S.group, i });
  if (seq !== S.seq) return;  // another episode was opened meanwhile
  if (!S.other) { pane.replaceChildren(renderEpisode(ep)); return; }
  const partner = pairs().map.get(i);
  const other = partner ? await getJSON("episode", { group: S.other, i: partner.e.i }) : null;
  if (seq !== S.seq) return;
  const labelOf = (g) => S.index.groups.find((x) => x.id === g)?.label + ": ";
  const how = !partner ? null : partner.sameSeed
    ? el("div", { class: "note pair-how", "data-same-seed": "1", text: `same env seed ${ep.seed}: the same board` })
    : el("div", { class: "note pair-how", "data-same-seed": "0", text: `different boards: seed ${ep.seed} vs ` +
      `${other.seed} (no episode on seed ${ep.seed} there; paired by position)` });
  pane.replaceChildren(how || "", el("div", { class: "compare" }, el("div", {}, renderEpisode(ep, labelOf(S.group))),
    el("div", {}, other ? renderEpisode(other, labelOf(S.other)) : el("p", { text: "no partner" }))));
}

async function openGroup(id, then) {
  S.group = id; S.page = 0; S.selected = null; S.shown = {};
  if (S.other === id) S.other = null;
  document.querySelectorAll("tr.group").forEach((tr) => tr.classList.toggle("current", tr.dataset.group === id));
  S.episodes = await getJSON("episodes", { group: id });
  S.otherEpisodes = S.other ? await getJSON("episodes", { group: S.other }) : [];
  updateScale();
  renderControls(); renderList();
  if (then === undefined) {  // no episode asked for (#i=N): the first one of the list
    const first = visibleEpisodes().find((e) => !S.other || pairs().map.has(e.i));
    then = first ? first.i : undefined;
  }
  if (then !== undefined) await openEpisode(then);
  else document.getElementById("episode-pane").replaceChildren(el("p", { class: "meta", text: "This group has no episodes." }));
}

async function setCompare(id) {
  S.other = id;
  S.otherEpisodes = id ? await getJSON("episodes", { group: id }) : [];
  updateScale();
  S.page = 0; renderList();
  if (S.selected !== null) await openEpisode(S.selected);
}

function updateScale() {  // one colour scale per view: the largest |advantage| of the shown groups
  const all = S.episodes.concat(S.otherEpisodes).map((e) => e.max_abs_adv).filter((x) => x !== null);
  S.advScale = all.length ? Math.max(...all) : 1;
}

// ---------------------------------------------------------------- the token tooltip
function tooltip(ev) {
  const tip = document.getElementById("tip");
  const t = ev.target.closest(".tok");
  if (!t) { tip.hidden = true; return; }
  const ep = S.shown[t.dataset.k], td = ep.token_data, row = td.rows[+t.dataset.r], p = +t.dataset.p;
  const v = (name) => (row[name] ? row[name][p] : undefined);
  const lines = [
    `position ${p}   id ${row.ids[p]}   ${JSON.stringify(td.pieces[String(row.ids[p])] ?? "")}`,
    row.mask[p] ? "loss mask 1: sampled by the policy, trained" : "loss mask 0: not sampled, not trained",
    `log-prob (sampling)    ${fmt(v("slp"), 4)}`,
    `log-prob (train pass)  ${fmt(v("logprobs"), 4)}`,
    `entropy                ${td.fields.includes("entropy") ? fmt(v("entropy"), 4) : "— (not dumped)"}`,
    `value                  ${td.fields.includes("values") ? fmt(v("values"), 4) : "— (no critic)"}`,
    `advantage              ${signed(v("advantages"), 4)}`,
    `return                 ${td.fields.includes("returns") ? fmt(v("returns"), 4) : "—"}`,
  ];
  if (t.dataset.v !== undefined) lines.push(`weights version        v${t.dataset.v} (sampled it)`);
  tip.textContent = lines.join("\n");
  tip.hidden = false;
  tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 380) + "px";
  tip.style.top = ev.clientY + 16 + "px";
}
document.addEventListener("mouseover", tooltip);
document.addEventListener("mouseout", (ev) => { if (ev.target.closest(".tok")) document.getElementById("tip").hidden = true; });

// ---------------------------------------------------------------- start
async function main() {
  S.index = await getJSON("index");
  renderOverview();
  const h = new URLSearchParams(location.hash.slice(1));
  const g = h.get("group") || (S.index.groups[0] && S.index.groups[0].id);
  if (h.get("other")) S.other = h.get("other");
  if (g) await openGroup(g, h.has("i") ? +h.get("i") : undefined);
  document.body.dataset.ready = "1";
}
main().catch((err) => {
  document.body.dataset.ready = "error";
  document.getElementById("episode-pane").replaceChildren(el("pre", { class: "note error",
    text: String(err.fromServer ? err.message : err.stack || err) }));
});
