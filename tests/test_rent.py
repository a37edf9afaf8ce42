"""`make rent-h200` end to end: the RunPod provider against a stand-in of its API on loopback, the machine
being this host's real sshd; each injected failure ends with the pod terminated exactly once and a non-zero
exit; the on-pod limit fires with this side gone; the static provider runs the whole burst; no secret leaks."""

import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REPO, clone, run
from runpod_standin import RunPodStandIn

pytestmark = pytest.mark.slow

# Made up per run, so that not even this file holds them.
API_KEY = f"rpa_{secrets.token_hex(16)}"
HUB_TOKEN = f"hf_{secrets.token_hex(16)}"
OUTPUTS: list[str] = []  # everything the sessions printed, for the secrets scan
EPOCHS = 5


@pytest.fixture(scope="module")
def ws(tmp_path_factory, ssh_server, scored):
    root = tmp_path_factory.mktemp("laptop") / "ws"
    pod = tmp_path_factory.mktemp("pod")
    standin = RunPodStandIn(ssh_server["port"])
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
                   "self_terminate": f"{REPO / 'tests' / 'runpodctl'} {standin.url} remove pod {{pod_id}}"},
    }
    yield {"root": root, "pod": pod, "env": env, "standin": standin, "base": base, "secrets": secrets_file,
           "ssh": ssh_server}
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


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    OUTPUTS.extend([out, err])
    return proc.returncode, out, err


def rent(ws, params: str, *args, env=None) -> tuple[int, str, str]:
    return finish(start(ws, params, *args, env=env))


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


def test_a_failed_create_terminates_the_pod_it_made(ws):
    ws["standin"].fail_create = True
    try:
        code, out, err = rent(ws, rent_params(ws, "create"))
    finally:
        ws["standin"].fail_create = False
    assert code == 1
    assert "RunPod create pod failed" in err
    pod_id = ws["standin"].created()[-1]
    assert len(ws["standin"].terminations(pod_id)) == 1 and f"pod {pod_id} terminated" in out


def test_ssh_that_never_comes_up_terminates_the_pod(ws):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    ws["standin"].ssh_port = closed
    try:
        code, out, err = rent(ws, rent_params(ws, "nossh"))
    finally:
        ws["standin"].ssh_port = ws["ssh"]["port"]
    assert code == 1
    assert "never came up within 5s" in err
    assert len(ws["standin"].terminations(ws["standin"].created()[-1])) == 1


def test_failed_setup_terminates_the_pod(ws):
    code, out, err = rent(ws, rent_params(ws, "setup", setup_command="echo no CUDA here >&2; exit 3"))
    assert code == 1
    assert "setup failed on" in err and "(exit 3)" in err and "no CUDA here" in err
    assert_terminated_once(ws, out)


def test_a_crashed_training_terminates_the_pod(ws):
    code, out, err = rent(ws, rent_params(ws, "crash"), env={"BURSTRL_KILL_AT": "optimizer_step@3"})
    assert code == 1
    assert "SIGKILL at optimizer_step" in out
    assert "train@001 failed" in err
    assert_terminated_once(ws, out)


def test_a_dropped_connection_terminates_the_pod(ws):
    proc = start(ws, rent_params(ws, "drop"))
    wait_for(lambda: training_started(ws), what="training on the pod")
    session = psutil.Process(proc.pid)
    for child in session.children(recursive=True):
        if child.name() == "ssh" and "stages/train.py" in " ".join(child.cmdline()):
            child.kill()
    code, out, err = finish(proc)
    assert code == 1
    assert "lost the SSH connection to" in out and "ssh ended by SIGKILL" in out
    assert_terminated_once(ws, out)


def test_ctrl_c_terminates_the_pod(ws):
    proc = start(ws, rent_params(ws, "ctrlc"))
    wait_for(lambda: training_started(ws), what="training on the pod")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends its foreground group
    code, out, err = finish(proc)
    assert code == 130
    assert "interrupted: giving the machine back" in err
    assert_terminated_once(ws, out)


def test_the_deadline_ends_the_session_and_terminates_the_pod(ws):
    # 63 s limit, training must stop 60 s before it: the deadline passes before training can start.
    code, out, err = rent(ws, rent_params(ws, "deadline", reserve_minutes=1.0), "--hours", "0.0175")
    assert code == 75
    assert "stopped for the session's deadline" in err
    assert_terminated_once(ws, out)


def test_the_on_pod_limit_ends_the_pod_when_this_side_is_gone(ws):
    # A 20 s session whose setup hangs; then the laptop vanishes (SIGKILL): nothing here can clean up.
    proc = start(ws, rent_params(ws, "limit", setup_command="sleep 300"), "--hours", str(20 / 3600))
    wait_for(lambda: ws["standin"].created() and (ws["pod"] / ".burstrl/guard/guard.pid").is_file(),
             what="the limit armed on the pod")
    os.killpg(proc.pid, signal.SIGKILL)
    finish(proc)
    pod_id = ws["standin"].created()[-1]
    wait_for(lambda: ws["standin"].terminations(pod_id), 60, "the pod to terminate itself")
    time.sleep(1)
    assert [c[2] for c in ws["standin"].terminations(pod_id)] == ["runpodctl-on-pod"]
    assert "session limit reached" in (ws["pod"] / ".burstrl/guard/guard.log").read_text()
    assert not ws["secrets"].exists()


def test_reap_terminates_only_this_projects_pods(ws):
    standin = ws["standin"]
    standin.pods["old1"] = {"id": "old1", "name": "burstrl-20261101-000000-abcdef", "desiredStatus": "RUNNING"}
    standin.pods["other"] = {"id": "other", "name": "someone-elses-notebook", "desiredStatus": "RUNNING"}
    code, out, err = rent(ws, rent_params(ws, "reap"), "reap")
    assert code == 0, err
    assert "reaped 1 machine(s) this project started: old1" in out
    assert len(standin.terminations("old1")) == 1 and not standin.terminations("other")


def test_a_static_host_session_loops_three_iterations_overlapping_home_and_training(ws):
    root, pod = ws["root"], ws["pod"].parent / "static-host"
    env = {"RSYNC_RSH": ws["ssh"]["rsh"]}
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["epochs"] = EPOCHS  # shorter trains than the interrupted ones above; home is the longer side
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    params = rent_params(ws, "static", provider="static",
                         static={"host": f"{ws['ssh']['user']}@127.0.0.1:{pod}", "on_expiry": ""})
    calls = len(ws["standin"].calls)
    code, out, err = rent(ws, params, "--iterations", "3", env=env)
    assert code == 0, err[-3000:]
    assert f"@127.0.0.1:{pod} is up" in out and out.count("rent: setup: ") == 1  # set-up paid once
    assert "elapsed, $" in out and "nothing to give back" in out and "forwarded HF_TOKEN" in out
    assert "appended iteration 002" in out and "appended iteration 003" in out and "iteration 004" not in out
    steps = 4 * EPOCHS  # 32 rollouts in batches of 8
    for key in ("001", "002", "003"):
        assert f"rent: train@{key} done" in out and f"train {key}: running on" in out
        assert f"train {key}: {steps} steps" in (pod / f"logs/train/{key}.log").read_text()  # it ran there
        assert (root / f"checkpoints/{key}/burstrl.json").read_text() == \
            (pod / f"checkpoints/{key}/burstrl.json").read_text()
        assert json.loads((root / f"metrics/train/{key}.json").read_text())["optimizer_steps"] == steps
    assert yaml.safe_load((root / "iterations.yaml").read_text())["iterations"]["003"] == \
        {"parent": "002", "sampler": "001"}  # rent.lag 1
    assert ws["standin"].calls[calls:] == []  # nothing rented
    assert not (pod / ".burstrl/guard/guard.pid").exists() and not ws["secrets"].exists()
    assert run(["dvc", "status", "--json"], root, ws["env"]).stdout.strip() in ("", "{}")
    assert "Running stage" not in run(["dvc", "repro"], root, ws["env"]).stdout

    [report_file] = [line.split(" in ")[1] for line in out.splitlines() if line.startswith("rent: session report")]
    summary = json.loads((root / report_file).read_text())
    runs = {r["stage"]: r for r in summary["stages"]}
    train = runs["train@002"]
    overlap = [name for name in ("generate@003", "score@003")
               if runs[name]["start"] < train["end"] and train["start"] < runs[name]["end"]]
    assert overlap, summary["stages"]  # home sampled and scored 003 (from 001) while 002 trained there
    assert summary["iterations_trained"] == ["001", "002", "003"]
    rented = summary["rented"]
    moved = sum(json.loads((root / f"metrics/train/{key}.json").read_text())["transfer_seconds"]
                for key in ("001", "002", "003"))
    assert rented["syncing_seconds"] == pytest.approx(moved, abs=0.2) and moved > 0  # shipping out, bringing home
    assert rented["training_seconds"] + rented["syncing_seconds"] == pytest.approx(
        sum(r["end"] - r["start"] for r in summary["stages"] if r["lane"] == "trainer"), abs=0.2)
    for line in ("session: 3 iteration(s) trained (001, 002, 003)", "session: rented ", "GPU-hours per iteration"):
        assert line in out
    code, out, _ = rent(ws, params, "--dry-run", "--iterations", "1", env=env)
    assert code == 0 and "ready now: none" in out


