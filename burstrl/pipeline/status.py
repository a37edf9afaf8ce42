"""Where the run stands: `python -m burstrl status [--json]` (or `make status`).

For each iteration, each stage is
  - done: DVC finds its lock entry matching its code, params, inputs and outputs (`dvc status`);
  - partial: an interrupted run left progress in build/resume (shards of generate or score, or a training
    checkpoint), which the next `dvc repro` continues; shown with how far it got;
  - pending: anything else (never run, or its inputs or params changed since).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from burstrl.pipeline import iterations, resume
from burstrl.pipeline.catalog import BOOTSTRAP_STAGES, ITERATION_STAGES


def progress(stage: str, iteration: str, root: Path = Path(".")) -> str | None:
    """How far an interrupted run of `stage` got, from its work directory; None if it left nothing."""
    work = root / resume.ROOT / stage / iteration
    if not work.is_dir():
        return None
    if stage == "train":
        saved = resume.checkpoints(work)
        if not saved:
            return "started, no checkpoint yet"
        step, path = saved[-1]
        steps = json.loads((path / "trainer_state.json").read_text())["max_steps"]
        return f"step {step}/{steps}"
    shards = resume.shard_progress(work)
    return f"{shards[0]}/{shards[1]} shards" if shards else "started, no shard yet"


def changed_stages(root: Path = Path(".")) -> set[str]:
    """Stage names (e.g. "train@001") that `dvc status` says must run."""
    done = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"status: `dvc status` failed: {done.stderr.strip()}")
    return {name.split(":")[-1] for name in json.loads(done.stdout or "{}")}


def table(root: Path = Path(".")) -> list[dict]:
    changed = changed_stages(root)
    rows = []
    for iteration in ["000", *iterations.load(root / iterations.FILE)]:
        stages = BOOTSTRAP_STAGES if iteration == "000" else ITERATION_STAGES
        row = {"iteration": iteration}
        for stage in stages:
            name = BOOTSTRAP_STAGES[stage] if iteration == "000" else f"{stage}@{iteration}"
            partial = progress(stage, iteration, root)
            row[stage] = ("done" if name not in changed else f"partial ({partial})" if partial else "pending")
        rows.append(row)
    return rows


def render(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        cells = [f"{stage} {state}" for stage, state in row.items() if stage != "iteration"]
        lines.append(f"{row['iteration']}  " + ", ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args()
    rows = table()
    print(json.dumps(rows, indent=2) if args.json else render(rows))
