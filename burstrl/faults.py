"""Named points where a test has the running stage killed with SIGKILL, to prove that a kill loses nothing.

BURSTRL_KILL_AT=NAME[@N][+SECONDS]: the N-th time (default the first) the process passes `point(NAME)`, it
sends itself SIGKILL: at once, or SECONDS later from a timer so that the kill lands inside a long call such
as the engine start. Unset, a point does nothing. The points are listed in docs/resume.md.
"""

import os
import re
import signal
import threading

_SPEC = re.compile(r"(?P<name>[a-z_]+)(?:@(?P<nth>\d+))?(?:\+(?P<delay>[0-9.]+))?")
_hits: dict[str, int] = {}


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def point(name: str) -> None:
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