def test_the_fleet_prepares_the_next_iteration_and_the_session_that_stops_it_only_trains(ws):
    root, pod = ws["root"], ws["pod"].parent / "static-host"
    env = {**ws["env"], "RSYNC_RSH": ws["ssh"]["rsh"]}
    bound = yaml.safe_load((root / "params.yaml").read_text())
    bound["train"]["max_staleness"] = 0  # the fleet's bound only: one iteration, sampled from checkpoint 003
    (root / "fleet.yaml").write_text(yaml.safe_dump(bound))
    # Its output goes to files: a pipe nobody reads while it runs would fill and block it.
    logs = {name: (root / f"fleet.{name}").open("w+") for name in ("out", "err")}
    fleet = subprocess.Popen(["python", "-m", "burstrl", "fleet", "--params", "fleet.yaml", "--poll", "1"], cwd=root,
                             env=env, stdout=logs["out"], stderr=logs["err"], text=True, start_new_session=True)
    try:
        wait_for(lambda: "score@004:" in (root / "dvc.lock").read_text(), 180, "the fleet to score iteration 004")
        params = rent_params(ws, "static-fleet", provider="static",
                             static={"host": f"{ws['ssh']['user']}@127.0.0.1:{pod}", "on_expiry": ""})
        code, out, err = rent(ws, params, "--iterations", "1", env={"RSYNC_RSH": ws["ssh"]["rsh"]})
        fleet.wait(timeout=60)
    finally:
        if fleet.poll() is None:
            os.killpg(fleet.pid, signal.SIGKILL)
        for log in logs.values():
            log.close()
    fleet_out, fleet_err = (root / "fleet.out").read_text(), (root / "fleet.err").read_text()
    assert code == 0, err[-3000:]
    assert f"stopped the fleet (pid {fleet.pid})" in out and fleet.returncode == 130
    assert "finished shards are kept" in fleet_err and "loop: appended iteration 004" in fleet_out
    assert yaml.safe_load((root / "iterations.yaml").read_text())["iterations"]["004"] == \
        {"parent": "003", "sampler": "003"}
    [report_file] = [line.split(" in ")[1] for line in out.splitlines() if line.startswith("rent: session report")]
    summary = json.loads((root / report_file).read_text())
    # The fleet's rollouts were used as they were: the session sampled and scored nothing.
    assert sorted(r["stage"] for r in summary["stages"]) == ["eval@004", "sync@004", "train@004"]
    assert summary["home"]["generate_seconds"] == summary["home"]["score_seconds"] == 0
    assert run(["dvc", "status", "--json"], root, ws["env"]).stdout.strip() in ("", "{}")


