"""The benchmark's own parts: stage processes told apart and measured, rollouts tiled into valid larger
batches, ratios and target verdicts from hand-computed figures, scratch params merged."""

import os
import sys

import pyarrow as pa
import pytest
import yaml

from bench.__main__ import ratios, verdicts
from bench.pipeline import tiled
from bench.watch import stage_key, watch
from burstrl.config import PlanningConfig
from burstrl.pipeline import workspace
from burstrl.remote.estimate import strategies, transfer_minutes


@pytest.mark.parametrize(("cmdline", "key"), [
    (["python", "stages/generate.py", "001", "000"], "generate 001 000"),
    (["/usr/bin/python3", "stages/score.py", "001", "--params", "scaled.yaml"], "score 001"),
    (["python", "stages/train.py", "002", "--params", "p.yaml", "001"], "train 002 001"),
    (["python", "-m", "vllm.entrypoints"], None),
    (["tee", "logs/generate.log"], None),
])
def test_stage_key_from_the_command_line(cmdline, key):
    assert stage_key(cmdline) == key


def test_watch_measures_a_stage_tree_and_fails_loudly(tmp_path):
    (tmp_path / "stages").mkdir()
    # The stage holds 200 MB in a child process: a stage's peak counts its whole process tree.
    (tmp_path / "stages/hold.py").write_text(
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import time; b = bytearray(200 << 20); time.sleep(1.0)'])\n")
    (tmp_path / "stages/fail.py").write_text("print('bad row 3'); raise SystemExit(3)\n")
    watched = watch([sys.executable, "stages/hold.py", "001"], tmp_path, os.environ)
    run = watched.stages["hold 001"]
    assert run.peak_rss > 200 << 20
    assert 0.9 < run.seconds <= watched.wall
    with pytest.raises(RuntimeError, match=r"(?s)failed \(3\).*bad row 3"):
        watch([sys.executable, "stages/fail.py"], tmp_path, os.environ)


def test_tiled_rollouts_get_new_prompt_ids_and_keep_their_rows():
    table = pa.table({"prompt_id": pa.array([0, 0, 2, 2], pa.int64()), "completion_ids": [[1], [2, 3], [4], [5]]})
    big = tiled(table, 3)
    # span = max id + 1 = 3: copy k shifts every id by 3 k.
    assert big["prompt_id"].to_pylist() == [0, 0, 2, 2, 3, 3, 5, 5, 6, 6, 8, 8]
    assert big["completion_ids"].to_pylist() == [[1], [2, 3], [4], [5]] * 3


def result(**changes) -> dict:
    r = {
        "generation": {"stage": {"tokens_per_second": 300.0}, "hf_generate": {"tokens_per_second": 150.0},
                       "raw_vllm": {"tokens_per_second": 400.0, "engine_start_seconds": 3.0},
                       "raw_vllm_other_engine_process": {"engine_start_seconds": 24.0}},
        "training": {"stage": {"update_seconds": 12.0, "stage_seconds": 20.0}, "floor": {"seconds": 10.0},
                     "colocated_trl": {"seconds": 40.0}},
        "sync": {"stage_transfer_seconds": 0.3, "plain_rsync_seconds": 0.2},
        "overhead": {"share": 0.04},
    }
    r.update(changes)
    return r


def test_ratios_and_verdicts_from_hand_computed_figures():
    memory = {"peak_rss": {1: {"score": 1000, "train": 2000}, 4: {"score": 1100, "train": 2000},
                           16: {"score": 1000, "train": 2400}},
              "rss_bytes_per_rollout_byte": {"score": 0, "train": 0.5}}
    tiny, mid = ratios(result(memory=memory)), ratios(result())
    assert mid == pytest.approx({"generate_vs_hf": 2.0, "generate_vs_raw_vllm": 0.75, "engine_start_vs_other": 0.125,
                                 "train_vs_floor": 1.2,
                                 "train_vs_trl": 0.3, "train_stage_vs_trl": 0.5, "sync_vs_rsync": 1.5,
                                 "overhead_share": 0.04})
    assert (tiny["rss_4x"], tiny["rss_16x"]) == pytest.approx((1.1, 1.2))  # the worse of score and train
    assert tiny["rss_per_rollout_byte"] == 0.5
    met = {(name, size): ok for name, size, _, _, ok in verdicts({"tiny": {"ratios": tiny}, "30m": {"ratios": mid}})}
    assert met == {
        ("generate vs HF generate (tokens/s)", "30m"): True,
        ("generate vs raw vLLM (tokens/s)", "30m"): False,
        ("train update vs floor (time)", "30m"): True,
        ("train update vs colocated TRL (time)", "30m"): True,
        ("peak RSS 16x vs 1x (score, train)", "tiny"): False,
        ("pipeline overhead (share of wall)", "tiny"): True,
    }


def test_scratch_merges_sections_and_replaces_scalars(tmp_path):
    env = workspace.scratch(tmp_path, {"seed": 3, "generate": {"max_tokens": 9}}, {"HF_HUB_OFFLINE": "0"})
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    base = yaml.safe_load((workspace.REPO / "params.yaml").read_text())
    assert params["seed"] == 3
    assert params["generate"] == {**base["generate"], "max_tokens": 9}
    assert env["HF_HUB_OFFLINE"] == "0" and env["DVC_NO_ANALYTICS"] == "1"
    assert (tmp_path / ".git").is_dir()
    assert (tmp_path / "dvc.yaml").read_bytes() == (workspace.REPO / "dvc.yaml").read_bytes()


def test_the_session_cost_model_from_hand_computed_stage_times():
    p = PlanningConfig(session_hours=10, generate_minutes=20, score_minutes=4, eval_minutes=3, sync_minutes=5,
                       train_minutes=15, setup_minutes=15, teardown_minutes=1, checkpoint_gb=0, rollouts_gb=0)
    burst, lag0, lag1 = strategies(p, train_usd=4.0, inference_usd=0.0)
    # A burst: home 32 min, then 15 set-up + 15 train + 1 teardown rented: 63 min, 9 in 600; 279 rented minutes.
    assert burst == {"strategy": "one burst per iteration", "iterations": 9, "minutes_per_iteration": 63.0,
                     "gpu_hours_per_iteration": round(279 / 60 / 9, 3), "usd_per_iteration": round(279 / 60 * 4 / 9, 2),
                     "training_share": round(135 / 279, 3),
                     "rented_minutes": {"setup": 135, "training": 135, "syncing": 0, "teardown": 9,
                                        "waiting_for_home": 0}}
    # Lag 0: sync 5 + generate 20 + score 4 + train 15 (eval beside the next train) = 44; (600 - 16) / 44 -> 13.
    assert (lag0["iterations"], lag0["minutes_per_iteration"], lag0["usd_per_iteration"]) == (13, 44.0, 3.08)
    # Lag 1: the longer side, home's 32 minutes; 584 / 32 -> 18; 10 rented hours at $4 over 18.
    assert (lag1["iterations"], lag1["minutes_per_iteration"], lag1["usd_per_iteration"]) == (18, 32.0, 2.22)
    assert lag1["training_share"] == 0.45
    # One set-up and teardown a session; 18 trains of 15 min; the rest of the 600 rented minutes waits for home.
    assert lag1["rented_minutes"] == {"setup": 15, "training": 270, "syncing": 0, "teardown": 1,
                                      "waiting_for_home": 314}
    moved = strategies(PlanningConfig(checkpoint_gb=2, rollouts_gb=0.05, uplink_mbps=40, downlink_mbps=300),
                       train_usd=4.0, inference_usd=0.0)[2]
    # 2 GB up once (6.67 min), then per iteration 0.05 GB up (0.167 min) and 2 GB down (0.889 min).
    assert moved["rented_minutes"]["syncing"] == round(2 * 8000 / 40 / 60 + moved["iterations"] * (
        0.05 * 8000 / 40 / 60 + 2 * 8000 / 300 / 60), 1)
    assert transfer_minutes(2.0, 40.0) == pytest.approx(2 * 8000 / 40 / 60)  # 2 GB at 40 Mbit/s: 6.7 min
