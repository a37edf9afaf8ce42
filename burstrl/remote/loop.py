"""The RL loop of a rented session: iterations one after another, home and trainer at the same time.

burstrl.remote.rent sets the machine up once, then hands this loop the environment that sends the train stage
there. The loop runs the pending stages of iterations.yaml on two lanes (burstrl.pipeline.lanes) and appends
the next iteration (sampled `rent.lag` checkpoints behind, burstrl.pipeline.iterations) as soon as the newest
one's generate has started, so with lag 1 home samples and scores iteration N+1 while the trainer trains N,
and train@N+1 can start the moment train@N is recorded. It stops appending and training at `--iterations`
trains or `--budget` dollars; at the session's limit the train stage itself stops with a checkpoint (exit 75).
Once the trainer is done, home finishes the eval and sync of what was trained and starts nothing new.

What the session spent is written to metrics/session/<id>.json: rented seconds (set-up, training, syncing the
train stages' inputs and outputs, waiting for home, teardown), home seconds (per stage kind, waiting for the
trainer), and per iteration its home and rented busy seconds, from the stages' own start and end times.
"""

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from burstrl.atomic import write_json
from burstrl.pipeline import iterations, lanes
from burstrl.pipeline.lanes import HOME, TRAINER, Lanes, Run

HOME_KINDS = ("generate", "score", "eval", "sync")


class Interrupted(BaseException):
    """SIGTERM or SIGHUP, raised like Ctrl-C's KeyboardInterrupt so the same clean-up runs."""


def raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def home_env() -> dict:
    """The environment of home's stages: this one, with this interpreter's scripts (dvc, python) on PATH."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("BURSTRL_TRAIN_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


class Loop:
    def __init__(self, pending: set[str], env: dict[str, dict], lag: int, max_trains: int | None,
                 budget: float | None, cost_so_far: Callable[[], float], train_cost: float,
                 on_done: Callable[[str], None] = lambda name: None, root: Path = Path(".")):
        self.root, self.lag, self.max_trains, self.budget = root, lag, max_trains, budget
        self.cost_so_far, self.train_cost, self.on_done = cost_so_far, train_cost, on_done
        self.iters = iterations.load(root / iterations.FILE)
        stages = lanes.load(self.iters, root)
        pending = {name for name in pending if lanes.lane(name)}
        self.planned = sum(name.startswith("train@") for name in pending)
        self.lanes = Lanes(stages, pending, env, allow=self.allow, grow=self.grow, done=self.on_done, root=root)

    @property
    def trainer_open(self) -> bool:
        return not (self.lanes.finished[TRAINER].is_set() or self.lanes.partial or self.lanes.stopped)

    def more_training(self) -> bool:
        started = sum(name.startswith("train@") for name in self.lanes.running) + \
            sum(r.lane == TRAINER for r in self.lanes.runs)
        if self.max_trains is not None and started >= self.max_trains:
            return False
        return self.budget is None or self.cost_so_far() + self.train_cost <= self.budget

    def allow(self, name: str) -> bool:
        kind = name.split("@")[0]
        if kind == "train":
            return self.trainer_open and self.more_training()
        # Without a trainer, home finishes what was trained (eval, sync) and samples nothing new.
        return self.trainer_open or kind in ("eval", "sync")

    def newest_waiting(self) -> bool:
        """Whether the newest iteration's generate has yet to start: no new iteration is appended before."""
        newest = max(self.iters, key=int, default=None)
        name = f"generate@{newest}"
        return newest is not None and name in self.lanes.pending and name not in self.lanes.running

    def grow(self) -> dict[str, lanes.Stage]:
        if self.newest_waiting() or not self.trainer_open or not self.more_training() or \
                (self.max_trains is not None and self.planned >= self.max_trains):
            return {}
        return self.append(self.lag)

    def append(self, lag: int) -> dict[str, lanes.Stage]:
        """Append the next iteration to iterations.yaml, sampled `lag` checkpoints behind; returns its stages."""
        self.iters = iterations.with_next(self.iters, lag)
        iterations.save(self.iters, self.root / iterations.FILE)
        key = max(self.iters, key=int)
        self.planned += 1
        entry = self.iters[key]
        lanes.say(f"loop: appended iteration {key} to {iterations.FILE}: trains from {entry['parent']}, "
                  f"samples from {entry['sampler']}")
        return {name: stage for name, stage in lanes.load(self.iters, self.root).items() if name.endswith(f"@{key}")}


