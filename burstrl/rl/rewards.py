"""Reward functions, with TRL's contract: fn(prompts, completions, completion_ids, **columns) -> list[float].

Any callable with that signature plugs in by dotted name in `score.reward_funcs`, including TRL's own
(`trl.rewards.accuracy_reward`, ...). A function may return None for a sample it does not apply to; the
weighted total skips it, as TRL does. NaN, inf or anything but a number is an error that names the function
and the row: TRL skips a NaN like a None, which would hide a broken verifier as a row it does not apply to.
"""

import importlib
import json
import math
import numbers

from burstrl.data.contract import fail
from burstrl.errors import ConfigError, ContractError

# What an episode recorded, passed to every function by name beside the task columns (docs/environments.md).
EPISODE_COLUMNS = ["num_turns", "tool_calls", "tool_errors", "env_reward"]


def _text(completion) -> str:
    """A completion in either TRL format: plain text, or chat messages whose last assistant message is the reply."""
    if isinstance(completion, str):
        return completion
    return next((m["content"] for m in reversed(completion) if m["role"] == "assistant"), "")


def exact_match(prompts, completions, completion_ids, answer, **kwargs) -> list[float]:
    """1.0 when the completion, stripped of whitespace, equals the reference answer, else 0.0."""
    return [1.0 if _text(c).strip() == a.strip() else 0.0 for c, a in zip(completions, answer, strict=True)]


def digit_match(prompts, completions, completion_ids, answer, **kwargs) -> list[float]:
    """Partial credit: the share of answer characters matched position by position, right-aligned as digits
    of a number are, over the longer of the two strings (so extra characters cost as much as missing ones)."""
    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        got, want = _text(completion).strip()[::-1], expected.strip()[::-1]
        hits = sum(g == w for g, w in zip(got, want, strict=False))
        scores.append(hits / max(len(got), len(want), 1))
    return scores


def environment_reward(prompts, completions, completion_ids, env_reward=None, **kwargs) -> list[float | None]:
    """The episode's environment's own `get_reward()`, as TRL adds it for an environment that defines one;
    None (skipped in the total) where it has none."""
    return list(env_reward) if env_reward is not None else [None] * len(completions)


def judge(prompts, completions, completion_ids, judge=None, **columns) -> list[float]:
    """A model served with vLLM as the verifier (burstrl.inference.judge): P(right) / (P(right) + P(wrong)) of its
    continuation after score.judge.template. Needs score.judge.model and servers.reward."""
    if judge is None:
        raise ConfigError("score.reward_funcs: burstrl.rl.rewards.judge needs score.judge.model and servers.reward")
    return judge([_text(p) for p in prompts], [_text(c) for c in completions], columns)


def resolve(name: str):
    """Import `package.module.function`; a bad name raises a ValueError that says which and why."""
    module_name, _, attr = name.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), attr) if module_name else None
    except ImportError as err:
        raise ConfigError(f"score.reward_funcs: cannot import module of '{name}': {err}") from err
    except AttributeError:
        fn = None
    if not callable(fn):
        raise ConfigError(f"score.reward_funcs: unknown reward function '{name}' (expected module.function)")
    return fn


def score_table(names: list[str], weights: list[float], source, table, task_columns: list[str],
                conversational: bool = False, extra: dict | None = None):
    """Run every reward function over a rollout table; returns (per-function values, weighted totals).

    Functions get `prompts`, `completions`, `completion_ids`, each task column and EPISODE_COLUMNS by name, as TRL
    passes dataset columns; with `conversational`, prompts are one-message chats and completions the episode's
    messages (a single completion is one assistant message), as in TRL.
    `extra` keyword arguments go to every function too: the served judge (burstrl.inference.judge) as `judge`.
    A function that raises, returns the wrong number of values, or a value that is neither a finite number nor
    None is named in the error, with the row.
    """
    funcs = [resolve(name) for name in names]
    present = [c for c in EPISODE_COLUMNS if c in table.column_names]
    kwargs = {c: table[c].to_pylist() for c in task_columns + present}
    prompts, completions = table["prompt"].to_pylist(), table["completion"].to_pylist()
    if conversational:
        prompts = [[{"role": "user", "content": p}] for p in prompts]
        chats = (table["completion_messages"].to_pylist() if "completion_messages" in table.column_names
                 else [None] * len(completions))
        completions = [json.loads(chat) if chat is not None else [{"role": "assistant", "content": c}]
                       for c, chat in zip(completions, chats, strict=True)]
    completion_ids = table["completion_ids"].to_pylist()
    per_function = []
    for name, fn in zip(names, funcs, strict=True):
        try:
            values = list(fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs,
                             **(extra or {})))
        except (TypeError, KeyError, AttributeError) as err:
            raise ContractError(f"{source}: reward function {name} failed on the columns {sorted(kwargs)}: "
                                f"{err}") from err
        if len(values) != len(prompts):
            raise ContractError(f"{source}: reward function {name} returned {len(values)} values for "
                                f"{len(prompts)} rows")
        for row, value in enumerate(values):
            if value is not None and not (isinstance(value, numbers.Real) and math.isfinite(value)):
                fail(source, row, "rewards", f"reward function {name} returned {value!r}; it must return a finite "
                     "number, or None for a row it does not apply to", table)
        per_function.append(values)
    totals = weighted_total(per_function, weights)
    missing = next((row for row, value in enumerate(totals) if math.isnan(value)), None)
    if missing is not None:
        raise ContractError(f"{source}: row {missing}: field 'reward': no reward function returned a value")
    return per_function, totals


def weighted_total(per_function: list[list[float | None]], weights: list[float]) -> list[float]:
    """Per-sample sum of weight * reward over the functions that returned a value (None is skipped)."""
    totals = []
    for values in zip(*per_function, strict=True):
        present = [w * v for w, v in zip(weights, values, strict=True) if v is not None]
        totals.append(sum(present) if present else math.nan)
    return totals
