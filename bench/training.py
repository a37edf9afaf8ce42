"""The alternatives to the train stage for the same update: the floor (plain PyTorch: one no-grad forward
for the proximal logprobs, one forward and backward, one optimizer step, over the same token batches) and
TRL's colocated GRPOTrainer, which generates the same number of completions inside each step."""

import time
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from bench.generation import device
from burstrl.config import Config
from burstrl.data.contract import read_task
from burstrl.rl.rewards import resolve

# Dense bf16 peak FLOP/s of GPUs the seed plans for, by a substring of torch's device name.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "RTX 4070": 58e12, "MI50": 26.5e12}


def _batches(scored: Path, size: int):
    table = pq.read_table(scored, columns=["prompt_ids", "completion_ids", "advantage"])
    rows = table.to_pylist()
    for lo in range(0, len(rows), size):
        part = rows[lo:lo + size]
        width = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros(len(part), width - 1)
        for i, r in enumerate(part):
            seq = r["prompt_ids"] + r["completion_ids"]
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, len(r["prompt_ids"]) - 1:len(seq) - 1] = 1  # positions that predict a completion token
        yield ids, mask, torch.tensor([r["advantage"] for r in part])


def _logps(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]


def floor(policy: Path, scored: Path, cfg: Config) -> dict:
    t = cfg.train
    model = AutoModelForCausalLM.from_pretrained(policy).to(device()).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.learning_rate)
    autocast = torch.autocast(device(), dtype=torch.float16 if t.precision == "fp16" else torch.bfloat16,
                              enabled=t.precision != "fp32")
    batches = [tuple(x.to(device()) for x in b) for b in _batches(scored, t.batch_size)] * t.epochs
    tokens = sum(int(ids.numel()) for ids, _, _ in batches)
    started = time.monotonic()
    for ids, mask, advantage in batches:
        with autocast:
            with torch.no_grad():
                old = _logps(model, ids)
            ratio = torch.exp(_logps(model, ids) - old)
            loss = -((ratio * advantage[:, None] * mask).sum() / mask.sum())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
    if device() == "cuda":
        torch.cuda.synchronize()
    seconds = time.monotonic() - started
    return {"seconds_per_step": seconds / len(batches), "steps": len(batches), "tokens_per_step": tokens / len(batches),
            "parameters": sum(p.numel() for p in model.parameters())}


def colocated_trl(policy: Path, task_file: Path, cfg: Config, steps: int, out: Path) -> dict:
    """TRL's GRPOTrainer as a user would run it on the rented GPU alone: generation (HF `generate`), the
    reference model's forward (beta > 0), and the update, `steps` times over batches of train.batch_size."""
    g, t = cfg.generate, cfg.train
    task = read_task(task_file)
    prompts = steps * t.batch_size // g.num_generations
    dataset = datasets.Dataset(task.select(["prompt", "answer"]).slice(0, prompts))
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=t.batch_size, gradient_accumulation_steps=1,
        num_generations=g.num_generations, max_completion_length=g.max_tokens,
        generation_kwargs={"min_new_tokens": g.min_tokens}, temperature=g.temperature, top_p=g.top_p,
        learning_rate=t.learning_rate, lr_scheduler_type="constant", beta=t.beta, loss_type=t.loss_type,
        epsilon=t.epsilon, epsilon_high=t.epsilon_high, max_grad_norm=t.max_grad_norm, max_steps=steps,
        seed=cfg.seed, bf16=t.precision == "bf16", fp16=t.precision == "fp16", use_cpu=device() == "cpu",
        logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, reward_weights=cfg.score.reward_weights,
    )
    trainer = GRPOTrainer(model=str(policy), reward_funcs=[resolve(name) for name in cfg.score.reward_funcs],
                          args=args, train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(policy))
    started = time.monotonic()
    trainer.train()
    return {"seconds_per_step": (time.monotonic() - started) / steps, "steps": steps}


def mfu(seconds_per_step: float, tokens_per_step: float, parameters: int) -> float | None:
    """Model FLOPs utilization of a step of 8 N FLOPs a token (2 N the no-grad forward, 6 N forward and
    backward); None off a GPU of known peak."""
    if device() != "cuda":
        return None
    name = torch.cuda.get_device_name()
    peak = next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)
    return 8 * parameters * tokens_per_step / seconds_per_step / peak if peak else None
