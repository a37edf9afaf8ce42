"""report: the run's history and report from metrics/ and data/sync/.

Writes report/history.json (one row per policy version; `dvc plots show` draws it), report/summary.json
(a few numbers per run, for `dvc metrics diff` and `dvc exp show`) and report/index.html (the charts and
the rented sessions' time splits from metrics/session/, offline), and prints a WARNING line for each
threshold of the reward-hacking watch crossed (docs/reward-hacking.md). `python -m burstrl report` prints the same
history as a table.
"""

from pathlib import Path

from omegaconf import OmegaConf

from burstrl.atomic import write_json, write_text
from burstrl.pipeline import iterations
from burstrl.pipeline.stage import parse, stage
from burstrl.reporting.charts import render, watch_section
from burstrl.reporting.history import collect, latest_suspects, sessions, summary
from burstrl.rl.watch import warnings

if __name__ == "__main__":
    args, cfg = parse(__doc__)
    with stage("report", {}):
        keys = list(iterations.load())
        rows = collect(Path("metrics"), Path("data/sync"), cfg.cost, keys)
        facts = summary(rows)
        alarms = warnings(rows, cfg.watch)
        write_json(Path("report/history.json"), rows)
        write_json(Path("report/summary.json"), {**facts, "watch_warnings": len(alarms)})
        params = OmegaConf.to_container(OmegaConf.load(args.params))
        page = render(rows, facts, params, sessions(Path("metrics")),
                      watch_section(alarms, latest_suspects(Path("metrics"), keys)))
        write_text(Path("report/index.html"), page)
    print(f"report: {len(rows)} policy versions, held-out accuracy {facts.get('heldout_accuracy')}, "
          "charts in report/index.html")
    for line in alarms:
        print(f"WARNING {line}")
