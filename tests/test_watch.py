"""The reward-hacking watch: its signals against hand values, and on the real score and report stages a reward
that pays for length sets it off while the task's own rewards do not."""

import json
import math

import pyarrow.parquet as pq
import pytest
from conftest import clone, run, with_tests_on_path

from burstrl.config import WatchConfig
from burstrl.rl import watch


def test_correlation_by_hand():
    # x = 0, 1, 2 and y = 0, 1, 1: sxy = 1, sxx = 2, syy = 2/3, r = 1 / sqrt(4/3)
    assert watch.correlation([0, 1, 2], [0, 1, 1]) == pytest.approx(math.sqrt(3) / 2)
    assert watch.correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert watch.correlation([1, 1, 1], [0, 1, 0]) is None  # a constant side: undefined, not 0
    assert watch.correlation([1.0], [1.0]) is None


def test_verifier_correlation_skips_rows_the_verifier_does_not_apply_to():
    # Without the None row the pairs are (0, 0), (1, 1), (2, 1): the r above.
    got = watch.verifier_correlation([0.0, 1.0, 9.0, 2.0], [0.0, 1.0, None, 1.0])
    assert got == pytest.approx(math.sqrt(3) / 2)


def test_disagreement_is_one_minus_the_lowest_pairwise_correlation():
    exact, digits, length = [0, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 1]
    # r(exact, digits) = 1/sqrt(3); r(exact, length) = -1; r(digits, length) = -1/sqrt(3)
    assert watch.disagreement([exact, digits]) == pytest.approx(1 - 1 / math.sqrt(3))
    assert watch.disagreement([exact, digits, length]) == pytest.approx(2.0)
    assert watch.disagreement([exact]) is None
    assert watch.disagreement([exact, [None, None, 1, 1]]) is None  # the pair's shared rows are constant


def test_suspects_are_the_best_paid_failures():
    rows = [{"prompt_id": i} for i in range(5)]
    rewards = [3.0, 5.0, 1.0, 4.0, 0.0]
    verified = [0.0, 1.0, 0.0, 0.0, 0.0]  # row 1 passes; row 4 fails but is paid the batch's least
    assert watch.suspects(rows, rewards, verified, 2) == [{"prompt_id": 3, "reward": 4.0},
                                                          {"prompt_id": 0, "reward": 3.0}]
    assert [r["prompt_id"] for r in watch.suspects(rows, rewards, verified, 10)] == [3, 0, 2]


def rows(*values):
    """History rows 000, 001, ...: (reward_mean, heldout_accuracy, completion_length, verifier_correlation)."""
    keys = ("reward_mean", "heldout_accuracy", "completion_length", "verifier_correlation")
    return [{"iteration": i, **dict(zip(keys, v, strict=True))} for i, v in enumerate(values)]


def test_warnings_name_each_threshold_crossed():
    cfg = WatchConfig()
    healthy = rows((None, 0.3, None, None), (1.0, 0.32, 3.0, 0.9), (1.2, 0.4, 3.2, 0.85))
    assert watch.warnings(healthy, cfg) == []
    paid_for_length = [{"iteration": 1, "length_correlation": 0.95, "reward_disagreement": 1.2}]
    assert watch.warnings(paid_for_length, cfg) == [
        "reward-hacking watch: iteration 001: reward and completion length correlate at 0.95, above "
        "watch.max_length_correlation 0.8: the reward pays for length",
        "reward-hacking watch: iteration 001: reward functions disagree (1.20 > watch.max_disagreement 1.0)",
    ]
    # Reward x2 while accuracy +10%: divergence 1.0 - 0.1 = 0.9 > 0.5; length 3 -> 7.5: +150% > 100%.
    hacked = rows((None, 0.3, None, None), (1.0, 0.3, 3.0, 0.9), (2.0, 0.33, 7.5, 0.1))
    assert watch.warnings(hacked, cfg) == [
        "reward-hacking watch: iteration 002: reward and the verifier correlate at 0.10, below "
        "watch.min_verifier_correlation 0.3: the reward pays for something else than the task",
        "reward-hacking watch: iteration 002: train reward rose 90% more than held-out accuracy "
        "(watch.max_divergence 50%)",
        "reward-hacking watch: iteration 002: mean completion length changed +150% since the first iteration "
        "(watch.max_length_drift 100%)",
    ]
    assert watch.divergence(hacked) == (2, pytest.approx(0.9))
    assert watch.length_drift(hacked) == (2, pytest.approx(1.5))
    assert watch.divergence(hacked[:2]) is None  # one iteration has no trend yet


@pytest.mark.slow
def test_a_reward_that_pays_for_length_sets_the_watch_off(scored, tmp_path):
    # The scored workspace's own rewards (exact and digit match) are the honest arm.
    honest = tmp_path / "honest"
    env = clone(scored, honest)
    report = run(["python", "stages/report.py"], honest, env).stdout
    assert "WARNING" not in report, report
    assert "No threshold crossed." in (honest / "report/index.html").read_text()
    assert json.loads((honest / "metrics/score/001.json").read_text())["length_correlation"] < 0.8

    # The same rollouts, paid by their length; train.beta 0 skips the reference pass the watch does not need.
    root = tmp_path / "length"
    params = {"score": {"reward_funcs": ["watch_rewards.length"], "reward_weights": [1.0]}, "train": {"beta": 0.0}}
    env = with_tests_on_path(clone(scored, root, params))
    run(["python", "stages/score.py", "001"], root, env)
    out = run(["python", "stages/report.py"], root, env).stdout
    table = run(["python", "-m", "burstrl", "report"], root, env).stdout
    metrics = json.loads((root / "metrics/score/001.json").read_text())
    warning = ("WARNING reward-hacking watch: iteration 001: reward and completion length correlate at 1.00, above "
               "watch.max_length_correlation 0.8: the reward pays for length")
    assert warning in out and warning in table

    # By hand from the scored table: the verifier (exact match), and the five best-paid rollouts it fails.
    scored_rows = pq.read_table(root / "data/scored/001.parquet").to_pylist()
    verified = [1.0 if r["completion"].strip() == r["answer"].strip() else 0.0 for r in scored_rows]
    assert metrics["verified_rate"] == pytest.approx(sum(verified) / len(verified))
    assert metrics["length_correlation"] == pytest.approx(1.0)
    low = min(r["reward"] for r in scored_rows)
    failing = sorted((r for r, v in zip(scored_rows, verified, strict=True) if not v and r["reward"] > low),
                     key=lambda r: -r["reward"])[:5]
    suspects = json.loads((root / "metrics/watch/001.json").read_text())
    assert [(s["prompt_id"], s["sample_index"], s["reward"]) for s in suspects["suspects"]] == [
        (r["prompt_id"], r["sample_index"], pytest.approx(r["reward"])) for r in failing]
    page = (root / "report/index.html").read_text()
    assert 'class="warning"' in page and 'class="suspects"' in page
