"""The iteration list (iterations.yaml) that dvc.yaml unrolls, and the command that extends it.

`python -m burstrl.iterations add` appends one iteration that starts from the newest checkpoint;
`dvc repro` then runs exactly that iteration's stages.
"""

import argparse
from pathlib import Path

import yaml

FILE = Path("iterations.yaml")
HEADER = (
    "# RL iterations: each key is an iteration, its value the checkpoint it starts from.\n"
    "# `make iterate` appends the next one; DVC unrolls one generate/score/train/eval/sync chain per entry.\n"
)


def with_next(iterations: dict[str, str]) -> dict[str, str]:
    """The mapping plus one entry: the next zero-padded number, starting from the newest key (000 if empty)."""
    newest = max(iterations, key=int, default="000")
    return {**iterations, f"{int(newest) + 1:03d}": newest}


def load(path: Path = FILE) -> dict[str, str]:
    return {str(k): str(v) for k, v in (yaml.safe_load(path.read_text()) or {}).get("iterations", {}).items()}


def save(iterations: dict[str, str], path: Path = FILE) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    body = "".join(f'  "{k}": "{v}"\n' for k, v in sorted(iterations.items()))
    tmp.write_text(HEADER + "iterations:\n" + body)
    tmp.replace(path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["add"])
    parser.parse_args()
    updated = with_next(load())
    save(updated)
    newest = max(updated, key=int)
    print(f"added iteration {newest} (from checkpoint {updated[newest]})")
