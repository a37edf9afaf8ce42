"""burstrl.launch: the `accelerate launch` command for each strategy and how the global batch is split."""

import json
import sys

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import copy_of, run

from burstrl.config import ConfigError, LaunchConfig, TrainConfig
from burstrl.launch import command, per_device_batch, world_size

GPU = TrainConfig(device="cuda", bf16=True)
LAUNCHER = [sys.executable, "-m", "accelerate.commands.launch"]


def test_ddp_on_eight_gpus():
    assert command(LaunchConfig(processes=0, strategy="ddp"), GPU, 8, ["stages/train.py", "001", "000"]) == [
        *LAUNCHER, "--num_processes", "8", "--num_machines", "1", "--dynamo_backend", "no",
        "--mixed_precision", "bf16", "--multi_gpu", "stages/train.py", "001", "000"]


def test_fsdp_and_zero3_flags_gather_full_weights_for_saving():
    fsdp = command(LaunchConfig(strategy="fsdp"), GPU, 8, ["s.py"])
    assert fsdp[fsdp.index("--use_fsdp"):] == ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy",
                                               "TRANSFORMER_BASED_WRAP", "--fsdp_state_dict_type", "FULL_STATE_DICT",
                                               "--fsdp_reshard_after_forward", "true", "s.py"]
    zero3 = command(LaunchConfig(strategy="deepspeed_zero3"), GPU, 2, ["s.py"])
    assert zero3[-6:] == ["--use_deepspeed", "--zero_stage", "3", "--zero3_save_16bit_model", "true", "s.py"]
    assert "--multi_gpu" not in fsdp + zero3


def test_cpu_ranks_run_under_torchrun_with_ddp_only():
    assert command(LaunchConfig(processes=2), TrainConfig(), 2, ["s.py"]) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "s.py"]
    with pytest.raises(ConfigError, match="needs GPUs"):
        command(LaunchConfig(processes=2, strategy="fsdp"), TrainConfig(), 2, ["s.py"])


def test_world_size_and_the_global_batch():
    assert world_size(LaunchConfig(processes=0), 8) == 8
    assert world_size(LaunchConfig(processes=2), 8) == 2
    with pytest.raises(ConfigError, match="no GPU is visible"):
        world_size(LaunchConfig(processes=0), 0)
    assert per_device_batch(256, 8) == 32
    with pytest.raises(ConfigError, match="train.batch_size=256 must divide evenly over 3"):
        per_device_batch(256, 3)


@pytest.mark.slow
def test_two_ranks_train_on_halves_and_report_every_row_like_one_process(scored, tmp_path):
    """Two CPU ranks (torchrun, DDP over gloo) through `dvc repro`: one log, every row reported in the table's
    order with the proximal logprobs one process computes, and the same start metrics; the steps differ
    (each rank shuffles its own half), so the trained weights are not compared."""
    results = {}
    for processes in (1, 2):
        root = tmp_path / f"p{processes}"
        env = copy_of(scored, root)
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["launch"]["processes"] = processes
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        out = run(["dvc", "repro", "train@001"], root, env).stdout
        assert ("train: 2 processes (ddp)" in out) == (processes == 2)
        log = (root / "logs/train/001.log").read_text()
        assert log.count("train 001: 100 steps on 32/32 rows") == 1
        assert run(["dvc", "status", "train@001"], root, env).stdout.strip() == "Data and pipelines are up to date."
        results[processes] = (json.loads((root / "metrics/train/001.json").read_text()),
                              pq.read_table(root / "data/weights/001.parquet").to_pylist())
    (one, one_rows), (two, two_rows) = results[1], results[2]
    assert two["optimizer_steps"] == one["optimizer_steps"] == 100
    for key in ("sampler_kl", "is_weight_mean", "is_weight_max", "is_clipped_fraction", "rows_kept"):
        assert two[key] == pytest.approx(one[key], abs=1e-5), key
    assert [(r["prompt_id"], r["sample_index"]) for r in two_rows] == [(r["prompt_id"], r["sample_index"])
                                                                         for r in one_rows]
    for a, b in zip(one_rows, two_rows, strict=True):
        assert b["proximal_logprobs"] == pytest.approx(a["proximal_logprobs"], abs=1e-5)
