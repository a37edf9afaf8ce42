"""burstrl.launch: the `accelerate launch` command for each strategy and how the global batch is split."""

import sys

import pytest

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


def test_cpu_ranks_use_the_cpu_launcher_in_fp32():
    cpu = command(LaunchConfig(processes=2), TrainConfig(), 2, ["s.py"])
    assert cpu[cpu.index("--mixed_precision"):] == ["--mixed_precision", "no", "--cpu", "s.py"]


def test_world_size_and_the_global_batch():
    assert world_size(LaunchConfig(processes=0), 8) == 8
    assert world_size(LaunchConfig(processes=2), 8) == 2
    with pytest.raises(ConfigError, match="no GPU is visible"):
        world_size(LaunchConfig(processes=0), 0)
    assert per_device_batch(256, 8) == 32
    with pytest.raises(ConfigError, match="train.batch_size=256 must divide evenly over 3"):
        per_device_batch(256, 3)
