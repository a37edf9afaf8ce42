"""The train stage on another host over real SSH (an sshd on 127.0.0.1 that the tests start): inputs go out
with rsync, the stage runs there, its outputs come back and DVC records them here; checkpoints come home
during the run, so a lost host costs at most one checkpoint interval. The workspace is a clone of the session's
scored one, so only train and what follows it run."""

import datetime
import json
import re
import shutil
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


def test_checkpoints_come_home_and_a_new_host_continues_from_them(ws):
    root, pod, env = ws
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["epochs"] = 400  # 1600 steps: longer than the deadline leaves
    params["resume"].update({"checkpoint_every_steps": 50, "pull_every_seconds": 1})
    (root / "long.yaml").write_text(yaml.safe_dump(params))
    cmd = ["python", "stages/train.py", "001", "000", "--params", "long.yaml"]
    deadline = datetime.datetime.fromtimestamp(time.time() + 45).astimezone().isoformat()
    done = run(cmd, root, {**env, "BURSTRL_DEADLINE": deadline}, check=False)
    assert done.returncode == 75, done.stderr[-2000:]
    saved = list((root / "build/resume/train/001").glob("checkpoint-*/burstrl-complete.json"))
    assert len(saved) == 1  # the deadline checkpoint, home with its marker
    step = json.loads(saved[0].read_text())["step"]
    assert 0 < step < 1600
    # Checkpoints came home while it ran, not only at the end, and no round failed though the host rotated
    # its checkpoints every couple of seconds.
    home = [int(s) for s in re.findall(r"^checkpoint-(\d+) is home$", done.stdout, re.M)]
    assert home[-1] == step and len(home) > 1 and all(k % 50 == 0 for k in home[:-1]), done.stderr[-3000:]
    assert home == sorted(set(home)) and "could not bring checkpoints home" not in done.stderr, done.stderr[-3000:]
    shutil.rmtree(pod / "build")  # the rented machine is gone; a fresh one has no progress of its own
    run(cmd, root, env)
    metrics = json.loads((root / "metrics/train/001.json").read_text())
    assert (metrics["resumed_from_step"], metrics["optimizer_steps"]) == (step, 1600)
