"""What every stage entry point shares: argument parsing, a log file, timing and atomic metric files."""

import argparse
import atexit
import datetime
import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from burstrl.config import Config, ConfigError, load_config
from burstrl.contract import ContractError
from burstrl.sync import SyncError


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path: Path, data: dict | list) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=isinstance(data, dict)) + "\n")


class _Tee:
    """Everything written to stdout and stderr, by this process and by the workers it starts (vLLM's engine),
    also goes to a log file. It works on the file descriptors, not on sys.stdout, so native code and child
    processes are caught too; stdout and stderr stay separate on the terminal."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.log = path.open("ab", buffering=0)
        self.log.write(f"==== {datetime.datetime.now().isoformat(timespec='seconds')} {' '.join(sys.argv)}\n".encode())
        self.lock = threading.Lock()
        self.saved, self.threads = {}, []
        for fd in (1, 2):
            read, write = os.pipe()
            self.saved[fd] = os.dup(fd)
            os.dup2(write, fd)
            os.close(write)
            thread = threading.Thread(target=self._pump, args=(read, self.saved[fd]), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _pump(self, read: int, terminal: int) -> None:
        while chunk := os.read(read, 1 << 16):
            os.write(terminal, chunk)
            with self.lock:
                self.log.write(chunk)
        os.close(read)

    def close(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in self.saved.items():
            os.dup2(original, fd)  # the pipe's last write end closes, so its pump sees EOF
        for thread in self.threads:
            thread.join(timeout=5)
        self.log.close()


_tee: _Tee | None = None


def _close_log() -> None:
    global _tee
    if _tee is not None:
        _tee.close()
        _tee = None


def parse(description: str, *names: str) -> tuple[argparse.Namespace, Config]:
    """Parse a stage's arguments and params; from here on its output is also logged to
    logs/<stage>/<iteration>.log (logs/<stage>.log for stages without an iteration)."""
    global _tee
    parser = argparse.ArgumentParser(description=description)
    for name in names:
        parser.add_argument(name)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args()
    name = Path(parser.prog).stem
    log = Path("logs") / name / f"{args.iteration}.log" if "iteration" in names else Path("logs") / f"{name}.log"
    _tee = _Tee(log)
    atexit.register(_close_log)
    try:
        return args, load_config(args.params)
    except (ConfigError, OmegaConfBaseException) as err:
        print(f"{Path(parser.prog).stem}: error: {err}", file=sys.stderr)
        sys.exit(1)


@contextmanager
def stage(name: str, metrics: dict):
    """Time the stage into metrics['seconds']; bad input or params become one clear line and exit status 1.
    Any other exception is a bug and keeps its traceback."""
    start = time.monotonic()
    try:
        yield
    except (ContractError, ConfigError, SyncError) as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        sys.exit(1)
    metrics["seconds"] = round(time.monotonic() - start, 2)


def finish() -> None:
    """End a stage that ran vLLM once its outputs are in place. Interpreter teardown is skipped: vLLM's
    native threads can abort it ("terminate called without an active exception"), which would turn a
    finished stage, whose files are already renamed into place, into a failed one."""
    _close_log()
    os._exit(0)
