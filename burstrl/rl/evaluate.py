"""Greedy held-out accuracy: the learning curve, free of sampling noise."""

from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from burstrl.inference import engine
from burstrl.rl.rewards import exact_match


def heldout_accuracy(llm, tokenizer, heldout: pa.Table, max_tokens: int) -> dict:
    prompts = heldout["prompt"].to_pylist()
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    texts = engine.greedy(llm, ids, max_tokens)
    correct = exact_match(prompts, texts, None, heldout["answer"].to_pylist())
    return {"heldout_accuracy": sum(correct) / len(correct), "heldout_size": len(correct)}


def heldout_episodes(llm, tokenizer, heldout: pa.Table, cfg, policy: Path) -> dict:
    """Greedy episodes on the held-out set: accuracy overall, with and without tool use, and the tool-use rate."""
    from burstrl.env import environment

    greedy = replace(cfg.generate, temperature=0.0, top_p=1.0, max_tokens=cfg.eval.max_tokens)
    with environment.sandbox(cfg.env, tokenizer, policy) as box:
        groups = environment.play(engine.Offline(llm), tokenizer, box, heldout, [0] * len(heldout), greedy,
                                  cfg.env.max_turns, cfg.model.max_len, n=1)
    # The answer is the last assistant message, as reward functions see it; tool use is a call that ran.
    correct = exact_match(None, [group[0].messages for group in groups], None, heldout["answer"].to_pylist())
    used = [group[0].tool_calls > group[0].malformed_calls for group in groups]

    def share(flags, where):
        picked = [f for f, w in zip(flags, where, strict=True) if w]
        return sum(picked) / len(picked) if picked else None

    everywhere = [True] * len(used)
    return {"heldout_accuracy": share(correct, everywhere), "heldout_size": len(correct),
            "tool_use_rate": share(used, everywhere), "accuracy_with_tool": share(correct, used),
            "accuracy_without_tool": share(correct, [not u for u in used]),
            "tool_errors": sum(group[0].tool_errors for group in groups),
            "turns_mean": sum(group[0].num_turns for group in groups) / len(groups)}


def evaluate(llm, tokenizer, heldout: pa.Table, cfg, policy: Path) -> dict:
    """Held-out metrics of the policy the engine runs: episodes when the run has an environment."""
    if cfg.env.enabled:
        return heldout_episodes(llm, tokenizer, heldout, cfg, policy)
    return heldout_accuracy(llm, tokenizer, heldout, cfg.eval.max_tokens)
