"""The alternatives to the generate stage, over the prompts and seeds it sampled (read back from its
rollouts): the raw vLLM engine with the same requests, and Hugging Face `generate` (what TRL's trainer
runs without vLLM) with the same group size and fixed lengths."""

import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM

from burstrl.config import Config
from burstrl.inference import engine


def prompts_of(rollouts: Path) -> tuple[list[list[int]], list[int]]:
    """Each group's prompt token ids and sampling seed, in the order generate drew them."""
    table = pq.read_table(rollouts, columns=["prompt_id", "prompt_ids", "seed"]).to_pylist()
    first = {}
    for row in table:
        first.setdefault(row["prompt_id"], row)
    return [r["prompt_ids"] for r in first.values()], [r["seed"] for r in first.values()]


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def raw_vllm(policy: Path, cfg: Config, prompt_ids, seeds) -> dict:
    g = cfg.generate
    started = time.monotonic()
    with engine.running(policy, cfg.inference, cfg.model.max_len, cfg.seed) as llm:
        start_seconds = time.monotonic() - started
        params = engine.sampling_params(seeds, n=g.num_generations, temperature=g.temperature, top_p=g.top_p,
                                        max_tokens=g.max_tokens, min_tokens=g.min_tokens)
        started = time.monotonic()
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        seconds = time.monotonic() - started
    tokens = sum(len(c.token_ids) for out in outputs for c in out.outputs)
    return {"engine_start_seconds": start_seconds, "seconds": seconds, "tokens": tokens}


def hf_generate(policy: Path, cfg: Config, prompt_ids) -> dict:
    """One batch of every prompt x G, left-padded, as TRL's trainer generates a rollout batch."""
    g = cfg.generate
    dtype = getattr(torch, cfg.inference.dtype) if cfg.inference.dtype != "auto" else "auto"
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=dtype).to(device()).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else model.config.eos_token_id
    width = max(map(len, prompt_ids))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=device())
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device())

    def run(rows: slice, new_tokens: int) -> torch.Tensor:
        return model.generate(input_ids=ids[rows], attention_mask=mask[rows], do_sample=True,
                              temperature=g.temperature, top_p=g.top_p, num_return_sequences=g.num_generations,
                              max_new_tokens=new_tokens, min_new_tokens=min(g.min_tokens, new_tokens),
                              pad_token_id=pad)

    torch.manual_seed(cfg.seed)
    with torch.no_grad():
        run(slice(0, 1), 2)  # first-call setup, which vLLM's engine start also does before it is timed
        started = time.monotonic()
        out = run(slice(None), g.max_tokens)
        seconds = time.monotonic() - started
    completions = out[:, width:]
    eos = model.generation_config.eos_token_id
    ended = torch.zeros_like(completions[:, 0], dtype=torch.bool)
    tokens = 0
    for step in completions.T:  # tokens up to and including each sequence's EOS, as vLLM counts them
        tokens += int((~ended).sum())
        ended |= torch.isin(step, torch.tensor(eos if isinstance(eos, list) else [eos], device=step.device))
    return {"seconds": seconds, "tokens": tokens}
