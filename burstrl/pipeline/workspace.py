"""A scratch copy of this repository, for the tests and the benchmarks: the tracked files only (what a
clean clone has), params merged over params.yaml, one iteration in iterations.yaml, and a fresh git repository so
DVC runs in it as in a user's clone. Stages in it import this checkout's package.

A scratch workspace that has run some stages can be cloned: the clone holds its git repository, DVC cache, lock
file and outputs, so DVC finds those stages up to date there unless the clone's params change what they read."""

import os
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ONE_ITERATION = 'iterations:\n  "001": {parent: "000", sampler: "000"}\n'
# The one small param set of the tests' shared workspaces and of bench.loop: a quick bootstrap, and an iteration
# of 8 prompts x 4 completions in 4 optimizer steps. Tests that need other sizes change only the sections they
# need, in a clone.
SMALL = {
    "task": {"heldout_size": 20},
    "bootstrap": {"sft_steps": 60},
    "generate": {"prompts_per_iteration": 8, "num_generations": 4},
    "train": {"batch_size": 8},
}


def merge_params(path: Path, params: dict) -> None:
    """Merge `params` over the params file at `path`: a section given as a mapping updates that section's keys,
    anything else replaces the section."""
    merged = yaml.safe_load(path.read_text())
    for section, values in params.items():
        merged[section] = {**merged[section], **values} if isinstance(values, dict) else values
    path.write_text(yaml.safe_dump(merged))


def environment(env: dict | None = None) -> dict:
    """The environment a scratch workspace's stages run with: this checkout's virtual environment first on PATH,
    nothing phoning home unless `env` says otherwise."""
    return {**os.environ, "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}", **(env or {})}


def scratch(root: Path, params: dict, env: dict | None = None) -> dict:
    """Fill `root` (an empty directory); returns the environment its stages run with (`environment`)."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    merge_params(root / "params.yaml", params)
    (root / "iterations.yaml").write_text(ONE_ITERATION)
    env = environment(env)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=burstrl", "-c", "user.email=burstrl@localhost", "commit", "-qm", "scratch"]):
        subprocess.run(cmd, cwd=root, env=env, capture_output=True, check=True)
    return env


def clone(source: Path, dest: Path, params: dict | None = None) -> None:
    """Copy the scratch workspace `source` to `dest` (which must not exist) and merge `params` over its params.yaml.
    A plain copy: the workspaces are a few MB, and DVC's state is keyed by path, so each copy keeps its own."""
    shutil.copytree(source, dest, symlinks=True)
    if params:
        merge_params(dest / "params.yaml", params)
