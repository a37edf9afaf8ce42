"""Rollout rows from a sampler: completions (or episodes) of prompts, in the rollout contract's columns.

Generate samples every prompt of an iteration with it; score samples again the groups whose rewards were
all equal, when score.zero_variance is resample (docs/objective.md, "Dynamic sampling").
"""

from contextlib import ExitStack
from pathlib import Path

import pyarrow as pa
from transformers import AutoTokenizer

from burstrl.config import Config
from burstrl.data.contract import ROLLOUT_FIELDS
from burstrl.data.policy import policy_name, read_metadata
from burstrl.env import environment
from burstrl.env.episodes import Episode
from burstrl.errors import ConfigError, ContractError
from burstrl.inference import client, engine


def completion_columns(s, tokenizer) -> dict:
    """A sample's columns: a single completion (engine.Sample) is one policy turn; an episode brings its own."""
    if isinstance(s, Episode):
        return {"prompt_ids": s.prompt_ids, "completion": tokenizer.decode(s.completion_ids, skip_special_tokens=True),
                "completion_ids": s.completion_ids, "completion_mask": s.completion_mask,
                "sampler_logprobs": s.logprobs, "finish_reason": s.finish_reason, "num_turns": s.num_turns,
                "tool_calls": s.tool_calls, "tool_errors": s.tool_errors, "completion_messages": s.transcript,
                "env_reward": s.env_reward}
    return {"completion": s.text, "completion_ids": s.completion_ids, "completion_mask": [1] * len(s.completion_ids),
            "sampler_logprobs": s.logprobs, "finish_reason": s.finish_reason, "num_turns": 1, "tool_calls": 0,
            "tool_errors": 0, "completion_messages": None, "env_reward": None}


def rollout_table(prompts: pa.Table, prompt_ids, seeds, groups, stamp: dict, tokenizer) -> pa.Table:
    """One row per completion of `groups` (the samples or episodes of each prompt), with the sampler's `stamp`."""
    rows = [(i, k, s) for i, group in enumerate(groups) for k, s in enumerate(group)]
    take = [i for i, _, _ in rows]
    columns = [{"prompt_ids": prompt_ids[i], **completion_columns(s, tokenizer)} for i, _, s in rows]
    table = pa.table({
        "sample_index": pa.array([k for _, k, _ in rows], pa.int32()),
        **{name: [c[name] for c in columns] for name in columns[0]},
        **{name: [value] * len(rows) for name, value in stamp.items()},
        "seed": [seeds[i] for i in take],
    })
    task_columns = prompts.take(take)
    for name in task_columns.column_names:
        table = table.append_column(name, task_columns[name])
    return table


def sample_rollouts(sampler, cfg: Config, prompts: pa.Table, prompt_ids, seeds, stamp: dict, tokenizer,
                    sandbox=None) -> pa.Table:
    """generate.num_generations completions of each prompt row (its task columns, with prompt_id first), as
    episodes in `sandbox` when the run has tools."""
    g = cfg.generate
    if sandbox:
        groups = environment.play(sampler, tokenizer, sandbox, prompts, seeds, g, cfg.env.max_turns,
                                  cfg.model.max_len)
    else:
        groups = sampler.sample(prompt_ids, seeds, n=g.num_generations, temperature=g.temperature, top_p=g.top_p,
                                max_tokens=g.max_tokens, min_tokens=g.min_tokens)
    return rollout_table(prompts, prompt_ids, seeds, groups, stamp, tokenizer)


def redraw(stack: ExitStack, source: Path, table: pa.Table, cfg: Config):
    """draw(prompts, prompt_ids, seeds) -> rollout rows, by the sampler that produced `table`: its checkpoint in
    the offline engine, or servers.policy serving the same weights variant. Refused when the batch came from
    several samplers, or from weights this stage cannot run (an offline --weights copy)."""
    stamps = set(zip(*(table[c].to_pylist() for c in ("policy_version", "policy_hash", "sampler_weights")),
                     strict=True))
    if len(stamps) != 1:
        raise ContractError(f"{source}: field 'policy_version': score.zero_variance resample draws again with the "
                            f"batch's one sampler, but its rows come from {len(stamps)}: {sorted(stamps)}")
    version, digest, variant = stamps.pop()
    policy = Path("checkpoints") / version
    meta = read_metadata(policy)
    if meta["content_hash"] != digest:
        raise ContractError(f"{source}: field 'policy_hash': {digest} is not {policy}'s {meta['content_hash']}")
    if cfg.servers.policy:
        sampler = stack.enter_context(client.connected(cfg.servers.policy, policy_name(meta), cfg.servers, "policy"))
        if sampler.variant != variant:
            raise ConfigError(f"score.zero_variance resample: servers.policy serve {sampler.variant}, but {source} "
                              f"was sampled by {variant}; a batch must come from one sampler")
    elif variant != "checkpoint":
        raise ConfigError(f"score.zero_variance resample: {source} was sampled by {variant}, which score cannot run "
                          "offline: set servers.policy to servers of those weights, or score.zero_variance keep")
    else:
        sampler = stack.enter_context(engine.offline(policy, cfg.inference, cfg.model.max_len, cfg.seed))
    tokenizer = AutoTokenizer.from_pretrained(policy)
    sandbox = stack.enter_context(environment.sandbox(cfg.env, tokenizer, policy)) if cfg.env.enabled else None
    g = cfg.generate
    stamp = {"policy_version": version, "policy_hash": digest, "sampler_weights": variant,
             "tokenizer_hash": meta["tokenizer_hash"], "temperature": g.temperature, "top_p": g.top_p}
    task = ["prompt_id", "prompt", *(c for c in table.column_names if c not in {f.name for f in ROLLOUT_FIELDS})]

    def draw(heads: pa.Table, prompt_ids: list[list[int]], seeds: list[int]) -> pa.Table:
        return sample_rollouts(sampler, cfg, heads.select(task), prompt_ids, seeds, stamp, tokenizer, sandbox)

    return draw
