"""How the train stage's processes start: in the stage's own process, or one per GPU via `accelerate launch`.

With launch.processes other than 1, `stages/train.py` runs its own command again under `accelerate launch`
as a child (so its log and its reaper cover every rank) and exits with the ranks' status; each rank knows
it is one by the WORLD_SIZE that the launcher sets. The strategy picks how ranks share the model:
  - ddp: a full replica per GPU, gradients all-reduced; the fastest when the model, its gradients and Adam
    state fit on one GPU (everything up to 1B parameters on an H200);
  - fsdp: FSDP2, parameters, gradients and optimizer state sharded per decoder layer; full weights are
    gathered for saving, so checkpoints load anywhere;
  - deepspeed_zero2 / deepspeed_zero3: the same through DeepSpeed (installed separately: `pip install deepspeed`).
train.batch_size stays the global batch: each rank takes batch_size / processes rows per step.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from burstrl.config import LaunchConfig, TrainConfig
from burstrl.errors import ConfigError
from burstrl.pipeline.stage import STATUS_FILE, launched

STRATEGY_FLAGS = {
    "ddp": [],
    "fsdp": ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
             "--fsdp_state_dict_type", "FULL_STATE_DICT", "--fsdp_reshard_after_forward", "true"],
    "deepspeed_zero2": ["--use_deepspeed", "--zero_stage", "2"],
    "deepspeed_zero3": ["--use_deepspeed", "--zero_stage", "3", "--zero3_save_16bit_model", "true"],
}


def world_size(launch: LaunchConfig, visible_gpus: int) -> int:
    if launch.processes:
        return launch.processes
    if visible_gpus < 1:
        raise ConfigError("launch.processes is 0 (one per GPU) but no GPU is visible")
    return visible_gpus


def per_device_batch(batch_size: int, processes: int) -> int:
    if batch_size % processes:
        raise ConfigError(f"train.batch_size={batch_size} must divide evenly over {processes} training processes")
    return batch_size // processes


def command(launch: LaunchConfig, train: TrainConfig, processes: int, script: list[str]) -> list[str]:
    """The command line that runs `script` (argv) as `processes` ranks on this host: `accelerate launch` on
    GPUs; torchrun on CPU (DDP over gloo, for tests), where `accelerate launch` would start a single process."""
    if train.device == "cpu":
        if launch.strategy != "ddp":
            raise ConfigError(f"launch.strategy={launch.strategy} needs GPUs; on CPU several processes use ddp")
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                *script]
    flags = ["--num_processes", str(processes), "--num_machines", "1", "--dynamo_backend", "no",
             "--mixed_precision", {"fp32": "no"}.get(train.precision, train.precision)]
    if launch.strategy == "ddp":
        flags.append("--multi_gpu")
    return [sys.executable, "-m", "accelerate.commands.launch", *flags, *STRATEGY_FLAGS[launch.strategy], *script]


def run_ranks(launch: LaunchConfig, train: TrainConfig, env: dict[str, str]) -> int | None:
    """Run this stage's command as several ranks under `accelerate launch` and return the status the stage
    should exit with; None when one process is asked for (then the caller trains itself)."""
    if launched() or launch.processes == 1:
        return None
    import torch

    processes = world_size(launch, torch.cuda.device_count() if train.device != "cpu" else 0)
    if processes == 1:
        return None
    per_device_batch(train.batch_size, processes)
    if launch.strategy.startswith("deepspeed"):
        try:
            import deepspeed  # noqa: F401
        except ImportError as err:
            raise ConfigError(f"launch.strategy={launch.strategy} needs DeepSpeed: pip install deepspeed") from err
    argv = command(launch, train, processes, [sys.argv[0], *sys.argv[1:]])
    print(f"train: {processes} processes ({launch.strategy}): {' '.join(argv[1:])}", flush=True)
    # The launcher turns any rank's non-zero exit into its own 1, so rank 0 leaves the stage's status in a file.
    with tempfile.TemporaryDirectory() as tmp:
        status = Path(tmp) / "status"
        code = subprocess.call(argv, env={**os.environ, **env, STATUS_FILE: str(status)})
        return int(status.read_text()) if code == 0 and status.is_file() else code
