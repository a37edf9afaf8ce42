"""Group-relative advantages, as in GRPO (https://arxiv.org/abs/2402.03300, eq. 3) and TRL.

A_i = (r_i - mean(group)) / (std(group) + eps), std with Bessel's correction as torch.std computes it;
with scale=False the division is skipped (Dr. GRPO, https://arxiv.org/abs/2503.20783).
"""

import math

EPS = 1e-4


def zero_variance_groups(rewards: list[float], group_ids: list[int]) -> int:
    """Groups whose rewards are all equal: they carry no GRPO gradient."""
    spread: dict[int, set[float]] = {}
    for reward, gid in zip(rewards, group_ids, strict=True):
        spread.setdefault(gid, set()).add(reward)
    return sum(len(values) == 1 for values in spread.values())


def group_advantages(rewards: list[float], group_ids: list[int], scale: bool = True) -> list[float]:
    groups: dict[int, list[float]] = {}
    for reward, gid in zip(rewards, group_ids, strict=True):
        groups.setdefault(gid, []).append(reward)
    stats = {}
    for gid, values in groups.items():
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        stats[gid] = (mean, std)
    out = []
    for reward, gid in zip(rewards, group_ids, strict=True):
        mean, std = stats[gid]
        out.append((reward - mean) / (std + EPS) if scale else reward - mean)
    return out
