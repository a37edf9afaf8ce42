"""Checkpoint directories and sync: real rsync, to a local directory and over SSH to 127.0.0.1."""

import hashlib
import json
import os

import pytest

from burstrl.atomic import staging_dir
from burstrl.data.policy import (
    check_policy_dir,
    content_hash,
    mark_derived,
    publish_policy,
    read_metadata,
    read_variant,
)
from burstrl.errors import ContractError, SyncError
from burstrl.remote.sync import Target, sync_checkpoint


def fake_policy(root, name="000", weights=b"w" * 1000, parent=None):
    tmp = staging_dir(root / name)
    (tmp / "config.json").write_text("{}")
    (tmp / "tokenizer_config.json").write_text("{}")
    (tmp / "tokenizer.json").write_text("{}")
    (tmp / "model.safetensors").write_bytes(weights)
    publish_policy(tmp, root / name, version=name, parent=parent, iteration=int(name))
    return root / name


def test_policy_without_tokenizer_is_rejected(tmp_path):
    policy = fake_policy(tmp_path)
    (policy / "tokenizer.json").unlink()
    with pytest.raises(ContractError, match=r"000: policy directory has no tokenizer"):
        check_policy_dir(policy)
    assert (policy / "model.safetensors").exists()


def test_publish_stamps_lineage_and_hash_of_everything_but_metadata(tmp_path):
    policy = fake_policy(tmp_path)
    meta = read_metadata(policy)
    digest = content_hash(policy)
    empty, weights = hashlib.sha256(b"{}").hexdigest(), hashlib.sha256(b"w" * 1000).hexdigest()
    files = {"config.json": empty, "model.safetensors": weights, "tokenizer.json": empty,
             "tokenizer_config.json": empty}
    assert digest == hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    # Only the vocabulary files (here tokenizer.json) define the tokenizer hash.
    vocabulary = hashlib.sha256(json.dumps({"tokenizer.json": empty}).encode()).hexdigest()
    assert meta == {"policy_version": "000", "parent_version": None, "iteration": 0, "content_hash": digest,
                    "tokenizer_hash": vocabulary, "files": files,
                    "lineage": [{"policy_version": "000", "content_hash": digest}]}
    assert not (tmp_path / ".000.tmp").exists()
    child = read_metadata(fake_policy(tmp_path, "001", weights=b"x" * 1000, parent=meta))
    assert child["content_hash"] != digest
    assert child["parent_version"] == "000"
    assert child["lineage"] == [{"policy_version": "001", "content_hash": child["content_hash"]}] + meta["lineage"]


def test_half_copied_or_edited_checkpoint_is_named_not_loaded(tmp_path):
    policy = fake_policy(tmp_path)
    whole = (policy / "model.safetensors").read_bytes()
    (policy / "model.safetensors").write_bytes(whole[:300])
    with pytest.raises(ContractError, match=r"000: files do not match burstrl.json \(a half-copied or edited "
                                            r"checkpoint\): differ from the recorded sha256: model.safetensors$"):
        read_metadata(policy)
    (policy / "model.safetensors").write_bytes(whole)
    (policy / "tokenizer_config.json").unlink()
    (policy / "notes.txt").write_text("x")
    with pytest.raises(ContractError, match="000: policy directory has no tokenizer_config.json"):
        read_metadata(policy)
    (policy / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ContractError, match="checkpoint\\): unrecorded: notes.txt$"):
        read_metadata(policy)
    (policy / "notes.txt").unlink()
    assert (policy / "model.safetensors").read_bytes() == whole
    assert read_metadata(policy)["policy_version"] == "000"


