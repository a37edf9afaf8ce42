"""Episodes: model turns and tool results, batched across episodes so the engine stays full.

Each turn, every unfinished episode's ids so far go to the sampler as one request (n=1, a seed of its own derived
from the prompt's seed, the sample index and the turn, so an episode and a shard of them come out the same on a
re-run). A turn is parsed with the tokenizer's response template; its tool calls run in the sandbox; the results
are rendered by the chat template once and appended. An episode ends when the model answers without a call
("stop"), runs out of tokens ("length": generate.max_tokens for the whole episode, or the model's context; tool
results that would not fit are dropped, as TRL drops them), makes a call on its last allowed turn ("max_turns"),
or its environment ends it ("done").
"""

import hashlib
import json
from dataclasses import dataclass, field

from burstrl.env import chat
from burstrl.env.sandbox import Sandbox
from burstrl.errors import ContractError
from burstrl.pipeline import faults


@dataclass
class Episode:
    prompt_ids: list[int]
    seed: int
    key: str
    environment: str = ""
    completion_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    num_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0  # of tool_calls: syntax the parser rejected, so nothing ran
    finish_reason: str = ""
    env_reward: float | None = None

    def append(self, ids: list[int], logprobs: list[float] | None) -> None:
        """Sampled ids (with their logprobs, mask 1) or the environment's (no logprobs, mask 0)."""
        self.completion_ids += ids
        self.completion_mask += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [None] * len(ids)

    @property
    def transcript(self) -> str:
        return json.dumps(self.messages)


def turn_seed(seed: int, sample_index: int, turn: int) -> int:
    """A 31-bit seed from a prompt's seed, a sample index and a turn: an episode's is (prompt seed, k, 0), and
    each of its turns' is (that seed, 0, turn)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{sample_index}:{turn}".encode()).digest()[:4], "big") >> 1


def start(sandbox: Sandbox, tokenizer, rows: list[dict], seeds: list[int], n: int) -> list[list[Episode]]:
    """n episodes per task row; with an environment factory each gets its own instance, whose `reset` text joins
    the prompt before it is tokenized."""
    groups = []
    for row, seed in zip(rows, seeds, strict=True):
        group = []
        for k in range(n):
            key, environment = f"{row['prompt_id']}:{k}", row.get("environment") or ""
            text = row["prompt"]
            if sandbox.has_factory:
                reset = sandbox.reset(key, environment, row)
                if reset.error:
                    raise ContractError(f"env.environment_factory: reset failed on prompt_id {row['prompt_id']} "
                                        f"(environment {environment!r}): {reset.text}")
                text = f"{text}{reset.text}" if reset.text else text
            ids = chat.prompt_ids(tokenizer, text, sandbox.tool_schemas(environment))
            group.append(Episode(ids, turn_seed(seed, k, 0), key, environment))
        groups.append(group)
    return groups


def run(sampler, tokenizer, sandbox: Sandbox, episodes: list[Episode], *, temperature: float, top_p: float,
        max_tokens: int, max_turns: int, max_len: int) -> None:
    """Play every episode to its end, one batched sampler call per turn."""
    active, turn = list(episodes), 0
    while active:
        contexts = [e.prompt_ids + e.completion_ids for e in active]
        budgets = [min(max_tokens - len(e.completion_ids), max_len - 1 - len(c)) for e, c in zip(active, contexts,
                                                                                                   strict=True)]
        seeds = [turn_seed(e.seed, 0, turn) for e in active]
        samples = sampler.sample(contexts, seeds, n=1, temperature=temperature, top_p=top_p, max_tokens=budgets)
        still = []
        for e, context, (sample,) in zip(active, contexts, samples, strict=True):
            if _turn(e, context, sample, tokenizer, sandbox, max_tokens, max_turns, max_len):
                still.append(e)
        active, turn = still, turn + 1
        faults.point("episode_turn")
    for e in episodes:
        e.env_reward = sandbox.reward(e.key)
        sandbox.close(e.key)


def _turn(e: Episode, context, sample, tokenizer, sandbox, max_tokens, max_turns, max_len) -> bool:
    """Take one sampled turn into the episode; whether it goes on."""
    e.num_turns += 1
    e.append(sample.completion_ids, sample.logprobs)
    message, malformed = chat.parse(tokenizer, sample.completion_ids, context, sandbox.tool_schemas(e.environment))
    e.messages.append(message)
    # Call syntax the parser rejects is a failed call: the turn stands as text, and ends the episode as an answer.
    e.tool_calls += malformed
    e.tool_errors += malformed
    e.malformed_calls += malformed
    calls = message.get("tool_calls") or []
    if sample.finish_reason == "length" or not calls or e.num_turns >= max_turns:
        e.finish_reason = "length" if sample.finish_reason == "length" else "max_turns" if calls else "stop"
        return False
    results, done = [], False
    for call in calls:
        function = call["function"]
        reply = sandbox.call(e.key, function["name"], function["arguments"])
        e.tool_calls += 1
        e.tool_errors += reply.error
        done |= reply.done
        results.append({"role": "tool", "name": function["name"], "content": reply.text})
    suffix = chat.tool_suffix(tokenizer, results)
    if (len(e.completion_ids) + len(suffix) >= max_tokens
            or len(e.prompt_ids) + len(e.completion_ids) + len(suffix) >= max_len - 1):
        e.finish_reason = "length"
        return False
    e.append(suffix, None)
    e.messages += results
    if done:
        e.finish_reason = "done"
        return False
    return True
