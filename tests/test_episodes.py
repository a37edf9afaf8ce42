"""Multi-turn episodes through the real pipeline: `dvc repro` on the built-in tool task (conf/task/tools.yaml),
generate, score, train, eval and sync; a kill between episode turns; tools that fail in every way; episodes
sampled from a vLLM server.

The module's workspace bootstraps the tool task once and generates iteration 001 uninterrupted: the reference
the killed run must reproduce byte for byte, and the start of the full iteration.
"""

import json
import shutil
import socket
import subprocess
import sys
import time

import datasets
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import REPO, Workspace, clone, run
from test_serving import free_port, kill_tree, start_server, wait_for
from transformers import AutoTokenizer

from burstrl.config import load_config
from burstrl.data.contract import read_scored
from burstrl.data.policy import policy_name, read_metadata
from burstrl.env.chat import environment_spans
from burstrl.pipeline import workspace
from burstrl.training.trainer import RolloutGRPOTrainer, grpo_config

pytestmark = pytest.mark.slow


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def tools_params() -> dict:
    """The tool task's Hydra option, scaled down: 8 prompts x 4 episodes, a warm-up that calls the tool half the time.
    The context is longer than the task's, so that the fault test's error messages fit into its episodes."""
    task = yaml.safe_load((REPO / "conf/task/tools.yaml").read_text())
    return {**task, "task": {**task["task"], "heldout_size": 20}, "model": {"max_len": 192},
            "bootstrap": {"sft_steps": 240, "batch_size": 32, "tool_demos": 0.5},
            "generate": {**task["generate"], "prompts_per_iteration": 8, "num_generations": 4},
            "train": {"batch_size": 8}, "resume": {"shard_prompts": 2}}


@pytest.fixture(scope="module")
def tools_ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("episodes") / "ws"
    root.mkdir()
    env = workspace.scratch(root, tools_params())
    run(["dvc", "repro", "generate@001"], root, env)
    return Workspace(root, env)


def test_a_multi_turn_iteration_runs_through_every_stage(tools_ws, tmp_path):
    root = tmp_path / "ws"
    env = clone(tools_ws, root)
    run(["dvc", "repro", "eval@001", "sync@001"], root, env)
    rollouts = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(root / "checkpoints/000")
    episodes = [r for r in rollouts if r["tool_calls"]]
    assert episodes and any(r["num_turns"] == 3 for r in rollouts)
    for r in rollouts:
        # The sampler's logprobs sit exactly on the policy's tokens; the environment's have none.
        assert len(r["completion_mask"]) == len(r["completion_ids"]) == len(r["sampler_logprobs"])
        assert [lp is not None for lp in r["sampler_logprobs"]] == [m == 1 for m in r["completion_mask"]]
        messages = json.loads(r["completion_messages"])
        results = [m["content"] for m in messages if m["role"] == "tool"]
        calls = [c["function"]["arguments"] for m in messages for c in m.get("tool_calls") or []]
        # Every result is what add returned, and the tokens after each call are that result as rendered.
        assert results == [str(c["a"] + c["b"]) for c in calls[:len(results)]]
        spans = environment_spans(r["completion_ids"], r["completion_mask"])
        assert [tokenizer.decode(s) for s in spans] == [f"({result})|" for result in results]
    generated = json.loads((root / "metrics/generate/001.json").read_text())
    assert generated["tool_calls"] == sum(r["tool_calls"] for r in rollouts)
    evaluated = json.loads((root / "metrics/eval/001.json").read_text())
    assert {"tool_use_rate", "accuracy_with_tool", "accuracy_without_tool"} <= set(evaluated)
    assert json.loads((root / "data/sync/001.json").read_text())["policy_version"] == "001"
    assert_environment_tokens_carry_no_weight(root, tmp_path)


