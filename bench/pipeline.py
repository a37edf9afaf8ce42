"""What the pipeline adds around the work: DVC, Parquet and sync as shares of an iteration, sync against a
plain rsync, and score's and train's peak memory as the rollout batch grows."""

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from bench.watch import Watched, watch
from burstrl.data.contract import ROLLOUT_FIELDS, SCORED_FIELDS, WEIGHT_FIELDS, read_rollouts, read_scored, write_table


def parquet_seconds(ws: Path, iteration: str) -> float:
    """The Parquet writes and checked reads one iteration's stages make of its three tables, done again:
    generate writes the rollouts and reads them back, score reads them and writes the scored table, train
    reads that and writes the importance weights."""
    data = ws / "data"
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        rollouts = read_rollouts(data / f"rollouts/{iteration}.parquet")
        write_table(rollouts, ROLLOUT_FIELDS, Path(tmp) / "rollouts.parquet")
        read_rollouts(Path(tmp) / "rollouts.parquet")
        read_rollouts(Path(tmp) / "rollouts.parquet")
        scored = read_scored(data / f"scored/{iteration}.parquet")
        write_table(scored, SCORED_FIELDS, Path(tmp) / "scored.parquet")
        read_scored(Path(tmp) / "scored.parquet")
        weights = pq.read_table(data / f"weights/{iteration}.parquet")
        write_table(weights, WEIGHT_FIELDS, Path(tmp) / "weights.parquet")
        return time.monotonic() - started


def overhead(ws: Path, iteration: Watched, iteration_id: str) -> dict:
    """An iteration's `dvc repro` wall time, split: each stage process's lifetime, DVC (what is left:
    hashing, dvc.lock, starting stages), Parquet (re-timed) and the sync stage."""
    stage_seconds = sum(run.seconds for run in iteration.stages.values())
    dvc = iteration.wall - stage_seconds
    parquet = parquet_seconds(ws, iteration_id)
    sync = iteration.seconds("sync")
    return {"wall_seconds": iteration.wall, "dvc_seconds": dvc, "parquet_seconds": parquet, "sync_seconds": sync,
            "stages": {key: run.seconds for key, run in iteration.stages.items()},
            "share": (dvc + parquet + sync) / iteration.wall}


def plain_rsync(ws: Path, iteration: str) -> float:
    """rsync -a of the same checkpoint into an empty directory: the transfer alone."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        subprocess.run(["rsync", "-a", f"{ws / 'checkpoints' / iteration}/", f"{tmp}/"], check=True)
        return time.monotonic() - started


def tiled(table: pa.Table, times: int) -> pa.Table:
    """`times` copies of a rollout table, each copy's groups under new prompt ids: a valid batch `times`
    as large, with the same rows' token lengths."""
    span = max(table["prompt_id"].to_pylist()) + 1
    parts = [table.set_column(table.schema.get_field_index("prompt_id"), "prompt_id",
                              pa.array([pid + k * span for pid in table["prompt_id"].to_pylist()], pa.int64()))
             for k in range(times)]
    return pa.concat_tables(parts)


def memory(ws: Path, env: dict, base_prompts: int, scales: list[int], work: Path) -> dict:
    """Peak RSS of the score and train stages, run in a copy of the workspace whose rollouts are the first
    `base_prompts` groups of the iteration's, tiled `k` times for each scale k; and the RSS each stage gains
    per byte of rollouts between the smallest and largest scale (0 for data streamed, about 1 or more for
    data held whole)."""
    params = yaml.safe_load((ws / "params.yaml").read_text())
    rollouts = read_rollouts(ws / "data/rollouts/001.parquet")
    first = list(dict.fromkeys(rollouts["prompt_id"].to_pylist()))[:base_prompts]
    base = rollouts.filter(pc.is_in(rollouts["prompt_id"], pa.array(first, pa.int64())))
    peaks, sizes = {}, {}
    for k in scales:
        copy = work / f"memory-{k}x"
        shutil.copytree(ws, copy, symlinks=True)
        scaled = {**params, "generate": {**params["generate"], "prompts_per_iteration": base_prompts * k}}
        (copy / "scaled.yaml").write_text(yaml.safe_dump(scaled))
        big = tiled(base, k)
        write_table(big, ROLLOUT_FIELDS, copy / "data/rollouts/001.parquet")
        sizes[k] = big.nbytes
        score = watch(["python", "stages/score.py", "001", "--params", "scaled.yaml"], copy, env)
        train = watch(["python", "stages/train.py", "001", "000", "--params", "scaled.yaml"], copy, env)
        peaks[k] = {"score": score.stages["score 001"].peak_rss, "train": train.stages["train 001 000"].peak_rss,
                    "score_seconds": score.wall, "train_seconds": train.wall}
        shutil.rmtree(copy)
    lo, hi = min(scales), max(scales)
    slope = {s: (peaks[hi][s] - peaks[lo][s]) / (sizes[hi] - sizes[lo]) for s in ("score", "train")}
    return {"base_prompts": base_prompts, "peak_rss": peaks, "rollout_bytes": sizes,
            "rss_bytes_per_rollout_byte": slope}
