"""`python -m burstrl fleet [--once] [--poll SECONDS]` (`make fleet`): home keeps the next iterations' rollouts
ready while no GPU is rented.

Between sessions the inference boxes would sit idle. The fleet runs a session's home lane alone
(burstrl.remote.loop): it appends iterations sampled from the newest trained checkpoint, as many as
train.max_staleness allows (iteration N trains from N-1 on rollouts of checkpoint C, N-1-C versions stale),
generates and scores them, evaluates and syncs what sessions trained, and records each stage with
`dvc commit`. A session started afterwards finds those stages done and trains at once.

With --once it stops when nothing more can be prepared; otherwise it looks again every --poll seconds, for a
session may have trained new checkpoints since. SIGTERM, SIGHUP or Ctrl-C stop it cleanly (exit 130): its
running stages get SIGTERM and keep their finished shards (docs/resume.md). Two loops must not append to one
iterations.yaml, so it keeps its pid in build/fleet.pid and `make rent-h200` stops it before renting.
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import psutil

from burstrl.atomic import write_text
from burstrl.config import load_config
from burstrl.errors import INTERRUPTED, ConfigError
from burstrl.pipeline import status
from burstrl.pipeline.catalog import BOOTSTRAP_STAGES
from burstrl.pipeline.lanes import HOME, TRAINER, Stage
from burstrl.remote.loop import Interrupted, Loop, home_env, raise_interrupted

PID_FILE = Path("build/fleet.pid")


class Prefetch(Loop):
    """The loop without a trainer: home stages only, new iterations bounded by staleness instead of a count."""

    def __init__(self, pending: set[str], env: dict, max_staleness: int, root: Path = Path(".")):
        super().__init__(pending, {HOME: env, TRAINER: env}, lag=0, max_trains=0, budget=None,
                         cost_so_far=lambda: 0.0, train_cost=0.0, root=root)
        self.max_staleness = max_staleness

    def allow(self, name: str) -> bool:
        return not name.startswith("train@")

    def grow(self) -> dict[str, Stage]:
        if self.newest_waiting():
            return {}
        newest = int(max(self.iters, key=int, default="000"))
        trained = max([0] + [int(k) for k in self.iters if f"train@{k}" not in self.lanes.pending])
        # The next iteration trains from `newest`; sampled from the newest trained checkpoint, it is this stale.
        lag = newest - trained
        return self.append(lag) if lag <= self.max_staleness else {}


def stop_running(root: Path = Path("."), timeout: float = 120.0) -> int | None:
    """Stop the fleet that build/fleet.pid names, if it still runs (SIGTERM, then SIGKILL after `timeout`), and wait
    for it to end; returns its pid."""
    try:
        proc = psutil.Process(int((root / PID_FILE).read_text()))
        if "fleet" not in " ".join(proc.cmdline()):
            return None  # the pid was reused
        proc.terminate()
        if not _ended(proc, timeout):
            proc.kill()  # its stages end with it (burstrl.pipeline.lanes), keeping their finished shards
            _ended(proc, timeout)
        return proc.pid
    except (FileNotFoundError, ValueError, psutil.NoSuchProcess):
        return None


def _ended(proc: psutil.Process, timeout: float) -> bool:
    # Not our child: it ends as a zombie until whoever started it reaps it, which psutil's wait() would wait for.
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def pass_once(max_staleness: int) -> tuple[int, list[str]]:
    """Prepare what can be prepared now; (exit status, the stages recorded)."""
    changed = status.changed_stages()
    missing = sorted(name for name in BOOTSTRAP_STAGES.values() if name in changed)
    if missing:
        raise ConfigError(f"{', '.join(missing)} not done: run `dvc repro sync-bootstrap` first")
    loop = Prefetch(changed, home_env(), max_staleness)
    loop.lanes.start()
    try:
        loop.lanes.wait()
    except (KeyboardInterrupt, Interrupted):
        loop.lanes.stop()
        raise
    if loop.lanes.error:
        print(f"fleet: error: {loop.lanes.error}", file=sys.stderr)
        return 1, []
    return 0, [r.stage for r in loop.lanes.runs if r.code == 0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--once", action="store_true", help="stop when nothing more can be prepared")
    parser.add_argument("--poll", type=float, default=60.0, help="seconds between looks for new checkpoints")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupted)
    signal.signal(signal.SIGHUP, raise_interrupted)
    write_text(PID_FILE, f"{os.getpid()}\n")
    try:
        max_staleness = load_config(args.params).train.max_staleness
        while True:
            code, recorded = pass_once(max_staleness)
            print(f"fleet: recorded {', '.join(recorded) or 'nothing'}; up to {max_staleness} version(s) "
                  "ahead of the newest checkpoint (train.max_staleness)", flush=True)
            if code or args.once:
                return code
            time.sleep(args.poll)
    except ConfigError as err:
        print(f"fleet: error: {err}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted):
        print("fleet: stopped; finished shards are kept for the next run", file=sys.stderr)
        return INTERRUPTED
    finally:
        PID_FILE.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
