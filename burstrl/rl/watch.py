"""The reward-hacking watch (docs/reward-hacking.md): signs that the policy is learning the reward, not the task.

A reward is a proxy for the task; the task's own verifier (`watch.verifier`, the check held-out accuracy
uses) is the ground truth. Per iteration, score measures how the rewards agree with the verifier and with
completion length on the train rollouts, and lists the best-paid rollouts the verifier fails. Across
iterations, the report compares the train reward's trend with held-out accuracy's, and watches completion
length. Each signal has a threshold in the `watch` params; `warnings` names every crossing. Pure functions,
pinned by hand values in tests.
"""

import math
from itertools import combinations

from burstrl.config import WatchConfig


def correlation(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r; None when either side is constant (or there are fewer than 2 pairs), where it is undefined."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def verifier_correlation(rewards: list[float], verified: list[float | None]) -> float | None:
    """r between each rollout's total reward and whether the verifier passes it, over rows it applies to."""
    pairs = [(r, v) for r, v in zip(rewards, verified, strict=True) if v is not None]
    return correlation([r for r, _ in pairs], [v for _, v in pairs])


def length_correlation(rewards: list[float], lengths: list[int]) -> float | None:
    """r between each rollout's total reward and its length in policy tokens: near 1, length alone explains
    the reward, the classic hack of a reward that pays for verbosity."""
    return correlation(rewards, [float(n) for n in lengths])


def disagreement(per_function: list[list[float | None]]) -> float | None:
    """1 - the lowest pairwise r between reward functions, over rows both score: 0 when they rank rollouts
    alike, 1 when some pair is unrelated, up to 2 when one pays for what the other punishes. None with fewer
    than two functions or no defined pair."""
    rs = []
    for a, b in combinations(per_function, 2):
        pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
        r = correlation([x for x, _ in pairs], [y for _, y in pairs])
        if r is not None:
            rs.append(r)
    return 1 - min(rs) if rs else None


def suspects(rows: list[dict], rewards: list[float], verified: list[float | None], k: int) -> list[dict]:
    """The k best-paid rollouts the verifier fails (ties in table order), with the reward they got; a failure paid
    only the batch's lowest reward is no sign of hacking and is left out."""
    lowest = min(rewards)
    failing = [i for i, v in enumerate(verified) if v is not None and v < 1 and rewards[i] > lowest]
    failing.sort(key=lambda i: -rewards[i])
    return [{**rows[i], "reward": rewards[i]} for i in failing[:k]]


def _trend(rows: list[dict], *keys: str) -> tuple[int, list[float | None]] | None:
    """(last iteration, relative change of each key) from the first to the last iteration row (000 excluded)
    that has every key; None with fewer than two such rows."""
    have = [r for r in rows if r["iteration"] > 0 and all(r.get(k) is not None for k in keys)]
    if len(have) < 2:
        return None
    first, last = have[0], have[-1]
    return last["iteration"], [None if first[k] == 0 else last[k] / first[k] - 1 for k in keys]


def divergence(rows: list[dict]) -> tuple[int, float] | None:
    """(iteration, relative train-reward gain - relative held-out accuracy gain) since the first iteration."""
    trend = _trend(rows, "reward_mean", "heldout_accuracy")
    if trend is None or None in trend[1]:
        return None
    reward, accuracy = trend[1]
    return trend[0], reward - accuracy


def length_drift(rows: list[dict]) -> tuple[int, float] | None:
    """(iteration, relative change of the mean completion length since the first iteration)."""
    trend = _trend(rows, "completion_length")
    return None if trend is None or trend[1][0] is None else (trend[0], trend[1][0])


def warnings(rows: list[dict], watch: WatchConfig) -> list[str]:
    """One line per threshold crossed, oldest iteration first, naming the value and the threshold."""
    lines = []
    for r in rows:
        it = f"iteration {r['iteration']:03d}"
        corr, dis, length = (r.get(k) for k in ("verifier_correlation", "reward_disagreement", "length_correlation"))
        if corr is not None and corr < watch.min_verifier_correlation:
            lines.append(f"{it}: reward and the verifier correlate at {corr:.2f}, below "
                         f"watch.min_verifier_correlation {watch.min_verifier_correlation}: the reward pays for "
                         "something else than the task")
        if length is not None and length > watch.max_length_correlation:
            lines.append(f"{it}: reward and completion length correlate at {length:.2f}, above "
                         f"watch.max_length_correlation {watch.max_length_correlation}: the reward pays for length")
        if dis is not None and dis > watch.max_disagreement:
            lines.append(f"{it}: reward functions disagree ({dis:.2f} > watch.max_disagreement "
                         f"{watch.max_disagreement})")
    gap = divergence(rows)
    if gap is not None and gap[1] > watch.max_divergence:
        lines.append(f"iteration {gap[0]:03d}: train reward rose {gap[1]:.0%} more than held-out accuracy "
                     f"(watch.max_divergence {watch.max_divergence:.0%})")
    drift = length_drift(rows)
    if drift is not None and abs(drift[1]) > watch.max_length_drift:
        lines.append(f"iteration {drift[0]:03d}: mean completion length changed {drift[1]:+.0%} since the first "
                     f"iteration (watch.max_length_drift {watch.max_length_drift:.0%})")
    return ["reward-hacking watch: " + line for line in lines]
