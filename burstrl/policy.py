"""Policy checkpoints: a Hugging Face model directory plus `burstrl.json` naming its lineage.

`checkpoints/NNN/` holds config.json, model.safetensors, the tokenizer files and burstrl.json:
{"policy_version": "NNN", "parent_version": "MMM" | null, "iteration": int, "content_hash": sha256}.
The content hash covers every file but burstrl.json, so rollouts stamped with it prove which weights
sampled them. Directories are written under a temporary name and renamed into place.
"""

import hashlib
import json
import shutil
from pathlib import Path

from burstrl.contract import ContractError

METADATA = "burstrl.json"
REQUIRED_FILES = ("config.json", "tokenizer_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def file_hashes(directory: Path, skip: tuple[str, ...] = (METADATA,)) -> dict[str, str]:
    """sha256 of every file under `directory` but those named in `skip`, keyed by relative path."""
    hashes = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name not in skip):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        hashes[str(path.relative_to(directory))] = digest.hexdigest()
    return hashes


def content_hash(directory: Path) -> str:
    listing = json.dumps(file_hashes(directory), sort_keys=True).encode()
    return hashlib.sha256(listing).hexdigest()


def check_policy_dir(directory: Path) -> None:
    """A loadable policy: config, weights and a tokenizer, or a ContractError naming what is missing."""
    if not directory.is_dir():
        raise ContractError(f"{directory}: policy directory does not exist")
    for name in REQUIRED_FILES:
        if not (directory / name).is_file():
            raise ContractError(f"{directory}: policy directory has no {name}")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ContractError(f"{directory}: policy directory has no tokenizer (one of {', '.join(TOKENIZER_FILES)})")
    if not any(directory.glob("*.safetensors")):
        raise ContractError(f"{directory}: policy directory has no *.safetensors weights")


def read_metadata(directory: Path) -> dict:
    check_policy_dir(directory)
    path = directory / METADATA
    if not path.is_file():
        raise ContractError(f"{path}: missing; every checkpoint records its policy_version and content_hash")
    meta = json.loads(path.read_text())
    for key in ("policy_version", "content_hash"):
        if key not in meta:
            raise ContractError(f"{path}: field '{key}' is missing")
    return meta


def publish_policy(tmp_dir: Path, out_dir: Path, *, version: str, parent: str | None, iteration: int) -> dict:
    """Stamp metadata into a finished `tmp_dir`, then rename it to `out_dir` (replacing any older copy)."""
    check_policy_dir(tmp_dir)
    meta = {
        "policy_version": version,
        "parent_version": parent,
        "iteration": iteration,
        "content_hash": content_hash(tmp_dir),
    }
    (tmp_dir / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp_dir.rename(out_dir)
    return meta


def staging_dir(out_dir: Path) -> Path:
    """A fresh sibling of `out_dir` to build into; a leftover from a killed run is discarded."""
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp
