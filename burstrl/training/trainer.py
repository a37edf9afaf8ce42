"""TRL's GRPOTrainer, fed scored rollouts from Parquet instead of generating them, with an off-policy-correct loss.

TRL generates and scores inside `_generate_and_score_completions`, which returns the tensors its loss
consumes. This subclass overrides that hook, the sampler and `_compute_loss`; TRL still owns the training
loop, batch shuffling and slicing, the optimizer, logging and the logprob forward pass. Departures from TRL's
colocated loop, all forced by the decoupled pipeline:
  - the whole rollout file is one generation batch: steps_per_generation = rollouts / batch_size optimizer
    steps, TRL shuffling and slicing it exactly as it does a freshly generated batch;
  - the proximal ("old") logprobs are always computed with the trainer's weights when the batch arrives,
    because the sampler is never the trainer: it ran an earlier version, other precision or quantized weights;
  - the loss is `burstrl.rl.objective.grpo_loss`: TRL's, plus the KL estimator choice and a loss mask for rows
    `burstrl.rl.selection.select_rows` leaves out; the importance weight is TRL's vLLM correction, fed from Parquet;
  - an episode's environment tokens (completion_mask 0) are context, not actions: the loss mask, the importance
    ratio, every normalizer and every metric count policy tokens only, as TRL's tool_mask does;
  - reference logprobs come from the score stage, so TRL is built with beta=0 (it would otherwise load a
    second copy of the policy as its reference) and the KL coefficient is set afterwards;
  - with a `work` directory, the prepared batch is saved there before the first step and checkpoints are
    marked complete (burstrl.training.trainstate), so a resumed run takes the same slices of the same batch; a slice
    is chosen by the optimizer step, which a resumed Trainer restores, not by TRL's own call counter.
"""

import math
from pathlib import Path

import torch
from accelerate.utils import gather_object
from torch.utils.data import SequentialSampler
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import add_fused_lm_head, pad

from burstrl.atomic import replacing
from burstrl.config import TrainConfig
from burstrl.data.policy import read_metadata
from burstrl.pipeline import faults
from burstrl.rl import mismatch, objective
from burstrl.training import launch, trainstate


def _precomputed(*args, **kwargs):
    raise RuntimeError("rewards are precomputed by the score stage; the train stage never scores")


