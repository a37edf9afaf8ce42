"""python -m burstrl.pipeline.orphans PID TOKEN [SPARE ...]: once process PID has ended, however it ended, kill
what it started.

Every stage starts one (burstrl.pipeline.stage.parse). A stage killed with SIGKILL cannot stop its children, and
vLLM's engine core, orphaned while starting, waits minutes for its dead front end while it holds the
memory (on a GPU, the memory the re-run needs). The reaper records the stage's descendants while the stage
runs, and every process started after the stage set TOKEN in its environment (STAGE_TOKEN) carries it: a child
spawned in the moment before the stage died, which no poll saw, is found by it. Once the stage has ended, the
reaper kills both kinds still alive; SPARE pids (the log's tee processes) are left to finish.
"""

import sys
import time

import psutil

STAGE_TOKEN = "BURSTRL_STAGE_TOKEN"


def carrying(token: str) -> list[psutil.Process]:
    """Processes whose environment holds `token` as STAGE_TOKEN (those of other users cannot be read: skipped)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(STAGE_TOKEN) == token:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def watch(pid: int, spare: set[int], poll: float = 0.5, token: str | None = None) -> list[int]:
    """Wait for `pid` to end, then kill its recorded descendants and the processes carrying `token`, but `spare`;
    returns the pids killed."""
    try:
        stage = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    seen: dict[int, psutil.Process] = {}
    spare = spare | {psutil.Process().pid, pid}
    try:
        while stage.status() != psutil.STATUS_ZOMBIE:
            seen.update((p.pid, p) for p in stage.children(recursive=True) if p.pid not in spare)
            time.sleep(poll)
    except psutil.NoSuchProcess:
        pass
    if token:
        seen.update((p.pid, p) for p in carrying(token) if p.pid not in spare and p.pid not in seen)
    killed = []
    for proc in seen.values():
        try:
            # psutil checks the start time too, so a pid the system has since reused is not touched.
            if proc.is_running():
                proc.kill()
                killed.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return sorted(killed)


if __name__ == "__main__":
    watch(int(sys.argv[1]), {int(p) for p in sys.argv[3:]}, token=sys.argv[2])
