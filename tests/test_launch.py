"""burstrl.training.launch: the `accelerate launch` command for each strategy and how the global batch is split."""

import json
import sys

import pyarrow.parquet as pq
import pytest
import yaml
from accelerate.commands.launch import launch_command_parser
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
from conftest import clone, run

from burstrl.config import LaunchConfig, TrainConfig
from burstrl.errors import PARTIAL, ConfigError, ToolError
from burstrl.pipeline.stage import STATUS_FILE, Exit, stage
from burstrl.training.launch import command, per_device_batch, world_size

GPU = TrainConfig(device="cuda", precision="bf16")
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


@pytest.mark.parametrize(("strategy", "expected"), [
    ("ddp", {"ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_DYNAMO_BACKEND": "NO"}),
    ("fsdp", {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
              "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT", "FSDP_RESHARD_AFTER_FORWARD": "true"}),
    ("deepspeed_zero2", {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}),
    ("deepspeed_zero3", {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
                         "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true"}),
])
def test_accelerate_reads_each_command_line_as_intended(strategy, expected):
    """The command line through accelerate's own parser and the environment it would give every rank: what a
    typo in a flag, or a flag accelerate renamed, would silently change."""
    argv = command(LaunchConfig(processes=0, strategy=strategy), GPU, 8, ["stages/train.py", "001", "000"])
    assert argv[:3] == LAUNCHER
    args = launch_command_parser().parse_args(argv[3:])
    assert (args.num_processes, args.num_machines, args.mixed_precision) == (8, 1, "bf16")
    assert (args.training_script, args.training_script_args) == ("stages/train.py", ["001", "000"])
    assert (args.multi_gpu, args.use_fsdp, args.use_deepspeed) == (
        strategy == "ddp", strategy == "fsdp", strategy.startswith("deepspeed"))
    args.main_process_port = 0  # any free port: nothing listens, the environment is only built
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ""  # what accelerate's validation sets with no config file
        env = prepare_deepspeed_cmd_env(args)[1]
    else:
        env = prepare_multi_gpu_env(args)
    assert {key: env.get(key) for key in expected} == expected


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


def ends_with(monkeypatch, env: dict[str, str], raised: Exception) -> int:
    for key in ("WORLD_SIZE", "RANK", STATUS_FILE):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    metrics: dict = {}
    with pytest.raises(SystemExit) as done, stage("train", metrics):
        raise raised
    assert "seconds" not in metrics  # only a stage that finished has its time
    return done.value.code


def test_a_stage_ends_with_the_status_it_raises_and_a_rank_hands_it_to_the_launcher(monkeypatch, tmp_path, capsys):
    assert ends_with(monkeypatch, {}, Exit(PARTIAL, "train 003: stopped for the deadline")) == PARTIAL
    assert capsys.readouterr().err == "train 003: stopped for the deadline\n"
    assert ends_with(monkeypatch, {}, ToolError("llmcompressor is not installed")) == 1
    assert capsys.readouterr().err == "train: error: llmcompressor is not installed\n"
    # Under the launcher every rank exits 0 (it turns any other status into 1); rank 0 writes the status down.
    status = tmp_path / "status"
    rank = {"WORLD_SIZE": "2", STATUS_FILE: str(status)}
    assert ends_with(monkeypatch, {**rank, "RANK": "1"}, Exit(PARTIAL)) == 0
    assert not status.exists()
    assert ends_with(monkeypatch, {**rank, "RANK": "0"}, Exit(PARTIAL)) == 0
    assert status.read_text() == str(PARTIAL)


@pytest.mark.slow
def test_two_ranks_train_on_halves_and_report_every_row_like_one_process(scored, tmp_path):
    """Two CPU ranks (torchrun, DDP over gloo) through `dvc repro`: one log, every row reported in the table's
    order with the proximal logprobs one process computes, and the same start metrics; the steps differ
    (each rank shuffles its own half), so the trained weights are not compared."""
    results = {}
    for processes in (1, 2):
        root = tmp_path / f"p{processes}"
        env = clone(scored, root)
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
    for key in ("sampler_kl", "chi2", "is_ess", "log_ratio_abs_mean", "quantization_kl", "is_weight_mean",
                "is_weight_max", "is_clipped_fraction", "rows_kept"):
        assert two[key] == pytest.approx(one[key], abs=1e-5), key
    assert [(r["prompt_id"], r["sample_index"]) for r in two_rows] == [(r["prompt_id"], r["sample_index"])
                                                                         for r in one_rows]
    for a, b in zip(one_rows, two_rows, strict=True):
        assert b["proximal_logprobs"] == pytest.approx(a["proximal_logprobs"], abs=1e-5)
