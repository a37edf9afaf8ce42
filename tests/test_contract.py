"""The stage data contract: good files read back, each kind of bad file is named precisely and left in place."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import as_table, rollout_rows

from burstrl.data.contract import (
    ROLLOUT_FIELDS,
    SCORED_FIELDS,
    TASK_FIELDS,
    TEACHER_FIELDS,
    check_tokens,
    read_rollouts,
    read_scored,
    read_task,
    write_table,
)
from burstrl.errors import ContractError


def write(tmp_path, rows, fields=ROLLOUT_FIELDS, name="r.parquet"):
    path = tmp_path / name
    write_table(as_table(rows, fields), fields, path)
    return path


def test_valid_files_round_trip(tmp_path):
    rows = rollout_rows()
    assert read_rollouts(write(tmp_path, rows)).num_rows == 4
    scored = read_scored(write(tmp_path, rows, SCORED_FIELDS, "s.parquet"))
    assert scored["advantage"].to_pylist() == [-0.5, 0.5, -0.5, 0.5]
    assert scored["answer"].to_pylist() == ["1", "1", "2", "2"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_missing_column_names_file_and_field(tmp_path):
    path = tmp_path / "r.parquet"
    pq.write_table(as_table(rollout_rows()).drop_columns(["sampler_logprobs"]), path)
    with pytest.raises(ContractError, match=r"r\.parquet: schema: field 'sampler_logprobs': column is missing"):
        read_rollouts(path)
    assert path.exists()


def test_wrong_dtype_is_named(tmp_path):
    path = tmp_path / "r.parquet"
    table = as_table(rollout_rows())
    table = table.set_column(table.schema.get_field_index("seed"), "seed", pa.array(["x"] * 4))
    pq.write_table(table, path)
    with pytest.raises(ContractError, match="field 'seed': dtype is string, expected int64"):
        read_rollouts(path)


def test_unequal_per_token_lengths_name_the_row(tmp_path):
    rows = rollout_rows()
    rows[3]["sampler_logprobs"] = [-0.5]
    path = write(tmp_path, rows)
    with pytest.raises(ContractError, match=r"row 3 \(prompt_id=1, sample_index=1\): field 'sampler_logprobs': "
                                            r"has 1 values for 2 completion tokens"):
        read_rollouts(path)


def test_nan_and_positive_logprobs_are_rejected(tmp_path):
    rows = rollout_rows()
    rows[1]["ref_logprobs"] = [math.nan, -0.1]
    with pytest.raises(ContractError, match="row 1 .* field 'ref_logprobs': holds nan"):
        read_scored(write(tmp_path, rows, SCORED_FIELDS))
    rows = rollout_rows()
    rows[0]["sampler_logprobs"] = [0.5, -0.1]
    with pytest.raises(ContractError, match="row 0 .* field 'sampler_logprobs': holds 0.5"):
        read_rollouts(write(tmp_path, rows))


def test_group_with_one_completion_is_rejected(tmp_path):
    rows = rollout_rows()[:3]
    with pytest.raises(ContractError, match="row 2 .* field 'prompt_id': group 1 has 1 completion; GRPO needs >= 2"):
        read_rollouts(write(tmp_path, rows))


def test_gap_in_sample_index_is_rejected(tmp_path):
    rows = rollout_rows()
    rows[1]["sample_index"] = 5
    with pytest.raises(ContractError, match=r"field 'sample_index': group 0 has indices \[0, 5\]"):
        read_rollouts(write(tmp_path, rows))


def test_truncated_file_is_reported_not_crashed(tmp_path):
    path = write(tmp_path, rollout_rows())
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ContractError, match="not a readable Parquet file"):
        read_rollouts(path)


def test_non_finite_reward_is_rejected(tmp_path):
    rows = rollout_rows()
    rows[2]["advantage"] = math.inf
    with pytest.raises(ContractError, match="row 2 .* field 'advantage': is inf"):
        read_scored(write(tmp_path, rows, SCORED_FIELDS))


def test_advantages_that_do_not_sum_to_zero_in_a_group_are_rejected(tmp_path):
    rows = rollout_rows()
    rows[2]["advantage"] = 0.9
    with pytest.raises(ContractError, match="row 2 .* field 'advantage': group 1 sums to 1.4"):
        read_scored(write(tmp_path, rows, SCORED_FIELDS))


def teacher_rows():
    """Scored rows with a teacher's columns: two completion tokens, top 2 at each."""
    rows = rollout_rows()
    for row in rows:
        row.update(teacher_logprobs=[-0.7, -0.2], teacher_topk_ids=[[5, 7], [2, 9]],
                   teacher_topk_logprobs=[[-0.5, -1.5], [-0.2, -2.0]])
    return rows


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.update(teacher_topk_logprobs=[[-1.5, -0.5], [-0.2, -2.0]]),
     "field 'teacher_topk_logprobs': holds \\[-1.5, -0.5\\] at token 0; .* most likely first"),
    (lambda r: r.update(teacher_topk_ids=[[5], [2, 9]]),
     "field 'teacher_topk_ids': has 1 ids and 2 logprobs at token 0"),
    (lambda r: r.update(teacher_topk_logprobs=[[-0.1, -0.2], [-0.2, -2.0]]),
     "at token 0 sums to probability 1.7236 > 1"),
    (lambda r: r.update(teacher_logprobs=[-0.7]), "field 'teacher_logprobs': has 1 values for 2 completion tokens"),
])
def test_bad_teacher_columns_are_named(tmp_path, change, message):
    rows = teacher_rows()
    assert read_scored(write(tmp_path, rows, SCORED_FIELDS + TEACHER_FIELDS)).num_rows == 4
    change(rows[3])
    with pytest.raises(ContractError, match=f"row 3 .*{message}"):
        read_scored(write(tmp_path, rows, SCORED_FIELDS + TEACHER_FIELDS))