class RolloutGRPOTrainer(GRPOTrainer):
    def __init__(self, *, train: TrainConfig, work: Path | None = None, exact_policies: dict | None = None,
                 **kwargs):
        super().__init__(reward_funcs=[_precomputed], **kwargs)
        self.beta = train.beta
        self.train_config = train
        self.work = work
        # policy_version -> the checkpoint directory that version sampled from (None: the trainer's own weights),
        # for the split of the sampler gap; None when some version's checkpoint is not here. Loaded only when the
        # batch is prepared, so a resumed run that reloads its saved batch never loads them.
        self.exact_policies = exact_policies
        self.start_metrics: dict = {}
        self.row_report: dict = {}

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        saved = self._saved_batch()
        if self._buffered_inputs is None and not self.load_saved_batch():
            super()._prepare_inputs(generation_batch)
            if saved:
                with replacing(saved) as tmp:
                    torch.save({"steps": self._buffered_inputs, "start_metrics": self.start_metrics,
                                "row_report": self.row_report}, tmp)
        return self._buffered_inputs[self.state.global_step % self.args.steps_per_generation]

    def _saved_batch(self) -> Path | None:
        return self.work / trainstate.BATCH.format(rank=self.accelerator.process_index) if self.work else None

    def load_saved_batch(self) -> bool:
        """The batch (and its start metrics and row report) an interrupted run prepared, if it saved one."""
        saved = self._saved_batch()
        if not (saved and saved.is_file()):
            return False
        state = torch.load(saved, map_location=self.accelerator.device)
        self._buffered_inputs = state["steps"]
        self.start_metrics, self.row_report = state["start_metrics"], state["row_report"]
        return True

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        checkpoint = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        faults.point("checkpoint_write")
        self.accelerator.wait_for_everyone()  # every process has written its share (RNG states) first
        if self.args.should_save:
            trainstate.mark_complete(checkpoint, self.state.global_step)

    def _get_train_sampler(self, dataset=None):
        # Rows are completions, not prompts to repeat; TRL shuffles the generation batch itself.
        return SequentialSampler(dataset if dataset is not None else self.train_dataset)

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict:
        device = self.accelerator.device

        def padded(key, value, side, dtype=torch.long):
            # An environment token has no sampler logprob (null); the policy mask keeps it out of every term.
            return pad([torch.tensor([value if v is None else v for v in row[key]], dtype=dtype) for row in inputs],
                       padding_value=value, padding_side=side).to(device)

        def ones(key, side):
            return pad([torch.ones(len(row[key]), dtype=torch.long) for row in inputs], padding_value=0,
                       padding_side=side).to(device)

        prompt_ids = padded("prompt_ids", self.processing_class.pad_token_id, "left")
        prompt_mask = ones("prompt_ids", "left")
        completion_ids = padded("completion_ids", self.processing_class.pad_token_id, "right")
        completion_mask = ones("completion_ids", "right")
        # Attention covers every completion token; the loss only the policy's (TRL's tool_mask).
        policy_mask = padded("completion_mask", 0, "right")
        keep = torch.tensor([row.get("keep", True) for row in inputs], device=device)
        loss_mask = policy_mask * keep.unsqueeze(1)
        sampler = padded("sampler_logprobs", 0.0, "right", torch.float32)
        with torch.no_grad():
            proximal, _, _ = self._get_per_token_logps_and_entropies(
                self.model, torch.cat([prompt_ids, completion_ids], dim=1),
                torch.cat([prompt_mask, completion_mask], dim=1), completion_ids.size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
            exact = self._exact_logprobs(inputs, prompt_ids, prompt_mask, completion_ids, completion_mask, proximal)
        t = self.train_config
        # Left-out rows get their true weights too, for data/weights; the loss mask silences them.
        ratio = objective.raw_importance_ratio(proximal, sampler, policy_mask, t.is_mode)
        weights = objective.importance_weights(ratio, t.is_mode, t.is_cap, t.is_floor)
        teacher = padded("teacher_logprobs", 0.0, "right", torch.float32) if t.objective != "grpo" else None
        self._record_start(inputs, proximal, sampler, exact, ratio, weights, loss_mask, t.is_mode, teacher)
        batch = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "loss_mask": loss_mask,
            "advantages": torch.tensor([row["advantage"] for row in inputs], dtype=torch.float32, device=device),
            # Summed over all processes, as TRL does, so dapo's token normalizer is right on several GPUs.
            "num_items_in_batch": self.accelerator.gather(loss_mask.sum()).sum(),
            "old_per_token_logps": proximal,
            "importance_sampling_ratio": weights,
        }
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = padded("ref_logprobs", 0.0, "right", torch.float32)
        if teacher is not None:
            k = len(inputs[0]["teacher_topk_ids"][0])
            batch["teacher_topk_ids"] = pad([torch.tensor(row["teacher_topk_ids"], dtype=torch.long) for row in inputs],
                                            padding_value=0, padding_side="right").to(device)
            batch["teacher_topk_logprobs"] = pad(
                [torch.tensor(row["teacher_topk_logprobs"], dtype=torch.float32) for row in inputs],
                padding_value=-math.log(k), padding_side="right").to(device)
        return batch

    def _forward_with_teacher(self, model, inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token logprobs, entropies and reverse KL to the teacher over its top k
        (burstrl.rl.objective.topk_reverse_kl) from one forward pass with the LM head's logits: the student's
        logprobs at the teacher's top-k ids need the whole next-token distribution, which TRL's fused head (the
        path without a teacher) does not give."""
        completion_ids = inputs["completion_ids"]
        logits = model(input_ids=torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
                       attention_mask=torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
                       logits_to_keep=completion_ids.size(1) + 1).logits[:, :-1]
        full = torch.log_softmax(logits.float() / self.temperature, -1)
        logps = full.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        entropies = -(full.exp() * full).sum(-1)
        student = full.gather(-1, inputs["teacher_topk_ids"])
        return logps, entropies, objective.topk_reverse_kl(student, inputs["teacher_topk_logprobs"])

    def _exact_logprobs(self, inputs, prompt_ids, prompt_mask, completion_ids, completion_mask, proximal):
        """Each row's logprobs under the exact checkpoint of the version that sampled it (its sampler's weights
        before quantization), or None without them. Rows sampled by the trainer's own version reuse `proximal`."""
        if self.exact_policies is None:
            return None
        exact = proximal.clone()
        versions = [row["policy_version"] for row in inputs]
        for version, path in self.exact_policies.items():
            rows = [i for i, v in enumerate(versions) if v == version]
            if path is None or not rows:
                continue
            model = AutoModelForCausalLM.from_pretrained(path).eval().to(self.accelerator.device)
            # The same logprob head TRL gives the policy, at the same temperature.
            add_fused_lm_head(model, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
            logps, _, _ = self._get_per_token_logps_and_entropies(
                model, torch.cat([prompt_ids[rows], completion_ids[rows]], dim=1),
                torch.cat([prompt_mask[rows], completion_mask[rows]], dim=1), completion_ids.size(1),
                batch_size=self.args.per_device_train_batch_size)
            exact[rows] = logps
        return exact

    def _record_start(self, inputs, proximal, sampler, exact, ratio, weights, loss_mask, mode, teacher=None):
        """What the batch looked like before any update: the sampler-vs-trainer gap and the IS weights."""
        units = loss_mask if ratio.size(1) > 1 else loss_mask.amax(-1, keepdim=True)
        changed = torch.zeros_like(ratio) if mode == "none" else (weights != ratio).float()
        lengths = [len(row["completion_ids"]) for row in inputs]
        weighted = [[w if m else None for w, m in zip(values[:n].tolist(), row["completion_mask"], strict=True)]
                    for values, n, row in zip(weights.expand_as(proximal), lengths, inputs, strict=True)]
        self.row_report = {
            "key": [(row["prompt_id"], row["sample_index"]) for row in inputs],
            "proximal_logprobs": [values[:n].tolist() for values, n in zip(proximal, lengths, strict=True)],
            # An environment token is no term of the loss, so it has no weight (null).
            "is_weights": weighted,
        }
        # On several processes each holds a share of the rows: the metrics describe all of them. Padding is
        # masked out, so it changes no mean or maximum.
        acc = self.accelerator
        proximal, sampler, loss_mask, weights, ratio, changed, units = (
            acc.gather(acc.pad_across_processes(t, dim=1))
            for t in (proximal, sampler, loss_mask, weights, ratio, changed, units))
        exact, teacher = (None if x is None else acc.gather(acc.pad_across_processes(x, dim=1))
                          for x in (exact, teacher))
        self.start_metrics = {
            **mismatch.batch_metrics(proximal, sampler, ratio, weights, loss_mask, units, exact),
            "is_weight_mean": objective.masked_mean(weights, units),
            "is_weight_max": (weights * units).max().item(),
            "is_ratio_max": (ratio * units).max().item(),
            "is_clipped_fraction": objective.masked_mean(changed, units),
            # KL(pi_old || teacher) on the policy's own tokens, what distillation lowers (k1: a mean log ratio).
            **({"teacher_kl": objective.masked_mean(proximal - teacher, loss_mask)} if teacher is not None else {}),
        }

    def full_row_report(self, keys: list[tuple[int, int]]) -> dict[str, list]:
        """Every process's row report, in the order of `keys` (the table's (prompt_id, sample_index) pairs)."""
        names = [name for name in self.row_report if name != "key"]
        rows = gather_object([(key, *values) for key, *values in zip(*self.row_report.values(), strict=True)])
        by_key = {tuple(row[0]): row[1:] for row in rows}
        return {name: [by_key[key][i] for key in keys] for i, name in enumerate(names)}

    def _mean_everywhere(self, values: torch.Tensor, mask: torch.Tensor) -> float:
        """The masked mean over the tokens of every process's share of the step, not just this one's."""
        sums = self.accelerator.gather(torch.stack([(values * mask).sum(), mask.sum().float()]).reshape(1, 2)).sum(0)
        return (sums[0] / sums[1].clamp(min=1.0)).item()

    def _compute_loss(self, model, inputs):
        t = self.train_config
        completion_ids = inputs["completion_ids"]
        distill = None
        if t.objective == "grpo":
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
                torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1), completion_ids.size(1),
                compute_entropy=True,
            )
        else:
            logps, entropies, distill = self._forward_with_teacher(model, inputs)
        mask = inputs["loss_mask"]
        # TRL's normalizers, kept term for term so the equivalence test holds for any accumulation and process
        # count: dapo divides by this step's share of the generation batch's tokens on all processes, the
        # others by the accumulation steps.
        accumulation = self.current_gradient_accumulation_steps
        tokens = (inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
                  * accumulation / self.args.steps_per_generation)
        terms = objective.grpo_loss(
            logps, inputs["old_per_token_logps"], inputs["advantages"], inputs["importance_sampling_ratio"],
            inputs.get("ref_per_token_logps"), mask, beta=self.beta, kl_estimator=t.kl_estimator,
            kl_ratio_correction=t.kl_ratio_correction, eps_low=t.epsilon,
            eps_high=t.epsilon_high, loss_type=t.loss_type, max_completion_length=self.max_completion_length,
            token_normalizer=tokens, entropies=entropies, entropy_coef=t.entropy_coef, distill=distill,
            distill_coef=t.distill_coef, rewards=t.objective != "distill",
        )
        metrics = self._metrics["train" if self.model.training else "eval"]
        if terms.kl is not None:
            metrics["kl"].append(self._mean_everywhere(terms.kl.detach(), mask))
        metrics["entropy"].append(self._mean_everywhere(entropies.detach(), mask))
        if distill is not None:
            metrics["distill_kl"].append(self._mean_everywhere(distill.detach(), mask))
        metrics["clip_ratio"].append(self._mean_everywhere(terms.clipped.float(), mask))
        return terms.loss if t.loss_type == "dapo" else terms.loss / accumulation


