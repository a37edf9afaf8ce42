"""What a stage needs of the environment: the sandbox, chat-rendered prompts, played episodes and their metrics."""

from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from burstrl.config import EnvConfig, GenerateConfig
from burstrl.data.task import check_fits
from burstrl.env import chat, episodes
from burstrl.env.sandbox import Sandbox


@contextmanager
def sandbox(env: EnvConfig, tokenizer, policy: Path):
    """The tool worker for a stage, after checking that the policy's tokenizer can hold a tool-calling chat."""
    chat.check_template(tokenizer, str(policy))
    with Sandbox(env.tools, env.environment_factory, env.sandbox) as box:
        box.start()
        yield box


def prompt_ids(tokenizer, prompts: pa.Table, box: Sandbox | None) -> list[list[int]]:
    """Each prompt's ids: plain text without an environment, else rendered by the chat template with its tools."""
    texts = prompts["prompt"].to_pylist()
    if box is None:
        return [tokenizer(p)["input_ids"] for p in texts]
    names = prompts["environment"].to_pylist() if "environment" in prompts.column_names else [""] * len(texts)
    return [chat.prompt_ids(tokenizer, p, box.tool_schemas(name or "")) for p, name in zip(texts, names, strict=True)]


def play(sampler, tokenizer, box: Sandbox, prompts: pa.Table, seeds: list[int], g: GenerateConfig, max_turns: int,
         max_len: int, n: int | None = None) -> list[list[episodes.Episode]]:
    """n (default generate.num_generations) finished episodes per prompt row."""
    groups = episodes.start(box, tokenizer, prompts.to_pylist(), seeds, n or g.num_generations)
    # A reset's text joins the prompt: the longest of each group must still leave room for the episode.
    check_fits(prompts, [max((e.prompt_ids for e in group), key=len) for group in groups], g.max_tokens, max_len)
    episodes.run(sampler, tokenizer, box, [e for group in groups for e in group], temperature=g.temperature,
                 top_p=g.top_p, max_tokens=g.max_tokens, max_turns=max_turns, max_len=max_len)
    return groups


def episode_metrics(table: pa.Table, restarts: int) -> dict:
    """Turns, tool calls and errors of a rollout table, and how often the tool worker had to be started again."""
    n = len(table)
    turns, calls, errors = (table[c].to_pylist() for c in ("num_turns", "tool_calls", "tool_errors"))
    reasons = table["finish_reason"].to_pylist()
    return {"turns_mean": sum(turns) / n, "tool_calls": sum(calls), "tool_errors": sum(errors),
            "tool_use_rate": sum(c > 0 for c in calls) / n, "sandbox_restarts": restarts,
            **{f"finished_{reason}": reasons.count(reason) for reason in sorted(set(reasons))}}
