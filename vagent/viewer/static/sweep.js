/* vagent view: a sweep's page. Plain JS written for vagent (no library, no CDN).
 *
 * Shows the numbers of `vagent sweep report` (vagent/sweep/report.py, computed by the server:
 * this page only formats them), the validation curves it draws, and the trials. Served, each
 * trial with a run directory links to its run viewer under trial/<row>/seed_<k>/; in a page
 * written with --out the data (curves as data: URIs) is in the <script id="vagent-data"> block
 * and the trials are listed with their run directories.
 */
"use strict";

const EMBED = document.getElementById("vagent-data");
const STATIC = EMBED ? JSON.parse(EMBED.textContent) : null;

async function getSweep() {
  if (STATIC) return STATIC.sweep;
  const r = await fetch("api/sweep");
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
const fileUrl = (rel) => (STATIC ? STATIC.files[rel] || null : rel);

const num = (x, d) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(d));

/* the cells of report.md's table (vagent/sweep/report.py: markdown), from report.json's numbers */
function cells(c, d, isBase) {
  const meanSe = c.n === 0 ? "-" : c.n < 2 ? num(c.mean, d) : `${num(c.mean, d)} ± ${num(c.se, d)}`;
  const perSeed = Object.entries(c.seeds).map(([s, v]) => `${s}: ${num(v, d)}`).join(" / ") || "-";
  let diff = "", ci = "";
  if (isBase || c.diff === null) diff = "(baseline)";
  else if (c.diff.n === 0) diff = "-";
  else {
    diff = (c.diff.mean >= 0 ? "+" : "") + num(c.diff.mean, d);
    if (c.diff.n >= 2) ci = `[${num(c.diff.lo, d)}, ${num(c.diff.hi, d)}]`;
  }
  const excludesZero = c.diff && c.diff.n >= 2 && (c.diff.lo > 0 || c.diff.hi < 0);
  return { meanSe, perSeed, diff, ci, excludesZero };
}

function metricTable(m, sw) {
  const head = el("tr", {}, ["row", "seeds", "mean ± SE", "per seed", "diff vs baseline", "95% CI"].map(
    (h, i) => el("th", { class: i === 0 || i === 3 ? "l" : null, text: h })));
  const rows = sw.rows.map((row) => {
    const isBase = row === sw.baseline, c = cells(m.rows[row], m.digits, isBase);
    return el("tr", { class: isBase ? "baseline" : null, "data-row": row },
      el("td", { class: "l" }, el("code", { text: row })), el("td", { text: String(m.rows[row].n) }),
      el("td", { class: "mean", text: c.meanSe }), el("td", { class: "l seeds", text: c.perSeed }),
      el("td", { class: "diff", text: c.diff }),
      el("td", { class: "ci" + (c.excludesZero ? " sig" : ""), text: c.ci,
        title: c.excludesZero ? "the interval excludes 0: a difference at the 5% level" : null }));
  });
  return el("div", { class: "metric", "data-metric": m.key },
    el("h2", {}, `${m.title} `, el("code", { text: m.key })), el("table", {}, head, rows));
}

function trialLink(t) {
  if (!t.viewable) return el("span", { class: "meta", text: "no run directory yet" });
  if (STATIC) return el("code", { class: "run-dir", text: t.run_dir });
  const [row, seed] = t.id.split("/");
  return el("a", { class: "trial-link", href: `trial/${encodeURIComponent(row)}/${encodeURIComponent(seed)}/`,
    text: "open its run" });
}

function trialTable(sw) {
  const head = el("tr", {}, ["row", "seed", "status", "final val success", STATIC ? "run directory" : "run viewer"].map(
    (h, i) => el("th", { class: i === 0 || i >= 2 ? "l" : null, text: h })));
  const rows = sw.trials.map((t) => el("tr", { class: "trial", "data-trial": t.id, "data-status": t.status },
    el("td", { class: "l" }, el("code", { text: t.row })), el("td", { text: String(t.seed) }),
    el("td", { class: "l" }, el("span", { class: t.status === "finished" ? "ok" : t.status === "failed" ? "bad" : "meta",
      text: t.status }), t.error ? el("div", { class: "meta", text: t.error }) : null),
    el("td", { text: num(t.val_success_final, 3) }), el("td", { class: "l" }, trialLink(t))));
  const note = STATIC
    ? "Each trial's run directory opens in the run viewer with `vagent view <run directory>` " +
      "(or serve the sweep with `vagent view <sweep directory>` and click a trial)."
    : "Finished trials count in the tables; unfinished ones can be opened too (their run so far).";
  return [el("h2", { text: `Trials (${sw.n_finished} of ${sw.n_trials} finished)` }), el("p", { class: "meta", text: note }),
    el("table", { class: "trials" }, head, rows)];
}

function render(sw) {
  document.title = `vagent view: sweep ${sw.title}`;
  document.getElementById("title").textContent = `sweep ${sw.title} · ${sw.path}`;
  document.getElementById("summary").textContent =
    `${sw.n_finished} finished trials over ${sw.rows.length} rows; baseline row: ${sw.baseline}. Values are mean ± ` +
    "standard error over seeds (vagent sweep report's numbers, from the trials as they are now); the difference " +
    "to the baseline is paired by seed (the seeds both rows finished) with its 95% t-interval; an interval in " +
    "bold excludes 0." + (sw.missing.length ? ` Not finished (left out): ${sw.missing.join(", ")}.` : "");
  document.getElementById("tables").replaceChildren(...sw.metrics.map((m) => metricTable(m, sw)));
  document.getElementById("curves").replaceChildren(el("h2", { text: "Validation curves: mean over seeds ± standard error" }),
    el("div", { class: "curves" }, sw.curves.map((c) => {
      const src = fileUrl(c.file);
      return src ? el("img", { class: "curve", src, alt: `${c.key} curve`, "data-curve": c.key })
        : el("p", { class: "meta", text: `${c.key}: not drawn` });
    })));
  document.getElementById("trials").replaceChildren(...trialTable(sw));
}

getSweep().then((sw) => { render(sw); document.body.dataset.ready = "1"; }).catch((err) => {
  document.body.dataset.ready = "error";
  document.getElementById("summary").replaceChildren(el("pre", { class: "note", text: String(err.stack || err) }));
});
