"""Greedy held-out accuracy: the learning curve, free of sampling noise."""

import pyarrow as pa

from burstrl.inference import engine
from burstrl.rl.rewards import exact_match


def heldout_accuracy(llm, tokenizer, heldout: pa.Table, max_tokens: int) -> dict:
    prompts = heldout["prompt"].to_pylist()
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    texts = engine.greedy(llm, ids, max_tokens)
    correct = exact_match(prompts, texts, None, heldout["answer"].to_pylist())
    return {"heldout_accuracy": sum(correct) / len(correct), "heldout_size": len(correct)}
