"""Policy checkpoints: a Hugging Face model directory plus `burstrl.json` naming its lineage.

`checkpoints/NNN/` holds config.json, model.safetensors, the tokenizer files and burstrl.json:
{"policy_version": "NNN", "parent_version": "MMM" | null, "iteration": int, "content_hash": sha256,
 "tokenizer_hash": sha256, "files": {relative path: sha256}, "lineage": [{"policy_version", "content_hash"}, ...]},
lineage listing this policy first, then its parent, back to the bootstrap policy. The content hash covers
every file but burstrl.json, so rollouts stamped with it prove which weights sampled them, and a rollout's
staleness is its policy's position in the lineage of the checkpoint training starts from. The tokenizer
hash covers the files that map text to ids: token ids from two policies are comparable only when it matches.
Directories are written under a temporary name and renamed into place, and every read checks the files
against the recorded sums, so a half-copied or edited checkpoint is named, never loaded.
"""

import hashlib
import json
from pathlib import Path

from burstrl import atomic
from burstrl.errors import ContractError

METADATA = "burstrl.json"
REQUIRED_FILES = ("config.json", "tokenizer_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
VOCABULARY_FILES = TOKENIZER_FILES + ("merges.txt",)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_hashes(directory: Path, skip: tuple[str, ...] = (METADATA,)) -> dict[str, str]:
    """sha256 of every file under `directory` but those named in `skip`, keyed by relative path."""
    return {str(path.relative_to(directory)): file_sha256(path)
            for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name not in skip)}


def _listing_hash(hashes: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def content_hash(directory: Path) -> str:
    return _listing_hash(file_hashes(directory))


def tokenizer_hash(directory: Path) -> str:
    """Hash of the vocabulary files: equal for two policies exactly when their token ids mean the same text."""
    return _listing_hash({name: file_sha256(directory / name) for name in VOCABULARY_FILES
                          if (directory / name).is_file()})


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
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ContractError(f"{path}: not valid JSON: {err}") from err
    for key in ("policy_version", "content_hash", "tokenizer_hash", "files", "lineage"):
        if key not in meta:
            raise ContractError(f"{path}: field '{key}' is missing")
    found = file_hashes(directory)
    if found != meta["files"]:
        missing = sorted(meta["files"].keys() - found.keys())
        differ = sorted(k for k in found.keys() & meta["files"].keys() if found[k] != meta["files"][k])
        extra = sorted(found.keys() - meta["files"].keys())
        problems = [f"{label}: {', '.join(names)}" for label, names in
                    (("missing", missing), ("differ from the recorded sha256", differ), ("unrecorded", extra)) if names]
        raise ContractError(f"{directory}: files do not match {METADATA} (a half-copied or edited checkpoint): "
                            + "; ".join(problems))
    return meta


def publish_policy(tmp_dir: Path, out_dir: Path, *, version: str, parent: dict | None, iteration: int) -> dict:
    """Stamp metadata into a finished `tmp_dir`, then rename it to `out_dir` (replacing any older copy).

    `parent` is the metadata of the checkpoint this one was trained from (None for the bootstrap policy)."""
    check_policy_dir(tmp_dir)
    files = file_hashes(tmp_dir)
    digest = _listing_hash(files)
    meta = {
        "policy_version": version,
        "parent_version": parent["policy_version"] if parent else None,
        "iteration": iteration,
        "content_hash": digest,
        "tokenizer_hash": tokenizer_hash(tmp_dir),
        "files": files,
        "lineage": [{"policy_version": version, "content_hash": digest}] + (parent["lineage"] if parent else []),
    }
    (tmp_dir / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    atomic.publish(tmp_dir, out_dir)
    return meta


def mark_derived(directory: Path, source: dict, variant: str) -> None:
    """Label `directory` as a copy of the policy `source` (its metadata) with changed weights: quantized for
    an inference box, or perturbed in tests. Rollouts it samples carry `source`'s version and hash."""
    check_policy_dir(directory)
    if (directory / METADATA).is_file() and "lineage" in json.loads((directory / METADATA).read_text()):
        raise ContractError(f"{directory / METADATA}: is a checkpoint's own metadata; derive into a copy")
    meta = {"derived_from": {k: source[k] for k in ("policy_version", "content_hash")}, "variant": variant}
    atomic.write_text(directory / METADATA, json.dumps(meta, indent=2) + "\n")


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



def served_name(directory: Path) -> str:
    """The model name a vLLM server gives `directory` (burstrl.inference.serve) and a stage asks for:
    `<version>-<hash12>` for a checkpoint, `<version>-<hash12>@<variant>` for a copy made by `mark_derived`
    (quantized weights)."""
    path = directory / METADATA
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ContractError(f"{path}: cannot read the policy's metadata: {err}") from err
    origin = meta.get("derived_from", meta)
    if not {"policy_version", "content_hash"} <= origin.keys():
        raise ContractError(f"{path}: field 'policy_version' or 'content_hash' is missing")
    name = policy_name(origin)
    return f"{name}@{meta['variant']}" if "derived_from" in meta else name


def policy_name(meta: dict) -> str:
    """`<version>-<hash12>`: how sync names a checkpoint's directory and a server names the policy it serves."""
    return f"{meta['policy_version']}-{meta['content_hash'][:12]}"
