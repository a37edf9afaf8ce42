"""Pure functions, checked against values computed by hand."""

import math

import pyarrow as pa
import pytest

from burstrl.data.task import addition_problems, check_fits, draw_prompts
from burstrl.pipeline.iterations import load, save, with_next
from burstrl.rl.advantages import group_advantages, zero_variance_groups
from burstrl.rl.rewards import digit_match, exact_match, resolve, score_table, weighted_total
from burstrl.training.tinymodel import build_tokenizer


def test_group_advantages_scaled_matches_hand_computation():
    # group 7: rewards 1,0,0,0 -> mean 0.25, Bessel std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    # group 9: all equal -> zero advantage, no division blow-up
    adv = group_advantages([1, 0, 0, 0, 2, 2], [7, 7, 7, 7, 9, 9], scale="group")
    assert adv[0] == pytest.approx(0.75 / 0.5001)
    assert adv[1:4] == pytest.approx([-0.25 / 0.5001] * 3)
    assert adv[4:] == [0.0, 0.0]


def test_group_advantages_unscaled_is_centred_reward():
    assert group_advantages([3, 1, 0, 0], [1, 1, 2, 2], scale="none") == [1.0, -1.0, 0.0, 0.0]


def test_leave_one_out_baseline_is_the_mean_of_the_others():
    # group 1: rewards 3, 0, 0 -> baselines (0+0)/2 = 0 and (3+0)/2 = 1.5 -> advantages 3, -1.5, -1.5
    adv = group_advantages([3, 0, 0, 2, 2], [1, 1, 1, 2, 2], baseline="leave_one_out", scale="none")
    assert adv == pytest.approx([3.0, -1.5, -1.5, 0.0, 0.0])


def test_batch_scale_divides_by_the_std_of_all_rewards():
    # rewards 1, 0, 2, 2: mean 1.25, Bessel variance (0.0625 + 1.5625 + 0.5625 * 2) / 3 = 11/12
    adv = group_advantages([1, 0, 2, 2], [1, 1, 2, 2], scale="batch")
    std = math.sqrt(11 / 12) + 1e-4
    assert adv == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0])


def test_exact_match_strips_whitespace():
    assert exact_match(["1+1="] * 3, ["2", " 2 ", "3"], None, answer=["2", "2", "2"]) == [1.0, 1.0, 0.0]


def test_weighted_total_skips_none_like_trl():
    totals = weighted_total([[1.0, None, None], [0.5, 0.25, None]], [2.0, 4.0])
    assert totals[:2] == [2.0 + 2.0, 1.0]
    assert math.isnan(totals[2])


def test_resolve_known_and_unknown_names():
    assert resolve("burstrl.rl.rewards.exact_match") is exact_match
    with pytest.raises(ValueError, match="unknown reward function 'burstrl.rl.rewards.nope'"):
        resolve("burstrl.rl.rewards.nope")
    with pytest.raises(ValueError, match="cannot import module of 'nosuchpkg.f'"):
        resolve("nosuchpkg.f")


def test_addition_split_is_fixed_and_disjoint():
    train, heldout = addition_problems(seed=3, heldout_size=50)
    again, heldout_again = addition_problems(seed=3, heldout_size=50)
    assert len(train) + len(heldout) == 100 * 100
    assert heldout.to_pylist() == heldout_again.to_pylist() and train.equals(again)
    assert not set(train["prompt"].to_pylist()) & set(heldout["prompt"].to_pylist())
    row = heldout.to_pylist()[0]
    a, b = row["prompt"].rstrip("=").split("+")
    assert row["answer"] == str(int(a) + int(b))
    assert sorted(train["prompt_id"].to_pylist() + heldout["prompt_id"].to_pylist()) == list(range(10000))


def test_draw_prompts_is_seeded_per_iteration_without_replacement():
    train, _ = addition_problems(seed=0, heldout_size=10)
    first = draw_prompts(train, 32, seed=0, iteration=1)["prompt_id"].to_pylist()
    assert first == draw_prompts(train, 32, seed=0, iteration=1)["prompt_id"].to_pylist()
    assert len(set(first)) == 32
    assert first != draw_prompts(train, 32, seed=0, iteration=2)["prompt_id"].to_pylist()
    with pytest.raises(ValueError, match="exceeds"):
        draw_prompts(train, len(train) + 1, seed=0, iteration=1)


