"""Summaries of evaluation episodes: ``summary.json`` rows, the printed table and ``report.html``.

Everything here reads episode *records* (the JSON dicts of :mod:`vagent.eval.store`), so a
summary is always recomputed from what is on disk, whatever runs produced it.

Per (env, model, format) cell (``summarize_cell``):

- ``episodes``: expected episodes; ``finished``: records on disk; ``errors``: records with an
  error (API failure after retries, env crash); ``valid = finished - errors``.
- ``success_rate = successes / valid`` (errored episodes are neither successes nor failures:
  they are counted in ``errors``), with the Wilson score interval at 95 %
  (:func:`wilson_interval`); both null when ``valid == 0``.
- ``mean_return``: mean env return (``Episode.env_return``) over valid episodes;
  ``mean_total_reward`` adds the reasoning-judge rewards; ``mean_turns``.
- ``format_accuracy``: correctly formatted turns / turns, pooled over the valid episodes' turns.
- ``reasoning_scores``: per judge, the mean raw score over the judged turns of valid episodes.
- ``prompt_tokens`` / ``completion_tokens``: sums over every recorded turn that reported usage
  (errored episodes included: they were billed); null when no turn reported usage.
- ``cost_usd = (prompt_tokens * p_in + completion_tokens * p_out) / 1e6`` with
  ``[p_in, p_out] = prices[model label]`` or ``prices[model id]``; null without usage or price.
- ``retries``: retries of the replies that arrived (failed requests are in ``summary["api"]``).
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from vagent.rollout.records import error_headline

#: the 0.975 quantile of the standard normal distribution (two-sided 95 % interval)
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion; None when ``n == 0``.

    With ``p = k / n``::

        center = (p + z^2 / (2n)) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / (4 n^2))
        [center - half, center + half]

    (Wilson 1927). Unlike the normal approximation it stays inside [0, 1] and is not empty at
    k = 0 or k = n; e.g. 7 of 10 -> [0.3968, 0.8922], 0 of 5 -> [0, 0.4345].
    """
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes}")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def _mean(xs: Sequence[float]) -> float | None:
    return float(sum(xs) / len(xs)) if xs else None


def price_of(prices: Mapping[str, Any], label: str, model_id: str) -> tuple[float, float] | None:
    p = prices.get(label, prices.get(model_id))
    return (float(p[0]), float(p[1])) if p is not None else None


