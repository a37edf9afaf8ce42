"""The TRL hook: scored rows become the tensors TRL's GRPO loss expects, and an update moves the right way."""

import datasets
import pyarrow as pa
import pytest
import torch
from conftest import as_table, rollout_rows

from burstrl.config import TrainConfig
from burstrl.data.contract import SCORED_FIELDS
from burstrl.training.tinymodel import build_model, build_tokenizer
from burstrl.training.trainer import RolloutGRPOTrainer, grpo_config


def make_trainer(tmp_path, table, **train):
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64, layers=1, max_len=32)
    cfg = TrainConfig(batch_size=len(table) // 2, **train)
    args = grpo_config(output_dir=str(tmp_path), rollouts=len(table), train=cfg, temperature=1.0,
                       max_completion_length=4, num_generations=4, seed=0)
    return RolloutGRPOTrainer(model=model, processing_class=tokenizer, args=args,
                              train_dataset=datasets.Dataset(table), train=cfg)


def test_rows_become_padded_trl_batch(tmp_path):
    rows = rollout_rows(groups=2, size=4)
    rows[0]["prompt_ids"] = [1, 7, 16]
    rows[1]["completion_ids"], rows[1]["sampler_logprobs"], rows[1]["ref_logprobs"] = [9, 8, 2], [-1.0] * 3, [-2.0] * 3
    # Row 1's middle token came from the environment: no sampler logprob, attended to, never in the loss.
    rows[1]["completion_mask"], rows[1]["sampler_logprobs"][1] = [1, 0, 1], None
    table = as_table(rows, SCORED_FIELDS)
    trainer = make_trainer(tmp_path, table, beta=0.1)
    batch = trainer._generate_and_score_completions(table.to_pylist())
    assert batch["prompt_ids"][0].tolist() == [0, 0, 1, 7, 16]  # left-padded with <pad>=0
    assert batch["prompt_mask"][0].tolist() == [0, 0, 1, 1, 1]
    assert batch["completion_ids"][0].tolist() == [5, 2, 0]  # right-padded
    assert batch["completion_mask"][0].tolist() == [1, 1, 0]
    assert batch["completion_ids"][1].tolist() == [9, 8, 2]
    assert batch["ref_per_token_logps"][1].tolist() == [-2.0] * 3
    assert batch["completion_mask"][1].tolist() == [1, 1, 1]
    assert batch["loss_mask"][1].tolist() == [1, 0, 1]
    assert batch["advantages"].tolist() == [r["advantage"] for r in rows]
    assert batch["num_items_in_batch"].item() == 2 * 7 + 2
    assert batch["old_per_token_logps"].shape == (8, 3)
    # The trainer never sampled these rows, so every batch gets importance weights pi_old / sampler.
    expected = torch.exp(batch["old_per_token_logps"][0, :2] - torch.tensor([-0.5, -0.25])).clamp(max=2.0)
    assert batch["importance_sampling_ratio"][0, :2].tolist() == pytest.approx(expected.tolist())
    assert trainer.row_report["is_weights"][0] == pytest.approx(expected.tolist())


def test_rows_left_out_get_no_loss_and_no_token_count(tmp_path):
    table = as_table(rollout_rows(groups=2, size=4), SCORED_FIELDS)
    trainer = make_trainer(tmp_path, table, beta=0.0)
    inputs = [{**row, "keep": row["prompt_id"] == 0} for row in table.to_pylist()]
    batch = trainer._generate_and_score_completions(inputs)
    assert "ref_per_token_logps" not in batch
    assert batch["loss_mask"].sum(-1).tolist() == [2] * 4 + [0] * 4
    assert batch["num_items_in_batch"].item() == 8
    # A left-out row still shows its true weights in data/weights, for inspection.
    expected = torch.exp(batch["old_per_token_logps"][4, :2] - torch.tensor([-0.5, -0.25])).clamp(max=2.0)
    assert trainer.row_report["is_weights"][4] == pytest.approx(expected.tolist())
    assert expected.sub(1).abs().max() > 0.01


def test_no_importance_weighting_reports_nothing_clipped(tmp_path):
    table = as_table(rollout_rows(groups=2, size=4), SCORED_FIELDS)
    trainer = make_trainer(tmp_path, table, beta=0.0, is_mode="none")
    batch = trainer._generate_and_score_completions(table.to_pylist())
    assert batch["importance_sampling_ratio"].unique().tolist() == [1.0]
    assert trainer.start_metrics["is_clipped_fraction"] == 0.0
    assert trainer.start_metrics["sampler_kl"] > 0.1  # the gap is still measured


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


def test_epochs_reuse_one_batch_and_its_proximal_logprobs(tmp_path):
    table = as_table(rollout_rows(groups=2, size=4), SCORED_FIELDS)
    trainer = make_trainer(tmp_path, table, beta=0.0, epochs=3, learning_rate=1e-2)
    calls = []
    original = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: calls.append(len(inputs)) or original(inputs)
    trainer.train()
    # 2 steps per pass over 8 rows, 3 passes, and pi_old computed once, before the first update.
    assert trainer.state.global_step == 6 and calls == [8]


def test_rows_through_the_train_stages_dataset_give_the_tables_batch(tmp_path):
    """The train stage hands the trainer its table as a `datasets.Dataset` with a `keep` column; the rows the
    trainer's data loader draws from it (lists of float32 read back as Python floats) build the same batch as the
    table's own rows."""
    table = as_table(rollout_rows(groups=2, size=4), SCORED_FIELDS)
    keep = [row["sample_index"] != 3 for row in table.to_pylist()]
    trainer = make_trainer(tmp_path, table, beta=0.1)
    dataset = datasets.Dataset(table.append_column("keep", pa.array(keep)))
    from_dataset = trainer._generate_and_score_completions([dataset[i] for i in range(len(dataset))])
    from_table = trainer._generate_and_score_completions(
        [{**row, "keep": k} for row, k in zip(table.to_pylist(), keep, strict=True)])
    assert from_dataset.keys() == from_table.keys()
    for name, value in from_table.items():
        assert torch.equal(from_dataset[name], value), name
    assert from_dataset["ref_per_token_logps"][0].tolist() == pytest.approx([-0.4, -0.3])
    assert from_dataset["loss_mask"].sum(-1).tolist() == [0 if not k else 2 for k in keep]