def test_derived_copy_must_name_its_source(tmp_path):
    source = read_metadata(fake_policy(tmp_path))
    copy = fake_policy(tmp_path, "009", weights=b"q" * 10)
    with pytest.raises(ContractError, match="009/burstrl.json: is a checkpoint's own metadata"):
        mark_derived(copy, source, "w4a16")
    (copy / "burstrl.json").unlink()
    mark_derived(copy, source, "w4a16")
    assert read_variant(copy, source) == "w4a16"
    with pytest.raises(ContractError, match=r"009/burstrl.json: field 'derived_from'.*must derive from policy 001"):
        read_variant(copy, {**source, "policy_version": "001"})


def test_target_parsing_follows_rsync():
    assert Target.parse("user@box:/srv/models") == Target("user@box", "/srv/models")
    assert Target.parse("box:models") == Target("box", "models")
    assert Target.parse("build/inference") == Target(None, "build/inference")
    assert Target.parse("./a:b") == Target(None, "./a:b")


def sync(policy, spec, version="001"):
    return sync_checkpoint(policy, version, read_metadata(policy)["content_hash"], spec, "ssh")


def check_published(base, policy, version="001"):
    name = f"{version}-{read_metadata(policy)['content_hash'][:12]}"
    assert os.readlink(base / "current") == name
    assert json.loads((base / "current" / "burstrl.json").read_text()) == read_metadata(policy)
    assert (base / name / "model.safetensors").read_bytes() == (policy / "model.safetensors").read_bytes()
    assert oct((base / name / "model.safetensors").stat().st_mode & 0o777) == oct(0o644)
    assert not list((base / ".incoming").iterdir())


def test_sync_to_local_directory_publishes_and_never_rewrites_in_place(tmp_path):
    policy = fake_policy(tmp_path / "ck", "001")
    (policy / "model.safetensors").chmod(0o600)
    base = tmp_path / "inference"
    receipt = sync(policy, str(base))
    assert receipt["files"] == 5 and receipt["verified_sha256"]
    check_published(base, policy)
    first = os.readlink(base / "current")
    again = sync(policy, str(base))
    assert again["path"] == receipt["path"] and os.readlink(base / "current") == first

    changed = fake_policy(tmp_path / "ck2", "001", weights=b"new" * 10)
    sync(changed, str(base))
    check_published(base, changed)
    assert (base / first / "model.safetensors").read_bytes() == b"w" * 1000  # a reader of the old one is undisturbed


def test_resyncing_an_older_iteration_does_not_move_current_back(tmp_path):
    base = tmp_path / "inference"
    newer = fake_policy(tmp_path / "ck", "002", weights=b"2" * 10)
    older = fake_policy(tmp_path / "ck", "001", weights=b"1" * 10)
    sync(newer, str(base), "002")
    receipt = sync(older, str(base), "001")
    assert os.readlink(base / "current").startswith("002-")
    assert receipt["current"].startswith("002-") and (base / receipt["path"].split("/")[-1]).is_dir()


def test_target_without_a_usable_path_is_refused(tmp_path):
    policy = fake_policy(tmp_path / "ck", "001")
    for spec in ("box:", "box:~/models"):
        with pytest.raises(SyncError, match="give an absolute path"):
            sync(policy, spec)


def test_sync_over_ssh_to_loopback(tmp_path, ssh_server, monkeypatch):
    monkeypatch.setenv("RSYNC_RSH", ssh_server["rsh"])
    policy = fake_policy(tmp_path / "ck", "001")
    base = tmp_path / "remote box"
    receipt = sync(policy, f"{ssh_server['user']}@127.0.0.1:{base}")
    assert receipt["path"].startswith(f"{base}/001-")
    check_published(base, policy)


def test_unreachable_ssh_target_is_reported_with_its_host(tmp_path, ssh_server, monkeypatch):
    monkeypatch.setenv("RSYNC_RSH", ssh_server["rsh"])
    policy = fake_policy(tmp_path / "ck", "001")
    with pytest.raises(SyncError, match="on nosuchuser@127.0.0.1: `mkdir -p .*x/.incoming/001-"):
        sync(policy, f"nosuchuser@127.0.0.1:{tmp_path}/x")