def summarize_cell(records: Sequence[Mapping[str, Any]], *, env: str, model: str, format: str, backend: str,
                   model_id: str, expected: int, prices: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary row of one (env, model, format) cell from its episode records (module docstring)."""
    valid = [r for r in records if r.get("error") is None]
    errors = len(records) - len(valid)
    k = sum(bool(r["success"]) for r in valid)
    turns = [t for r in valid for t in r["turns"]]
    judged: dict[str, list[float]] = {}
    for t in turns:
        for name, score in t.get("reasoning_scores", {}).items():
            judged.setdefault(name, []).append(float(score))
    reported = sum(r["usage"]["reported_turns"] for r in records)
    pt = sum(r["usage"]["prompt_tokens"] for r in records) if reported else None
    ct = sum(r["usage"]["completion_tokens"] for r in records) if reported else None
    price = price_of(prices or {}, model, model_id)
    cost = (pt * price[0] + ct * price[1]) / 1e6 if (price and pt is not None) else None
    ci = wilson_interval(k, len(valid))
    return {
        "env": env, "model": model, "format": format, "backend": backend, "model_id": model_id,
        "episodes": expected, "finished": len(records), "valid": len(valid), "errors": errors,
        "successes": k,
        "success_rate": k / len(valid) if valid else None,
        "success_ci95": list(ci) if ci else None,
        "mean_return": _mean([r["env_return"] for r in valid]),
        "mean_total_reward": _mean([r["total_reward"] for r in valid]),
        "mean_turns": _mean([r["n_turns"] for r in valid]),
        "format_accuracy": _mean([float(t["parsed"]["format_ok"]) for t in turns]),
        "reasoning_scores": {name: _mean(v) for name, v in sorted(judged.items())},
        "prompt_tokens": pt, "completion_tokens": ct, "cost_usd": cost,
        "retries": sum(r["usage"].get("retries", 0) for r in records),
        "error_examples": sorted({error_headline(r["error"])[:300] for r in records if r.get("error")})[:3],
    }


def failure_line(summary: Mapping[str, Any], first_error: str | None, retry_errors: bool = True) -> str | None:
    """The line ``vagent eval`` ends with when episodes failed (its exit code is then 1; see
    docs/evaluation.md, "Exit codes"): how many of the expected episodes, whether any cell measured
    nothing, and the first error (cell order, then seed); None when none failed."""
    cells = summary["cells"]
    failed, total = sum(c["errors"] for c in cells), sum(c["episodes"] for c in cells)
    if not failed:
        return None
    empty = [c for c in cells if c["errors"] and not c["valid"]]
    if len(empty) == len(cells):
        what = "nothing was measured"
    elif empty:
        what = f"{len(empty)} of {len(cells)} cells measured nothing: " + ", ".join(
            f"{c['env']}/{c['model']}/{c['format']}" for c in empty)
    else:
        what = "left out of the success rates"
    again = "the same command runs them again" if retry_errors else "retry_errors is off: --force reruns them"
    return f"vagent eval: {failed} of {total} episodes failed ({what}; {again}); first error: {first_error}"


def summary_metrics(summary: Mapping[str, Any], prefix: str = "eval") -> dict[str, float]:
    """Flat metrics ``<prefix>/<env>/<model>/<format>/<field>`` of a summary (for metric loggers)."""
    out = {}
    for row in summary["cells"]:
        base = f"{prefix}/{row['env']}/{row['model']}/{row['format']}"
        for k in ("success_rate", "mean_return", "mean_turns", "format_accuracy", "errors", "cost_usd"):
            if row.get(k) is not None:
                out[f"{base}/{k}"] = float(row[k])
        for name, v in row["reasoning_scores"].items():
            if v is not None:
                out[f"{base}/reasoning_{name}"] = float(v)
    return out


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def table_rows(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the printed summary table."""
    head = ["env", "model", "format", "episodes", "success (95% CI)", "return", "turns", "format ok",
            "judges", "errors", "tokens in/out", "cost $"]
    rows = []
    for r in summary["cells"]:
        ci = r["success_ci95"]
        succ = "-" if r["success_rate"] is None else f"{r['success_rate']:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"
        judges = " ".join(f"{k}={_fmt(v, '.2f')}" for k, v in r["reasoning_scores"].items()) or "-"
        tokens = "-" if r["prompt_tokens"] is None else f"{r['prompt_tokens']}/{r['completion_tokens']}"
        done = f"{r['finished']}" if r["finished"] == r["episodes"] else f"{r['finished']}/{r['episodes']}"
        rows.append([r["env"], r["model"], r["format"], done, succ, _fmt(r["mean_return"]),
                     _fmt(r["mean_turns"], ".2f"), _fmt(r["format_accuracy"]), judges, str(r["errors"]),
                     tokens, _fmt(r["cost_usd"], ".4f")])
    return head, rows


def print_table(summary: Mapping[str, Any], console: Any = None) -> None:
    """Print the summary table with rich."""
    from rich.console import Console
    from rich.table import Table

    head, rows = table_rows(summary)
    table = Table(title=f"vagent eval: {summary['run']['out_dir']}")
    for h in head:
        table.add_column(h, overflow="fold")
    for row in rows:
        table.add_row(*row)
    if console is None:
        console = Console()
        if not console.is_terminal:  # a log file: do not fold the columns at 80 characters
            console = Console(width=180)
    console.print(table)


# ---------------------------------------------------------------------------------------------
# HTML report: one self-contained page per run (inline CSS, images as data URLs, a tiny script
# that records in <body data-images-loaded/-broken> how many images decoded, for the test).

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f0f0f0}h2{margin-top:2em;border-bottom:2px solid #888}
details{margin:4px 0;border:1px solid #ddd;border-radius:4px;padding:4px 8px}
summary{cursor:pointer}.ok{color:#070}.fail{color:#a00}.err{color:#a0a;font-weight:bold}
pre{white-space:pre-wrap;background:#f7f7f7;padding:6px;margin:4px 0;font-size:12px}
.turn{border-left:3px solid #99c;margin:8px 0;padding-left:8px}.reply{background:#eef7ee}
img{image-rendering:pixelated;width:192px;border:1px solid #aaa;margin:2px}
.meta{color:#666;font-size:12px}
"""

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0, bad = 0;
  for (var i = 0; i < imgs.length; i++) {
    if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; else bad++;
  }
  document.body.setAttribute('data-images-loaded', ok);
  document.body.setAttribute('data-images-broken', bad);
});
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _img(out_dir: Path, rel: str) -> str:
    p = out_dir / rel
    try:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
    except FileNotFoundError:
        return f'<span class="err">missing image {_e(rel)}</span>'
    return f'<img alt="{_e(rel)}" src="data:image/png;base64,{data}">'


def _obs_html(out_dir: Path, obs: Mapping[str, Any]) -> str:
    imgs = "".join(_img(out_dir, rel) for rel in obs.get("images", []))
    return f"<pre>{_e(obs['text'])}</pre>{imgs}"


def _turn_html(out_dir: Path, t: Mapping[str, Any]) -> str:
    parsed = t["parsed"]
    fields = "".join(f"<tr><th>{_e(k)}</th><td>{_e(parsed.get(k))}</td></tr>"
                     for k in ("format_ok", "error", "observation", "reasoning", "prediction", "answer", "actions")
                     if parsed.get(k) not in (None, "", []))
    judges = "".join(f"<tr><th>judge {_e(k)}</th><td>score {_e(round(v, 3))}, reward "
                     f"{_e(round(t['reasoning_rewards'].get(k, 0.0), 3))}</td></tr>"
                     for k, v in t.get("reasoning_scores", {}).items())
    info = json.dumps(t.get("info", {}), ensure_ascii=False)
    return (
        f'<div class="turn"><b>turn {t["index"]}</b> <span class="meta">env reward {t["env_reward"]:.3f}, '
        f'reward {t["reward"]:.3f}, finish {_e(t["finish_reason"])}, usage {_e(t.get("usage", {}))}'
        f'{", terminated" if t["terminated"] else ""}{", truncated" if t["truncated"] else ""}</span>'
        f"<div>observation:</div>{_obs_html(out_dir, t['observation'])}"
        f'<div>reply:</div><pre class="reply">{_e(t["reply"])}</pre>'
        f"<table>{fields}{judges}<tr><th>info</th><td>{_e(info)}</td></tr></table></div>"
    )


def _episode_html(out_dir: Path, r: Mapping[str, Any]) -> str:
    key = r["key"]
    if r.get("error"):
        status = '<span class="err">ERROR</span>'
    else:
        status = '<span class="ok">success</span>' if r["success"] else '<span class="fail">failure</span>'
    head = (f"seed {key['seed']} sample {key['sample']}: {status}, return {r['env_return']:.3f}, "
            f"{r['n_turns']} turn(s), format ok {r['n_format_ok']}/{r['n_turns']}")
    body = [f'<details class="system"><summary>system prompt</summary><pre>{_e(r["system_prompt"])}</pre></details>']
    if r.get("error"):
        body.append(f'<pre class="err">{_e(r["error"])}</pre>')
    body += [_turn_html(out_dir, t) for t in r["turns"]]
    if r.get("final_observation"):
        body.append(f"<div><b>final observation</b>{_obs_html(out_dir, r['final_observation'])}</div>")
    return f'<details class="episode" data-seed="{key["seed"]}"><summary>{head}</summary>{"".join(body)}</details>'


def render_html(summary: Mapping[str, Any], records: Mapping[tuple[str, str, str], Sequence[Mapping[str, Any]]],
                out_dir: str | Path, max_episodes: int = 100) -> str:
    """The self-contained HTML page of a run: summary table, then each cell's episodes turn by turn.

    ``records`` maps (env, model, format) to that cell's records; at most ``max_episodes`` per cell
    are shown (the page says how many more are on disk).
    """
    out_dir = Path(out_dir)
    head, rows = table_rows(summary)
    table = "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
    table += "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>vagent eval {_e(summary['run']['out_dir'])}</title><style>{_CSS}</style>",
        f"<script>{_SCRIPT}</script></head><body>",
        f"<h1>vagent eval</h1><p class='meta'>{_e(summary['run']['out_dir'])} &middot; "
        f"{_e(summary['run'].get('finished_at_text', ''))} &middot; max turns {_e(summary['run']['max_turns'])}, "
        f"mode {_e(summary['run']['mode'])}, sampling {_e(summary['run']['sampling'])}</p>",
        table,
    ]
    for row in summary["cells"]:
        cell = (row["env"], row["model"], row["format"])
        recs = sorted(records.get(cell, []), key=lambda r: (r["key"]["seed"], r["key"]["sample"]))
        parts.append(f'<h2 class="cell">{_e(row["env"])} / {_e(row["model"])} / {_e(row["format"])}</h2>')
        parts += [_episode_html(out_dir, r) for r in recs[:max_episodes]]
        if len(recs) > max_episodes:
            parts.append(f"<p class='meta'>{len(recs) - max_episodes} more episode(s) in "
                         f"episodes/{_e(row['model'])}/{_e(row['env'])}/{_e(row['format'])}/</p>")
    parts.append("</body></html>")
    return "".join(parts)


__all__ = ["Z95", "wilson_interval", "summarize_cell", "error_headline", "failure_line", "summary_metrics",
           "table_rows", "print_table", "render_html", "price_of"]
