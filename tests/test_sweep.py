"""Sweep files, the experiments they make and the comparison's statistics, by hand. The sweep through DVC's queue
runs in tests/test_experiments.py."""

import math

import pytest
from conftest import REPO

from burstrl.errors import ConfigError
from burstrl.pipeline import sweep
from burstrl.reporting import compare

CONF = REPO / "conf"


def write(tmp_path, text: str):
    path = tmp_path / "abl.yaml"
    path.write_text(text)
    return path


def test_each_arm_runs_under_each_seed_with_its_overrides(tmp_path):
    path = write(tmp_path, "seeds: [3, 7]\narms:\n  lo: {train.beta: 0.0, score.scale_rewards: none}\n"
                           "  mi50: {hardware: mi50, train.is_mode: token_mask}\n")
    experiments = sweep.load(path, CONF).experiments()
    assert [(e.name, e.arm, e.seed) for e in experiments] == [
        ("abl-lo-s3", "lo", 3), ("abl-lo-s7", "lo", 7), ("abl-mi50-s3", "mi50", 3), ("abl-mi50-s7", "mi50", 7)]
    assert experiments[1].overrides == ("train.beta=0.0", "score.scale_rewards=none", "generate.seed=7")
    assert sweep.queue_commands(sweep.load(path, CONF), force=False)[2] == [
        "dvc", "exp", "run", "--queue", "-n", "abl-mi50-s3", "-S", "hardware=mi50", "-S", "train.is_mode=token_mask",
        "-S", "generate.seed=3"]


def test_the_shipped_sweeps_load():
    for path in sorted((CONF / "sweep").glob("*.yaml")):
        assert sweep.load(path, CONF).experiments()


@pytest.mark.parametrize("text, message", [
    ("seeds: [0]\n", "exactly two keys, seeds and arms"),
    ("seeds: []\narms: {a: {}}\n", "seeds must be a list of distinct integers >= 0"),
    ("seeds: [1, 1]\narms: {a: {}}\n", "seeds must be a list of distinct integers >= 0"),
    ("seeds: [0]\narms: {a b: {}}\n", "arm 'a b': a name of letters"),
    ("seeds: [0]\narms: {a: {train.betta: 0}}\n", "arm a: 'train.betta' is not a params key"),
    ("seeds: [0]\narms: {a: {generate.seed: 4}}\n", "arm a: generate.seed is the sweep's seed"),
    ("seeds: [0]\narms: {a: [train.beta]}\n", "arm a: overrides must be a mapping"),
])
def test_a_bad_sweep_file_names_the_file_arm_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as raised:
        sweep.load(path, CONF)
    assert str(raised.value).startswith(f"{path}: ")


def test_overrides_are_spelled_as_hydra_reads_them():
    assert [sweep._hydra(v) for v in (0.02, 0, True, None, "token_mask", "a b", [1, 2])] == [
        "0.02", "0", "true", "null", "token_mask", "'a b'", "[1,2]"]


def test_interval_of_the_mean_by_hand():
    mean, lo, hi = compare.interval([1.0, 2.0, 3.0])  # s = 1, t(2) = 4.303
    assert (mean, lo, hi) == (2.0, pytest.approx(2 - 4.303 / math.sqrt(3)), pytest.approx(2 + 4.303 / math.sqrt(3)))
    assert compare.interval([0.5]) == (0.5, None, None)
    assert compare.interval([]) == (None, None, None)
    assert compare.t975(60) == pytest.approx(2.0003, abs=0.002)  # past the table


def test_comparison_rows_per_arm_and_iteration():
    spec = sweep.Sweep("s", (0, 1), {"a": {}, "b": {"train.beta": 0}})
    hist = {"s-a-s0": [{"iteration": 0, "heldout_accuracy": 0.1}, {"iteration": 1, "heldout_accuracy": 0.2,
                                                                    "reward_mean": 1.0, "kl_ref": 0.5}],
            "s-a-s1": [{"iteration": 0, "heldout_accuracy": 0.1}, {"iteration": 1, "heldout_accuracy": 0.4,
                                                                    "reward_mean": 2.0, "kl_ref": None}],
            "s-b-s1": [{"iteration": 0, "heldout_accuracy": 0.1}]}  # s-b-s0 missing
    rows = {(r["arm"], r["iteration"]): r for r in compare.comparison(spec, hist)}
    assert set(rows) == {("a", 0), ("a", 1), ("b", 0)}
    one = rows[("a", 1)]
    half = 12.706 * (math.sqrt(0.02) / math.sqrt(2))  # s of (0.2, 0.4) = sqrt(0.02)
    assert (one["seeds"], one["heldout_accuracy"]) == (2, pytest.approx(0.3))
    assert (one["heldout_accuracy_lo"], one["heldout_accuracy_hi"]) == (pytest.approx(0.3 - half),
                                                                        pytest.approx(0.3 + half))
    assert (one["kl_ref"], one["kl_ref_lo"], one["kl_ref_n"]) == (0.5, None, 1)
    assert (one["entropy"], one["entropy_n"]) == (None, 0)
    assert (rows[("b", 0)]["seeds"], rows[("b", 0)]["heldout_accuracy_hi"]) == (1, None)
    table = compare.render_table(list(rows.values())).splitlines()
    assert table[2].split()[:5] == ["a", "001", "2", "0.3", "±"]
