"""What every stage entry point shares: argument parsing, a log file, timing and atomic metric files."""

import argparse
import atexit
import datetime
import os
import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from burstrl.config import Config, load_config
from burstrl.errors import FAILED, BurstrlError, ConfigError
from burstrl.pipeline import orphans

# Where a rank that burstrl.training.launch started writes its exit status; set only in such ranks.
STATUS_FILE = "BURSTRL_LAUNCH_STATUS"


def launched() -> bool:
    """True in a process that `accelerate launch` (torchrun) started as one rank of several."""
    if os.environ.get(STATUS_FILE) and "WORLD_SIZE" not in os.environ:
        # Started by run_ranks, yet not as a rank: training here would be one process pretending to be N.
        raise ConfigError("the launcher started a single process instead of ranks (no WORLD_SIZE)")
    return "WORLD_SIZE" in os.environ


class _Tee:
    """Everything written to stdout and stderr, by this process and by the workers it starts (vLLM's engine),
    also goes to a log file. Each descriptor is piped through its own `tee` process rather than a thread:
    the stage never waits for it, output still reaches the terminal if the stage dies hard, and a closed
    terminal (`tee -p`) does not stop the log. stdout and stderr stay separate on the terminal."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as log:
            log.write(f"==== {datetime.datetime.now().isoformat(timespec='seconds')} {' '.join(sys.argv)}\n")
        # Workers see a pipe, not a terminal; unbuffered, their last lines are logged before they are stopped.
        os.environ["PYTHONUNBUFFERED"] = "1"
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = {}
        self.pids = []
        for fd in (1, 2):
            self.saved[fd] = os.dup(fd)
            tee = subprocess.Popen(["tee", "-p", "-a", str(path)], stdin=subprocess.PIPE, stdout=self.saved[fd],
                                   start_new_session=True)
            os.dup2(tee.stdin.fileno(), fd)
            tee.stdin.close()
            self.pids.append(tee.pid)

    def close(self) -> None:
        """Point stdout and stderr back at the terminal; each tee ends once the last writer has exited."""
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in self.saved.items():
            os.dup2(original, fd)
            os.close(original)


_tee: _Tee | None = None


def close_log() -> None:
    global _tee
    if _tee is not None:
        _tee.close()
        _tee = None


def watch(log: Path) -> None:
    """From here on this process's output, and its workers', also goes to `log`, and a reaper
    (burstrl.pipeline.orphans) stops what this process started if it dies."""
    global _tee
    os.environ[orphans.STAGE_TOKEN] = token = secrets.token_hex(8)  # before this process starts anything
    _tee = _Tee(log)
    atexit.register(close_log)
    subprocess.Popen([sys.executable, "-m", "burstrl.pipeline.orphans", str(os.getpid()), token,
                      *map(str, _tee.pids)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def parse(description: str, *names: str) -> tuple[argparse.Namespace, Config]:
    """Parse a stage's arguments and params, then `watch` it: its log is logs/<stage>/<iteration>.log
    (logs/<stage>.log for stages without an iteration). Bad params exit 1 with one line."""
    parser = argparse.ArgumentParser(description=description)
    for name in names:
        parser.add_argument(name)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args()
    name = Path(parser.prog).stem
    # A rank that `accelerate launch` started writes through the launcher, which is the stage's own process
    # (burstrl.training.launch): its log and reaper already cover the rank.
    if not launched():
        watch(Path("logs") / name / f"{args.iteration}.log" if "iteration" in names else Path("logs") / f"{name}.log")
    try:
        return args, load_config(args.params)
    except (ConfigError, OmegaConfBaseException) as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        sys.exit(FAILED)


class Exit(Exception):  # noqa: N818 (a way out, not an error)
    """Raised inside `stage()` to end the stage with status `code`, after printing `message` (if any) to
    stderr: errors.PARTIAL when it stopped on purpose with a checkpoint, or the status of the ranks or the
    host that did the stage's work."""

    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message


def leave(code: int) -> None:
    """Close the log and exit with `code`. A rank of several exits 0, since the launcher turns any other
    status into 1; rank 0 leaves the code in the status file for burstrl.training.launch.run_ranks."""
    close_log()
    if launched():
        if os.environ.get("RANK", "0") == "0":
            Path(os.environ[STATUS_FILE]).write_text(str(code))
        code = 0
    sys.exit(code)


@contextmanager
def stage(name: str, metrics: dict):
    """Time the stage into metrics['seconds']; every way out of it closes the log first. `Exit` ends it with
    its status; bad input, params or a failure outside (errors.BurstrlError) become one clear line and exit
    status 1. Any other exception is a bug and keeps its traceback."""
    start = time.monotonic()
    try:
        yield
    except Exit as done:
        if done.message:
            print(done.message, file=sys.stderr)
        leave(done.code)
    except BurstrlError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        close_log()
        sys.exit(FAILED)
    metrics["seconds"] = round(time.monotonic() - start, 2)


def finish() -> None:
    """End a stage that ran vLLM once its outputs are in place. Interpreter teardown is skipped: vLLM's
    native threads can abort it ("terminate called without an active exception"), which would turn a
    finished stage, whose files are already renamed into place, into a failed one."""
    close_log()
    os._exit(0)