def test_tokenizer_is_character_level_and_round_trips():
    tok = build_tokenizer()
    ids = tok("12+34=")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 7
    assert tok.decode(ids[1:]) == "12+34="
    answer = tok("46", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(answer, skip_special_tokens=True) == "46"


def test_digit_match_gives_right_aligned_partial_credit():
    got = digit_match(None, ["46", "47", "146", "6", "", "64"], None, answer=["46"] * 6)
    assert got == [1.0, 0.5, 2 / 3, 0.5, 0.0, 0.0]


def test_iterations_file_round_trips(tmp_path):
    path = tmp_path / "iterations.yaml"
    save({"002": {"parent": "001", "sampler": "000"}, "001": {"parent": "000", "sampler": "000"}}, path)
    assert load(path) == {"001": {"parent": "000", "sampler": "000"}, "002": {"parent": "001", "sampler": "000"}}
    assert path.read_text().splitlines()[-1] == '  "002": {parent: "001", sampler: "000"}'


def test_next_iteration_trains_from_the_newest_and_samples_lag_behind():
    first = with_next({})
    assert first == {"001": {"parent": "000", "sampler": "000"}}
    assert with_next(first, lag=2)["002"] == {"parent": "001", "sampler": "000"}  # never before the bootstrap
    assert with_next({**first, "009": {"parent": "008", "sampler": "008"}}, lag=1)["010"] == {
        "parent": "009", "sampler": "008"}


def test_old_or_broken_iteration_entries_are_named(tmp_path):
    path = tmp_path / "iterations.yaml"
    path.write_text('iterations:\n  "001": "000"\n')
    with pytest.raises(ValueError, match=r"iterations.yaml: iteration 001: expected \{parent: \"NNN\", sampler"):
        load(path)


def test_zero_variance_groups_counts_groups_without_signal():
    assert zero_variance_groups([1, 1, 0, 1, 2, 2], [1, 1, 2, 2, 3, 3]) == {1, 3}


def test_trl_builtin_reward_runs_unchanged_on_conversational_rows():
    table = pa.table({"prompt": ["1+1="] * 2, "completion": ["<think>so</think>2", "2"], "completion_ids": [[5], [5]],
                      "answer": ["2", "2"]})
    per_function, totals = score_table(["trl.rewards.think_format_reward", "burstrl.rl.rewards.exact_match"],
                                       [1.0, 0.5], "r.parquet", table, ["answer"], conversational=True)
    assert per_function[0] == [1.0, 0.0]
    assert totals == [1.0, 0.5]


def test_reward_function_errors_name_the_function():
    table = pa.table({"prompt": ["1+1="], "completion": ["2"], "completion_ids": [[5]]})
    with pytest.raises(ValueError, match=r"r.parquet: reward function burstrl.rl.rewards.exact_match failed"):
        score_table(["burstrl.rl.rewards.exact_match"], [1.0], "r.parquet", table, [])


@pytest.mark.parametrize(("name", "shown"), [("nan", "nan"), ("inf", "inf"), ("text", "'1.0'")])
def test_a_reward_that_is_not_a_finite_number_names_the_function_and_row(name, shown):
    table = pa.table({"prompt": ["1+1=", "1+2="], "completion": ["2", "3"], "completion_ids": [[5], [6]]})
    with pytest.raises(ValueError, match=rf"^r.parquet: row 1: field 'rewards': reward function reward_faults.{name} "
                                         rf"returned {shown}; it must return a finite number, or None"):
        score_table([f"reward_faults.{name}"], [1.0], "r.parquet", table, [])


def test_prompt_that_leaves_no_room_is_named():
    train, _ = addition_problems(seed=0, heldout_size=10)
    rows = train.slice(0, 2)
    check_fits(rows, [[1] * 7, [1] * 7], max_tokens=5, max_len=13)
    with pytest.raises(ValueError, match=rf"prompt_id {rows['prompt_id'][1].as_py()}: field 'prompt': 8 tokens"):
        check_fits(rows, [[1] * 7, [1] * 8], max_tokens=5, max_len=13)
