"""Ablations as DVC experiments with Hydra composition: two short runs that differ in one param, compared
with DVC's own commands. Real `dvc exp run`, real stages, tiny model, in a clone of the session's scored
workspace committed as a user would after a run, so the experiments start from its checkpoint 000 and rollouts."""

import json
import re

import pytest
import yaml
from conftest import SMALL, clone, run, screenshot

from burstrl.reporting.charts import COLORS

pytestmark = pytest.mark.slow

EXPERIMENT = {**SMALL, "train": {"batch_size": 16}}  # two optimizer steps per run


def committed(scored, root, params: dict) -> dict:
    """A clone of the scored workspace at `root` with `params` merged over its params.yaml and into conf/ (which
    `dvc exp run` composes params.yaml from: a section set by a config group (task) into the group's default
    option, every other one into config.yaml), committed as a user would after a run; returns its environment."""
    env = clone(scored, root, params)
    conf = yaml.safe_load((root / "conf/config.yaml").read_text())
    groups = {group: option for entry in conf["defaults"] if isinstance(entry, dict) for group, option in entry.items()}
    for section, values in params.items():
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
    return env


def test_two_experiments_differ_in_exactly_one_param(scored, tmp_path):
    root = tmp_path / "ws"
    env = committed(scored, root, EXPERIMENT)

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


def test_a_sweep_runs_each_arm_under_each_seed_through_the_queue_and_compares_them(scored, tmp_path):
    root = tmp_path / "ws"
    env = committed(scored, root, EXPERIMENT)
    (root / "conf/sweep/mini.yaml").write_text("seeds: [0, 1]\narms: {base: {}, bonus: {train.entropy_coef: 0.05}}\n")
    done = run(["python", "-m", "burstrl", "sweep", "conf/sweep/mini.yaml"], root, env)
    assert "sweep mini: 4 experiments" in done.stdout
    names = ["mini-base-s0", "mini-base-s1", "mini-bonus-s0", "mini-bonus-s1"]
    shown = json.loads(run(["dvc", "exp", "show", "--json"], root, env).stdout)
    exps = {e["name"]: e["data"] for head in shown for e in head.get("experiments") or [] for e in e["revs"]}
    assert set(names) <= set(exps)

    def metric(name, file, key):
        return exps[name]["metrics"][file]["data"][key]

    def param(name, key):
        section, field = key.split(".")
        return exps[name]["params"]["params.yaml"]["data"][section][field]

    assert [param(n, "generate.seed") for n in names] == [0, 1, 0, 1]
    assert [param(n, "train.entropy_coef") for n in names] == [0.0, 0.0, 0.05, 0.05]
    # Seed 1 drew other rollouts; both arms of a seed trained on the same ones.
    rollouts = [exps[n]["outs"]["data/rollouts/001.parquet"]["hash"] for n in names]
    assert rollouts[0] == rollouts[2] != rollouts[1] == rollouts[3]

    compared = run(["python", "-m", "burstrl", "compare", "conf/sweep/mini.yaml"], root, env)
    assert "compare mini: 4 of 4 experiments" in compared.stdout
    rows = {(r["arm"], r["iteration"]): r for r in json.loads((root / "report/sweep/mini/compare.json").read_text())}
    assert set(rows) == {(arm, i) for arm in ("base", "bonus") for i in (0, 1)}
    for arm in ("base", "bonus"):
        for key, file, field in [("heldout_accuracy", "metrics/eval/001.json", "heldout_accuracy"),
                                 ("reward_mean", "metrics/score/001.json", "reward_mean"),
                                 ("kl_ref", "metrics/train/001.json", "kl"),
                                 ("entropy", "metrics/train/001.json", "entropy")]:
            a, b = (metric(f"mini-{arm}-s{seed}", file, field) for seed in (0, 1))
            mean, half = (a + b) / 2, 12.706 * abs(a - b) / 2  # t * s / sqrt(2), s = |a - b| / sqrt(2)
            row = rows[(arm, 1)]
            assert (row["seeds"], row[f"{key}_n"]) == (2, 2)
            assert row[key] == pytest.approx(mean)
            assert (row[f"{key}_lo"], row[f"{key}_hi"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
        # Both seeds start from the one bootstrap policy: its accuracy has no spread.
        start = metric(f"mini-{arm}-s0", "metrics/eval/000.json", "heldout_accuracy")
        assert (rows[(arm, 0)]["heldout_accuracy"], rows[(arm, 0)]["heldout_accuracy_hi"]) == \
            (pytest.approx(start), pytest.approx(start))
    assert "bonus" in compared.stdout and "±" in compared.stdout

    page = root / "report/sweep/mini/index.html"
    drawn = re.findall(r'<svg class="chart"[^>]*aria-label="([^"]*)"', page.read_text())
    assert drawn == [f"{title} (mean, 95% interval over seeds)" for title in
                     ("Held-out accuracy", "Reward", "KL to the reference", "Entropy")]
    pixels = screenshot(page, tmp_path / "shot.png")
    for color in COLORS[:2]:  # each arm's line and markers
        rgb = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
        assert sum(p == rgb for p in pixels) > 300, f"arm colour {color} not drawn"
    plots = run(["dvc", "plots", "show", "report/sweep/mini/compare.json", "--template", "band", "-x", "iteration",
                 "-y", "heldout_accuracy", "-o", "sweep_plots"], root, env)
    assert "WARNING" not in plots.stderr, plots.stderr
    assert "heldout_accuracy_lo" in (root / "sweep_plots/index.html").read_text()
