"""A run's history: one row per policy version, gathered from the metrics files the stages write.

Row `iteration` 0 is the bootstrap policy: its held-out accuracy, and its warm-up's seconds and cost at the
training GPU's rate. Row N holds what iteration N's stages measured: the reward of its rollouts and each
reward function's mean, the held-out accuracy of the policy it produced, KL to the reference and from the
sampler, entropy, importance-weight statistics, staleness, completion length, seconds per stage and cost.
Missing values are stages not run yet. `sessions` reads the rented sessions' reports (metrics/session/<id>.json,
burstrl.remote.loop): one row per session, its rented and home seconds split by what each side was doing.
"""

import json
import math
from pathlib import Path

from burstrl.config import CostConfig
from burstrl.pipeline.catalog import ITERATION_STAGES, TIMED_STAGES, TRAINING_STAGES


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _staleness_mean(histogram: dict | None) -> float | None:
    if not histogram:
        return None
    rows = sum(histogram.values())
    return sum(int(lag) * n for lag, n in histogram.items()) / rows


def stage_cost(seconds: dict[str, float | None], cost: CostConfig) -> float | None:
    """USD for one row: train and bootstrap time at the rented GPU's rate, the other stages at the inference
    boxes' rate."""
    if all(seconds.get(s) is None for s in TIMED_STAGES):
        return None
    inference = sum(seconds.get(s) or 0.0 for s in TIMED_STAGES if s not in TRAINING_STAGES)
    training = sum(seconds.get(s) or 0.0 for s in TRAINING_STAGES)
    return (training * cost.train_usd_per_hour + inference * cost.inference_usd_per_hour) / 3600


def _finite(value):
    """NaN and infinity become None: strict JSON has neither, and a chart cannot place them."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def episode_columns(generate: dict, evaluation: dict) -> dict:
    """A run with episodes: the held-out tool use and accuracy with and without it, and per sampled episode its
    turns, calls and errors; nothing for single completions, so their history has no such columns."""
    columns = {k: evaluation[k] for k in ("tool_use_rate", "accuracy_with_tool", "accuracy_without_tool")
               if k in evaluation}
    if "turns_mean" in generate:
        columns.update(turns_mean=generate["turns_mean"],
                       tool_calls_per_episode=generate["tool_calls"] / generate["rollouts"],
                       tool_errors_per_episode=generate["tool_errors"] / generate["rollouts"])
    return columns


def collect(metrics_dir: Path, sync_dir: Path, cost: CostConfig, iterations: list[str]) -> list[dict]:
    """Rows for the bootstrap policy and `iterations` (the keys of iterations.yaml): files of iterations no
    longer listed are left out."""
    rows, total = [], 0.0
    for version in ["000", *sorted(iterations, key=int)]:
        m = {s: _load(metrics_dir / s / f"{version}.json") for s in ITERATION_STAGES if s != "sync"}
        m["sync"] = _load(sync_dir / f"{version}.json")
        m["bootstrap"] = _load(metrics_dir / "bootstrap.json") if version == "000" else {}
        score, train = m["score"], m["train"]
        row = {
            "iteration": int(version),
            "reward_mean": score.get("reward_mean"),
            **{k: v for k, v in score.items() if k.startswith("reward/")},
            "heldout_accuracy": m["eval"].get("heldout_accuracy"),
            **{k: score.get(k) for k in ("verified_rate", "verifier_correlation", "length_correlation",
                                          "reward_disagreement")},
            "kl_ref": train.get("kl"),
            "sampler_kl": train.get("sampler_kl"),
            **{k: train.get(k) for k in ("quantization_kl", "staleness_kl", "chi2", "is_ess")},
            "entropy": train.get("entropy"),
            "is_weight_mean": train.get("is_weight_mean"),
            "is_clipped_fraction": train.get("is_clipped_fraction"),
            "clip_ratio": train.get("clip_ratio"),
            "staleness_mean": _staleness_mean(train.get("staleness")),
            "rows_dropped": (train["rows_dropped_stale"] + train["rows_dropped_zero_variance"]
                             + train["rows_masked_truncated"]) if "rows_kept" in train else None,
            "completion_length": m["generate"].get("completion_length_mean"),
            **episode_columns(m["generate"], m["eval"]),
        }
        seconds = {s: m[s].get("seconds") for s in TIMED_STAGES}
        row.update({f"seconds_{s}": v for s, v in seconds.items()})
        row["cost_usd"] = stage_cost(seconds, cost)
        total += row["cost_usd"] or 0.0
        row["cost_usd_total"] = total
        rows.append(row)
    # Every row gets every key (None where a stage has not run): DVC plots ignore a file whose rows differ.
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return [{k: _finite(row.get(k)) for k in keys} for row in rows]


def latest_suspects(metrics_dir: Path, iterations: list[str]) -> dict | None:
    """The newest listed iteration's reward-hacking suspects (metrics/watch/N.json), with its iteration."""
    for version in sorted(iterations, key=int, reverse=True):
        path = metrics_dir / "watch" / f"{version}.json"
        if path.is_file():
            return {"iteration": version, **json.loads(path.read_text())}
    return None


SESSION_SPLITS = {"rented": ("setup", "training", "syncing", "waiting_for_home", "teardown"),
                  "home": ("generate", "score", "eval", "sync", "waiting_for_trainer")}


def sessions(metrics_dir: Path) -> list[dict]:
    """One row per rented session, oldest first (a session's id starts with its start time)."""
    rows = []
    for path in sorted((metrics_dir / "session").glob("*.json")):
        s = json.loads(path.read_text())
        row = {"session": s["id"], "iterations": len(s["iterations_trained"]), "wall_seconds": s["wall_seconds"],
               "rented_seconds": s["rented"]["total_seconds"]}
        for side, parts in SESSION_SPLITS.items():
            row.update({f"{side}_{part}_seconds": s[side].get(f"{part}_seconds") for part in parts})
        row.update({k: s[k] for k in ("usd", "usd_per_iteration", "gpu_hours_per_iteration")})
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    """The run in a few numbers, for `dvc metrics diff` between experiments."""
    if not rows:
        return {}
    accuracies = [r["heldout_accuracy"] for r in rows if r["heldout_accuracy"] is not None]
    rewards = [r["reward_mean"] for r in rows if r["reward_mean"] is not None]
    last = rows[-1]
    return {
        "iterations": last["iteration"],
        "heldout_accuracy": accuracies[-1] if accuracies else None,
        "heldout_accuracy_best": max(accuracies) if accuracies else None,
        "heldout_accuracy_gain": accuracies[-1] - accuracies[0] if accuracies else None,
        "reward_mean": rewards[-1] if rewards else None,
        "kl_ref": last["kl_ref"],
        "sampler_kl": last["sampler_kl"],
        "cost_usd_total": last["cost_usd_total"],
        "hours_total": sum(r[f"seconds_{s}"] or 0.0 for r in rows for s in TIMED_STAGES) / 3600,
    }
