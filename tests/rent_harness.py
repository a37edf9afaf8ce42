"""What the tests of `make rent-h200` share: a workspace (a clone of the scored one) whose pod is a directory this
host's real sshd serves, the strict RunPod stand-in (tests/runpod_standin.py) in front of it, and helpers to run,
signal and check sessions. Each module builds its own with `rent_workspace`."""

import json
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import REPO, clone
from runpod_standin import RunPodStandIn

# Made up per run, so that not even this file holds them.
API_KEY = f"rpa_{secrets.token_hex(16)}"
HUB_TOKEN = f"hf_{secrets.token_hex(16)}"


def rent_workspace(tmp_path_factory, ssh_server, scored):
    """A module's rent workspace: yields a dict of its root, pod, environment, stand-in, rent params, the forwarded
    secrets file's path on the pod, the ssh server, and `outputs` (everything its sessions printed)."""
    root = tmp_path_factory.mktemp("laptop") / "ws"
    pod = tmp_path_factory.mktemp("pod")
    rp_environment = pod.parent / f"{pod.name}-rp_environment"  # what RunPod keeps in a pod's /etc/rp_environment
    standin = RunPodStandIn(ssh_server["port"], API_KEY, rp_environment)
    env = {**clone(scored, root), "RUNPOD_API_BASE_URL": standin.url, "RUNPOD_API_KEY": API_KEY,
           "HF_TOKEN": HUB_TOKEN}
    env.pop("RSYNC_RSH", None)
    env.pop("BURSTRL_TRAIN_HOST", None)
    secrets_file = pod.parent / f"{pod.name}-home" / "secrets.env"
    base = {
        "provider": "runpod", "max_hours": 1.0, "reserve_minutes": 0.1, "ssh_key": ssh_server["key"],
        # The machine's setup: a Python environment with the project's dependencies (here, this checkout's).
        "setup_command": f"ln -sfn {REPO / '.venv'} .venv",
        "check_command": ".venv/bin/python -c 'import torch; print(\"torch\", torch.__version__)'",
        "secrets_file": str(secrets_file), "ssh_timeout_seconds": 5, "report_every_seconds": 1,
        "runpod": {"dir": str(pod), "ssh_user": ssh_server["user"],
                   "self_terminate": f". {rp_environment} 2>/dev/null; {REPO / 'tests' / 'runpodctl'} {standin.url} "
                                     "remove pod {pod_id}"},
    }
    yield {"root": root, "pod": pod, "env": env, "standin": standin, "base": base, "secrets": secrets_file,
           "ssh": ssh_server, "outputs": []}
    standin.close()


def rent_params(ws, name: str, **changes) -> str:
    params = yaml.safe_load((ws["root"] / "params.yaml").read_text())
    rent = json.loads(json.dumps(ws["base"]))
    for key, value in changes.items():
        if isinstance(value, dict):
            rent.setdefault(key, {}).update(value)
        else:
            rent[key] = value
    params["rent"].update(rent)
    (ws["root"] / f"{name}.yaml").write_text(yaml.safe_dump(params))
    return f"{name}.yaml"


def start(ws, params: str, *args, env=None) -> subprocess.Popen:
    # One iteration unless a test asks for more: a session's default, iterations until the limit, would append
    # new ones to this module's workspace.
    args = args if "--iterations" in args else (*args, "--iterations", "1")
    shutil.rmtree(ws["pod"] / "build", ignore_errors=True)  # each session's pod starts without progress
    # A session started from a terminal takes Ctrl-C; one started by a test run that a shell put in the
    # background would inherit SIGINT ignored. A handler here (not SIG_IGN) reaches the child as the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(["python", "-m", "burstrl", "rent", "--params", params, *args], cwd=ws["root"],
                                env={**ws["env"], **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def finish(ws, proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    ws["outputs"].extend([out, err])
    return proc.returncode, out, err


def rent(ws, params: str, *args, env=None) -> tuple[int, str, str]:
    return finish(ws, start(ws, params, *args, env=env))


def wait_for(condition, timeout=120.0, what="condition"):
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.2)


def remote_trainers(pod: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        if proc.info["cwd"] == str(pod) and "stages/train.py" in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def training_started(ws) -> bool:
    return (ws["pod"] / "build/resume/train/001").is_dir()


def assert_terminated_once(ws, out: str) -> str:
    pod_id = ws["standin"].created()[-1]
    assert len(ws["standin"].terminations(pod_id)) == 1, ws["standin"].calls
    assert f"pod {pod_id} terminated" in out and "session over" in out
    wait_for(lambda: not remote_trainers(ws["pod"]), 30, "the remote training to stop")
    assert not (ws["pod"] / ".burstrl/guard/guard.pid").exists()  # the on-pod limit was disarmed
    return pod_id


def test_dry_run_prints_the_plan_and_cost_and_rents_nothing(ws):
    code, out, err = rent(ws, rent_params(ws, "dry", max_hours=4.0), "--dry-run", "--hours", "2")
    assert code == 0, err
    assert "plan: a session loop until 1 iteration(s), sampler 1 checkpoint(s) behind (rent.lag); ready now: " \
        "train@001; on runpod (1x NVIDIA H200), limit 2:00:00" in out
    # No train stage ran before, so the estimate is the limit: 2 h at cost.train_usd_per_hour.
    assert "estimated 2:00:00, $7.00 at $3.50/h" in out and "at most $7.00" in out
    assert "rent: the loop at lag 1: about " in out and " iteration(s) in 2 h" in out
    assert ws["standin"].calls == []




def assert_no_secret(ws, places: list[Path]) -> None:
    """Neither the API key nor the forwarded token is in anything the sessions printed or any file under `places`."""
    assert ws["outputs"], "the sessions ran"
    for text in ws["outputs"]:
        assert API_KEY not in text and HUB_TOKEN not in text
    scanned = 0
    for place in places:
        for path in place.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                assert API_KEY.encode() not in data and HUB_TOKEN.encode() not in data, path
                scanned += 1
    assert scanned > 100 and (ws["root"] / "dvc.lock").is_file()
