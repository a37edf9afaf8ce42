"""The short soak (bench.soak; `make soak` runs the long one): `dvc repro`'s whole process group SIGKILLed from
outside once in every stage kind, at a moment drawn uniformly from the stage's duration in an uninterrupted run
(or as its command exits, while DVC commits), then run to the end and compared with that uninterrupted run.

The uninterrupted runs are the session's: `bootstrapped` for prepare, bootstrap and sync-bootstrap (timed as it
is built), and this module's `reference`, a clone of it that ran the iteration. The first test kills the first
stages in a fresh workspace, the second kills the iteration's stages in a clone of `bootstrapped`.
"""

import random

import pytest
from conftest import SMALL, clone, scratch_workspace

from bench import soak
from bench.watch import watch

pytestmark = pytest.mark.slow
TOLERANCE = 1e-6  # the resume tests' bound; on CPU the resumed weights are in fact bit-identical


@pytest.fixture(scope="module")
def reference(bootstrapped, tmp_path_factory):
    root = tmp_path_factory.mktemp("soak") / "reference"
    watched = watch(["dvc", "repro"], root, clone(bootstrapped, root))
    return root, {**bootstrapped.durations, **soak.durations(watched)}


def assert_lossless(kills: list[soak.Kill], diffs: dict, stages: list[str]) -> None:
    lines = soak.table(kills, [diffs], stages)
    print(soak.render(lines))
    assert [line["kills"] for line in lines] == [1] * len(stages), kills
    for line in lines:
        assert line["rows_lost"] == line["rows_duplicated"] == 0, line
        assert line["weight_max_diff"] is None or line["weight_max_diff"] <= TOLERANCE, line
    assert {stage: [k for k, v in checks.items() if v is False] for stage, checks in diffs.items()} == {
        stage: [] for stage in stages}


def test_a_kill_in_each_first_stage_loses_nothing(bootstrapped, tmp_path):
    stages = ["prepare", "bootstrap", "sync-bootstrap"]
    root = tmp_path / "ws"
    root.mkdir()
    env = scratch_workspace(root, SMALL)
    kills = soak.soak_run(root, env, stages, bootstrapped.durations, random.Random(1),
                          cmd=("dvc", "repro", "sync-bootstrap"))
    assert_lossless(kills, soak.compare(bootstrapped.root, root, stages), stages)


def test_a_kill_in_each_iteration_stage_loses_nothing(bootstrapped, reference, tmp_path):
    ref, durations = reference
    stages = ["generate", "score", "train", "eval", "sync", "report"]
    root = tmp_path / "ws"
    env = clone(bootstrapped, root)
    kills = soak.soak_run(root, env, stages, durations, random.Random(2))
    assert_lossless(kills, soak.compare(ref, root, stages), stages)