def leftovers(root: Path, host: Path) -> list[str]:
    """Processes a killed session left in the workspace or on the host, but a limit armed there (it stays until
    the next session disarms it)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cwd = proc.info["cwd"] or ""
        if (cwd == str(root) or cwd.startswith(str(host))) and not cwd.startswith(str(host / ".burstrl/guard")):
            found.append(" ".join(proc.info["cmdline"] or []))
    return found


def recorded_trains(root: Path) -> set[str]:
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    return {name.split("@")[1] for name in lock if name.startswith("train@")}


KILLS, PLANNED = 5, 2


def test_a_session_killed_at_random_points_finishes_its_iterations_when_run_again(ws):
    root, host = ws["root"], ws["pod"].parent / "static-host"
    env = {"RSYNC_RSH": ws["ssh"]["rsh"]}
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["epochs"] = EPOCHS  # as the session test left it, when this test runs alone
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    params = rent_params(ws, "static-kill", provider="static",
                         static={"host": f"{ws['ssh']['user']}@127.0.0.1:{host}", "on_expiry": ""})
    seed = int(os.environ.get("BURSTRL_KILL_SEED") or secrets.randbits(32))  # set it to replay a failure
    rng, kills, runs = random.Random(seed), [], 0
    before = yaml.safe_load((root / "iterations.yaml").read_text())["iterations"]
    done_before = recorded_trains(root) & set(before)

    def trained() -> set[str]:
        return recorded_trains(root) - done_before

    while len(trained()) < PLANNED:
        runs += 1
        assert runs <= KILLS + 3, f"seed {seed}: kills at {kills}, still not done"
        proc = start(ws, params, "--iterations", str(PLANNED - len(trained())), env=env)
        delay = rng.uniform(3, 20) if len(kills) < KILLS else 600
        try:
            out, err = proc.communicate(timeout=delay)
        except subprocess.TimeoutExpired:
            # The home process only, as a closed laptop or the OOM killer would: its stages end with it.
            proc.kill()
            kills.append(round(delay, 1))
            out, err = proc.communicate(timeout=60)
        OUTPUTS.extend([out, err])
        code = proc.returncode
        assert code in (0, -signal.SIGKILL), f"seed {seed}, kills at {kills}: exit {code}\n{err[-3000:]}"
        wait_for(lambda: not leftovers(root, host), 60,
                 lambda: f"the killed session's stages to end (seed {seed}, kills at {kills}): {leftovers(root, host)}")
    assert len(kills) == KILLS, f"seed {seed}: the iterations were done after {kills}"

    iters = yaml.safe_load((root / "iterations.yaml").read_text())["iterations"]
    new = sorted(set(iters) - done_before, key=int)
    assert len(new) == PLANNED and trained() == set(new), (seed, kills, iters)  # none appended beyond the plan
    steps = 4 * EPOCHS
    for key in new:
        for path in (f"data/rollouts/{key}.parquet", f"data/scored/{key}.parquet"):
            rows = pq.read_table(root / path, columns=["prompt_id", "sample_index"]).to_pylist()
            pairs = {(r["prompt_id"], r["sample_index"]) for r in rows}
            assert len(rows) == len(pairs) == 32, (seed, kills, path)  # 8 prompts x 4: none lost, none twice
            assert {i for _, i in pairs} == set(range(4)) and len({p for p, _ in pairs}) == 8
        log = (host / f"logs/train/{key}.log").read_text()
        assert len(re.findall(rf"^train {key}: {steps} steps on", log, re.M)) == 1, (seed, kills, log[-2000:])
        assert json.loads((root / f"metrics/train/{key}.json").read_text())["optimizer_steps"] == steps
    ledger = [line.split(" ", 1)[1] for line in (host / ".burstrl/guard/ledger.log").read_text().splitlines()]
    armed = [line.split()[1] for line in ledger if line.startswith("armed ")]
    for session in armed:  # each session's limit was disarmed once: by itself, or by the next after a kill
        assert sum(line.startswith(f"disarmed {session} by ") for line in ledger) == 1, (seed, kills, ledger)
    assert not any(line.startswith("fired") for line in ledger) and not (host / ".burstrl/guard/guard.pid").exists()
    assert run(["dvc", "status", "--json"], root, ws["env"]).stdout.strip() in ("", "{}")
    assert "Running stage" not in run(["dvc", "repro"], root, ws["env"]).stdout


def test_no_secret_in_any_file_or_log(ws):
    places = [ws["root"], ws["pod"], ws["pod"].parent / "static-host"]
    assert OUTPUTS, "the sessions above ran"
    for text in OUTPUTS:
        assert API_KEY not in text and HUB_TOKEN not in text
    scanned = 0
    for place in places:
        for path in place.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                assert API_KEY.encode() not in data and HUB_TOKEN.encode() not in data, path
                scanned += 1
    assert scanned > 100 and (ws["root"] / "logs/train/001.log").is_file() and (ws["root"] / "dvc.lock").is_file()