def assert_environment_tokens_carry_no_weight(root, tmp_path):
    """The loss and every gradient are the same whatever the sampler and reference logprobs say at the
    environment's tokens: only the policy's tokens are terms of the loss."""
    cfg = load_config(root / "params.yaml")
    scored = read_scored(root / "data/scored/001.parquet")
    rows = [{**r, "keep": True} for r in scored.to_pylist()]
    changed = []
    for r in rows:
        weird = [-7.5 if m == 0 else None for m in r["completion_mask"]]
        changed.append({**r, "ref_logprobs": [w if w is not None else v for w, v in zip(weird, r["ref_logprobs"],
                                                                                          strict=True)],
                        "sampler_logprobs": [-7.5 if v is None else v for v in r["sampler_logprobs"]]})
    assert changed != rows

    def loss_and_grads(inputs):
        torch.manual_seed(0)
        policy = root / "checkpoints/000"
        trainer = RolloutGRPOTrainer(
            model=str(policy), processing_class=AutoTokenizer.from_pretrained(policy),
            train=cfg.train, train_dataset=datasets.Dataset(scored),
            args=grpo_config(output_dir=str(tmp_path / "grad"), rollouts=len(rows), train=cfg.train, temperature=1.0,
                             max_completion_length=cfg.generate.max_tokens, num_generations=4, seed=0))
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        batch = trainer._generate_and_score_completions(inputs)
        assert batch["num_items_in_batch"].item() == sum(sum(r["completion_mask"]) for r in inputs)
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in trainer.model.parameters()]

    loss, grads = loss_and_grads(rows)
    changed_loss, changed_grads = loss_and_grads(changed)
    assert changed_loss == loss
    for grad, changed_grad in zip(grads, changed_grads, strict=True):
        assert torch.equal(grad, changed_grad)


def test_a_kill_between_episode_turns_resumes_to_the_same_bytes(tools_ws, tmp_path):
    root = tmp_path / "ws"
    env = clone(tools_ws, root)
    out = root / "data/rollouts/001.parquet"
    out.unlink()
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    del lock["stages"]["generate@001"]
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    # A shard plays at most env.max_turns = 4 turns, so the fifth lands inside a later shard, after one is saved.
    killed = run(["dvc", "repro", "--single-item", "--no-run-cache", "generate@001"], root,
                 {**env, "BURSTRL_KILL_AT": "episode_turn@5"}, check=False)
    assert killed.returncode != 0 and not out.exists()
    assert list((root / "build/resume/generate/001").glob("shard-*"))
    resumed = run(["dvc", "repro", "--no-run-cache", "generate@001"], root, env).stdout
    assert "shards saved by an interrupted run" in resumed
    assert out.read_bytes() == (tools_ws.root / "data/rollouts/001.parquet").read_bytes()


def test_tools_that_hang_raise_hog_dial_crash_or_return_objects_are_counted_errors(tools_ws, tmp_path):
    root = tmp_path / "ws"
    env = {**clone(tools_ws, root), "PYTHONPATH": str(REPO / "tests")}
    # The stage by hand, on params of its own: through dvc.yaml the changed env would make bootstrap run again.
    faulty = root / "faulty.yaml"
    shutil.copy(root / "params.yaml", faulty)
    workspace.merge_params(faulty, {"env": {"tools": ["toolbox_faults.add"],
                                            "sandbox": {"timeout_seconds": 1.0, "memory_mb": 256}},
                                    "generate": {"max_tokens": 176}})
    run(["python", "stages/generate.py", "001", "000", "--params", str(faulty)], root, env)
    rollouts = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    assert len(rollouts) == 8 * 4
    contents = [m["content"] for r in rollouts for m in json.loads(r["completion_messages"]) if m["role"] == "tool"]
    errors = [c for c in contents if c.startswith("error: ")]
    for expected in ("timed out after 1s", "RuntimeError: tool failed on purpose", "out of memory",
                     "socket.getaddrinfo refused", "the tool process died", "returned object, not text"):
        assert any(expected in e for e in errors), (expected, errors)
    metrics = json.loads((root / "metrics/generate/001.json").read_text())
    assert metrics["tool_errors"] == sum(r["tool_errors"] for r in rollouts) >= len(errors)
    assert metrics["sandbox_restarts"] >= 2


