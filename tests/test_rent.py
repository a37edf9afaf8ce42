"""`make rent-h200` end to end: the RunPod provider against a stand-in of its API on loopback, the machine
being this host's real sshd; each injected failure ends with the pod terminated exactly once and a non-zero
exit; the on-pod limit fires with this side gone; the static provider runs the whole burst; no secret leaks."""

import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import run
from rent_harness import (
    assert_no_secret,
    assert_terminated_once,
    finish,
    rent,
    rent_params,
    rent_workspace,
    start,
    training_started,
    wait_for,
)

pytestmark = pytest.mark.slow

EPOCHS = 5


@pytest.fixture(scope="module")
def ws(tmp_path_factory, ssh_server, scored):
    yield from rent_workspace(tmp_path_factory, ssh_server, scored)


def test_a_failed_create_terminates_the_pod_it_made(ws):
    ws["standin"].inject("create", "fail")  # RunPod made the pod, but its answer was lost
    code, out, err = rent(ws, rent_params(ws, "create"))
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
    code, out, err = finish(ws, proc)
    assert code == 1
    assert "lost the SSH connection to" in out and "ssh ended by SIGKILL" in out
    assert_terminated_once(ws, out)


def test_ctrl_c_terminates_the_pod(ws):
    proc = start(ws, rent_params(ws, "ctrlc"))
    wait_for(lambda: training_started(ws), what="training on the pod")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends its foreground group
    code, out, err = finish(ws, proc)
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
    finish(ws, proc)
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
        ws["outputs"].extend([out, err])
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
    assert_no_secret(ws, [ws["root"], ws["pod"], ws["pod"].parent / "static-host"])
    assert (ws["root"] / "logs/train/001.log").is_file()
