"""TRL's tool and environment contract (TRL 1.16, where GRPOTrainer marks `environment_factory` experimental).

Supported, as TRL does it:
  - `env.tools`: plain functions by dotted name; their typed signatures and Google-style docstrings become the JSON
    schemas the chat template renders (transformers' `get_json_schema`, as `apply_chat_template(tools=...)`);
  - `env.environment_factory`: the dotted name of a callable returning an environment, or of a dict of such
    callables chosen per row by its `environment` column. One instance per episode; `reset(**row)` gets the task
    row and returns None or text appended to the last user message; every public method but `reset` and
    `get_reward` is a tool; a `get_reward()` method owns a reward, stored per episode as `env_reward` for score's
    `burstrl.rl.rewards.environment_reward`.
Not supported: async tools and environments, multimodal tool results, and reward functions that receive the live
`environments` (the environment lives in generate's sandbox; score sees what it recorded). An environment may set
`done = True` (or `finished`) to end its episode after a call, and without `get_reward` may keep its reward in a
`reward` attribute: the conventions of TRL's own OpenReward adapter (trl.experimental.openreward).
"""

import inspect

from burstrl.errors import ConfigError


def resolve(name: str, what: str):
    import importlib

    module_name, _, attr = name.rpartition(".")
    try:
        value = getattr(importlib.import_module(module_name), attr) if module_name else None
    except ImportError as err:
        raise ConfigError(f"{what}: cannot import module of '{name}': {err}") from err
    except AttributeError:
        value = None
    if value is None:
        raise ConfigError(f"{what}: '{name}' not found (expected package.module.name)")
    return value


def resolve_all(names: list[str]) -> list:
    functions = [resolve(name, "env.tools") for name in names]
    for name, fn in zip(names, functions, strict=True):
        if not callable(fn):
            raise ConfigError(f"env.tools: '{name}' is not callable")
    return functions


def factories(name: str) -> dict:
    """{environment name (None for a single factory): factory}; empty without one."""
    if not name:
        return {}
    value = resolve(name, "env.environment_factory")
    found = value if isinstance(value, dict) else {None: value}
    for key, factory in found.items():
        if not callable(factory):
            raise ConfigError(f"env.environment_factory: '{name}' entry {key!r} is not callable")
    return found


def methods(env) -> dict:
    """The environment's tools: public methods on its class but reset and get_reward (properties not evaluated)."""
    names = [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
             if not n.startswith("_") and n not in ("reset", "get_reward")]
    if not callable(getattr(env, "reset", None)):
        raise ConfigError(f"env.environment_factory: {type(env).__name__} has no reset method, which TRL requires")
    return {n: getattr(env, n) for n in names}


def bound(env, functions: dict) -> dict:
    return {**functions, **(methods(env) if env is not None else {})}


def schemas(functions: dict, found: dict) -> dict[str, list[dict]]:
    """JSON schemas per environment name ("" without a factory), from one probe instance of each, as TRL does."""
    from transformers.utils import get_json_schema

    if not found:
        return {"": [get_json_schema(fn) for fn in functions.values()]}
    return {key or "": [get_json_schema(fn) for fn in bound(factory(), functions).values()]
            for key, factory in found.items()}
