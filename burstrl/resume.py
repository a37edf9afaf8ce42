"""Progress that survives a killed stage, kept in build/resume/<stage>/<iteration>/ until the stage finishes.

DVC deletes a stage's outputs before running it, so saved progress cannot live in them. It lives in a work
directory keyed by everything the stage's result depends on: input file hashes, the params the stage reads,
the shard size and the code dvc.yaml lists for it. Progress made from other inputs is discarded with a
message, never reused.
Every file in it is written under a temporary name and renamed, so a file that exists is complete.
generate and score save one Parquet shard per slice of their rows; train saves Trainer checkpoints
(burstrl.trainstate). `python -m burstrl.status` reads how far each stage got from these files.
"""

import datetime
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from burstrl.config import ConfigError
from burstrl.contract import write_parquet
from burstrl.policy import file_sha256

ROOT = Path("build/resume")
COMPLETE = "burstrl-complete.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def code_hash(stage: str, pipeline: Path = Path("dvc.yaml")) -> str:
    """The code `stage` depends on, as dvc.yaml lists it: progress saved by other code is not trusted, and
    editing code the stage does not run (the report, say) keeps it."""
    definition = yaml.safe_load(pipeline.read_text())["stages"][stage]
    deps = sorted(d for d in definition.get("do", definition)["deps"] if d.endswith(".py"))
    return hashlib.sha256(json.dumps({d: file_sha256(Path(d)) for d in deps}).encode()).hexdigest()


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


class WorkDir:
    def __init__(self, stage: str, iteration: str, inputs: dict):
        self.label = f"{stage} {iteration}"
        self.path = ROOT / stage / iteration
        key = hashlib.sha256(json.dumps({**inputs, "code": code_hash(stage)}, sort_keys=True).encode()).hexdigest()
        manifest = self.path / "inputs.json"
        try:
            saved = json.loads(manifest.read_text())["key"] if manifest.is_file() else None
        except (json.JSONDecodeError, KeyError):
            saved = None
        if self.path.exists() and saved != key:
            print(f"{self.label}: discarding saved progress in {self.path}: it was made from other inputs or code")
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        if not manifest.is_file():
            _write_json(manifest, {"key": key, "inputs": inputs})

    def finish(self) -> None:
        """The stage's outputs are in place: its saved progress is no longer needed."""
        shutil.rmtree(self.path, ignore_errors=True)


class Shards:
    """A stage's rows cut into fixed slices; each finished slice is one Parquet file in the work directory."""

    def __init__(self, work: WorkDir, total: int, size: int):
        self.work = work
        self.bounds = [(start, min(start + size, total)) for start in range(0, total, size)]

    def path(self, k: int) -> Path:
        return self.work.path / f"shard-{k:05d}-of-{len(self.bounds):05d}.parquet"

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
