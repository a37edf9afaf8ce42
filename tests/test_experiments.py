"""Ablations as DVC experiments with Hydra composition: two short runs that differ in one param, compared
with DVC's own commands. Real `dvc exp run`, real stages, tiny model, in a clone of the session's scored
workspace committed as a user would after a run, so the experiments start from its checkpoint 000 and rollouts."""

import json
import re

import pytest
import yaml
from conftest import SMALL, clone, run

pytestmark = pytest.mark.slow

EXPERIMENT = {**SMALL, "train": {"batch_size": 16}}  # two optimizer steps per run


def test_two_experiments_differ_in_exactly_one_param(scored, tmp_path):
    root = tmp_path / "ws"
    env = clone(scored, root, EXPERIMENT)
    # `dvc exp run` composes params.yaml from conf/, so the small sizes go there too: a section set by a config
    # group (task) into the group's default option, every other one into config.yaml.
    conf = yaml.safe_load((root / "conf/config.yaml").read_text())
    groups = {group: option for entry in conf["defaults"] if isinstance(entry, dict) for group, option in entry.items()}
    for section, values in EXPERIMENT.items():
        if section in groups:
            path = root / f"conf/{section}/{groups[section]}.yaml"
            text = path.read_text()
            option = yaml.safe_load(text)
            option[section].update(values)
            header = "".join(line + "\n" for line in text.splitlines() if line.startswith("# @package"))
            path.write_text(header + yaml.safe_dump(option, sort_keys=False))
        else:
            conf[section].update(values)
    (root / "conf/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    run(["git", "add", "-A"], root, env)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "small, scored"], root, env)

    # The composed params equal the scored workspace's up to train: only train and what follows it run.
    first = run(["dvc", "exp", "run", "-n", "base"], root, env).stdout
    assert "Running stage 'score@001'" not in first and "Running stage 'train@001'" in first
    second = run(["dvc", "exp", "run", "-n", "nokl", "-S", "train.beta=0"], root, env).stdout
    assert "skipping reference logprobs" in second

    params = json.loads(run(["dvc", "params", "diff", "base", "nokl", "--json"], root, env).stdout)
    assert params == {"params.yaml": {"train.beta": {"old": 0.02, "new": 0, "diff": -0.02}}}

    metrics = json.loads(run(["dvc", "metrics", "diff", "base", "nokl", "--json", "--all"], root, env).stdout)
    summary = metrics["report/summary.json"]
    assert {"heldout_accuracy", "reward_mean", "cost_usd_total"} <= set(summary)
    assert summary["kl_ref"]["old"] > 0 and summary["kl_ref"]["new"] is None  # no KL term, none logged
    assert metrics["metrics/score/001.json"]["reference_logprobs"] == {"old": True, "new": False, "diff": -1}
    assert "loss" in metrics["dvclive/train/001/metrics.json"]  # DVCLive's final step values

    shown = run(["dvc", "exp", "show", "--json"], root, env).stdout
    assert "nokl" in shown and "base" in shown

    diff = run(["dvc", "plots", "diff", "base", "nokl", "-o", "plots_diff"], root, env)
    assert "WARNING" not in diff.stderr, diff.stderr  # DVC warns, and drops the plot, on data it cannot draw
    page = (root / "plots_diff/index.html").read_text()
    for title in ("Reward and held-out accuracy", "KL to the reference and from the sampler", "Seconds per stage",
                  "dvclive/train/001/plots/metrics/loss.tsv"):
        assert title in page
    shown = run(["dvc", "plots", "show"], root, env)
    assert "WARNING" not in shown.stderr, shown.stderr
    assert "Completion length" in (root / "dvc_plots/index.html").read_text()
    # The offline report draws what `dvc plots show` draws, and the running cost, which DVC does not plot.
    plots = [next(iter(plot)) for plot in yaml.safe_load((root / "dvc.yaml").read_text())["plots"]]
    drawn = re.findall(r'<svg class="chart"[^>]*aria-label="([^"]*)"', (root / "report/index.html").read_text())
    assert drawn == [*plots, "Cost so far (USD)"]
