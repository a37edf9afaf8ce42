"""report: the run's history and report from metrics/ and data/sync/.

Writes report/history.json (one row per policy version; `dvc plots show` draws it), report/summary.json
(a few numbers per run, for `dvc metrics diff` and `dvc exp show`) and report/index.html (the charts and
the rented sessions' time splits from metrics/session/, offline). `python -m burstrl report` prints the same
history as a table.
"""

from pathlib import Path

from omegaconf import OmegaConf

from burstrl.atomic import write_json, write_text
from burstrl.pipeline import iterations
from burstrl.pipeline.stage import parse, stage
from burstrl.reporting.charts import render
from burstrl.reporting.history import collect, sessions, summary

if __name__ == "__main__":
    args, cfg = parse(__doc__)
    with stage("report", {}):
        rows = collect(Path("metrics"), Path("data/sync"), cfg.cost, list(iterations.load()))
        facts = summary(rows)
        write_json(Path("report/history.json"), rows)
        write_json(Path("report/summary.json"), facts)
        params = OmegaConf.to_container(OmegaConf.load(args.params))
        write_text(Path("report/index.html"), render(rows, facts, params, sessions(Path("metrics"))))
    print(f"report: {len(rows)} policy versions, held-out accuracy {facts.get('heldout_accuracy')}, "
          "charts in report/index.html")
