"""Which scored rows one update may use, and why the others are left out.

Rows are never deleted: a row the update cannot use keeps its place in the batch with a zero loss mask,
so shapes, the Parquet file and the diagnostics stay aligned, and every exclusion is counted by reason.
"""

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from burstrl.config import TrainConfig
from burstrl.data.contract import fail
from burstrl.errors import ContractError
from burstrl.rl.advantages import zero_variance_groups


def staleness(source: Path, table: pa.Table, parent: dict) -> list[int]:
    """Per row, how many policy versions its sampler lags `parent` (the checkpoint training starts from).

    A row's (policy_version, policy_hash) must appear in the parent's lineage; anything else is a rollout
    from another run or from weights that were changed after sampling, and stops the stage."""
    position = {(e["policy_version"], e["content_hash"]): i for i, e in enumerate(parent["lineage"])}
    hashes = {e["policy_version"]: e["content_hash"] for e in parent["lineage"]}
    lags = []
    pairs = zip(table["policy_version"].to_pylist(), table["policy_hash"].to_pylist(), strict=True)
    for row, (version, digest) in enumerate(pairs):
        if (version, digest) in position:
            lags.append(position[(version, digest)])
        elif version in hashes:
            fail(source, row, "policy_hash", f"{digest} is not policy {version}'s hash {hashes[version]} in the "
                 f"lineage of checkpoint {parent['policy_version']}", table)
        else:
            fail(source, row, "policy_version", f"policy {version} is not in the lineage of checkpoint "
                 f"{parent['policy_version']} ({', '.join(hashes)})", table)
    return lags


def check_batch(source: Path, table: pa.Table, *, beta: float, expected_rows: int, objective: str = "grpo") -> float:
    """Refuse a rollout batch this update cannot use as is; returns its sampling temperature."""
    temperatures = sorted(set(table["temperature"].to_pylist()))
    if len(temperatures) != 1:
        raise ContractError(f"{source}: field 'temperature': one batch must share one temperature, got {temperatures}")
    if beta and temperatures != [1.0]:
        raise ContractError(f"{source}: field 'temperature': the KL term needs rollouts sampled at 1.0 "
                            f"(reference logprobs are at 1.0), got {temperatures[0]}")
    if beta and table["ref_logprobs"].null_count:
        raise ContractError(f"{source}: field 'ref_logprobs': scored without reference logprobs (train.beta was 0 "
                            f"when score ran), but train.beta is {beta}")
    if objective != "grpo" and "teacher_logprobs" not in table.column_names:
        raise ContractError(f"{source}: field 'teacher_logprobs': scored without a teacher (score.teacher was empty "
                            f"when score ran), but train.objective is {objective}")
    if objective != "grpo" and temperatures != [1.0]:
        raise ContractError(f"{source}: field 'temperature': distillation needs rollouts sampled at 1.0 (teacher "
                            f"logprobs are at 1.0), got {temperatures[0]}")
    if len(table) != expected_rows:
        raise ContractError(f"{source}: field 'prompt_id': {len(table)} rows, but generate.prompts_per_iteration * "
                            f"generate.num_generations = {expected_rows}")
    return temperatures[0]


@dataclass
class Selection:
    keep: list[bool]
    counts: dict[str, int]
    staleness: dict[str, int]


def select_rows(source: Path, table: pa.Table, lags: list[int], train: TrainConfig) -> Selection:
    """The rows the loss uses: not staler than train.max_staleness, and by param not in a zero-variance
    group and not truncated. Counts are per reason, so a row excluded twice is counted under both.
    A batch with no row left stops the stage rather than publish an untrained checkpoint as trained."""
    groups = table["prompt_id"].to_pylist()
    flat = zero_variance_groups(table["reward"].to_pylist(), groups)
    stale = [lag > train.max_staleness for lag in lags]
    zero_variance = [train.drop_zero_variance_groups and g in flat for g in groups]
    # An episode stopped on its last turn with a call unanswered has no answer either.
    truncated = [train.mask_truncated and r in ("length", "max_turns") for r in table["finish_reason"].to_pylist()]
    keep = [not (a or b or c) for a, b, c in zip(stale, zero_variance, truncated, strict=True)]
    histogram = {str(lag): n for lag, n in sorted(Counter(lags).items())}
    counts = {"rows_kept": sum(keep), "rows_dropped_stale": sum(stale),
              "rows_dropped_zero_variance": sum(zero_variance), "rows_masked_truncated": sum(truncated)}
    if not any(keep):
        reasons = ", ".join(f"{k}={v}" for k, v in counts.items())
        raise ContractError(f"{source}: no row left to train on ({reasons}; staleness {histogram}, "
                            f"train.max_staleness={train.max_staleness})")
    return Selection(keep, counts, histogram)
