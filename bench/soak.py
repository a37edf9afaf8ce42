"""`python -m bench.soak [--kills 50] [--seed 0] [--stages all] [--per-stage 2]`: random external SIGKILLs of
`dvc repro` over every stage of the embedded pipeline, each run resumed until it completes, then compared with
an uninterrupted run of the same seed (docs/resume.md, The soak).

A reference workspace (the tests' SMALL params, one iteration, syncing to a local directory) runs `dvc repro`
once while its process tree is sampled, which gives each stage's duration. Then, until `--kills` have landed,
a fresh workspace runs the pipeline: for each stage kind in `--stages`, `--per-stage` times, a `dvc repro`
starts and its whole process group is SIGKILLed at a moment drawn uniformly from the stage's reference
duration after the stage starts, or, when the stage's command ends first, at once (DVC is then hashing the
outputs and writing dvc.lock). A second kill of a stage lands in its resumed run. A last `dvc repro` completes
the run, which is compared with the reference: rollout and scored rows (identity and bytes), weights, the
train metrics and loss curve, the eval metrics, dvc.lock's hashes, the sync receipts and what the inference
directory serves. The table per stage goes to stdout, everything to build/soak/results.json.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import yaml
from safetensors.torch import load_file

from bench.watch import Watched, stage_processes, watch
from burstrl.atomic import write_json
from burstrl.pipeline import workspace

OUT = workspace.REPO / "build" / "soak"
STAGES = ["prepare", "bootstrap", "sync-bootstrap", "generate", "score", "train", "eval", "sync", "report"]
POLL_SECONDS = 0.02
# Files whose content holds wall-clock times: compared with those fields left out, and their dvc.lock hashes not.
TIMED = ("metrics/", "report/", "data/sync/", "dvclive/")


@dataclass
class Kill:
    run: int
    stage: str  # the stage kind that ran at the kill, or whose outputs DVC was committing
    in_commit: bool  # the stage's command had exited: DVC was hashing its outputs and writing dvc.lock
    resumed: bool  # the stage had been killed before in this run: the kill hit its resumed run
    seconds_into_stage: float


def kind(key: str) -> str:
    """The stage kind of a watched process key: 'generate 001 000' -> 'generate', 'sync 000' -> 'sync-bootstrap'."""
    name, *args = key.split()
    return "sync-bootstrap" if name == "sync" and args == ["000"] else name


def running(top: psutil.Process) -> set[str]:
    return {kind(key) for key, _ in stage_processes(top)}


def kill_during(root: Path, env: dict, cmd: list[str], target: str, delay: float, log) -> tuple[bool, float]:
    """Run `cmd` (a `dvc repro`) in `root` and SIGKILL its process group `delay` seconds after stage kind
    `target` starts, or as soon as the target's command exits if that comes first. Returns (whether the kill
    came after the command had exited, seconds into the stage); raises if the run ended before the target ran."""
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    top, started = psutil.Process(proc.pid), None
    while proc.poll() is None:
        now, kinds = time.monotonic(), running(top)
        if started is None and target in kinds:
            started = now
        if started is not None and (target not in kinds or now - started >= delay):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return target not in kinds, now - started
        time.sleep(POLL_SECONDS)
    raise RuntimeError(f"{root}: `dvc repro` ended ({proc.returncode}) before stage {target} ran; see {log.name}")


def complete(root: Path, env: dict, cmd: list[str], log) -> None:
    log.flush()
    done = subprocess.run(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{root}: the resuming `dvc repro` failed ({done.returncode}); see {log.name}")


def soak_run(root: Path, env: dict, targets: list[str], durations: dict[str, float], rng: random.Random,
             run: int = 1, cmd: tuple[str, ...] = ("dvc", "repro")) -> list[Kill]:
    """Kill `cmd` in `root` once per entry of `targets` (stage kinds, in pipeline order), then run it to the end;
    its output goes to `root`/soak.log."""
    kills: list[Kill] = []
    with open(root / "soak.log", "a") as log:
        for target in targets:
            in_commit, after = kill_during(root, env, list(cmd), target, rng.uniform(0, durations[target]), log)
            kills.append(Kill(run, target, in_commit, any(k.stage == target for k in kills), round(after, 3)))
        complete(root, env, list(cmd), log)
    return kills


def _identities(table) -> Counter:
    return Counter(zip(table["prompt_id"].to_pylist(), table["sample_index"].to_pylist(),
                       table["seed"].to_pylist(), strict=True))


def rows(ref: Path, got: Path) -> dict:
    """Rows of `ref` missing from `got`, rows of `got` beyond one per identity, and whether the bytes match."""
    want, have = _identities(pq.read_table(ref)), _identities(pq.read_table(got))
    return {"lost": sum((want - have).values()), "duplicated": sum(n - 1 for n in have.values() if n > 1),
            "identical_bytes": ref.read_bytes() == got.read_bytes()}


def weight_diff(ref: Path, got: Path) -> float:
    a, b = load_file(ref), load_file(got)
    if a.keys() != b.keys():
        return float("inf")
    return max((a[k] - b[k]).abs().max().item() for k in a)


def timing(key: str) -> bool:
    """A field that holds wall-clock time (or the cost computed from it), or how a resumed run got its result."""
    return (key in {"seconds", "step_time", "resumed_from_step", "shards_resumed"} or key.startswith("seconds_")
            or key.endswith("_seconds") or key.startswith("cost_usd"))


def untimed(path: Path) -> object:
    """A JSON file's content without its timing fields, at any depth."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not timing(k)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(json.loads(path.read_text()))


