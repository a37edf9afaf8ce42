"""The per-run HTML report: one self-contained page with inline SVG charts, readable offline.

No JavaScript and no network: the page must open from a rented box, a laptop on a train or a headless
browser in CI alike. `dvc plots show` gives the interactive Vega view of the same history.
"""

import html
import json

from burstrl.pipeline.catalog import CHARTS, EPISODE_CHARTS

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]
TABLE = ["iteration", "reward_mean", "heldout_accuracy", "kl_ref", "sampler_kl", "entropy", "is_clipped_fraction",
         "staleness_mean", "rows_dropped", "completion_length", "seconds_train", "cost_usd"]
WIDTH, HEIGHT, PAD = 520, 280, 48
STYLE = """<style>
body { font-family: sans-serif; margin: 24px; color: #222; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
.chart { border: 1px solid #ddd; background: #fff; }
table { border-collapse: collapse; margin: 12px 0; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
pre { background: #f6f6f6; padding: 12px; font-size: 12px; }
.warning { color: #a40000; font-weight: bold; }
</style>"""


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _frame(title: str, xs: list[int], values: list[float]):
    """The chart's axes, grid and title for `values` over iterations `xs`: (svg parts, x to px, y to px)."""
    out = [f'<svg class="chart" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{PAD}" y="18" font-weight="bold">{html.escape(title)}</text>']
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y0, y1 = min(0.0, min(values)), max(values)
    y1 = y1 + (y1 - y0) * 0.05 if y1 > y0 else y0 + 1

    def px(x):
        return PAD + (x - x0) / (x1 - x0) * (WIDTH - 2 * PAD)

    def py(y):
        return HEIGHT - PAD + 12 - (y - y0) / (y1 - y0) * (HEIGHT - 2 * PAD - 12)

    out.append(f'<line x1="{PAD}" y1="{py(y0)}" x2="{WIDTH - PAD}" y2="{py(y0)}" stroke="#444"/>'
               f'<line x1="{PAD}" y1="{py(y0)}" x2="{PAD}" y2="{py(y1)}" stroke="#444"/>')
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        out.append(f'<line x1="{PAD}" y1="{py(y):.1f}" x2="{WIDTH - PAD}" y2="{py(y):.1f}" stroke="#eee"/>'
                   f'<text x="{PAD - 6}" y="{py(y) + 4:.1f}" text-anchor="end" font-size="11">{y:.3g}</text>')
    ticks = sorted(set(xs))
    for x in ticks[::max(1, len(ticks) // 10)]:
        out.append(f'<text x="{px(x):.1f}" y="{HEIGHT - PAD + 28}" text-anchor="middle" font-size="11">{x}</text>')
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 6}" text-anchor="middle" font-size="11">iteration</text>')
    return out, px, py


def _empty(title: str) -> str:
    return (f'<svg class="chart" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{html.escape(title)}">'
            f'<text x="{PAD}" y="18" font-weight="bold">{html.escape(title)}</text>'
            f'<text x="{PAD}" y="{HEIGHT // 2}" fill="#888">no data yet</text></svg>')


def _series(out: list[str], i: int, count: int, label: str, points: list[tuple], px, py) -> None:
    color = COLORS[i % len(COLORS)]
    coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    out.append(f'<polyline fill="none" stroke="{color}" stroke-width="3" points="{coords}"/>')
    out.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{color}"/>' for x, y in points)
    lx = PAD + 8 + i * ((WIDTH - 2 * PAD) // max(1, count))
    out.append(f'<rect x="{lx}" y="28" width="12" height="12" fill="{color}"/>'
               f'<text x="{lx + 16}" y="38" font-size="11">{html.escape(label)}</text>')


def line_chart(title: str, rows: list[dict], keys: list[str]) -> str:
    series = {k: [(r["iteration"], r[k]) for r in rows if isinstance(r.get(k), int | float)] for k in keys}
    values = [v for points in series.values() for _, v in points]
    if not values:
        return _empty(title)
    out, px, py = _frame(title, [r["iteration"] for r in rows], values)
    for i, (key, points) in enumerate(series.items()):
        _series(out, i, len(series), key.removeprefix("seconds_"), points, px, py)
    out.append("</svg>")
    return "".join(out)


def band_chart(title: str, arms: dict[str, list[tuple]]) -> str:
    """One line per arm through its mean, in a shaded band from its interval's low to high end:
    `arms` maps an arm to its (iteration, mean, low, high) points, low and high None where undefined."""
    points = {arm: [p for p in rows if p[1] is not None] for arm, rows in arms.items()}
    values = [v for rows in points.values() for p in rows for v in p[1:] if v is not None]
    if not values:
        return _empty(title)
    out, px, py = _frame(title, [p[0] for rows in points.values() for p in rows], values)
    for i, (arm, rows) in enumerate(points.items()):
        color, band = COLORS[i % len(COLORS)], [p for p in rows if p[2] is not None]
        if band:
            edge = [f"{px(x):.1f},{py(hi):.1f}" for x, _, _, hi in band]
            edge += [f"{px(x):.1f},{py(lo):.1f}" for x, _, lo, _ in reversed(band)]
            out.append(f'<polygon fill="{color}" fill-opacity="0.2" points="{" ".join(edge)}"/>')
        # An error bar per point too, side by side across arms: a band has no width at a single iteration.
        dodge = (i - (len(points) - 1) / 2) * 8
        out.extend(f'<line x1="{px(x) + dodge:.1f}" y1="{py(lo):.1f}" x2="{px(x) + dodge:.1f}" y2="{py(hi):.1f}" '
                   f'stroke="{color}" stroke-width="2"/>' for x, _, lo, hi in band)
        _series(out, i, len(points), arm, [(x, mean) for x, mean, _, _ in rows], px, py)
    out.append("</svg>")
    return "".join(out)


def table(rows: list[dict], keys: list[str], css: str) -> str:
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(k))}</td>" for k in keys) + "</tr>" for r in rows)
    return f'<table class="{css}"><tr>{head}</tr>{body}</table>'


