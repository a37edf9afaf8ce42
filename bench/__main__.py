"""`make bench` (python -m bench): for each model size, one real iteration in a scratch clone, then the
alternatives measured in this same run on this same machine, and the ratios the targets are stated in
(docs/benchmarks.md). Results go to build/bench/results.json as well as stdout.

    python -m bench [--sizes tiny,30m] [--hardware cpu] [--scales 4,16] [--keep]
"""

import argparse
import json
import multiprocessing
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench.generation import device, hf_generate, prompts_of, raw_vllm
from bench.pipeline import memory, overhead, plain_rsync
from bench.training import colocated_trl, floor, mfu
from bench.watch import watch
from burstrl.config import load_config
from burstrl.pipeline import workspace

SIZES = yaml.safe_load((Path(__file__).parent / "sizes.yaml").read_text())
OUT = workspace.REPO / "build" / "bench"
# (name, value key, comparison, bound): the targets of docs/benchmarks.md, checked on the sizes named.
TARGETS = [
    ("generate vs HF generate (tokens/s)", "generate_vs_hf", ">=", 1.5, "30m"),
    ("generate vs raw vLLM (tokens/s)", "generate_vs_raw_vllm", ">=", 0.85, "30m"),
    ("train update vs floor (time)", "train_vs_floor", "<=", 1.25, "30m"),
    ("train update vs colocated TRL (time)", "train_vs_trl", "<=", 0.75, "30m"),
    ("peak RSS 16x vs 1x (score, train)", "rss_16x", "<=", 1.15, "tiny"),
    ("pipeline overhead (share of wall)", "overhead_share", "<=", 0.05, "tiny"),
]


