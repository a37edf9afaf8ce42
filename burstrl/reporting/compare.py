"""`python -m burstrl compare conf/sweep/kl.yaml`: a sweep's arms side by side, with intervals over seeds.

Reads each experiment of the sweep (burstrl.pipeline.sweep) that DVC keeps for the commit checked out: its
report/history.json, from the experiment's Git commit. Per arm and iteration it gives, over the arm's seeds,
the mean and a 95% interval of held-out accuracy, reward, KL to the reference and entropy: mean +- t * s / sqrt(n)
with s the sample standard deviation and t Student's 0.975 quantile at n - 1 degrees of freedom (no interval
from one seed). Prints the table and writes report/sweep/SWEEP/compare.json (a row per arm and iteration:
`dvc plots show report/sweep/SWEEP/compare.json --template band -x iteration -y heldout_accuracy` draws the
bands) and report/sweep/SWEEP/index.html (the charts and the table, offline). Experiments not found are named,
and the exit status is then 1.
"""

import argparse
import html
import json
import math
import subprocess
import sys
from pathlib import Path

from burstrl.atomic import write_json, write_text
from burstrl.errors import FAILED, BurstrlError
from burstrl.pipeline import sweep as sweeps
from burstrl.reporting.charts import STYLE, band_chart

METRICS = {"heldout_accuracy": "Held-out accuracy", "reward_mean": "Reward", "kl_ref": "KL to the reference",
           "entropy": "Entropy"}
# Student's t, 0.975 quantile, by degrees of freedom.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
Z975 = 1.959964


def t975(df: int) -> float:
    """Past the table, the Cornish-Fisher term z + (z^3 + z) / (4 df): within 0.002 of the true value."""
    return T975[df - 1] if df <= len(T975) else Z975 + (Z975 ** 3 + Z975) / (4 * df)


def interval(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """(mean, low, high) of the 95% interval of the mean; low and high None below two values."""
    n = len(values)
    if n == 0:
        return None, None, None
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    half = t975(n - 1) * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def comparison(sweep: sweeps.Sweep, histories: dict[str, list[dict]]) -> list[dict]:
    """A row per arm and iteration from the experiments' histories ({experiment name: history rows}); each
    metric's mean, `_lo`, `_hi` and `_n` (the seeds that measured it)."""
    rows = []
    for arm in sweep.arms:
        runs = [histories[e.name] for e in sweep.experiments() if e.arm == arm and e.name in histories]
        for iteration in sorted({r["iteration"] for history in runs for r in history}):
            at = [r for history in runs for r in history if r["iteration"] == iteration]
            row = {"arm": arm, "iteration": iteration, "seeds": len(at)}
            for key in METRICS:
                values = [r[key] for r in at if isinstance(r.get(key), int | float)]
                row[key], row[f"{key}_lo"], row[f"{key}_hi"] = interval(values)
                row[f"{key}_n"] = len(values)
            rows.append(row)
    return rows


def _cell(row: dict, key: str) -> str:
    if row[key] is None:
        return "-"
    return f"{row[key]:.4g}" + (f" ± {row[f'{key}_hi'] - row[key]:.2g}" if row[f"{key}_hi"] is not None else "")


def render_table(rows: list[dict]) -> str:
    header = ["arm", "iter", "seeds", *METRICS]
    table = [[r["arm"], f"{r['iteration']:03d}", str(r["seeds"]), *(_cell(r, k) for k in METRICS)] for r in rows]
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *table])


def render_page(sweep: sweeps.Sweep, rows: list[dict], missing: list[str]) -> str:
    charts = "\n".join(band_chart(f"{title} (mean, 95% interval over seeds)", {
        arm: [(r["iteration"], r[key], r[f"{key}_lo"], r[f"{key}_hi"]) for r in rows if r["arm"] == arm]
        for arm in sweep.arms}) for key, title in METRICS.items())
    arms = "".join(f"<tr><th>{html.escape(arm)}</th><td>{html.escape(json.dumps(values))}</td></tr>"
                   for arm, values in sweep.arms.items())
    lost = (f'<p class="warning">Not found: {html.escape(", ".join(missing))}</p>' if missing else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>burstrl sweep {html.escape(sweep.name)}</title>
{STYLE}</head><body>
<h1>Sweep {html.escape(sweep.name)}: {len(sweep.arms)} arms, seeds {html.escape(str(list(sweep.seeds)))}</h1>
{lost}
<table class="arms">{arms}</table>
<div class="charts">
{charts}
</div>
<h2>Per arm and iteration</h2>
<pre>{html.escape(render_table(rows))}</pre>
</body></html>
"""


def histories(names: list[str], cwd: Path = Path(".")) -> dict[str, list[dict]]:
    """{name: report/history.json of that experiment} for the names DVC keeps an experiment of."""
    refs = sweeps.experiment_refs(cwd)
    found = {}
    for name in names:
        if name not in refs:
            continue
        shown = subprocess.run(["git", "show", f"{refs[name]}:report/history.json"], cwd=cwd, capture_output=True,
                               text=True)
        if shown.returncode != 0:
            raise BurstrlError(f"experiment {name} ({refs[name][:7]}) has no report/history.json: "
                               f"{shown.stderr.strip()}")
        found[name] = json.loads(shown.stdout)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the sweep file the experiments were run from")
    parser.add_argument("--out", type=Path, default=Path("report/sweep"), help="where SWEEP/ is written")
    args = parser.parse_args(argv)
    try:
        sweep = sweeps.load(args.sweep)
        names = [e.name for e in sweep.experiments()]
        found = histories(names)
    except BurstrlError as err:
        print(f"compare: error: {err}", file=sys.stderr)
        return FAILED
    missing = [name for name in names if name not in found]
    rows = comparison(sweep, found)
    out = args.out / sweep.name
    write_json(out / "compare.json", rows)
    write_text(out / "index.html", render_page(sweep, rows, missing))
    print(render_table(rows))
    print(f"compare {sweep.name}: {len(found)} of {len(names)} experiments; charts in {out / 'index.html'}")
    if missing:
        print(f"compare {sweep.name}: not found for this commit: {', '.join(missing)} (still queued or failed: "
              "`dvc queue status`)", file=sys.stderr)
    return FAILED if missing else 0


if __name__ == "__main__":
    sys.exit(main())
