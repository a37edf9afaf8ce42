"""Episodes' parts without an engine: the tool sandbox under every failure, the chat conventions of the embedded
tokenizer, and the contract's checks of the mask and the logprobs."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, as_table, rollout_rows

from burstrl.config import SandboxConfig
from burstrl.data.contract import ROLLOUT_FIELDS, read_rollouts
from burstrl.env import chat
from burstrl.env.calculator import demonstration
from burstrl.env.sandbox import Sandbox
from burstrl.errors import ContractError
from burstrl.training.tinymodel import build_tokenizer

FAULTS = [f"toolbox_faults.{name}" for name in ("sleepy", "raises", "hog", "dial", "crash", "nontext")]


@pytest.fixture
def tests_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def test_every_tool_failure_is_an_error_message_and_the_sandbox_goes_on(tests_on_path):
    with Sandbox(["burstrl.env.calculator.add", *FAULTS], "", SandboxConfig(timeout_seconds=1.0, memory_mb=256)) as box:
        assert [s["function"]["name"] for s in box.tool_schemas("")] == ["add", "sleepy", "raises", "hog", "dial",
                                                                         "crash", "nontext"]
        replies = {name: box.call("e", name, {}) for name in ("sleepy", "raises", "hog", "dial", "crash", "nontext")}
        assert all(r.error and r.text.startswith("error: ") and not r.done for r in replies.values())
        assert replies["sleepy"].text == "error: timed out after 1s"
        assert replies["raises"].text == "error: RuntimeError: tool failed on purpose"
        assert replies["hog"].text == "error: out of memory (env.sandbox.memory_mb=256)"
        assert "socket.getaddrinfo refused" in replies["dial"].text
        assert replies["crash"].text == "error: the tool process died (exit code 3)"
        assert replies["nontext"].text == "error: TypeError: tool nontext returned object, not text"
        assert box.restarts == 2  # the hang and the crash; each time a fresh worker answers the next call
        assert box.call("e", "add", {"a": 2, "b": 40}).text == "42"
        assert box.call("e", "nope", {}).text.startswith("error: LookupError: unknown tool 'nope'")
        missing = box.call("e", "add", {"a": 1}).text
        assert missing == "error: TypeError: add() missing 1 required positional argument: 'b'"


def test_network_on_lets_the_tool_reach_the_socket(tests_on_path):
    with Sandbox(["toolbox_faults.dial"], "", SandboxConfig(timeout_seconds=5.0, network=True)) as box:
        # Nothing listens on the discard port, so the connection is refused by the OS, not by the sandbox.
        assert "ConnectionRefusedError" in box.call("e", "dial", {}).text


def test_environments_live_per_episode_reset_joins_the_prompt_and_own_the_reward(tests_on_path):
    with Sandbox([], "toolbox_faults.Counter", SandboxConfig()) as box:
        assert [s["function"]["name"] for s in box.tool_schemas("")] == ["increment", "pause"]
        assert box.reset("a", "", {"prompt": "p", "start": 5}).text == " (counter at 5)"
        assert box.reset("b", "", {"prompt": "p", "start": 0}).text == " (counter at 0)"
        assert box.call("a", "increment", {"step": 2}).text == "7"
        assert box.call("b", "increment", {"step": 1}).text == "1"
        done = box.call("a", "increment", {"step": 3})
        assert (done.text, done.done) == ("10", True)  # the environment ends its episode at 10
        assert (box.reward("a"), box.reward("b")) == (10.0, 1.0)
        box.close("a")
        assert box.reward("a") is None


def test_a_reward_attribute_and_a_finished_flag_work_as_get_reward_and_done(tests_on_path):
    with Sandbox([], "toolbox_faults.Tally", SandboxConfig()) as box:
        assert box.reset("a", "", {"prompt": "p"}).text == ""
        assert box.reward("a") is None  # no reward yet: None, as the adapter starts
        first = box.call("a", "add", {"points": 4})
        assert (first.text, first.done, box.reward("a")) == ("4", False, 4.0)
        last = box.call("a", "add", {"points": 7})
        assert (last.text, last.done, box.reward("a")) == ("11", True, 11.0)


def test_a_killed_worker_ends_every_episode_whose_environment_it_held(tests_on_path):
    with Sandbox([], "toolbox_faults.Counter", SandboxConfig(timeout_seconds=1.0)) as box:
        box.reset("a", "", {"start": 1})
        box.reset("b", "", {"start": 2})
        hung = box.call("a", "pause", {"seconds": 30})
        assert (hung.text, hung.error, hung.done) == ("error: timed out after 1s", True, True)
        lost = box.call("b", "increment", {"step": 1})
        assert (lost.text, lost.error, lost.done) == ("error: the environment was lost with a killed tool process",
                                                      True, True)
        assert box.reward("b") is None
        box.reset("c", "", {"start": 3})  # a new episode gets a live environment in the new worker
        assert box.call("c", "increment", {"step": 1}).text == "4"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(chat=True)


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_embedded_chat_format_parses_calls_and_renders_results(tokenizer):
    prompt = chat.prompt_ids(tokenizer, "1+2+3=", [])
    assert tokenizer.decode(prompt) == "<bos>1+2+3=|"
    message, malformed = chat.parse(tokenizer, ids(tokenizer, "[add{a:1,b:2}]<eos>"), prompt, [])
    assert not malformed
    assert message["tool_calls"] == [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]
    assert chat.parse(tokenizer, ids(tokenizer, "6<eos>"), prompt, []) == ({"role": "assistant", "content": "6"},
                                                                           False)
    # Call syntax the parser rejects is text, flagged, never an exception.
    assert chat.parse(tokenizer, ids(tokenizer, "[add{a:1,b:]<eos>"), prompt, []) == (
        {"role": "assistant", "content": "[add{a:1,b:]"}, True)
    suffix = chat.tool_suffix(tokenizer, [{"role": "tool", "name": "add", "content": "3"}])
    assert tokenizer.decode(suffix) == "(3)|"


def test_a_rendered_chat_marks_what_the_assistant_wrote(tokenizer):
    full, mask = chat.rendered_episode(tokenizer, demonstration("1+2+3=", "6", use_tool=True))
    text = "<bos>1+2+3=|[add{a:1,b:2}]<eos>(3)|[add{a:3,b:3}]<eos>(6)|6<eos>"
    assert tokenizer.decode(full) == text
    written = "".join(tokenizer.decode([t]) for t, m in zip(full, mask, strict=True) if m)
    assert written == "[add{a:1,b:2}]<eos>[add{a:3,b:3}]<eos>6<eos>"
    assert chat.environment_spans(full, [1 - m for m in mask]) == [ids(tokenizer, "[add{a:1,b:2}]<eos>"),
                                                                       ids(tokenizer, "[add{a:3,b:3}]<eos>"),
                                                                       ids(tokenizer, "6<eos>")]


def episode_row(tokenizer):
    """One episode row: a call, its result (mask 0, no logprobs) and the answer."""
    call, result, answer = ids(tokenizer, "[add{a:1,b:2}]<eos>"), ids(tokenizer, "(3)|"), ids(tokenizer, "3<eos>")
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "name": "add", "content": "3"}, {"role": "assistant", "content": "3"}]
    return {"completion_ids": call + result + answer, "completion_mask": [1] * len(call) + [0] * 4 + [1] * 2,
            "sampler_logprobs": [-0.1] * len(call) + [None] * 4 + [-0.2] * 2, "num_turns": 2, "tool_calls": 1,
            "tool_errors": 0, "completion_messages": json.dumps(messages)}


@pytest.mark.parametrize(("change", "message"), [
    ({"completion_mask": [1, 1]}, "row 0 .*field 'completion_mask': has 2 values for 21 completion tokens"),
    ({"completion_mask": [0] + [1] * 20}, "field 'completion_mask': must hold only 0 and 1 and start with a policy"),
    ({"sampler_logprobs": [-0.5] * 21}, "field 'sampler_logprobs': holds -0.5 at environment token 15; it must be "
                                        "null where the mask is 0"),
    ({"sampler_logprobs": [None] * 21}, "field 'sampler_logprobs': holds None at token 0; logprobs must be finite"),
    ({"tool_errors": 2}, "field 'num_turns': turns=2, tool_calls=1, tool_errors=2"),
    ({"completion_messages": "[{"}, "field 'completion_messages': is not JSON"),
])
def test_episode_rows_break_the_contract_by_name(tmp_path, tokenizer, change, message):
    rows = rollout_rows(groups=1, size=2)
    for row in rows:
        row.update(episode_row(tokenizer))
    rows[0].update(change)
    path = tmp_path / "r.parquet"
    pq.write_table(as_table(rows, ROLLOUT_FIELDS), path)
    with pytest.raises(ContractError, match=message):
        read_rollouts(path)


def test_environment_tokens_must_be_the_rendered_tool_results(tmp_path, tokenizer):
    rows = rollout_rows(groups=1, size=2)
    for row in rows:
        row.update(episode_row(tokenizer))
    table = as_table(rows, ROLLOUT_FIELDS)
    chat.check_episode_tokens("r.parquet", table, tokenizer)
    messages = json.loads(rows[1]["completion_messages"])
    messages[1]["content"] = "4"  # the file says the tool returned 4, but the tokens say 3
    rows[1]["completion_messages"] = json.dumps(messages)
    with pytest.raises(ContractError, match=r"r.parquet: row 1 .*environment tokens \(mask 0\) are not the chat"):
        chat.check_episode_tokens("r.parquet", as_table(rows, ROLLOUT_FIELDS), tokenizer)
    assert pa.types.is_list(table.schema.field("completion_mask").type)