def exact_policies(table, parent: dict, checkpoints: Path) -> tuple[dict[str, Path | None] | None, list[str]]:
    """Where the exact weights of every version that sampled `table` are, for the sampler-gap split: the trainer's
    own for the parent's version (None), else checkpoints/VERSION when its content hash is the one the rows name.
    Returns (None, missing versions) when some are not here (a rented host holds only the parent)."""
    models, missing = {}, []
    for version, digest in sorted(set(zip(table["policy_version"].to_pylist(), table["policy_hash"].to_pylist(),
                                          strict=True))):
        path = checkpoints / version
        if version == parent["policy_version"]:
            models[version] = None
        elif (path / "burstrl.json").is_file() and read_metadata(path)["content_hash"] == digest:
            models[version] = path
        else:
            missing.append(version)
    return (None if missing else models), missing


def grpo_config(*, output_dir: str, rollouts: int, train: TrainConfig, temperature: float,
                max_completion_length: int, num_generations: int, seed: int, processes: int = 1) -> GRPOConfig:
    """TRL's config for one rollout file: `processes` ranks each take train.batch_size / processes rows a step."""
    steps_per_generation = rollouts // train.batch_size
    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=launch.per_device_batch(train.batch_size, processes),
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
        epsilon_high=train.epsilon_high,
        max_grad_norm=train.max_grad_norm,
        seed=seed,
        bf16=train.precision == "bf16",
        fp16=train.precision == "fp16",
        use_cpu=train.device == "cpu",
        remove_unused_columns=False,
        logging_steps=1,
        # burstrl.training.trainstate.Cadence decides when to save; the Trainer's own schedule stays off.
        save_strategy="no",
        report_to="none",
        disable_tqdm=False,
    )
