"""A scratch copy of this repository, for the tests and the benchmarks: the tracked files only (what a
clean clone has), params merged over params.yaml, one iteration in iterations.yaml, and a fresh git repository so
DVC runs in it as in a user's clone. Stages in it import this checkout's package."""

import os
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
ONE_ITERATION = 'iterations:\n  "001": {parent: "000", sampler: "000"}\n'


def scratch(root: Path, params: dict, env: dict | None = None) -> dict:
    """Fill `root` (an empty directory); returns the environment its stages run with: this checkout's
    virtual environment first on PATH, nothing phoning home unless `env` says otherwise."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    merged = yaml.safe_load((root / "params.yaml").read_text())
    for section, values in params.items():
        merged[section] = {**merged[section], **values} if isinstance(values, dict) else values
    (root / "params.yaml").write_text(yaml.safe_dump(merged))
    (root / "iterations.yaml").write_text(ONE_ITERATION)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}", **(env or {})}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=burstrl", "-c", "user.email=burstrl@localhost", "commit", "-qm", "scratch"]):
        subprocess.run(cmd, cwd=root, env=env, capture_output=True, check=True)
    return env
