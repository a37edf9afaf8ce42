"""Print the per-iteration table from the metrics files the stages write.

`python -m burstrl.report` shows, for the bootstrap policy and each iteration: mean reward of its rollouts,
greedy held-out accuracy of the policy it produced, KL to the reference during training, KL from the
sampler to the trainer when training began (the stale/quantized-sampler gap), mean completion length and
seconds per stage. Missing cells are stages that have not run yet.
"""

import json
from pathlib import Path

COLUMNS = [
    ("iter", None, None, "{}"),
    ("reward", "score", "reward_mean", "{:.3f}"),
    ("heldout_acc", "eval", "heldout_accuracy", "{:.3f}"),
    ("kl_ref", "train", "kl", "{:.4f}"),
    ("kl_samp", "train", "sampler_kl", "{:.4f}"),
    ("compl_len", "generate", "completion_length_mean", "{:.2f}"),
    ("s_gen", "generate", "seconds", "{:.0f}"),
    ("s_score", "score", "seconds", "{:.0f}"),
    ("s_train", "train", "seconds", "{:.0f}"),
    ("s_eval", "eval", "seconds", "{:.0f}"),
]


def rows(metrics_dir: Path) -> list[list[str]]:
    versions = sorted({p.stem for p in metrics_dir.glob("*/*.json")}, key=int)
    table = []
    for version in versions:
        row = []
        for _, stage, key, fmt in COLUMNS:
            if stage is None:
                row.append(version)
                continue
            path = metrics_dir / stage / f"{version}.json"
            value = json.loads(path.read_text()).get(key) if path.exists() else None
            row.append(fmt.format(value) if value is not None else "-")
        table.append(row)
    return table


def render(table: list[list[str]]) -> str:
    header = [name for name, *_ in COLUMNS]
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *table]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(rows(Path("metrics"))))
