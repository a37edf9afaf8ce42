"""Group-relative advantages, as in GRPO (https://arxiv.org/abs/2402.03300, eq. 3) and TRL.

A_i = (r_i - b_i) / s_i where
  - b_i, the baseline: the group mean ("group_mean"), or the mean of the other members of the group
    ("leave_one_out", RLOO: https://arxiv.org/abs/2402.14740), which equals G/(G-1) * (r_i - mean);
  - s_i, the scale: the group's std + eps ("group", GRPO), the whole batch's reward std + eps ("batch", as
    TRL's scale_rewards="batch"), or 1 ("none", Dr. GRPO: https://arxiv.org/abs/2503.20783).
Stds use Bessel's correction, as torch.std computes them.
"""

import math

from burstrl.config import BASELINES, SCALES

EPS = 1e-4


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _groups(rewards: list[float], group_ids: list[int]) -> dict[int, list[float]]:
    groups: dict[int, list[float]] = {}
    for reward, gid in zip(rewards, group_ids, strict=True):
        groups.setdefault(gid, []).append(reward)
    return groups


def zero_variance_groups(rewards: list[float], group_ids: list[int]) -> set[int]:
    """Groups whose rewards are all equal: with a group baseline they carry no policy gradient."""
    return {gid for gid, values in _groups(rewards, group_ids).items() if len(set(values)) == 1}


def group_advantages(rewards: list[float], group_ids: list[int], baseline: str = "group_mean",
                     scale: str = "group") -> list[float]:
    if baseline not in BASELINES or scale not in SCALES:
        raise ValueError(f"baseline must be one of {BASELINES} and scale one of {SCALES}")
    groups = _groups(rewards, group_ids)
    means = {gid: sum(v) / len(v) for gid, v in groups.items()}
    stds = {gid: _std(v) for gid, v in groups.items()}
    batch_std = _std(rewards)
    out = []
    for reward, gid in zip(rewards, group_ids, strict=True):
        size = len(groups[gid])
        centred = reward - means[gid]
        if baseline == "leave_one_out":
            centred *= size / (size - 1)
        divisor = {"group": stds[gid] + EPS, "batch": batch_std + EPS, "none": 1.0}[scale]
        out.append(centred / divisor)
    return out
