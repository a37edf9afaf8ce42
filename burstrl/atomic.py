"""Files and directories that appear whole or not at all: written under a temporary name, then renamed.

A reader (the next stage, a resumed run, rsync to another host) never sees half a file, and a kill leaves
the old content or the new, never a mix. The temporary name is `.<name>.tmp` beside the target, so the
rename stays on one filesystem and a leftover from a killed run is easy to recognise (and is overwritten).
"""

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield the temporary path to write `path`'s new content to; renamed over `path` if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary(path)
    yield tmp
    tmp.replace(path)


def write_text(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text)


def write_json(path: Path, data: dict | list) -> None:
    # Dicts sorted so reruns diff cleanly; lists of rows keep their column order for people reading them.
    write_text(path, json.dumps(data, indent=2, sort_keys=isinstance(data, dict)) + "\n")


def write_parquet(table: pa.Table, path: Path) -> None:
    with replacing(path) as tmp:
        pq.write_table(table, tmp)


def staging_dir(out_dir: Path) -> Path:
    """A fresh, empty sibling of `out_dir` to build a directory in; `publish` then puts it in place."""
    tmp = temporary(out_dir)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def publish(staged: Path, out_dir: Path) -> None:
    """Put the directory built in `staged` at `out_dir`, replacing what was there."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staged.rename(out_dir)
