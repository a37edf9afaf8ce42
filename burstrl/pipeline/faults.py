"""Named points where a test has the running stage killed with SIGKILL, to prove that a kill loses nothing.

BURSTRL_KILL_AT=NAME[@N][+SECONDS]: the N-th time (default the first) the process passes `point(NAME)`, it
sends itself SIGKILL: at once, or SECONDS later from a timer so that the kill lands inside a long call such
as the engine start. BURSTRL_PAUSE_AT=NAME[@N]:FILE instead creates FILE there and waits until the test
deletes it, so that the test acts (kills an inference server, say) at a known point of the stage's work.
Unset, a point does nothing. The points are listed in docs/resume.md.
"""

import os
import re
import signal
import threading
import time
from pathlib import Path

_SPEC = re.compile(r"(?P<name>[a-z_]+)(?:@(?P<nth>\d+))?(?:\+(?P<delay>[0-9.]+))?")
_PAUSE = re.compile(r"(?P<name>[a-z_]+)(?:@(?P<nth>\d+))?:(?P<file>.+)")
_hits: dict[str, int] = {}
_paused: dict[str, int] = {}


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _due(variable: str, pattern: re.Pattern, name: str, counts: dict[str, int]) -> re.Match | None:
    """The parsed spec in `variable` when this pass of point `name` is the one it names, else None."""
    match = pattern.fullmatch(os.environ.get(variable, ""))
    if match is None or match["name"] != name:
        return None
    counts[name] = counts.get(name, 0) + 1
    return match if counts[name] == int(match["nth"] or 1) else None


def point(name: str) -> None:
    if pause := _due("BURSTRL_PAUSE_AT", _PAUSE, name, _paused):
        flag = Path(pause["file"])
        flag.touch()
        print(f"faults: BURSTRL_PAUSE_AT: paused at {name} until {flag} is deleted", flush=True)
        while flag.exists():
            time.sleep(0.1)
    if kill := _due("BURSTRL_KILL_AT", _SPEC, name, _hits):
        print(f"faults: BURSTRL_KILL_AT={os.environ['BURSTRL_KILL_AT']}: SIGKILL at {name}", flush=True)
        if kill["delay"]:
            threading.Timer(float(kill["delay"]), _kill).start()
        else:
            _kill()
