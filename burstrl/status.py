"""Where the run stands: `python -m burstrl.status [--json]` (or `make status`).

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

from burstrl import iterations, resume

STAGES = ("generate", "score", "train", "eval", "sync")
BOOTSTRAP_NAMES = {"prepare": "prepare", "bootstrap": "bootstrap", "sync": "sync-bootstrap"}  # row 000's stages


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
    shards = sorted(work.glob("shard-*-of-*.parquet"))
    total = int(shards[0].stem.rsplit("-", 1)[1]) if shards else None
    return f"{len(shards)}/{total} shards" if shards else "started, no shard yet"


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
        stages = ("prepare", "bootstrap", "sync") if iteration == "000" else STAGES
        row = {"iteration": iteration}
        for stage in stages:
            name = BOOTSTRAP_NAMES[stage] if iteration == "000" else f"{stage}@{iteration}"
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
