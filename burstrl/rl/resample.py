"""Dynamic sampling on the cheap side: groups whose G rewards are all equal are sampled again before training.

Such a group has advantage 0 for every completion, so its rows cost the rented GPU a forward and backward
pass for no policy gradient (DAPO's dynamic sampling). With score.zero_variance resample, score draws each
such group again with the same sampler and fresh seeds, up to score.resample_rounds times, and a new group
replaces the old one only if its rewards differ. The batch keeps its size and order, so train is unchanged;
a replaced row stays in data/rollouts/N.parquet (generate's output), and its replacement in the scored file
carries the seed it was drawn with. Groups still without variance after the last round stay, counted.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from burstrl.rl.advantages import zero_variance_groups

# A round's seed for a group: the group's own plus round * RESEED, far from every other group's seeds, which
# generate spaces by prompt id (< 100_003 apart per iteration).
RESEED = 1_000_000_007


@dataclass
class Resampled:
    table: pa.Table
    counts: dict = field(default_factory=dict)


def resample(table: pa.Table, rewards: list[float], rounds: int,
             draw: Callable[[pa.Table, list[list[int]], list[int]], pa.Table],
             score: Callable[[pa.Table], list[float]]) -> Resampled:
    """`table` with its zero-variance groups drawn again: `draw(prompt rows, prompt ids, seeds)` samples
    the groups' prompts (one row each, the task columns included) into rollout rows, and `score(rows)` returns
    their total rewards."""
    pids = table["prompt_id"].to_pylist()
    pending = sorted(zero_variance_groups(rewards, pids), key=pids.index)
    counts = {"groups_resampled": 0, "resample_rounds": 0, "resampled_completions": 0}
    replacements: dict[int, pa.Table] = {}
    first = {pid: pids.index(pid) for pid in pending}
    for round_ in range(1, rounds + 1):
        if not pending:
            break
        counts["resample_rounds"] = round_
        heads = table.take([first[pid] for pid in pending])
        seeds = [seed + round_ * RESEED for seed in heads["seed"].to_pylist()]
        drawn = draw(heads, heads["prompt_ids"].to_pylist(), seeds)
        counts["resampled_completions"] += len(drawn)
        drawn_rewards = score(drawn)
        drawn_pids = drawn["prompt_id"].to_pylist()
        flat = zero_variance_groups(drawn_rewards, drawn_pids)
        for pid in pending:
            if pid not in flat:
                replacements[pid] = drawn.take([i for i, p in enumerate(drawn_pids) if p == pid])
        pending = [pid for pid in pending if pid not in replacements]
    counts["groups_resampled"] = len(replacements)
    counts["groups_zero_variance_after"] = len(pending)
    return Resampled(_replace(table, replacements), counts)


def _replace(table: pa.Table, replacements: dict[int, pa.Table]) -> pa.Table:
    """`table` with each replaced group's rows swapped for its new ones: same group order and schema."""
    if not replacements:
        return table
    rows: dict[int, list[int]] = {}
    for i, pid in enumerate(table["prompt_id"].to_pylist()):
        rows.setdefault(pid, []).append(i)
    return pa.concat_tables([replacements[pid].select(table.column_names).cast(table.schema) if pid in replacements
                             else table.take(indices) for pid, indices in rows.items()])
