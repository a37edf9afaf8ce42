"""The pure parts of burstrl.remote.rent (what is ready to train, what a session costs) and its on-machine limit,
run by a real shell here."""

import subprocess
import time

import pytest

from burstrl.remote.estimate import estimate, plan
from burstrl.remote.rent import disarm_in_place, guard_script

ITERS = {"001": {"parent": "000", "sampler": "000"}, "002": {"parent": "001", "sampler": "000"},
         "003": {"parent": "002", "sampler": "002"}}


def test_plan_runs_ready_trains_in_order_and_says_why_others_wait():
    # 002 samples from 000 (lag 1), so its rollouts are scored while 001 still has to train.
    changed = {"train@001", "train@002", "train@003", "score@003", "generate@003", "eval@001"}
    ready, waiting = plan(changed, ITERS)
    assert ready == ["train@001", "train@002"]
    assert waiting == ["train@003: score@003 is not done (run `dvc repro score@003` on the inference box)"]


def test_plan_waits_for_a_parent_that_cannot_train_yet():
    ready, waiting = plan({"score@001", "train@001", "train@002"}, ITERS)
    assert ready == []
    assert waiting[1] == "train@002: checkpoint 001 is not done"
    assert plan(set(), ITERS) == ([], [])


def test_estimate_from_past_train_stages_capped_by_the_limit():
    # 15 min setup + 2 stages x mean(1800, 3600) s = 0.25 h + 1.5 h = 1.75 h; at $4/h: $7.
    assert estimate(2, [1800.0, 3600.0], 15, 10, 4.0) == pytest.approx((1.75, 7.0))
    assert estimate(20, [3600.0], 15, 10, 4.0) == pytest.approx((10, 40.0))
    assert estimate(1, [], 15, 10, 4.0) == (10, 40.0)  # no history: the limit is the estimate


def sh(script: str) -> None:
    subprocess.run(["sh", "-c", script], check=True, stdin=subprocess.DEVNULL, timeout=10)


def test_the_limit_stops_the_training_and_ends_the_machine(tmp_path):
    training = subprocess.Popen(["sleep", "60"])
    (tmp_path / ".burstrl").mkdir()
    secrets = tmp_path / "secrets.env"
    secrets.write_text("export HF_TOKEN=x\n")
    sh(guard_script(str(tmp_path), 1, f"touch {tmp_path / 'ended'}", str(secrets), "s1"))
    (tmp_path / ".burstrl/train.pid").write_text(f"{training.pid}\n")
    assert training.wait(timeout=10) == -15  # SIGTERM from the limit
    deadline = time.monotonic() + 10
    while not (tmp_path / "ended").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "ended").exists() and not secrets.exists()
    assert "session limit reached" in (tmp_path / ".burstrl/guard/guard.log").read_text()
    assert ledger(tmp_path) == ["armed s1", "fired for s1"]


def ledger(workspace) -> list[str]:
    return [line.split(" ", 1)[1] for line in (workspace / ".burstrl/guard/ledger.log").read_text().splitlines()]


def test_a_disarmed_limit_never_fires_and_a_new_session_disarms_the_limit_a_dead_one_left(tmp_path):
    script = guard_script(str(tmp_path), 1, f"touch {tmp_path / 'ended'}", str(tmp_path / "secrets.env"), "s1")
    sh(script)
    pid = int((tmp_path / ".burstrl/guard/guard.pid").read_text())
    sh(guard_script(str(tmp_path), 30, "true", str(tmp_path / "secrets.env"), "s2"))  # s1 died without a word
    sh(f"cd {tmp_path}/.burstrl/guard && {disarm_in_place('s2')}true")
    sh(f"cd {tmp_path}/.burstrl/guard && {disarm_in_place('s2')}true")  # nothing armed: no line
    time.sleep(2)
    assert not (tmp_path / "ended").exists() and not (tmp_path / ".burstrl/guard/guard.pid").exists()
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0  # s1's sleep is gone too
    assert ledger(tmp_path) == ["armed s1", "disarmed s1 by s2", "armed s2", "disarmed s2 by s2"]
