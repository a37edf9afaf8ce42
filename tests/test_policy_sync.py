"""Checkpoint directories and sync: real rsync, to a local directory and over SSH to 127.0.0.1."""

import json
import os

import pytest

from burstrl.contract import ContractError
from burstrl.policy import check_policy_dir, content_hash, publish_policy, read_metadata, staging_dir
from burstrl.sync import SyncError, Target, sync_checkpoint


def fake_policy(root, name="000", weights=b"w" * 1000):
    tmp = staging_dir(root / name)
    (tmp / "config.json").write_text("{}")
    (tmp / "tokenizer_config.json").write_text("{}")
    (tmp / "tokenizer.json").write_text("{}")
    (tmp / "model.safetensors").write_bytes(weights)
    publish_policy(tmp, root / name, version=name, parent=None, iteration=0)
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
    assert meta == {"policy_version": "000", "parent_version": None, "iteration": 0,
                    "content_hash": content_hash(policy)}
    assert not (tmp_path / ".000.tmp").exists()
    other = fake_policy(tmp_path, "001", weights=b"x" * 1000)
    assert read_metadata(other)["content_hash"] != meta["content_hash"]


def test_target_parsing_follows_rsync():
    assert Target.parse("user@box:/srv/models") == Target("user@box", "/srv/models")
    assert Target.parse("box:models") == Target("box", "models")
    assert Target.parse("build/inference") == Target(None, "build/inference")
    assert Target.parse("./a:b") == Target(None, "./a:b")


def check_published(base, policy):
    assert os.readlink(base / "current") == "001"
    assert json.loads((base / "current" / "burstrl.json").read_text()) == read_metadata(policy)
    assert (base / "001" / "model.safetensors").read_bytes() == (policy / "model.safetensors").read_bytes()
    assert not list((base / ".incoming").iterdir())


def test_sync_to_local_directory_publishes_atomically_and_replaces(tmp_path):
    policy = fake_policy(tmp_path / "ck", "001")
    base = tmp_path / "inference"
    receipt = sync_checkpoint(policy, "001", str(base), "ssh")
    assert receipt["files"] == 5 and receipt["verified_sha256"]
    check_published(base, policy)
    (policy / "model.safetensors").write_bytes(b"new" * 10)
    sync_checkpoint(policy, "001", str(base), "ssh")
    assert (base / "current" / "model.safetensors").read_bytes() == b"new" * 10


def test_sync_over_ssh_to_loopback(tmp_path, ssh_server, monkeypatch):
    monkeypatch.setenv("RSYNC_RSH", ssh_server["rsh"])
    policy = fake_policy(tmp_path / "ck", "001")
    base = tmp_path / "remote box"
    receipt = sync_checkpoint(policy, "001", f"{ssh_server['user']}@127.0.0.1:{base}", "ssh -o BatchMode=yes")
    assert receipt["path"] == f"{base}/001"
    check_published(base, policy)


def test_sync_failure_is_reported_and_publishes_nothing(tmp_path, ssh_server, monkeypatch):
    monkeypatch.setenv("RSYNC_RSH", ssh_server["rsh"])
    policy = fake_policy(tmp_path / "ck", "001")
    with pytest.raises(SyncError, match="on nosuchuser@127.0.0.1"):
        sync_checkpoint(policy, "001", f"nosuchuser@127.0.0.1:{tmp_path}/x", "ssh")
    assert not (tmp_path / "x").exists()