def same(ref: Path, got: Path, path: str) -> bool:
    return untimed(ref / path) == untimed(got / path)


def lock_hashes(root: Path) -> dict[str, dict[str, str]]:
    """Per stage, the md5 dvc.lock records for each dep and out that holds data rather than timings."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    return {stage: {e["path"]: e.get("md5", "") for e in entry.get("deps", []) + entry.get("outs", [])
                    if not (e["path"] + "/").startswith(TIMED)}
            for stage, entry in lock.items()}


def served(root: Path) -> dict:
    """What the inference directory serves: the name `current` points at, its files' sums, the versions there."""
    base = root / "build/inference"
    meta = json.loads((base / "current/burstrl.json").read_text())
    return {"current": os.readlink(base / "current"), "files": meta["files"],
            "versions": sorted(p.name for p in base.iterdir() if not p.name.startswith("."))}


def curves(root: Path) -> dict[str, str]:
    """The train stage's DVCLive curves and summary, timings left out."""
    live = root / "dvclive/train/001"
    found = {p.name: p.read_text() for p in (live / "plots/metrics").glob("*.tsv") if not timing(p.stem)}
    return {**found, "metrics.json": json.dumps(untimed(live / "metrics.json"), sort_keys=True)}


def _train(ref: Path, got: Path) -> dict:
    return {"weight_max_diff": weight_diff(ref / "checkpoints/001/model.safetensors",
                                           got / "checkpoints/001/model.safetensors"),
            "metrics_identical": same(ref, got, "metrics/train/001.json"),
            "curves_identical": curves(ref) == curves(got)}


# Per stage kind, what its outputs must hold in a resumed run compared with the reference, beyond dvc.lock.
CHECKS = {
    "prepare": lambda ref, got: {},
    "bootstrap": lambda ref, got: {
        "weight_max_diff": weight_diff(ref / "checkpoints/000/model.safetensors",
                                       got / "checkpoints/000/model.safetensors"),
        "eval_identical": same(ref, got, "metrics/eval/000.json")},
    "sync-bootstrap": lambda ref, got: {"receipt_identical": same(ref, got, "data/sync/000.json")},
    "generate": lambda ref, got: rows(ref / "data/rollouts/001.parquet", got / "data/rollouts/001.parquet"),
    "score": lambda ref, got: rows(ref / "data/scored/001.parquet", got / "data/scored/001.parquet"),
    "train": _train,
    "eval": lambda ref, got: {"metrics_identical": same(ref, got, "metrics/eval/001.json")},
    "sync": lambda ref, got: {"receipt_identical": same(ref, got, "data/sync/001.json"),
                              "served_identical": served(ref) == served(got)},
    "report": lambda ref, got: {"history_identical": same(ref, got, "report/history.json")},
}
LOCKED = {"generate": "generate@001", "score": "score@001", "train": "train@001", "eval": "eval@001",
          "sync": "sync@001"}


def compare(ref: Path, got: Path, stages: list[str] = STAGES) -> dict[str, dict]:
    """Per stage kind, how the completed run `got` compares with the reference `ref`: each check's result."""
    locks_ref, locks_got = lock_hashes(ref), lock_hashes(got)
    return {stage: {"lock_identical": locks_got.get(LOCKED.get(stage, stage)) == locks_ref[LOCKED.get(stage, stage)],
                    **CHECKS[stage](ref, got)}
            for stage in stages}