def test_task_table_with_duplicate_prompt_ids_is_rejected(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt_id": [3, 4, 3], "prompt": ["a", "b", "c"], "answer": ["1", "2", "3"]},
                            schema=pa.schema(TASK_FIELDS)), path)
    with pytest.raises(ContractError, match=r"train\.parquet: row 2: field 'prompt_id': 3 appears twice"):
        read_task(path)


def test_token_ids_must_come_from_the_policys_tokenizer_and_vocabulary(tmp_path):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"vocab_size": 7}))
    rows = rollout_rows()  # token ids up to 16 (prompt_ids), tokenizer_hash "tok"
    path = write(tmp_path, rows)
    table = read_rollouts(path)
    with pytest.raises(ContractError, match=r"row 0 \(prompt_id=0, sample_index=0\): field 'tokenizer_hash': is tok, "
                                            r"but .*policy tokenizes with other: its token ids would mean other text"):
        check_tokens(path, table, policy, {"tokenizer_hash": "other"})
    with pytest.raises(ContractError, match=r"row 0 .*field 'prompt_ids': holds a token id outside .*vocabulary of 7"):
        check_tokens(path, table, policy, {"tokenizer_hash": "tok"})
    (policy / "config.json").write_text(json.dumps({"vocab_size": 17}))
    for row in rows:
        row["completion_ids"] = [5, 17] if row["prompt_id"] == 1 and row["sample_index"] == 1 else [5, 2]
    path = write(tmp_path, rows)
    with pytest.raises(ContractError, match=r"row 3 .*field 'completion_ids': holds a token id outside"):
        check_tokens(path, read_rollouts(path), policy, {"tokenizer_hash": "tok"})
    rows[3]["completion_ids"] = [5, 16]
    path = write(tmp_path, rows)
    check_tokens(path, read_rollouts(path), policy, {"tokenizer_hash": "tok"})
