"""The chat template's conventions, token in and token out: prompts, parsed turns and tool-result tokens.

Every model turn keeps the sampler's ids. Only what the environment adds is rendered, once, by the chat
template, and appended to the ids so far: earlier turns are never re-rendered, so a template that rewrites
history (dropping `<think>` from earlier turns) cannot change what the trainer scores. The rendering is TRL's:
a one-turn dummy chat with and without the tool messages, cut after the assistant's EOS.
"""

import json


def check_template(tokenizer, source: str) -> None:
    """The tokenizer can render a tool-calling chat and parse a response, or a ConfigError says what is missing."""
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from burstrl.errors import ConfigError

    if not supports_tool_calling(tokenizer):
        raise ConfigError(f"{source}: its chat template cannot render tool calls and tool results, which env.tools "
                          "and env.environment_factory need")
    if getattr(tokenizer, "response_template", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError as err:
            raise ConfigError(f"{source}: no response_template to parse tool calls with, and TRL knows none for "
                              f"its chat template: {err}") from err


def prompt_ids(tokenizer, text: str, tools: list[dict]) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tools=tools or None,
                                         add_generation_prompt=True, tokenize=True, return_dict=False)


def parse(tokenizer, ids: list[int], prefix: list[int], tools: list[dict]) -> tuple[dict, bool]:
    """The turn as a chat message, and whether it was malformed (unparseable tool-call syntax: then it is text)."""
    try:
        message = tokenizer.parse_response(ids, prefix=prefix, tools=tools or None)
        if message is None:
            raise ValueError("nothing parsed")
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(f"tool call without a name: {call!r}")
            if function.get("arguments") is None:
                function["arguments"] = {}
        message.setdefault("role", "assistant")
        message["content"] = (message.get("content") or "").removesuffix(tokenizer.eos_token)
        return message, False
    except (ValueError, TypeError, KeyError):
        return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}, True


def tool_suffix(tokenizer, tool_messages: list[dict]) -> list[int]:
    """The ids the chat template puts after an assistant turn for these tool results, up to the next turn's
    generation prompt."""
    call = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
    ends = [i for i, tok in enumerate(prefix) if tok == tokenizer.eos_token_id]
    if ends:
        prefix = prefix[: ends[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template renders an assistant turn differently once tool results follow it")
    return full[len(prefix):]


def rendered_episode(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """A whole chat's ids and a mask of what the assistant wrote (1) versus the prompt and the tools (0), by
    rendering it one message at a time: the warm-up's labels and the tests' expectation of an episode."""
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        assistant = message["role"] == "assistant"
        upto = tokenizer.apply_chat_template(messages[: i + (0 if assistant else 1)], tools=tools,
                                             add_generation_prompt=assistant, tokenize=True, return_dict=False)
        if assistant:
            upto_next = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=True,
                                                      return_dict=False)
            mask += [0] * (len(upto) - len(ids)) + [1] * (len(upto_next) - len(upto))
            ids = upto_next
        else:
            mask += [0] * (len(upto) - len(ids))
            ids = upto
    return ids, mask


def environment_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of ids the environment put into an episode (mask 0), in order."""
    spans: list[list[int]] = []
    for i, (tok, m) in enumerate(zip(ids, mask, strict=True)):
        if m == 0:
            if i == 0 or mask[i - 1] == 1:
                spans.append([])
            spans[-1].append(tok)
    return spans


def check_episode_tokens(path, table, tokenizer) -> None:
    """Every environment span of every row is exactly the chat template's rendering of the tool results its
    `completion_messages` record, or a ContractError names the row."""
    from burstrl.data.contract import fail

    columns = zip(table["completion_messages"].to_pylist(), table["completion_ids"].to_pylist(),
                  table["completion_mask"].to_pylist(), strict=True)
    for row, (text, ids, mask) in enumerate(columns):
        messages = json.loads(text) if text is not None else []
        runs: list[list[dict]] = []
        for i, message in enumerate(messages):
            if message["role"] == "tool":
                if i == 0 or messages[i - 1]["role"] != "tool":
                    runs.append([])
                runs[-1].append(message)
        expected = [tool_suffix(tokenizer, run) for run in runs]
        if environment_spans(ids, mask) != expected:
            fail(path, row, "completion_ids", "its environment tokens (mask 0) are not the chat template's rendering "
                 "of the tool results in completion_messages", table)
