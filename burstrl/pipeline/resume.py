"""Progress that survives a killed stage, kept in build/resume/<stage>/<iteration>/ until the stage finishes.

DVC deletes a stage's outputs before running it, so saved progress cannot live in them. It lives in a work
directory keyed by everything the stage's result depends on: input file hashes, the params the stage reads,
the shard size and the code the stage runs (burstrl.pipeline.deps). Progress made from other inputs is discarded with a
message, never reused.
Every file in it is written under a temporary name and renamed, so a file that exists is complete.
generate and score save one Parquet shard per slice of their rows; train saves Trainer checkpoints
(burstrl.training.trainstate). `python -m burstrl status` reads how far each stage got from these files.
"""

import datetime
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from burstrl.atomic import write_json, write_parquet
from burstrl.errors import ConfigError
from burstrl.pipeline import deps, faults

ROOT = Path("build/resume")
COMPLETE = "burstrl-complete.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")


class WorkDir:
    """`outputs`, if given, are the stage's outputs, written before `finish`: when a receipt of a finished run
    from the same inputs is there and so are they, the run is done (`finished`) and nothing is kept. A train
    stage on a rented machine finds its result so after the side that started it died before bringing it
    home: it is brought home, not trained again. DVC deletes outputs before a stage runs, so here a receipt
    alone never stands for a result."""

    def __init__(self, stage: str, iteration: str, inputs: dict, outputs: tuple[Path, ...] = ()):
        self.label = f"{stage} {iteration}"
        self.path = ROOT / stage / iteration
        self.receipt = ROOT / stage / f"{iteration}.done.json"
        code = deps.code_hash(Path("stages") / f"{stage}.py")
        self.key = key = hashlib.sha256(json.dumps({**inputs, "code": code}, sort_keys=True).encode()).hexdigest()
        self.finished = bool(outputs) and _key(self.receipt) == key and all(p.exists() for p in outputs)
        if self.finished:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        self.receipt.unlink(missing_ok=True)
        manifest = self.path / "inputs.json"
        if self.path.exists() and _key(manifest) != key:
            print(f"{self.label}: discarding saved progress in {self.path}: it was made from other inputs or code")
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        if not manifest.is_file():
            write_json(manifest, {"key": key, "inputs": inputs})

    def finish(self) -> None:
        """The stage's outputs are in place: its saved progress is no longer needed; the receipt says so."""
        shutil.rmtree(self.path, ignore_errors=True)
        write_json(self.receipt, {"key": self.key})


def _key(path: Path) -> str | None:
    try:
        return json.loads(path.read_text())["key"] if path.is_file() else None
    except (json.JSONDecodeError, KeyError):
        return None


_SHARD = re.compile(r"shard-(\d{5})-of-(\d{5})\.parquet")


class Shards:
    """A stage's rows cut into fixed slices; each finished slice is one Parquet file in the work directory.
    `what` names the slices in messages ("shards", "reference shards")."""

    def __init__(self, work: WorkDir, total: int, size: int, what: str = "shards"):
        self.work = work
        self.what = what
        self.bounds = [(start, min(start + size, total)) for start in range(0, total, size)]
        self.resumed = 0
        self.started = None

    def path(self, k: int) -> Path:
        return self.work.path / f"shard-{k:05d}-of-{len(self.bounds):05d}.parquet"

    def fill(self, compute: Callable[[Any, int, int], pa.Table], start: Callable[[], Any], fault: str) -> pa.Table:
        """Every row's result: the shards an interrupted run saved, and `compute(worker, lo, hi)` for each other
        slice, saved as it finishes. `start()` gives the worker (an engine, a server pool) once, before the first
        slice that needs computing, and is kept in `self.started` (None if every shard was saved); the kill
        point `fault` (burstrl.pipeline.faults) fires after each slice is computed, before it is saved."""
        pending = self.pending()
        self.resumed = len(self.bounds) - len(pending)
        if self.resumed:
            print(f"{self.work.label}: resuming: {self.resumed}/{len(self.bounds)} {self.what} saved by an "
                  "interrupted run")
        self.started = start() if pending else None
        for k in pending:
            table = compute(self.started, *self.bounds[k])
            faults.point(fault)
            self.save(k, table)
        return self.load()

    def pending(self) -> list[int]:
        todo = []
        for k in range(len(self.bounds)):
            try:
                pq.read_metadata(self.path(k))
            except FileNotFoundError:
                todo.append(k)
            except (OSError, pa.ArrowInvalid) as err:
                print(f"{self.work.label}: redoing unreadable shard {self.path(k)}: {err}")
                self.path(k).unlink()
                todo.append(k)
        return todo

    def save(self, k: int, table: pa.Table) -> None:
        write_parquet(table, self.path(k))

    def load(self) -> pa.Table:
        return pa.concat_tables([pq.read_table(self.path(k)) for k in range(len(self.bounds))])


def shard_progress(work: Path) -> tuple[int, int] | None:
    """(saved, total) shards in a work directory of generate or score, or None if it holds none."""
    found = [m for p in work.glob("shard-*.parquet") if (m := _SHARD.fullmatch(p.name))]
    return (len(found), int(found[0][2])) if found else None


def checkpoints(work: Path) -> list[tuple[int, Path]]:
    """The train stage's complete checkpoints in `work` (those holding COMPLETE), oldest first."""
    found = [(int(m[1]), p) for p in work.glob("checkpoint-*") if (m := CHECKPOINT.fullmatch(p.name))]
    return sorted((step, p) for step, p in found if (p / COMPLETE).is_file())


def deadline(configured: str | None, started: float) -> float | None:
    """The deadline as a time.time() value, from BURSTRL_DEADLINE or resume.deadline: an ISO 8601 time (local
    time unless it names a zone), or a number of seconds after `started`."""
    source, value = ("BURSTRL_DEADLINE", os.environ["BURSTRL_DEADLINE"]) if os.environ.get("BURSTRL_DEADLINE") \
        else ("resume.deadline", configured)
    if value is None or str(value).strip() == "":
        return None
    try:
        return started + float(value)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(str(value)).astimezone().timestamp()
    except ValueError:
        raise ConfigError(f"{source} is {value!r}: expected seconds from the stage's start or an ISO 8601 time "
                          "such as 2026-12-02T18:00:00+00:00") from None
