"""Run a command and sample its process tree: each stage process's lifetime and peak memory.

Stage processes are told apart by their command line (`stages/NAME.py ARGS`); a stage's memory is its own
RSS plus that of every process under it (vLLM's engine core, the log tees), summed at each sample.
"""

import subprocess
import threading
import time
from dataclasses import dataclass, field

import psutil

POLL_SECONDS = 0.05


@dataclass
class StageRun:
    first: float
    last: float
    peak_rss: int = 0

    @property
    def seconds(self) -> float:
        return self.last - self.first


@dataclass
class Watched:
    wall: float
    stages: dict[str, StageRun] = field(default_factory=dict)
    output: str = ""  # stdout and stderr, interleaved

    def seconds(self, prefix: str) -> float:
        return sum(run.seconds for key, run in self.stages.items() if key.startswith(prefix))


def stage_key(cmdline: list[str]) -> str | None:
    """'generate 001 000' for `python stages/generate.py 001 000 [--params P]`; None for any other process."""
    for i, arg in enumerate(cmdline):
        if arg.startswith("stages/") and arg.endswith(".py"):
            args = cmdline[i + 1:]
            positional = [a for j, a in enumerate(args)
                          if not a.startswith("--") and (j == 0 or args[j - 1] != "--params")]
            return " ".join([arg[len("stages/"):-3], *positional])
    return None


def stage_processes(top: psutil.Process) -> list[tuple[str, psutil.Process]]:
    """(stage_key, process) for every stage process under `top`, now; processes that end meanwhile are skipped."""
    try:
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return []
    found = []
    for proc in procs:
        try:
            key = stage_key(proc.cmdline())
        except psutil.Error:
            continue
        if key is not None:
            found.append((key, proc))
    return found


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def watch(cmd: list[str], cwd, env) -> Watched:
    """Run `cmd` to its end, failing on a non-zero exit with its output's tail."""
    started = time.monotonic()
    root = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(root.stdout), daemon=True)
    reader.start()
    result = Watched(wall=0.0)
    top = psutil.Process(root.pid)
    while root.poll() is None:
        now = time.monotonic()
        for key, proc in stage_processes(top):
            run = result.stages.setdefault(key, StageRun(first=now, last=now))
            run.last = now
            run.peak_rss = max(run.peak_rss, _tree_rss(proc))
        time.sleep(POLL_SECONDS)
    result.wall = time.monotonic() - started
    reader.join()
    result.output = "".join(out)
    if root.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({root.returncode}):\n{''.join(out)[-4000:]}")
    return result

