"""Dynamic sampling in score: zero-variance groups drawn again, replaced only when the new draw has reward
variance, with the batch's size, order and every other row unchanged."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import clone, run

from burstrl.rl.resample import RESEED, resample
from burstrl.rl.rewards import digit_match, exact_match


def rows(pid: int, values: list[float], seed: int) -> list[dict]:
    return [{"prompt_id": pid, "sample_index": k, "prompt_ids": [pid], "value": v, "seed": seed}
            for k, v in enumerate(values)]


def test_only_groups_that_gain_variance_are_replaced():
    # Groups 1 and 3 are flat. Round 1 gives group 1 variance; group 3 stays flat in both rounds.
    table = pa.Table.from_pylist(rows(1, [0.0, 0.0], 10) + rows(2, [0.0, 1.0], 20) + rows(3, [1.0, 1.0], 30))
    asked = []

    def draw(heads, prompt_ids, seeds):
        asked.append((heads["prompt_id"].to_pylist(), prompt_ids, seeds))
        return pa.Table.from_pylist([r for pid, seed in zip(heads["prompt_id"].to_pylist(), seeds, strict=True)
                                     for r in rows(pid, [0.0, 1.0] if pid == 1 else [1.0, 1.0], seed)])

    done = resample(table, table["value"].to_pylist(), 2, draw, lambda t: t["value"].to_pylist())
    assert asked == [([1, 3], [[1], [3]], [10 + RESEED, 30 + RESEED]), ([3], [[3]], [30 + 2 * RESEED])]
    assert done.counts == {"groups_resampled": 1, "resample_rounds": 2, "resampled_completions": 6,
                           "groups_zero_variance_after": 1}
    got = done.table.to_pylist()
    assert [(r["prompt_id"], r["sample_index"], r["value"], r["seed"]) for r in got] == [
        (1, 0, 0.0, 10 + RESEED), (1, 1, 1.0, 10 + RESEED), (2, 0, 0.0, 20), (2, 1, 1.0, 20), (3, 0, 1.0, 30),
        (3, 1, 1.0, 30)]
    assert done.table.schema == table.schema


def test_no_flat_group_draws_nothing():
    table = pa.Table.from_pylist(rows(1, [0.0, 1.0], 10))
    done = resample(table, [0.0, 1.0], 3, lambda *a: pytest.fail("nothing to draw"), lambda t: [])
    assert done.table is table and done.counts["groups_resampled"] == 0


@pytest.mark.slow
def test_score_resamples_zero_variance_groups_and_loses_no_row(scored, tmp_path):
    root = tmp_path / "ws"
    env = clone(scored, root, {"score": {"zero_variance": "resample", "resample_rounds": 2}})
    kept = json.loads((scored.root / "metrics/score/001.json").read_text())
    assert kept["groups_zero_variance"] == kept["groups_zero_variance_sampled"] > 0  # keep: nothing drawn
    run(["python", "stages/score.py", "001"], root, env)
    metrics = json.loads((root / "metrics/score/001.json").read_text())
    original = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    new = pq.read_table(root / "data/scored/001.parquet").to_pylist()

    # Every (prompt, sample) once, in the same order; a group is either untouched or drawn anew in full.
    assert [(r["prompt_id"], r["sample_index"]) for r in new] == [(r["prompt_id"], r["sample_index"])
                                                                  for r in original]
    pids = dict.fromkeys(r["prompt_id"] for r in original)
    before = {pid: [r for r in original if r["prompt_id"] == pid] for pid in pids}
    after = {pid: [r for r in new if r["prompt_id"] == pid] for pid in before}

    def total(group):  # the stage's rewards, by hand: exact match plus digit match
        texts, answers = [r["completion"] for r in group], [r["answer"] for r in group]
        return [a + b for a, b in zip(exact_match(None, texts, None, answers), digit_match(None, texts, None, answers),
                                      strict=True)]

    flat = [pid for pid, group in before.items() if len(set(total(group))) == 1]
    replaced = [pid for pid in flat if after[pid][0]["seed"] != before[pid][0]["seed"]]
    assert replaced, "the scored iteration's flat groups gain variance when drawn again; none was replaced"
    for pid, group in after.items():
        if pid in replaced:
            rounds = (group[0]["seed"] - before[pid][0]["seed"]) // RESEED
            assert 1 <= rounds <= 2 and {r["seed"] for r in group} == {before[pid][0]["seed"] + rounds * RESEED}
            assert len(set(total(group))) > 1  # replaced only because the new draw has variance
            assert [r["completion_ids"] for r in group] != [r["completion_ids"] for r in before[pid]]
        else:
            contract = ("completion_ids", "sampler_logprobs", "seed", "completion")
            assert [[r[k] for k in contract] for r in group] == [[r[k] for k in contract] for r in before[pid]]
        assert [r["reward"] for r in group] == pytest.approx(total(group))
    assert metrics["groups_zero_variance_sampled"] == len(flat)
    assert metrics["groups_resampled"] == len(replaced)
    assert metrics["groups_zero_variance"] == metrics["groups_zero_variance_after"] == len(flat) - len(replaced)
    assert metrics["resampled_completions"] > 0 and metrics["rollouts"] == len(original)
    assert all(r["ref_logprobs"] is not None and len(r["ref_logprobs"]) == len(r["completion_ids"]) for r in new)
