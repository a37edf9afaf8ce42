"""Print the run's history as a table: `python -m burstrl report`.

One row for the bootstrap policy and each iteration: mean reward of its rollouts, greedy held-out accuracy
of the policy it produced, KL to the reference during training, KL from the sampler to the trainer when
training began (the stale/quantized-sampler gap), mean completion length, seconds per stage and cost.
Missing cells are stages that have not run yet. The report stage draws the same history as charts. Below
the table, one WARNING line per threshold of the reward-hacking watch crossed (docs/reward-hacking.md).
"""

from pathlib import Path

from burstrl.config import load_config
from burstrl.pipeline import iterations
from burstrl.reporting.history import collect
from burstrl.rl.watch import warnings

COLUMNS = [
    ("iter", "iteration", "{:03d}"),
    ("reward", "reward_mean", "{:.3f}"),
    ("heldout_acc", "heldout_accuracy", "{:.3f}"),
    ("kl_ref", "kl_ref", "{:.4f}"),
    ("kl_samp", "sampler_kl", "{:.4f}"),
    ("compl_len", "completion_length", "{:.2f}"),
    ("s_gen", "seconds_generate", "{:.0f}"),
    ("s_score", "seconds_score", "{:.0f}"),
    ("s_train", "seconds_train", "{:.0f}"),
    ("s_eval", "seconds_eval", "{:.0f}"),
    ("usd", "cost_usd", "{:.4f}"),
]


def render(rows: list[dict]) -> str:
    header = [name for name, _, _ in COLUMNS]
    table = [[fmt.format(r[key]) if r.get(key) is not None else "-" for _, key, fmt in COLUMNS] for r in rows]
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *table])


if __name__ == "__main__":
    cfg = load_config()
    rows = collect(Path("metrics"), Path("data/sync"), cfg.cost, list(iterations.load()))
    print(render(rows))
    for line in warnings(rows, cfg.watch):
        print(f"WARNING {line}")