def busy(runs: list[Run], lane: str, key: str | None = None) -> float:
    """Seconds lane `lane` ran stages (of iteration `key` only, if given)."""
    return sum(r.end - r.start for r in runs if r.lane == lane and (key is None or r.stage.endswith(f"@{key}")))


def transfer_seconds(keys: list[str], root: Path = Path(".")) -> float:
    """Seconds the train stages of `keys` spent moving inputs out and outputs home (burstrl.remote.train_host)."""
    files = [root / "metrics/train" / f"{key}.json" for key in keys]
    return sum(json.loads(f.read_text()).get("transfer_seconds", 0.0) for f in files if f.is_file())


def report(session_id: str, runs: list[Run], marks: dict[str, float], usd: float, syncing: float = 0.0) -> dict:
    """The session's time, split by side and by what it was doing, from the runs and the session's marks:
    started, lanes (trainer ready), trainer_done, given_back and home_done, as time.time() values. `syncing`:
    the seconds of the train stages' runs that were transfers (transfer_seconds), not optimizer steps."""
    trained = sorted(r.stage.split("@")[1] for r in runs if r.lane == TRAINER and r.code == 0)
    training = busy(runs, TRAINER)
    syncing = min(syncing, training)
    trainer_window = max(0.0, marks["trainer_done"] - marks["lanes"])
    home_window = max(0.0, marks["home_done"] - marks["started"])
    home = {kind: round(sum(r.end - r.start for r in runs if r.stage.startswith(kind + "@")), 1)
            for kind in HOME_KINDS}
    keys = sorted({r.stage.split("@")[1] for r in runs}, key=int)
    per_iteration = {key: {"home_busy_seconds": round(busy(runs, HOME, key), 1),
                           "rented_busy_seconds": round(busy(runs, TRAINER, key), 1)} for key in keys}
    rented_seconds = marks["given_back"] - marks["started"]
    n = max(1, len(trained))
    return {
        "id": session_id,
        "iterations_trained": trained,
        "wall_seconds": round(max(marks["home_done"], marks["given_back"]) - marks["started"], 1),
        "rented": {"setup_seconds": round(marks["lanes"] - marks["started"], 1),
                   "training_seconds": round(training - syncing, 1), "syncing_seconds": round(syncing, 1),
                   "waiting_for_home_seconds": round(max(0.0, trainer_window - training), 1),
                   "teardown_seconds": round(marks["given_back"] - marks["trainer_done"], 1),
                   "total_seconds": round(rented_seconds, 1)},
        "home": {**{f"{kind}_seconds": seconds for kind, seconds in home.items()},
                 "waiting_for_trainer_seconds": round(max(0.0, home_window - busy(runs, HOME)), 1)},
        "usd": round(usd, 2),
        "usd_per_iteration": round(usd / n, 2),
        "gpu_hours_per_iteration": round(rented_seconds / 3600 / n, 4),
        "per_iteration": per_iteration,
        "stages": [{"stage": r.stage, "lane": r.lane, "start": round(r.start, 2), "end": round(r.end, 2),
                    "exit": r.code} for r in runs],
    }


def write_report(summary: dict, root: Path = Path(".")) -> Path:
    path = root / "metrics/session" / f"{summary['id']}.json"
    write_json(path, summary)
    return path


def lines(summary: dict) -> list[str]:
    r, h = summary["rented"], summary["home"]
    return [
        f"session: {len(summary['iterations_trained'])} iteration(s) trained "
        f"({', '.join(summary['iterations_trained']) or 'none'}) in {summary['wall_seconds']:.0f}s",
        f"session: rented {r['total_seconds']:.0f}s: set-up {r['setup_seconds']:.0f}s, training "
        f"{r['training_seconds']:.0f}s, syncing {r['syncing_seconds']:.0f}s, waiting for home "
        f"{r['waiting_for_home_seconds']:.0f}s, teardown {r['teardown_seconds']:.0f}s",
        "session: home " + ", ".join(f"{k.removesuffix('_seconds').replace('_', ' ')} {v:.0f}s" for k, v in h.items()),
        f"session: ${summary['usd']:.2f}, ${summary['usd_per_iteration']:.2f} and "
        f"{summary['gpu_hours_per_iteration']:.3f} GPU-hours per iteration",
    ]
