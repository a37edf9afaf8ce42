"""The train stage on another host over real SSH (an sshd on 127.0.0.1 that the tests start): inputs go out
with rsync, the stage runs there, its outputs come back and DVC records them here; checkpoints come home
during the run, so a lost host costs at most one checkpoint interval. The workspace is a clone of the session's
scored one, so only train and what follows it run."""

import datetime
import json
import re
import shutil
import subprocess
import time

import pytest
import yaml
from conftest import REPO, clone, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ws(tmp_path_factory, ssh_server, scored):
    root = tmp_path_factory.mktemp("local") / "ws"
    pod = tmp_path_factory.mktemp("pod")
    # The host's setup: a Python environment with the project's dependencies (here, this checkout's).
    (pod / ".venv").symlink_to(REPO / ".venv")
    env = clone(scored, root, {"train": {"epochs": 1}})  # 4 optimizer steps
    return root, pod, {**env, "RSYNC_RSH": ssh_server["rsh"],
                       "BURSTRL_TRAIN_HOST": f"{ssh_server['user']}@127.0.0.1:{pod}"}


def test_dvc_repro_trains_on_the_remote_host_and_records_the_outputs_here(ws):
    root, pod, env = ws
    out = run(["dvc", "repro"], root, env).stdout
    assert f"@127.0.0.1:{pod}" in out and "train 001: running on" in out
    assert "train 001: 4 steps" in (pod / "logs/train/001.log").read_text()  # it ran there
    assert (root / "checkpoints/001/burstrl.json").read_text() == (pod / "checkpoints/001/burstrl.json").read_text()
    assert json.loads((root / "metrics/train/001.json").read_text())["optimizer_steps"] == 4
    assert (root / "dvclive/train/001/plots/metrics/loss.tsv").is_file()
    assert not (root / "build/resume/train/001").exists()
    assert "Running stage" not in run(["dvc", "repro"], root, env).stdout
    assert run(["dvc", "status"], root, env).stdout.strip() == "Data and pipelines are up to date."


def test_checkpoints_come_home_and_a_new_host_continues_from_them(ws, tmp_path):
    root, pod, env = ws
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["epochs"] = 15  # 60 steps
    params["resume"].update({"checkpoint_every_steps": 10, "pull_every_seconds": 1})
    (root / "long.yaml").write_text(yaml.safe_dump(params))
    cmd = ["python", "stages/train.py", "001", "000", "--params", "long.yaml"]
    # The remote trainer holds at step 21, two periodic checkpoints in, until the deadline has passed, so where
    # it stops depends on its progress and not on how fast this machine is today. The deadline leaves room for
    # the remote start on a busy machine.
    pause, limit = tmp_path / "paused", 90
    deadline = time.time() + limit
    stamp = datetime.datetime.fromtimestamp(deadline).astimezone().isoformat()
    # Output goes to files: a pipe nobody reads while the test waits would fill and block the stage.
    out, err = tmp_path / "out", tmp_path / "err"
    stage = subprocess.Popen(cmd, cwd=root, stdout=out.open("w"), stderr=err.open("w"),
                             env={**env, "BURSTRL_DEADLINE": stamp, "BURSTRL_PAUSE_AT": f"optimizer_step@21:{pause}"})
    try:
        first = root / "build/resume/train/001/checkpoint-20" / "burstrl-complete.json"
        while not (pause.exists() and first.is_file()) and stage.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert pause.exists() and first.is_file(), f"not at step 21 with checkpoint-20 home within {limit} s"
        time.sleep(max(0.0, deadline - time.time()) + 1)
        pause.unlink()
        stage.wait(timeout=300)
    finally:
        pause.unlink(missing_ok=True)
        stage.kill()
    out, err = out.read_text(), err.read_text()
    assert stage.returncode == 75, err[-2000:]
    saved = list((root / "build/resume/train/001").glob("checkpoint-*/burstrl-complete.json"))
    assert len(saved) == 1  # the deadline checkpoint, home with its marker
    step = json.loads(saved[0].read_text())["step"]
    assert step == 21
    # Checkpoints came home while it ran, not only at the end, and no round failed though the host rotated
    # its checkpoints while they were being pulled.
    home = [int(s) for s in re.findall(r"^checkpoint-(\d+) is home$", out, re.M)]
    assert home[-1] == step and len(home) > 1 and all(k % 10 == 0 for k in home[:-1]), err[-3000:]
    assert home == sorted(set(home)) and "could not bring checkpoints home" not in err, err[-3000:]
    shutil.rmtree(pod / "build")  # the rented machine is gone; a fresh one has no progress of its own
    run(cmd, root, env)
    metrics = json.loads((root / "metrics/train/001.json").read_text())
    assert (metrics["resumed_from_step"], metrics["optimizer_steps"]) == (step, 60)