def durations(watched: Watched) -> dict[str, float]:
    """Each stage kind's duration in seconds, in a run `bench.watch` sampled."""
    return {kind(key): run.seconds for key, run in watched.stages.items()}


def reference(root: Path, params: dict) -> dict[str, float]:
    """An uninterrupted run at `root` (which must not exist); returns each stage kind's duration."""
    root.mkdir(parents=True)
    return durations(watch(["dvc", "repro"], root, workspace.scratch(root, params)))


def table(kills: list[Kill], diffs: list[dict], stages: list[str]) -> list[dict]:
    """One line per stage kind: kills landed, in DVC's commit, in a resumed run; rows lost and duplicated and the
    largest weight difference over every run; whether every check of the stage held in every run."""
    lines = []
    for stage in stages:
        mine = [k for k in kills if k.stage == stage]
        checks = [d[stage] for d in diffs]
        lines.append({
            "stage": stage, "kills": len(mine), "in_commit": sum(k.in_commit for k in mine),
            "resumed": sum(k.resumed for k in mine),
            "rows_lost": sum(c.get("lost", 0) for c in checks),
            "rows_duplicated": sum(c.get("duplicated", 0) for c in checks),
            "weight_max_diff": max((c["weight_max_diff"] for c in checks if "weight_max_diff" in c), default=None),
            "identical": all(v for c in checks for k, v in c.items() if isinstance(v, bool)),
        })
    return lines


def render(lines: list[dict]) -> str:
    out = ["| stage | kills | in DVC's commit | in a resumed run | rows lost | rows duplicated | weight max diff "
           "| identical |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in lines:
        diff = "" if s["weight_max_diff"] is None else f"{s['weight_max_diff']:.1e}"
        out.append(f"| {s['stage']} | {s['kills']} | {s['in_commit']} | {s['resumed']} | {s['rows_lost']} | "
                   f"{s['rows_duplicated']} | {diff} | {'yes' if s['identical'] else 'NO'} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=50, help="stop once at least this many kills have landed")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill times (the pipeline keeps params' seed)")
    parser.add_argument("--stages", default="all", help=f"comma-separated stage kinds to kill, of {', '.join(STAGES)}")
    parser.add_argument("--per-stage", type=int, default=2,
                        help="kills per stage kind and run (2: the second lands in the resumed run)")
    parser.add_argument("--keep", action="store_true", help="keep the workspaces under build/soak/")
    args = parser.parse_args()
    stages = STAGES if args.stages == "all" else [s for s in STAGES if s in args.stages.split(",")]
    unknown = set(args.stages.split(",")) - set(STAGES) - {"all"}
    if unknown or not stages or args.per_stage < 1:
        sys.exit(f"soak: --stages takes {', '.join(STAGES)} or all, and --per-stage >= 1; got {args.stages} and "
                 f"{args.per_stage}")
    shutil.rmtree(OUT, ignore_errors=True)
    started = time.monotonic()
    print("[soak] the uninterrupted reference run", flush=True)
    seconds = reference(OUT / "reference", workspace.SMALL)
    rng, kills, diffs, run = random.Random(args.seed), [], [], 0
    while len(kills) < args.kills:
        run += 1
        root = OUT / f"run-{run}"
        root.mkdir()
        env = workspace.scratch(root, workspace.SMALL)
        targets = [s for s in stages for _ in range(args.per_stage)]
        print(f"[soak] run {run}: {len(targets)} kills", flush=True)
        kills += soak_run(root, env, targets, seconds, rng, run)
        diffs.append(compare(OUT / "reference", root))
        if not args.keep:
            shutil.rmtree(root)
    lines = table(kills, diffs, stages)
    write_json(OUT / "results.json", {"seed": args.seed, "runs": run, "kills": [asdict(k) for k in kills],
                                      "durations": seconds, "stages": lines, "runs_compared": diffs,
                                      "seconds": round(time.monotonic() - started)})
    print(render(lines))
    print(f"[soak] {len(kills)} kills over {run} runs in {time.monotonic() - started:.0f} s; {OUT / 'results.json'}")
    if not all(s["identical"] and s["rows_lost"] == s["rows_duplicated"] == 0 for s in lines):
        sys.exit("[soak] a resumed run differs from the uninterrupted one (build/soak/results.json)")


if __name__ == "__main__":
    main()
