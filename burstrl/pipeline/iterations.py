"""The iteration list (iterations.yaml) that dvc.yaml unrolls, and the command that extends it.

Each iteration names the checkpoint training starts from (`parent`) and the one its rollouts are sampled
from (`sampler`). They are the same checkpoint unless the sampler lags: with lag k, iteration N samples
from checkpoint N-1-k, so `generate@N` can run on the inference boxes while `train@N-1` is still running,
and the train stage corrects for rollouts k versions stale (see docs/objective.md).

`python -m burstrl iterations add [--lag K]` appends one iteration after the newest;
`dvc repro` then runs exactly that iteration's stages.
"""

import argparse
import sys
from pathlib import Path

import yaml

from burstrl.atomic import write_text
from burstrl.errors import ConfigError

FILE = Path("iterations.yaml")
HEADER = (
    "# RL iterations: each key is an iteration; `parent` is the checkpoint it trains from, `sampler` the one\n"
    "# its rollouts come from. `make iterate` appends the next one; DVC unrolls one chain of stages per entry.\n"
)


def with_next(iterations: dict[str, dict], lag: int = 0) -> dict[str, dict]:
    """The mapping plus the next zero-padded iteration, trained from the newest (000 if empty), sampled from
    `lag` checkpoints before that (never before 000)."""
    newest = int(max(iterations, key=int, default="000"))
    entry = {"parent": f"{newest:03d}", "sampler": f"{max(0, newest - lag):03d}"}
    return {**iterations, f"{newest + 1:03d}": entry}


def load(path: Path = FILE) -> dict[str, dict]:
    raw = (yaml.safe_load(path.read_text()) or {}).get("iterations", {})
    for key, entry in raw.items():
        if not isinstance(entry, dict) or set(entry) != {"parent", "sampler"}:
            raise ConfigError(f'{path}: iteration {key}: expected {{parent: "NNN", sampler: "NNN"}}, got {entry!r}')
    return {str(k): {"parent": str(v["parent"]), "sampler": str(v["sampler"])} for k, v in raw.items()}


def save(iterations: dict[str, dict], path: Path = FILE) -> None:
    body = "".join(f'  "{k}": {{parent: "{v["parent"]}", sampler: "{v["sampler"]}"}}\n'
                   for k, v in sorted(iterations.items()))
    write_text(path, HEADER + "iterations:\n" + body)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["add"])
    parser.add_argument("--lag", type=int, default=0, help="checkpoints the sampler lags the trainer (default 0)")
    args = parser.parse_args()
    if args.lag < 0:
        parser.error("--lag must be >= 0: a sampler cannot be newer than the checkpoint training starts from")
    try:
        updated = with_next(load(), args.lag)
    except ConfigError as err:
        sys.exit(f"iterations: error: {err}")
    save(updated)
    newest = max(updated, key=int)
    print(f"added iteration {newest}: trains from checkpoint {updated[newest]['parent']}, "
          f"samples from {updated[newest]['sampler']}")
