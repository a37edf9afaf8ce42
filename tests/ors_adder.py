"""An environment on a real Open Reward Standard server (the openreward SDK's own), for TRL's OpenReward adapter
(tests/test_episodes.py): one task, an `add` tool that records each call it answers and ends the episode.

    python tests/ors_adder.py PORT CALLS_FILE
"""

import json
import sys

from openreward.environments import Environment, JSONObject, Server, TextBlock, ToolOutput, tool
from pydantic import BaseModel

CALLS = sys.argv[2] if __name__ == "__main__" else ""
# Empty: text after the task prompt is out of the tiny model's distribution, which would stop its tool calls.
RESET_TEXT = ""


class AddParams(BaseModel):
    a: int
    b: int


class Adder(Environment):
    """Adds two integers; the reward is the sum, so that the test can tell it came from this call."""

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}):  # noqa: B006 - the SDK's signature
        super().__init__(task_spec)

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"id": "0"}]

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(type="text", text=RESET_TEXT)]

    @tool
    async def add(self, params: AddParams) -> ToolOutput:
        """Adds two integers."""
        with open(CALLS, "a") as calls:
            calls.write(json.dumps({"a": params.a, "b": params.b}) + "\n")
        total = params.a + params.b
        return ToolOutput(blocks=[TextBlock(type="text", text=str(total))], reward=float(total), finished=True)


if __name__ == "__main__":
    Server([Adder]).run(host="127.0.0.1", port=int(sys.argv[1]))
