"""`make rent-h200` against the strict RunPod stand-in (tests/runpod_standin.py): a refused API key, a pod that
never gets a port, terminate calls that fail once or for good, Ctrl-C while the create is in flight, SIGTERM and
SIGHUP at every step of the session, a second Ctrl-C during the teardown, and failures of the GPU check, the
arming of the limit, the push, the forwarding of secrets and the pull of the trained outputs. On every path the
pod is given back exactly once, or the session says loudly that it could not and leaves the pod's limit armed;
the forwarded secrets file is never left on the pod."""

import shutil
import signal
import subprocess

import pytest
from rent_harness import (
    assert_no_secret,
    finish,
    rent,
    rent_params,
    rent_workspace,
    start,
    wait_for,
)

pytestmark = pytest.mark.slow
# The session's steps, each a pause point `rent_<step>` (burstrl.remote.rent.Session.run).
STEPS = ["create", "connect", "arm", "prepare", "push", "setup", "check", "secrets", "train"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory, ssh_server, scored):
    yield from rent_workspace(tmp_path_factory, ssh_server, scored)


def given_back_once(ws, out: str) -> str:
    """The session's pod was terminated by exactly one call that took effect, and no secret is left on it."""
    standin = ws["standin"]
    pod_id = standin.created()[-1]
    assert len(standin.terminations(pod_id)) == 1, standin.calls
    assert pod_id not in standin.running()
    assert f"pod {pod_id} terminated" in out and "session over" in out
    assert not ws["secrets"].exists()
    assert not (ws["pod"] / ".burstrl/guard/guard.pid").exists()  # the limit was disarmed
    return pod_id


def paused(ws, point: str, params: str, env: dict | None = None) -> tuple[subprocess.Popen, object]:
    """A session paused at pause point `point`: returns it and the flag file whose deletion resumes it."""
    flag = ws["root"] / f"paused-{point}"
    flag.unlink(missing_ok=True)
    proc = start(ws, params, env={"BURSTRL_PAUSE_AT": f"{point}:{flag}", **(env or {})})
    wait_for(lambda: flag.exists() or proc.poll() is not None, 180, f"the session to reach {point}")
    assert proc.poll() is None, proc.communicate()
    return proc, flag


def test_a_wrong_or_missing_api_key_rents_nothing(ws, tmp_path):
    calls = len(ws["standin"].calls)
    code, _, err = rent(ws, rent_params(ws, "badkey"), env={"RUNPOD_API_KEY": "rpa_not-the-key"})
    assert code == 1
    assert "rent: error: RunPod refused the API key in RUNPOD_API_KEY: Unauthorized request" in err
    assert [c[3] for c in ws["standin"].calls[calls:]] == ["unauthorized"]

    nowhere = tmp_path / "runpod-api-key"
    code, _, err = rent(ws, rent_params(ws, "nokey", runpod={"api_key_file": str(nowhere)}),
                        env={"RUNPOD_API_KEY": ""})
    assert code == 1
    assert f"rent: error: no RunPod API key: set RUNPOD_API_KEY or write it to {nowhere}" in err
    assert len(ws["standin"].calls) == calls + 1  # the refused key's one call: nothing was rented


def test_a_pod_that_never_gets_a_port_is_given_back(ws):
    ws["standin"].never_ports = True
    try:
        code, out, err = rent(ws, rent_params(ws, "noport"))
    finally:
        ws["standin"].never_ports = False
    pod_id = given_back_once(ws, out)
    assert code == 1
    assert f"rent: error: pod {pod_id} got no public SSH port within 5s" in err
    reads = [c for c in ws["standin"].calls if c[0] == "get" and c[1] == pod_id]
    assert len(reads) >= 3  # pending (no runtime), then up without ports, until the timeout


def test_a_failed_gpu_check_and_a_terminate_that_fails_once(ws):
    ws["standin"].inject("terminate", "fail")
    code, out, err = rent(ws, rent_params(ws, "gpu", check_command="echo no GPU >&2; exit 4"))
    pod_id = given_back_once(ws, out)
    assert code == 1
    assert "GPU check failed on" in err and "(exit 4)" in err and "no GPU" in err
    assert [c[3] for c in ws["standin"].calls if c[0] == "terminate" and c[1] == pod_id] == ["fail", "ok"]
    assert f"RunPod terminate pod {pod_id} failed" in err


