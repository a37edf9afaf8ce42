"""What every stage entry point shares: argument parsing, timing and atomic metric files."""

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from burstrl.config import Config, ConfigError, load_config
from burstrl.contract import ContractError
from burstrl.sync import SyncError


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def parse(description: str, *names: str) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(description=description)
    for name in names:
        parser.add_argument(name)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args()
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
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