def isolated(fn, *args):
    """fn(*args) in a fresh process, as a stage runs: an engine in the caller's process binds its threads and keeps
    memory, which would skew what this process measures after it."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def params_for(size: str, hardware: str) -> dict:
    """conf/ composed with the size's overrides, as `dvc exp run -S` would write params.yaml."""
    with initialize_config_dir(config_dir=str(workspace.REPO / "conf"), version_base=None):
        return OmegaConf.to_container(compose(config_name="config", overrides=[*SIZES[size], f"hardware={hardware}"]))


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def bench_size(size: str, hardware: str, scales: list[int], work: Path) -> dict:
    ws = work / size
    ws.mkdir(parents=True)
    params = params_for(size, hardware)
    online = {} if params["model"]["source"] == "tiny" else {"HF_HUB_OFFLINE": "0"}
    env = workspace.scratch(ws, params, online)
    print(f"[{size}] bootstrap", flush=True)
    watch(["dvc", "repro", "bootstrap"], ws, env)
    print(f"[{size}] one iteration: dvc repro", flush=True)
    iteration = watch(["dvc", "repro"], ws, env)
    cfg = load_config(ws / "params.yaml")
    gen, train = read(ws / "metrics/generate/001.json"), read(ws / "metrics/train/001.json")
    policy, scored = ws / "checkpoints/000", ws / "data/scored/001.parquet"

    print(f"[{size}] raw vLLM, HF generate", flush=True)
    prompt_ids, seeds = prompts_of(ws / "data/rollouts/001.parquet")
    raw = isolated(raw_vllm, policy, cfg, prompt_ids, seeds)
    # The profile's engine placement against the other one (inference.engine_process), same requests.
    flipped = replace(cfg, inference=replace(cfg.inference, engine_process=not cfg.inference.engine_process))
    other = isolated(raw_vllm, policy, flipped, prompt_ids, seeds)
    hf = hf_generate(policy, cfg, prompt_ids)
    stage_tps = gen["generated_tokens"] / gen["generation_seconds"]
    generation = {
        "stage": {"tokens": gen["generated_tokens"], "generation_seconds": gen["generation_seconds"],
                  "engine_start_seconds": gen["engine_start_seconds"], "stage_seconds": gen["seconds"],
                  "tokens_per_second": stage_tps},
        "raw_vllm": {**raw, "tokens_per_second": raw["tokens"] / raw["seconds"]},
        "hf_generate": {**hf, "tokens_per_second": hf["tokens"] / hf["seconds"]},
        "raw_vllm_other_engine_process": {**other, "engine_process": flipped.inference.engine_process},
    }

    print(f"[{size}] floor, colocated TRL", flush=True)
    steps = train["optimizer_steps"]
    low = floor(policy, scored, cfg)
    trl = colocated_trl(policy, ws / "data/task/train.parquet", cfg, steps, work / f"trl-{size}")
    training = {
        "stage": {"update_seconds": train["update_seconds"], "stage_seconds": train["seconds"], "steps": steps},
        "floor": {**low, "seconds": low["seconds_per_step"] * low["steps"]},
        "colocated_trl": {**trl, "seconds": trl["seconds_per_step"] * trl["steps"]},
        "mfu": mfu(train["update_seconds"] / steps, low["tokens_per_step"], low["parameters"]),
    }

    print(f"[{size}] sync vs rsync, overhead", flush=True)
    synced = read(ws / "data/sync/001.json")
    sync = {"stage_transfer_seconds": synced["seconds"], "stage_process_seconds": iteration.seconds("sync"),
            "plain_rsync_seconds": plain_rsync(ws, "001"), "bytes": sum(t["bytes"] for t in synced["targets"])}
    result = {"parameters": low["parameters"], "generation": generation, "training": training, "sync": sync,
              "overhead": overhead(ws, iteration, "001")}
    if scales:
        print(f"[{size}] peak RSS of score and train at {scales}x a quarter of the rollouts", flush=True)
        result["memory"] = memory(ws, env, cfg.generate.prompts_per_iteration // 4, scales, work)
    result["ratios"] = ratios(result)
    return result


def ratios(r: dict) -> dict:
    g, t = r["generation"], r["training"]
    out = {
        "generate_vs_hf": g["stage"]["tokens_per_second"] / g["hf_generate"]["tokens_per_second"],
        "generate_vs_raw_vllm": g["stage"]["tokens_per_second"] / g["raw_vllm"]["tokens_per_second"],
        "engine_start_vs_other": (g["raw_vllm"]["engine_start_seconds"]
                                  / g["raw_vllm_other_engine_process"]["engine_start_seconds"]),
        "train_vs_floor": t["stage"]["update_seconds"] / t["floor"]["seconds"],
        "train_vs_trl": t["stage"]["update_seconds"] / t["colocated_trl"]["seconds"],
        "train_stage_vs_trl": t["stage"]["stage_seconds"] / t["colocated_trl"]["seconds"],
        "sync_vs_rsync": r["sync"]["stage_transfer_seconds"] / r["sync"]["plain_rsync_seconds"],
        "overhead_share": r["overhead"]["share"],
    }
    if "memory" in r:
        peaks = r["memory"]["peak_rss"]
        for k in peaks:
            if k != 1:
                out[f"rss_{k}x"] = max(peaks[k][s] / peaks[1][s] for s in ("score", "train"))
        out["rss_per_rollout_byte"] = max(r["memory"]["rss_bytes_per_rollout_byte"].values())
    return out


def verdicts(results: dict) -> list[tuple[str, str, float, str, bool]]:
    """Each target that the sizes run here cover: (name, size, measured, target, met)."""
    rows = []
    for name, key, op, bound, size in TARGETS:
        value = results.get(size, {}).get("ratios", {}).get(key)
        if value is not None:
            rows.append((name, size, value, f"{op} {bound}", value >= bound if op == ">=" else value <= bound))
    return rows


def report(results: dict) -> str:
    lines = [f"{'ratio':<26}" + "".join(f"{size:>10}" for size in results)]
    keys = dict.fromkeys(k for r in results.values() for k in r["ratios"])
    for key in keys:
        cells = "".join(f"{r['ratios'][key]:>10.3f}" if key in r["ratios"] else f"{'-':>10}" for r in results.values())
        lines.append(f"{key:<26}{cells}")
    for size, r in results.items():
        if r["training"]["mfu"] is not None:
            lines.append(f"[{size}] trainer MFU {r['training']['mfu']:.1%}")
    lines.append("")
    for name, size, value, target, met in verdicts(results):
        lines.append(f"{'met   ' if met else 'MISSED'} {name} at {size}: {value:.3f} (target {target})")
    return "\n".join(lines)


def main() -> int:
    gpu = device() == "cuda"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="124m,760m" if gpu else "tiny,30m", help="sizes of bench/sizes.yaml")
    parser.add_argument("--hardware", default="h200" if gpu else "cpu", help="a profile of conf/hardware/")
    parser.add_argument("--scales", default="4,16", help="rollout multiples for the memory benchmark, besides 1 "
                        "(first size only; empty: no memory benchmark)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch workspaces under build/bench/work")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        print(f"bench/sizes.yaml has no size {', '.join(unknown)} (it has {', '.join(SIZES)})", file=sys.stderr)
        return 2
    scales = sorted({1, *(int(k) for k in args.scales.split(",") if k)}) if args.scales else []
    work = OUT / "work"
    shutil.rmtree(work, ignore_errors=True)
    started = time.monotonic()
    results = {}
    for i, size in enumerate(sizes):
        results[size] = bench_size(size, args.hardware, scales if i == 0 else [], work)
    (OUT / "results.json").write_text(json.dumps(
        {"device": device(), "hardware": args.hardware, "seconds": time.monotonic() - started, "sizes": results},
        indent=2, default=str))
    print(report(results))
    print(f"\nbench: {time.monotonic() - started:.0f} s; details in build/bench/results.json")
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
