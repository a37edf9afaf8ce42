"""The built-in tool task: three-number addition, with an `add(a, b)` calculator tool.

The ~1M-parameter embedded policy adds two numbers in its head only part of the time and three far less often;
with two calls to `add` it only has to copy digits. Its warm-up (bootstrap) shows it both ways, answers in its
head more often than through the tool, so GRPO has a better strategy to find: held-out accuracy and the
tool-use rate rise together (docs/environments.md).
"""

import random


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return int(a) + int(b)


def demonstration(prompt: str, answer: str, use_tool: bool) -> list[dict]:
    """The chat of a correct episode: two `add` calls and the answer, or the answer alone."""
    messages = [{"role": "user", "content": prompt}]
    if use_tool:
        a, b, c = (int(x) for x in prompt.rstrip("=").split("+"))
        for x, y in ((a, b), (a + b, c)):
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": x, "b": y}}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "name": "add", "content": str(x + y)}]
    return messages + [{"role": "assistant", "content": answer}]


def tool_demonstrations(prompts: list[str], answers: list[str], share: float, seed: int) -> list[list[dict]]:
    """The warm-up's chats: a seeded `share` of the problems solved with the tool, the others answered directly."""
    rng = random.Random(f"demos:{seed}")
    return [demonstration(p, a, rng.random() < share) for p, a in zip(prompts, answers, strict=True)]
