"""Tools that misbehave in every way the sandbox must survive (tests/test_environments.py)."""

import os
import socket
import time
from pathlib import Path


def sleepy() -> str:
    """Sleeps far past any test's timeout."""
    time.sleep(60)
    return "awake"


def raises() -> str:
    """Raises."""
    raise RuntimeError("tool failed on purpose")


def hog() -> str:
    """Allocates 2 GiB."""
    return str(len(bytearray(2 << 30)))


def dial() -> str:
    """Opens a TCP connection."""
    socket.create_connection(("127.0.0.1", 9), timeout=1).close()
    return "connected"


def crash() -> str:
    """Ends its process without a reply."""
    os._exit(3)


def nontext() -> object:
    """Returns something that is not text."""
    return object()


class Counter:
    """TRL's environment contract: a reset from the task row, a tool method, its own reward; done at 10."""

    def reset(self, start: int = 0, **row) -> str:
        self.value, self.done = start, False
        return f" (counter at {start})"

    def increment(self, step: int) -> int:
        """Adds a step to the counter.

        Args:
            step: How much to add.
        """
        self.value += step
        self.done = self.value >= 10
        return self.value

    def pause(self, seconds: float) -> str:
        """Waits.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "resumed"

    def get_reward(self) -> float:
        return float(self.value)


class Tally:
    """The conventions of TRL's OpenReward adapter: no get_reward, a `reward` attribute and a `finished` flag."""

    def reset(self, **row) -> None:
        self.reward, self.finished = None, False

    def add(self, points: int) -> str:
        """Adds points; ten or more finish the episode.

        Args:
            points: How many.
        """
        self.reward = (self.reward or 0) + points
        self.finished = self.reward >= 10
        return str(self.reward)


# The longest error first: a stage's first call has the most room left in its episode for the result.
ORDER = (dial, sleepy, raises, hog, crash, nontext)


def add(a: int, b: int) -> int:
    """Adds two integers, except that calls 1 to 6 of a stage fail in each way in turn, then every seventh.

    Args:
        a: The first integer.
        b: The second integer.
    """
    # The count lives in a file: a hang or a crash restarts the worker, which must not start the cycle again.
    counter = Path("build/faulty-add-calls")
    calls = int(counter.read_text()) if counter.exists() else 0
    counter.parent.mkdir(parents=True, exist_ok=True)
    counter.write_text(str(calls + 1))
    return ORDER[calls % 7]() if calls % 7 < len(ORDER) else a + b
