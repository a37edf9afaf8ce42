"""The TRL hook: scored rows become the tensors TRL's GRPO loss expects, and an update moves the right way."""

from pathlib import Path

import datasets
import pytest
import torch
from conftest import as_table, rollout_rows

from burstrl.config import TrainConfig
from burstrl.contract import SCORED_FIELDS
from burstrl.tinymodel import build_model, build_tokenizer
from burstrl.trainer import RolloutGRPOTrainer, check_batch, grpo_config


def make_trainer(tmp_path, table, **train):
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64, layers=1, max_len=32)
    cfg = TrainConfig(batch_size=len(table) // 2, **train)
    args = grpo_config(output_dir=str(tmp_path), rollouts=len(table), train=cfg, temperature=1.0,
                       max_completion_length=4, num_generations=4, seed=0)
    return RolloutGRPOTrainer(model=model, processing_class=tokenizer, args=args,
                              train_dataset=datasets.Dataset(table), beta=cfg.beta)


def test_rows_become_padded_trl_batch(tmp_path):
    rows = rollout_rows(groups=2, size=4)
    rows[0]["prompt_ids"] = [1, 7, 16]
    rows[1]["completion_ids"], rows[1]["sampler_logprobs"], rows[1]["ref_logprobs"] = [9, 8, 2], [-1.0] * 3, [-2.0] * 3
    table = as_table(rows, SCORED_FIELDS)
    trainer = make_trainer(tmp_path, table, beta=0.1)
    batch = trainer._generate_and_score_completions(table.to_pylist())
    assert batch["prompt_ids"][0].tolist() == [0, 0, 1, 7, 16]  # left-padded with <pad>=0
    assert batch["prompt_mask"][0].tolist() == [0, 0, 1, 1, 1]
    assert batch["completion_ids"][0].tolist() == [5, 2, 0]  # right-padded
    assert batch["completion_mask"][0].tolist() == [1, 1, 0]
    assert batch["completion_ids"][1].tolist() == [9, 8, 2]
    assert batch["ref_per_token_logps"][1].tolist() == [-2.0] * 3
    assert batch["sampling_per_token_logps"][0].tolist() == [-0.5, -0.25, 0.0]
    assert batch["advantages"].tolist() == [r["advantage"] for r in rows]
    assert batch["num_items_in_batch"].item() == 2 * 7 + 3
    # Two optimizer steps share the batch, so TRL's clipped ratio needs the pre-update logprobs.
    assert batch["old_per_token_logps"].shape == (8, 3)


def test_beta_zero_and_single_step_leave_out_ref_and_old_logprobs(tmp_path):
    table = as_table(rollout_rows(groups=2, size=4), SCORED_FIELDS)
    trainer = make_trainer(tmp_path, table, beta=0.0)
    trainer.args.steps_per_generation = 1  # one optimizer step per batch: the sampler's weights are the trainer's
    batch = trainer._generate_and_score_completions(table.to_pylist())
    assert "ref_per_token_logps" not in batch and "old_per_token_logps" not in batch


def sequence_logprob(model, row):
    ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return logps[-len(row["completion_ids"]):].sum().item()


def test_update_raises_positive_and_lowers_negative_advantage_completions(tmp_path):
    rows = rollout_rows(groups=2, size=4)
    for row in rows:
        good = row["sample_index"] == 0
        row["completion_ids"] = [5, 2] if good else [9, 2]
        row["advantage"] = 1.5 if good else -0.5
    table = as_table(rows, SCORED_FIELDS)
    trainer = make_trainer(tmp_path, table, beta=0.0, learning_rate=1e-2)
    before = [sequence_logprob(trainer.model, rows[i]) for i in (0, 1)]
    trainer.train()
    after = [sequence_logprob(trainer.model, rows[i]) for i in (0, 1)]
    assert trainer.state.global_step == 2
    assert after[0] > before[0] and after[1] < before[1]


def test_table_with_lists_round_trips_through_datasets():
    table = as_table(rollout_rows(), SCORED_FIELDS)
    assert datasets.Dataset(table)[0]["ref_logprobs"] == pytest.approx([-0.4, -0.3])


PARENT = {"policy_version": "000", "content_hash": "abc"}


@pytest.mark.parametrize(("change", "message"), [
    ({"policy_version": "007"}, r"field 'policy_version': rollouts from \['007'\], but training starts from"),
    ({"policy_hash": "old"}, r"field 'policy_hash': rollouts from \['old'\]"),
    ({"temperature": 0.7}, "the KL term needs rollouts sampled at 1.0"),
])
def test_check_batch_refuses_what_the_update_cannot_use(change, message):
    rows = rollout_rows()
    for row in rows:
        row.update(change)
    with pytest.raises(ValueError, match=message):
        check_batch(Path("s.parquet"), as_table(rows, SCORED_FIELDS), parent=PARENT, beta=0.02, expected_rows=4)
    good = as_table(rollout_rows(), SCORED_FIELDS)
    assert check_batch(Path("s.parquet"), good, parent=PARENT, beta=0.02, expected_rows=4) == 1.0
    with pytest.raises(ValueError, match="field 'prompt_id': 4 rows, but"):
        check_batch(Path("s.parquet"), good, parent=PARENT, beta=0.02, expected_rows=8)
