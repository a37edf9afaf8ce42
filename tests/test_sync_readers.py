"""Readers of a sync target never see a torn model: while syncs over SSH to 127.0.0.1 publish new versions,
re-sync older ones and get SIGKILLed mid-transfer, a loader (resolve `current` once, as burstrl.inference.serve
does, then load the model) and a checksum reader (every file against the published burstrl.json) read
without pause. Two syncs at once leave `current` at the newer version."""

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from burstrl.atomic import staging_dir
from burstrl.data.policy import publish_policy, read_metadata
from burstrl.errors import ContractError
from burstrl.remote.sync import sync_checkpoint
from burstrl.training.tinymodel import build_model, build_tokenizer, save_policy

pytestmark = pytest.mark.slow
VERSIONS = ["001", "002", "003", "004"]
# Newer and older syncs interleaved: each older one must leave `current` where it was.
ORDER = ["001", "002", "001", "003", "002", "004", "003", "001", "004", "002"] * 2
KILLED = 3


def policy(root: Path, version: str) -> Path:
    torch.manual_seed(int(version))
    tokenizer = build_tokenizer()
    tmp = staging_dir(root / version)
    save_policy(build_model(tokenizer, hidden_size=128, layers=4, max_len=32), tokenizer, tmp)
    publish_policy(tmp, root / version, version=version, parent=None, iteration=int(version))
    return root / version


def fingerprint(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


class Readers:
    """A loader and a checksum reader of `base/current`, each in a thread, counting reads and torn reads."""

    def __init__(self, base: Path, fingerprints: dict[str, float]):
        self.base, self.fingerprints = base, fingerprints
        self.stop = threading.Event()
        self.reads = {"load": 0, "checksum": 0}
        self.torn: list[str] = []
        self.threads = [threading.Thread(target=self.loop, args=(name,)) for name in self.reads]

    def resolve(self) -> Path | None:
        link = self.base / "current"
        return Path(os.path.realpath(link)) if link.is_symlink() else None

    def read(self, kind: str, directory: Path) -> None:
        meta = read_metadata(directory)  # every file against the sums sync published with it
        if kind == "load":
            model = AutoModelForCausalLM.from_pretrained(directory)
            if abs(fingerprint(model) - self.fingerprints[meta["policy_version"]]) > 1e-6:
                raise ContractError(f"{directory}: loaded weights are not those of {meta['policy_version']}")

    def loop(self, kind: str) -> None:
        while not self.stop.is_set():
            directory = self.resolve()
            if directory is None:
                time.sleep(0.01)
                continue
            try:
                self.read(kind, directory)
            except Exception as err:  # a torn read shows as any failure to read a complete, matching model
                self.torn.append(f"{kind} {directory.name}: {type(err).__name__}: {err}")
            self.reads[kind] += 1
            time.sleep(0.005)  # the syncs run in this process too: leave them the interpreter between reads

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join()


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    root = tmp_path_factory.mktemp("policies")
    dirs = {v: policy(root, v) for v in VERSIONS}
    prints = {v: fingerprint(AutoModelForCausalLM.from_pretrained(d)) for v, d in dirs.items()}
    return dirs, prints


def sync(directory: Path, spec: str) -> dict:
    meta = read_metadata(directory)
    return sync_checkpoint(directory, meta["policy_version"], meta["content_hash"], spec, "ssh")


SYNC = ("import sys; from pathlib import Path; from burstrl.data.policy import read_metadata; "
        "from burstrl.remote.sync import sync_checkpoint; d = Path(sys.argv[1]); m = read_metadata(d); "
        "sync_checkpoint(d, m['policy_version'], m['content_hash'], sys.argv[2], 'ssh')")


def sync_process(directory: Path, spec: str) -> subprocess.Popen:
    """A sync in a process of its own, as a stage runs it."""
    return subprocess.Popen([sys.executable, "-c", SYNC, str(directory), spec])


def killed_sync(directory: Path, spec: str, delay: float) -> None:
    """A sync SIGKILLed `delay` seconds in: mid-transfer, mid-verification or mid-publish."""
    proc = sync_process(directory, spec)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_readers_never_see_a_torn_model_while_syncs_publish_resync_and_die(policies, tmp_path, ssh_server,
                                                                            monkeypatch):
    monkeypatch.setenv("RSYNC_RSH", ssh_server["rsh"])
    dirs, prints = policies
    base = tmp_path / "inference box"
    spec = f"{ssh_server['user']}@127.0.0.1:{base}"
    rng = random.Random(0)
    receipts = []
    with Readers(base, prints) as readers:
        for i, version in enumerate(ORDER):
            receipts.append(sync(dirs[version], spec))
            newest = max(ORDER[:i + 1])
            assert os.readlink(base / "current").startswith(f"{newest}-")
            if i % (len(ORDER) // KILLED) == 1:
                killed_sync(dirs[rng.choice(VERSIONS)], spec, rng.uniform(0.2, 1.5))
            time.sleep(0.05)  # let the readers read each published state
    print(f"{len(receipts)} syncs, {KILLED} killed, reads: {readers.reads}, torn: {len(readers.torn)}")
    assert len(receipts) >= 20
    assert min(readers.reads.values()) >= 20
    assert readers.torn == []
    newest = f"004-{read_metadata(dirs['004'])['content_hash'][:12]}"
    assert os.readlink(base / "current") == receipts[-1]["current"] == newest


def test_two_syncs_at_once_leave_current_at_the_newer_version(policies, tmp_path, ssh_server, monkeypatch):
    monkeypatch.setenv("RSYNC_RSH", ssh_server["rsh"])
    dirs, _ = policies
    for trial in range(4):
        base = tmp_path / f"box-{trial}"
        spec = f"{ssh_server['user']}@127.0.0.1:{base}"
        sync(dirs["001"], spec)
        # The older of the two starts first half the time: the lock, not the start order, decides.
        pair = ["002", "003"] if trial % 2 else ["003", "002"]
        procs = [sync_process(dirs[v], spec) for v in pair]
        assert [proc.wait() for proc in procs] == [0, 0]
        assert os.readlink(base / "current").startswith("003-"), f"trial {trial}"
