"""Tools that misbehave in every way the sandbox must survive (tests/test_environments.py)."""

import os
import socket
import time


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