def session_table(sessions: list[dict]) -> str:
    """Where each rented session's time went: set-up, training, syncing, waiting for home and teardown on the
    rented side; generating, scoring, eval, sync and waiting for the trainer at home; and what an iteration cost."""
    if not sessions:
        return '<p class="sessions">no rented session yet (`make rent-h200`)</p>'
    return table(sessions, list(sessions[0]), "sessions")


def watch_section(warnings: list[str], suspects: dict | None) -> str:
    """The reward-hacking watch: each threshold crossed, and the last scored iteration's best-paid failures."""
    lines = "".join(f'<p class="warning">{html.escape(w)}</p>' for w in warnings) or "<p>No threshold crossed.</p>"
    if not suspects or not suspects["suspects"]:
        return lines
    keys = list(suspects["suspects"][0])
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r[k])}</td>"
                                    for k in keys) + "</tr>" for r in suspects["suspects"])
    return (f"{lines}<p>Iteration {suspects['iteration']}: the best-paid rollouts that fail "
            f"{html.escape(suspects['verifier'])}</p><table class=\"suspects\"><tr>{head}</tr>{body}</table>")


def render(rows: list[dict], summary: dict, params: dict, sessions: list[dict] = (), watch: str = "") -> str:
    episodes = [c for c in EPISODE_CHARTS if any(r.get(k) is not None for r in rows for k in c[1])]
    charts = "\n".join(line_chart(title, rows, keys) for title, keys in CHARTS + episodes)
    facts = "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in summary.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>burstrl run report</title>
{STYLE}</head><body>
<h1>burstrl run report</h1>
<table class="summary">{facts}</table>
<div class="charts">
{charts}
</div>
<h2>Reward-hacking watch</h2>
{watch}
<h2>Per iteration</h2>
{table(rows, TABLE, "history")}
<h2>Rented sessions (seconds)</h2>
{session_table(list(sessions))}
<h2>Params</h2>
<pre>{html.escape(json.dumps(params, indent=2))}</pre>
</body></html>
"""
