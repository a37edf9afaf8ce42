"""Killed runs lose nothing: each stage is SIGKILLed at a named point (burstrl.pipeline.faults), `dvc repro` runs again,
and the result equals that of an uninterrupted run of the same workspace.

The workspace, a clone of the session's bootstrapped one, runs iteration 001 once uninterrupted (the reference).
Each test then forces one stage to run again with BURSTRL_KILL_AT set, checks what the kill left (shards,
checkpoints, `burstrl status`), runs a plain `dvc repro`, and compares with the reference: the same rollout rows
(no duplicate, none missing), the same scores, the same losses step by step and weights within TOLERANCE.
"""

import datetime
import json
import os
import time

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import clone, run
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

# Resumed training replays the same batch slices with the restored optimizer and RNG states; on CPU the
# arithmetic is the same, so the weights agree to float32 round-off at most.
TOLERANCE = 1e-6
STEPS = 8  # 16 prompts x 4 completions / batch 8
PARAMS = {
    "generate": {"prompts_per_iteration": 16},
    "train": {"learning_rate": 3e-4},
    "resume": {"shard_prompts": 4, "checkpoint_every_steps": 2, "checkpoint_every_minutes": 0},
}


def ran_stages(output: str) -> list[str]:
    return sorted(line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage"))


@pytest.fixture(scope="module")
def ws(tmp_path_factory, ssh_server, bootstrapped):
    root = tmp_path_factory.mktemp("resume") / "ws"
    remote = root / "remote"
    env = clone(bootstrapped, root, {**PARAMS, "sync": {"targets": [f"{ssh_server['user']}@127.0.0.1:{remote}"]}})
    env = {**env, "RSYNC_RSH": ssh_server["rsh"]}
    run(["dvc", "repro"], root, env)
    reference = {
        "rollouts": pq.read_table(root / "data/rollouts/001.parquet"),
        "scored": pq.read_table(root / "data/scored/001.parquet"),
        "weights": load_file(root / "checkpoints/001/model.safetensors"),
        "loss": (root / "dvclive/train/001/plots/metrics/loss.tsv").read_text(),
    }
    return root, env, remote, reference


def kill(ws, stage: str, point: str) -> None:
    """Run `stage` as if it had never completed (its dvc.lock entry dropped) and SIGKILL it at `point`."""
    root, env, _, _ = ws
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    del lock["stages"][stage]
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    done = run(["dvc", "repro", "--single-item", "--no-run-cache", stage], root, {**env, "BURSTRL_KILL_AT": point},
               check=False)
    assert done.returncode != 0
    assert f"BURSTRL_KILL_AT={point}: SIGKILL at" in done.stdout + done.stderr


def status(root, env) -> dict[str, dict]:
    rows = json.loads(run(["python", "-m", "burstrl", "status", "--json"], root, env).stdout)
    return {row["iteration"]: row for row in rows}


def repro(ws) -> str:
    """`dvc repro`, without DVC's run cache: it holds the reference run, whose outputs DVC would restore
    instead of letting the interrupted stage resume."""
    root, env, _, _ = ws
    return run(["dvc", "repro", "--no-run-cache"], root, env).stdout


def identities(table) -> list[tuple]:
    return sorted(zip(table["prompt_id"].to_pylist(), table["sample_index"].to_pylist(), table["seed"].to_pylist(),
                      strict=True))


def losses(tsv: str) -> list[tuple[int, float]]:
    """(step, loss) from DVCLive's loss.tsv: a header, then one `step<TAB>loss` line per logged step."""
    return [(int(step), float(loss)) for step, loss in (line.split("\t")[:2] for line in tsv.splitlines()[1:])]


def assert_weights_match(root, reference):
    resumed = load_file(root / "checkpoints/001/model.safetensors")
    assert resumed.keys() == reference.keys()
    assert max((resumed[k] - reference[k]).abs().max().item() for k in reference) <= TOLERANCE


def test_kill_during_engine_start(ws):
    root, env, _, reference = ws
    kill(ws, "generate@001", "engine_start+3")  # 3 s into vLLM's start, which takes longer on CPU
    assert not (root / "data/rollouts/001.parquet").exists()
    assert status(root, env)["001"]["generate"] == "partial (started, no shard yet)"
    out = repro(ws)
    # Regenerated rollouts are byte-identical to the reference, so DVC re-runs nothing downstream of them
    # (the report re-runs for the new timing in metrics/generate).
    assert ran_stages(out) == ["generate@001", "report"]
    assert pq.read_table(root / "data/rollouts/001.parquet").equals(reference["rollouts"])


def test_kill_mid_shard_keeps_finished_shards(ws):
    root, env, _, reference = ws
    kill(ws, "generate@001", "generate_shard@3")  # shards 1 and 2 saved, the third sampled but not written
    assert sorted(p.name for p in (root / "build/resume/generate/001").glob("shard-*")) == [
        "shard-00000-of-00004.parquet", "shard-00001-of-00004.parquet"]
    assert status(root, env)["001"]["generate"] == "partial (2/4 shards)"
    out = repro(ws)
    assert "resuming: 2/4 shards saved by an interrupted run" in out
    assert ran_stages(out) == ["generate@001", "report"]
    rollouts = pq.read_table(root / "data/rollouts/001.parquet")
    assert identities(rollouts) == identities(reference["rollouts"])
    assert len(set(identities(rollouts))) == 16 * 4
    assert rollouts.equals(reference["rollouts"])
    assert json.loads((root / "metrics/generate/001.json").read_text())["shards_resumed"] == 2
    assert not (root / "build/resume/generate/001").exists()


def test_kill_mid_score_shard(ws):
    root, env, _, reference = ws
    kill(ws, "score@001", "score_shard@2")
    assert status(root, env)["001"]["score"] == "partial (1/4 shards)"
    out = repro(ws)
    assert "resuming: 1/4 reference shards" in out
    assert ran_stages(out) == ["report", "score@001"]
    assert pq.read_table(root / "data/scored/001.parquet").equals(reference["scored"])


def test_kill_mid_optimizer_step_resumes_from_last_checkpoint(ws):
    root, env, _, reference = ws
    kill(ws, "train@001", "optimizer_step@5")  # step 5's gradients computed; checkpoints at steps 2 and 4
    assert status(root, env)["001"]["train"] == f"partial (step 4/{STEPS})"
    out = repro(ws)
    assert "train@001" in ran_stages(out) and "score@001" not in ran_stages(out)
    assert "resuming from build/resume/train/001/checkpoint-4 (step 4)" in out
    metrics = json.loads((root / "metrics/train/001.json").read_text())
    assert (metrics["resumed_from_step"], metrics["optimizer_steps"]) == (4, STEPS)
    resumed = losses((root / "dvclive/train/001/plots/metrics/loss.tsv").read_text())
    assert [step for step, _ in resumed] == list(range(1, STEPS + 1))
    # Steps 1-4 were logged before the kill, 5-8 after the resume: each step's loss is the uninterrupted run's.
    assert resumed == [(step, pytest.approx(loss, rel=1e-5, abs=1e-7)) for step, loss in losses(reference["loss"])]
    assert_weights_match(root, reference["weights"])


def test_kill_while_a_checkpoint_is_written(ws):
    root, env, _, reference = ws
    kill(ws, "train@001", "checkpoint_write@2")  # checkpoint-4's files written, not yet marked complete
    work = root / "build/resume/train/001"
    assert (work / "checkpoint-4").is_dir() and not (work / "checkpoint-4/burstrl-complete.json").exists()
    assert status(root, env)["001"]["train"] == f"partial (step 2/{STEPS})"
    out = repro(ws)
    assert "discarded build/resume/train/001/checkpoint-4, which a kill interrupted" in out
    assert "(step 2)" in out
    assert json.loads((root / "metrics/train/001.json").read_text())["resumed_from_step"] == 2
    assert_weights_match(root, reference["weights"])


def test_kill_during_sync_never_publishes_half_a_model(ws):
    root, env, remote, _ = ws
    for path in sorted(remote.rglob("*"), reverse=True):  # a fresh inference box
        path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
    kill(ws, "sync@001", "sync_transfer")
    assert any((remote / ".incoming").iterdir()) and not (remote / "current").exists()
    assert ran_stages(repro(ws)) == ["report", "sync@001"]
    meta = json.loads((root / "checkpoints/001/burstrl.json").read_text())
    assert os.readlink(remote / "current") == f"001-{meta['content_hash'][:12]}"
    weights = (root / "checkpoints/001/model.safetensors").read_bytes()
    assert (remote / "current/model.safetensors").read_bytes() == weights
    assert not any((remote / ".incoming").iterdir())
    states = [state for row in status(root, env).values() for key, state in row.items() if key != "iteration"]
    assert set(states) == {"done"}


def test_deadline_stops_training_with_a_checkpoint_and_a_rerun_completes_it(ws, tmp_path):
    root, env, _, _ = ws
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["epochs"] = 400  # 3200 steps, about 80 s here: far longer than the 30 s the deadline leaves
    params["resume"].update({"checkpoint_every_steps": 0, "deadline_margin_seconds": 5})
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(params))
    cmd = ["python", "stages/train.py", "001", "000", "--params", str(tmp_path / "long.yaml")]
    deadline = time.time() + 30
    at = datetime.datetime.fromtimestamp(deadline).astimezone().isoformat()
    done = run(cmd, root, {**env, "BURSTRL_DEADLINE": at}, check=False)
    assert done.returncode == 75, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    saved = sorted((root / "build/resume/train/001").glob("checkpoint-*/burstrl-complete.json"))
    assert len(saved) == 1
    # What the deadline promises is a finished checkpoint before it, not when the process is gone.
    assert saved[0].stat().st_mtime < deadline
    step = json.loads(saved[0].read_text())["step"]
    assert 0 < step < 3200
    assert f"stopped for the deadline after step {step}/3200" in done.stderr
    run(cmd, root, env)
    metrics = json.loads((root / "metrics/train/001.json").read_text())
    assert (metrics["resumed_from_step"], metrics["optimizer_steps"]) == (step, 3200)
