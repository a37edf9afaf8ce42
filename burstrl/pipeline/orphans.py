"""python -m burstrl.pipeline.orphans PID [SPARE ...]: once process PID has ended, however it ended, kill what it
started.

Every stage starts one (burstrl.pipeline.stage.parse). A stage killed with SIGKILL cannot stop its children, and
vLLM's engine core, orphaned while starting, waits minutes for its dead front end while it holds the
memory (on a GPU, the memory the re-run needs). The reaper records the stage's descendants while the stage
runs and kills those still alive when it ends; SPARE pids (the log's tee processes) are left to finish.
"""

import sys
import time

import psutil


def watch(pid: int, spare: set[int], poll: float = 0.5) -> list[int]:
    """Wait for `pid` to end, then kill its recorded descendants but `spare`; returns the pids killed."""
    try:
        stage = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    seen: dict[int, psutil.Process] = {}
    spare = spare | {psutil.Process().pid}
    try:
        while stage.status() != psutil.STATUS_ZOMBIE:
            seen.update((p.pid, p) for p in stage.children(recursive=True) if p.pid not in spare)
            time.sleep(poll)
    except psutil.NoSuchProcess:
        pass
    killed = []
    for proc in seen.values():
        try:
            # psutil checks the start time too, so a pid the system has since reused is not touched.
            if proc.is_running():
                proc.kill()
                killed.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return killed


if __name__ == "__main__":
    watch(int(sys.argv[1]), {int(p) for p in sys.argv[2:]})