def test_episodes_from_a_vllm_server_are_the_offline_engines(tools_ws, tmp_path):
    """servers.policy: each turn of each episode is a request to `vllm serve`, with the same seed, so the rollouts
    are the offline engine's, row for row."""
    root = tmp_path / "ws"
    env = clone(tools_ws, root)
    proc, url = start_server(root, env, "--model", "checkpoints/000")
    try:
        wait_for(url, policy_name(read_metadata(root / "checkpoints/000")), proc)
        served = root / "served.yaml"
        shutil.copy(root / "params.yaml", served)
        workspace.merge_params(served, {"servers": {"policy": [url]}})
        run(["python", "stages/generate.py", "001", "000", "--params", str(served)], root, env)
    finally:
        kill_tree(proc)
    reference = pq.read_table(tools_ws.root / "data/rollouts/001.parquet").to_pylist()
    assert pq.read_table(root / "data/rollouts/001.parquet").to_pylist() == reference
    requests = json.loads((root / "metrics/generate/001.json").read_text())["servers"]["requests"][url]
    assert requests == sum(r["num_turns"] for r in reference)  # one request per episode and turn


def test_trl_openreward_adapter_runs_unchanged_against_a_server_on_loopback(tools_ws, tmp_path):
    """TRL's own environment adapter (trl.experimental.openreward), installed as it ships, as env.environment_factory:
    its tools come from the server, its (empty) reset text leaves each prompt as it was, its `finished` ends an
    episode and its `reward` attribute is the episode's env_reward; the server answered exactly the calls the rollouts
    record."""
    root = tmp_path / "ws"
    port, calls = free_port(), tmp_path / "ors-calls.jsonl"
    url = f"http://localhost:{port}"
    env = {**clone(tools_ws, root), "PYTHONPATH": str(REPO / "tests"), "BURSTRL_TEST_ORS_URL": url}
    server = subprocess.Popen([sys.executable, str(REPO / "tests/ors_adder.py"), str(port), str(calls)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not port_open(port):
            assert server.poll() is None and time.monotonic() < deadline, "the ORS server did not start"
            time.sleep(0.2)
        adapter = root / "adapter.yaml"
        shutil.copy(root / "params.yaml", adapter)
        workspace.merge_params(adapter, {"env": {"tools": [], "environment_factory": "ors_factory.factory",
                                                 "sandbox": {"network": True}}})
        run(["python", "stages/generate.py", "001", "000", "--params", str(adapter)], root, env)
    finally:
        server.kill()
        server.wait()
    rollouts = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    reference = pq.read_table(tools_ws.root / "data/rollouts/001.parquet").to_pylist()
    assert [r["prompt_ids"] for r in rollouts] == [r["prompt_ids"] for r in reference]
    answered = []
    for r in rollouts:
        messages = json.loads(r["completion_messages"])
        ran = [m for m in messages if m["role"] == "tool"]
        call = [m["tool_calls"][0]["function"]["arguments"] for m in messages if m.get("tool_calls")]
        if ran:  # the server's result, then the episode ended by `finished`, its reward the adapter's
            total = call[0]["a"] + call[0]["b"]
            assert len(ran) == 1 and ran[0]["content"] == str(total)
            assert r["finish_reason"] == "done" and r["env_reward"] == total and r["num_turns"] == 1
            answered.append({"a": call[0]["a"], "b": call[0]["b"]})
        else:
            assert r["env_reward"] is None and r["tool_calls"] == r["tool_errors"]  # no call, or a malformed one
    server_side = [json.loads(line) for line in calls.read_text().splitlines()]
    assert answered and sorted(server_side, key=json.dumps) == sorted(answered, key=json.dumps)
