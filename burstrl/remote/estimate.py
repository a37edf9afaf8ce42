"""What a session will train and cost, worked out before anything is rented (`make rent-plan`)."""

import datetime
import json
from pathlib import Path

SETUP_MINUTES = 15  # provisioning, install and GPU check of a fresh pod, for the estimate


def plan(changed: set[str], iters: dict[str, dict]) -> tuple[list[str], list[str]]:
    """(train stages to run, in order; why each other pending train stage must wait). A stage is ready when
    its scored rollouts are done and its parent checkpoint is done or trained earlier in this session."""
    ready, waiting = [], []
    for key in sorted(iters, key=int):
        name, parent = f"train@{key}", iters[key]["parent"]
        if name not in changed:
            continue
        upstream = "bootstrap" if parent == "000" else f"train@{parent}"
        if f"score@{key}" in changed:
            waiting.append(f"{name}: score@{key} is not done (run `dvc repro score@{key}` on the inference box)")
        elif upstream in changed and upstream not in ready:
            waiting.append(f"{name}: checkpoint {parent} is not done")
        else:
            ready.append(name)
    return ready, waiting


def estimate(stages: int, past_seconds: list[float], setup_minutes: float, hours: float,
             usd_per_hour: float) -> tuple[float, float]:
    """(estimated hours, estimated cost): setup plus each stage at the mean of past train stages, capped by
    the session limit; with no past stage to go by, the limit itself."""
    if not past_seconds:
        return hours, hours * usd_per_hour
    expected = min(hours, setup_minutes / 60 + stages * sum(past_seconds) / len(past_seconds) / 3600)
    return expected, expected * usd_per_hour


def past_train_seconds(root: Path = Path(".")) -> list[float]:
    return [json.loads(p.read_text())["seconds"] for p in sorted((root / "metrics/train").glob("*.json"))]


def clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))