def test_a_terminate_that_fails_for_good_is_reported_and_the_limit_stays_armed(ws):
    ws["standin"].inject("terminate", "fail", "fail", "fail")
    code, out, err = rent(ws, rent_params(ws, "stuck"), env={"BURSTRL_KILL_AT": "optimizer_step@1"})
    standin, guard = ws["standin"], ws["pod"] / ".burstrl/guard"
    pod_id = standin.created()[-1]
    try:
        assert code == 1
        assert f"rent: COULD NOT GIVE BACK {pod_id}: terminate it by hand (`make reap`)" in err
        assert [c[3] for c in standin.calls if c[0] == "terminate" and c[1] == pod_id] == ["fail"] * 3
        assert pod_id in standin.running()
        assert (guard / "guard.pid").is_file()  # the pod's own limit still ends it
        assert "forwarded HF_TOKEN" in out and not ws["secrets"].exists()
    finally:  # what `make reap` and the limit would do, now, so nothing outlives the test
        subprocess.run(f"cd {guard} && kill -- -$(cat guard.pid); rm -f guard.pid", shell=True)
        code, out, _ = rent(ws, rent_params(ws, "reap-stuck"), "reap")
    assert code == 0 and f"reaped 1 machine(s) this project started: {pod_id}" in out


def test_ctrl_c_while_the_create_is_in_flight_gives_back_the_pod_it_made(ws):
    ws["standin"].inject("create", "hang")
    before = len(ws["standin"].created())
    proc = start(ws, rent_params(ws, "inflight"))
    wait_for(lambda: len(ws["standin"].created()) > before, 60, "the create call")
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(ws, proc)
    assert code == 130
    assert "interrupted: giving the machine back" in err
    given_back_once(ws, out)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("step", STEPS)
def test_a_signal_at_each_step_gives_the_pod_back(ws, step, signum):
    before = len(ws["standin"].created())
    proc, flag = paused(ws, f"rent_{step}", rent_params(ws, f"signal-{step}"))
    proc.send_signal(signum)
    code, out, err = finish(ws, proc)
    flag.unlink(missing_ok=True)
    assert code == 130, err[-2000:]
    assert "interrupted: giving the machine back" in err
    if step == "create":  # nothing rented yet, nothing to give back
        assert len(ws["standin"].created()) == before and "session over" in out
    else:
        given_back_once(ws, out)


def test_a_second_ctrl_c_during_the_teardown_does_not_cut_it_short(ws):
    standin = ws["standin"]
    standin.hang_seconds = 4.0  # a slow answer, inside the SDK's timeout
    standin.inject("terminate", "hang")
    try:
        proc, flag = paused(ws, "rent_setup", rent_params(ws, "twice"))
        pod_id = standin.created()[-1]
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: any(c[0] == "terminate" and c[1] == pod_id for c in standin.calls), 60, "the teardown")
        proc.send_signal(signal.SIGINT)
        code, out, err = finish(ws, proc)
        flag.unlink(missing_ok=True)
    finally:
        standin.hang_seconds = 40.0
    assert code == 130
    assert given_back_once(ws, out) == pod_id
    assert err.count("interrupted: giving the machine back") == 1


def test_a_limit_that_cannot_be_armed_gives_the_pod_back(ws):
    blocker = ws["pod"].parent / f"{ws['pod'].name}-blocker"
    blocker.write_text("a file where the workspace's parent should be")
    code, out, err = rent(ws, rent_params(ws, "arm", runpod={"dir": str(blocker / "pod")}))
    given_back_once(ws, out)
    assert code == 1 and "rent: error: could not arm the time limit on" in err


def test_a_failed_push_gives_the_pod_back(ws):
    # A non-empty directory where a tracked file goes: rsync cannot make way for it.
    in_the_way = ws["pod"] / "dvc.yaml"
    code, out, err = rent(ws, rent_params(ws, "push", prepare_command=f"rm -f {in_the_way}; mkdir -p {in_the_way}/x"))
    shutil.rmtree(in_the_way)
    given_back_once(ws, out)
    assert code == 1 and "rent: error: rsync ./ ->" in err and "could not make way for new regular file" in err


def test_a_failed_secret_forwarding_gives_the_pod_back(ws):
    blocker = ws["pod"].parent / f"{ws['pod'].name}-secrets-blocker"
    blocker.write_text("a file where the secrets' directory should be")
    code, out, err = rent(ws, rent_params(ws, "forward", secrets_file=str(blocker / "secrets.env")))
    given_back_once(ws, out)
    assert code == 1 and "rent: error: could not write the forwarded environment on" in err


def test_a_failed_pull_of_the_trained_outputs_gives_the_pod_back_and_keeps_home_as_it_was(ws):
    root = ws["root"]
    proc, flag = paused(ws, "train_pull", rent_params(ws, "pull"))
    shutil.rmtree(ws["pod"] / "checkpoints/001")  # what the pull would bring home is gone
    flag.unlink()
    code, out, err = finish(ws, proc)
    given_back_once(ws, out)
    assert code == 1
    assert "train: error: rsync" in out + err and "train@001 failed" in err
    assert not (root / "checkpoints/001").exists() and (root / "data/scored/001.parquet").is_file()


def test_no_secret_in_any_file_or_log(ws):
    assert_no_secret(ws, [ws["root"], ws["pod"]])
