"""TRL's GRPOTrainer, fed scored rollouts from Parquet instead of generating them.

TRL generates and scores inside `_generate_and_score_completions`, which returns the tensors its GRPO loss
consumes (prompt/completion ids and masks, advantages, optional old and reference logprobs). This subclass
overrides only that hook and the sampler, so the loss, clipping, KL term, logging and optimizer are TRL's own.
Departures from TRL's colocated loop, all forced by the decoupled pipeline:
  - the whole rollout file is one generation batch: steps_per_generation = rollouts / batch_size optimizer
    steps, TRL shuffling and slicing it exactly as it does a freshly generated batch;
  - reference logprobs come from the score stage (a frozen copy of the bootstrap policy in vLLM), so TRL is
    built with beta=0 (it would otherwise load a second copy of the policy as its reference) and the KL
    coefficient is set afterwards;
  - "old" logprobs for the clipped ratio are computed with the trainer's weights at the start of the batch
    when more than one optimizer step uses it, as TRL does; the sampler's own logprobs are carried along.
"""

from pathlib import Path

import pyarrow as pa
import torch
from torch.utils.data import SequentialSampler
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import pad

from burstrl.contract import ContractError


def _precomputed(*args, **kwargs):
    raise RuntimeError("rewards are precomputed by the score stage; the train stage never scores")


class RolloutGRPOTrainer(GRPOTrainer):
    def __init__(self, *, beta: float, **kwargs):
        super().__init__(reward_funcs=[_precomputed], **kwargs)
        self.beta = beta

    def _get_train_sampler(self, dataset=None):
        # Rows are completions, not prompts to repeat; TRL shuffles the generation batch itself.
        return SequentialSampler(dataset if dataset is not None else self.train_dataset)

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict:
        device = self.accelerator.device

        def padded(key, value, side, dtype=torch.long):
            return pad([torch.tensor(row[key], dtype=dtype) for row in inputs], padding_value=value,
                       padding_side=side).to(device)

        def mask(key, side):
            return pad([torch.ones(len(row[key]), dtype=torch.long) for row in inputs], padding_value=0,
                       padding_side=side).to(device)

        prompt_ids = padded("prompt_ids", self.processing_class.pad_token_id, "left")
        prompt_mask = mask("prompt_ids", "left")
        completion_ids = padded("completion_ids", self.processing_class.pad_token_id, "right")
        completion_mask = mask("completion_ids", "right")
        batch = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": torch.tensor([row["advantage"] for row in inputs], dtype=torch.float32, device=device),
            # Summed over all processes, as TRL does, so dapo's token normalizer is right on several GPUs.
            "num_items_in_batch": self.accelerator.gather(completion_mask.sum()).sum(),
            "sampling_per_token_logps": padded("sampler_logprobs", 0.0, "right", torch.float32),
        }
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = padded("ref_logprobs", 0.0, "right", torch.float32)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self.args.gradient_accumulation_steps % generate_every != 0:
            with torch.no_grad():
                batch["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    torch.cat([prompt_ids, completion_ids], dim=1),
                    torch.cat([prompt_mask, completion_mask], dim=1),
                    completion_ids.size(1),
                    batch_size=self.args.per_device_train_batch_size,
                )
        return batch


def check_batch(source: Path, table: pa.Table, *, parent: dict, beta: float, expected_rows: int) -> float:
    """Refuse a rollout batch this update cannot use as is; returns its sampling temperature.

    `parent` is the metadata of the checkpoint training starts from: every rollout must have been sampled
    by exactly those weights (same version and content hash), since the update is on-policy for them.
    """
    for field, key in (("policy_version", "policy_version"), ("policy_hash", "content_hash")):
        others = sorted({v for v in table[field].to_pylist() if v != parent[key]})
        if others:
            raise ContractError(f"{source}: field '{field}': rollouts from {others}, "
                             f"but training starts from policy {parent['policy_version']} ({parent[key]})")
    temperatures = sorted(set(table["temperature"].to_pylist()))
    if len(temperatures) != 1:
        raise ContractError(f"{source}: field 'temperature': one batch must share one temperature, got {temperatures}")
    if beta and temperatures != [1.0]:
        raise ContractError(f"{source}: field 'temperature': the KL term needs rollouts sampled at 1.0 "
                         f"(reference logprobs are at 1.0), got {temperatures[0]}")
    if len(table) != expected_rows:
        raise ContractError(f"{source}: field 'prompt_id': {len(table)} rows, but generate.prompts_per_iteration * "
                         f"generate.num_generations = {expected_rows}")
    return temperatures[0]


def grpo_config(*, output_dir: str, rollouts: int, train, temperature: float, max_completion_length: int,
                num_generations: int, seed: int) -> GRPOConfig:
    steps_per_generation = rollouts // train.batch_size
    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=train.batch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=steps_per_generation,
        num_iterations=train.epochs,
        max_steps=steps_per_generation * train.epochs,
        num_generations=num_generations,
        max_completion_length=max_completion_length,
        temperature=temperature,
        learning_rate=train.learning_rate,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type=train.loss_type,
        epsilon=train.epsilon,
        max_grad_norm=train.max_grad_norm,
        seed=seed,
        bf16=train.bf16,
        use_cpu=train.device == "cpu",
        remove_unused_columns=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
