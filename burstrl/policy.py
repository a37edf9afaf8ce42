"""Policy checkpoints: a Hugging Face model directory plus `burstrl.json` naming its lineage.

`checkpoints/NNN/` holds config.json, model.safetensors, the tokenizer files and burstrl.json:
{"policy_version": "NNN", "parent_version": "MMM" | null, "iteration": int, "content_hash": sha256,
 "lineage": [{"policy_version", "content_hash"}, ...]}, lineage listing this policy first, then its parent,
back to the bootstrap policy. The content hash covers every file but burstrl.json, so rollouts stamped with
it prove which weights sampled them, and a rollout's staleness is its policy's position in the lineage of
the checkpoint training starts from. Directories are written under a temporary name and renamed into place.
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
    for key in ("policy_version", "content_hash", "lineage"):
        if key not in meta:
            raise ContractError(f"{path}: field '{key}' is missing")
    return meta


def publish_policy(tmp_dir: Path, out_dir: Path, *, version: str, parent: dict | None, iteration: int) -> dict:
    """Stamp metadata into a finished `tmp_dir`, then rename it to `out_dir` (replacing any older copy).

    `parent` is the metadata of the checkpoint this one was trained from (None for the bootstrap policy)."""
    check_policy_dir(tmp_dir)
    digest = content_hash(tmp_dir)
    meta = {
        "policy_version": version,
        "parent_version": parent["policy_version"] if parent else None,
        "iteration": iteration,
        "content_hash": digest,
        "lineage": [{"policy_version": version, "content_hash": digest}] + (parent["lineage"] if parent else []),
    }
    (tmp_dir / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp_dir.rename(out_dir)
    return meta


def mark_derived(directory: Path, source: dict, variant: str) -> None:
    """Label `directory` as a copy of the policy `source` (its metadata) with changed weights: quantized for
    an inference box, or perturbed in tests. Rollouts it samples carry `source`'s version and hash."""
    check_policy_dir(directory)
    if (directory / METADATA).is_file() and "lineage" in json.loads((directory / METADATA).read_text()):
        raise ContractError(f"{directory / METADATA}: is a checkpoint's own metadata; derive into a copy")
    meta = {"derived_from": {k: source[k] for k in ("policy_version", "content_hash")}, "variant": variant}
    (directory / METADATA).write_text(json.dumps(meta, indent=2) + "\n")


def read_variant(directory: Path, source: dict) -> str:
    """The variant label of a copy made by `mark_derived`, checked to derive from `source`."""
    check_policy_dir(directory)
    path = directory / METADATA
    try:
        meta = json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError as err:
        raise ContractError(f"{path}: not valid JSON: {err}") from err
    origin = meta.get("derived_from", {})
    if (origin.get("policy_version"), origin.get("content_hash")) != (source["policy_version"], source["content_hash"]):
        raise ContractError(f"{path}: field 'derived_from': {origin or 'missing'}; sampling weights must derive "
                            f"from policy {source['policy_version']} ({source['content_hash']})")
    if not isinstance(meta.get("variant"), str):
        raise ContractError(f"{path}: field 'variant': missing; a derived copy names what changed")
    return meta["variant"]


def staging_dir(out_dir: Path) -> Path:
    """A fresh sibling of `out_dir` to build into; a leftover from a killed run is discarded."""
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp
