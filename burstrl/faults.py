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


def _pause(name: str) -> None:
    match = _PAUSE.fullmatch(os.environ.get("BURSTRL_PAUSE_AT", ""))
    if match is None or match["name"] != name:
        return
    _paused[name] = _paused.get(name, 0) + 1
    if _paused[name] != int(match["nth"] or 1):
        return
    flag = Path(match["file"])
    flag.touch()
    print(f"faults: BURSTRL_PAUSE_AT: paused at {name} until {flag} is deleted", flush=True)
    while flag.exists():
        time.sleep(0.1)


def point(name: str) -> None:
    _pause(name)
    spec = os.environ.get("BURSTRL_KILL_AT")
    if not spec:
        return
    match = _SPEC.fullmatch(spec)
    if match is None or match["name"] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != int(match["nth"] or 1):
        return
    print(f"faults: BURSTRL_KILL_AT={spec}: SIGKILL at {name}", flush=True)
    if match["delay"]:
        threading.Timer(float(match["delay"]), _kill).start()
    else:
        _kill()
