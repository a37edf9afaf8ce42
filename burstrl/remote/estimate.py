"""What a session will train and cost, worked out before anything is rented (`make rent-plan`): the train stages
ready now, the estimate from past train stages, and the cost model of the loop (`strategies`, printed by
`python -m bench.session`) from stage times and link speeds."""

import dataclasses
import datetime
import json
import math
from pathlib import Path

from burstrl.config import Config, PlanningConfig


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


def transfer_minutes(gigabytes: float, mbps: float) -> float:
    return gigabytes * 8000 / mbps / 60


def strategies(p: PlanningConfig, train_usd: float, inference_usd: float) -> list[dict]:
    """One row per way of running: iterations in the window, minutes per iteration, GPU-hours and $ per iteration,
    the share of rented time spent in optimizer steps, and the rented minutes split as a session reports them
    (burstrl.remote.loop): set-up, training, syncing (checkpoints and rollouts over the links), waiting for
    home, teardown."""
    window = p.session_hours * 60
    parent_up = transfer_minutes(p.checkpoint_gb, p.uplink_mbps)
    # What the trainer does for each iteration in a session: rollouts out, train, the new checkpoint home.
    moving = transfer_minutes(p.rollouts_gb, p.uplink_mbps) + transfer_minutes(p.checkpoint_gb, p.downlink_mbps)
    trainer = moving + p.train_minutes
    home = p.generate_minutes + p.score_minutes + p.eval_minutes + p.sync_minutes
    burst_rented = p.setup_minutes + parent_up + trainer + p.teardown_minutes
    rows = []
    for name, per_iteration, rented_per_iteration, setup in [
        ("one burst per iteration", home + burst_rented, burst_rented, 0.0),
        # eval@N runs while train@N+1 does; sync, generate and score stand between two trains.
        ("session loop, lag 0", p.sync_minutes + p.generate_minutes + p.score_minutes + max(trainer, p.eval_minutes),
         None, p.setup_minutes + parent_up),
        ("session loop, lag 1", max(trainer, home), None, p.setup_minutes + parent_up),
    ]:
        iterations = math.floor((window - setup - p.teardown_minutes) / per_iteration) if rented_per_iteration is None \
            else math.floor(window / per_iteration)
        rented = window if rented_per_iteration is None else iterations * rented_per_iteration
        n = max(1, iterations)
        bursts = 1 if rented_per_iteration is None else iterations  # set-ups, first checkpoints up, teardowns
        split = {"setup": bursts * p.setup_minutes, "training": iterations * p.train_minutes,
                 "syncing": bursts * parent_up + iterations * moving, "teardown": bursts * p.teardown_minutes}
        split["waiting_for_home"] = rented - sum(split.values())
        usd = rented / 60 * train_usd + window / 60 * inference_usd
        rows.append({"strategy": name, "iterations": iterations, "minutes_per_iteration": round(per_iteration, 1),
                     "gpu_hours_per_iteration": round(rented / 60 / n, 3), "usd_per_iteration": round(usd / n, 2),
                     "training_share": round(iterations * p.train_minutes / rented, 3) if rented else 0.0,
                     "rented_minutes": {k: round(v, 1) for k, v in split.items()}})
    return rows


def measured(p: PlanningConfig, root: Path = Path(".")) -> PlanningConfig:
    """`p` with the stage minutes of this run's metrics (the mean `seconds` of each stage's files), where any."""
    values = dict(vars(p))
    for stage in ("generate", "score", "eval", "sync", "train"):
        files = sorted((root / "metrics" / stage).glob("[0-9]*.json")) if stage != "sync" else \
            sorted((root / "data/sync").glob("[0-9]*.json"))
        seconds = [json.loads(f.read_text()).get("seconds") for f in files]
        seconds = [s for s in seconds if s is not None]
        if seconds:
            values[f"{stage}_minutes"] = sum(seconds) / len(seconds) / 60
    return PlanningConfig(**values)


def loop_outlook(cfg: Config, hours: float, root: Path = Path(".")) -> str:
    """One line: what a session of `hours` at rent.lag buys, from past stage times (else the `planning` params)."""
    p = dataclasses.replace(measured(cfg.planning, root), session_hours=hours)
    row = strategies(p, cfg.cost.train_usd_per_hour, cfg.cost.inference_usd_per_hour)[2 if cfg.rent.lag else 1]
    return (f"the loop at lag {cfg.rent.lag}: about {row['iterations']} iteration(s) in {hours:g} h, "
            f"{row['minutes_per_iteration']:.0f} min, ${row['usd_per_iteration']:.2f} and "
            f"{row['gpu_hours_per_iteration']:.2f} GPU-hours per iteration, {row['training_share']:.0%} of the rented "
            "time training (past stage times where there are any, else the `planning` params); rented minutes: "
            + ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in row["rented_minutes"].items()))
