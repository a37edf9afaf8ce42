"""Two lanes of stages that run at the same time: home (generate, score, eval, sync, on the inference boxes) and
trainer (train, on the rented GPU). A rented session (burstrl.remote.loop) drives them.

Why not `dvc repro`: DVC lets one process at a time hold a repository's lock, and `dvc repro train@N` holds it
for the whole remote training, so home could not sample the next iteration meanwhile. A lane instead runs a
stage's own command (its `cmd` in dvc.yaml, unrolled for its iteration) and, once it exits 0, records it with
`dvc commit --force STAGE`, which holds the lock for a second, one commit at a time. A stage starts only once
every stage whose outputs it reads has been recorded, and nothing else writes those outputs, the code or the
params during a session, so what `dvc commit` hashes as the stage's inputs is what the stage read: afterwards
`dvc status` is clean and `dvc repro` runs nothing, exactly as if `dvc repro` had run each stage.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from burstrl.atomic import write_json
from burstrl.errors import PARTIAL

HOME, TRAINER = "home", "trainer"
LANE_OF = {"generate": HOME, "score": HOME, "eval": HOME, "sync": HOME, "train": TRAINER}
_VAR = re.compile(r"\$\{(key|item\.(\w+))\}")
JOURNAL = Path("build/lanes")  # stages that exited 0 and are not yet recorded, with what they read and wrote
ON_DEATH = ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []  # util-linux, on every Linux


@dataclass
class Stage:
    cmd: str
    deps: list[str]
    outs: list[str]


@dataclass
class Run:
    """One stage a lane ran: when, and how it exited."""
    stage: str
    lane: str
    start: float
    end: float
    code: int


def _paths(entries) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]


def unroll(dvc_yaml: dict, iters: dict[str, dict]) -> dict[str, Stage]:
    """Every stage of dvc.yaml by DVC's name for it (`train@002`), its foreach stages once per iteration."""
    def resolve(spec: dict, key: str | None, item: dict | None) -> Stage:
        def sub(text: str) -> str:
            return _VAR.sub(lambda m: key if m[1] == "key" else item[m[2]], text)
        return Stage(sub(spec["cmd"]), [sub(d) for d in _paths(spec.get("deps"))],
                     [sub(o) for kind in ("outs", "metrics", "plots") for o in _paths(spec.get(kind))])

    stages = {}
    for name, spec in dvc_yaml["stages"].items():
        if "foreach" in spec:
            stages.update({f"{name}@{key}": resolve(spec["do"], key, item) for key, item in iters.items()})
        else:
            stages[name] = resolve(spec, None, None)
    return stages


def load(iters: dict[str, dict], root: Path = Path(".")) -> dict[str, Stage]:
    return unroll(yaml.safe_load((root / "dvc.yaml").read_text()), iters)


def needs(name: str, stages: dict[str, Stage], made_by: dict[str, str] | None = None) -> set[str]:
    """The stages whose outputs stage `name` reads (an output that is a folder holds the paths under it).
    `made_by` maps each output to its stage (`producers(stages)`), for callers that ask often."""
    made_by = producers(stages) if made_by is None else made_by
    found = set()
    for dep in stages[name].deps:
        parts = Path(dep).parts
        found.update(made_by[p] for i in range(1, len(parts) + 1) if (p := "/".join(parts[:i])) in made_by)
    return found - {name}


def producers(stages: dict[str, Stage]) -> dict[str, str]:
    return {out: name for name, stage in stages.items() for out in stage.outs}


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else []


def argv(cmd: str) -> list[str]:
    """A simple command of a program runs as that program, not under a shell that would outlive it; anything
    else (operators, expansions, a builtin such as `exit 3`) under sh."""
    words = [] if set(cmd) & set(";&|<>()`$*?~\\\n'\"") else shlex.split(cmd)
    return words if words and shutil.which(words[0]) else ["sh", "-c", cmd]


def lane(name: str) -> str | None:
    return LANE_OF.get(name.split("@")[0]) if "@" in name else None


def priority(name: str) -> tuple:
    """Home runs first what the trainer needs first: generate@N and score@N feed train@N, sync@N a later
    iteration's generate at the earliest N+1; eval, which no stage waits for, when nothing else is ready."""
    stage, key = name.split("@")
    return stage == "eval", int(key) + (stage == "sync"), list(LANE_OF).index(stage)


@dataclass
class Lanes:
    """Runs `pending` stages on their lanes until none can start. `allow(name)` says whether a ready stage may start
    now (a session's stop conditions); `grow()` is asked for more stages (a new iteration's) whenever a lane looks
    for work; `done(name)` hears of each recorded stage."""
    stages: dict[str, Stage]
    pending: set[str]
    env: dict[str, dict]
    allow: Callable[[str], bool] = lambda name: True
    grow: Callable[[], dict[str, Stage]] = dict
    done: Callable[[str], None] = lambda name: None
    root: Path = Path(".")
    runs: list[Run] = field(default_factory=list)
    error: str | None = None
    partial: bool = False

    def __post_init__(self):
        self.cond = threading.Condition()
        self.commit_lock = threading.Lock()
        self.running: dict[str, subprocess.Popen | None] = {}
        self.stopped = False
        self.finished = {HOME: threading.Event(), TRAINER: threading.Event()}
        self.made_by, self.needs = producers(self.stages), {}
        self.gate = threading.Event()  # the trainer lane starts once it is set (its machine is ready)
        self.gate.set()

    def needs_of(self, name: str) -> set[str]:
        if name not in self.needs:  # asked on every wake of every lane: worked out once per stage
            self.needs[name] = needs(name, self.stages, self.made_by)
        return self.needs[name]

    def ready(self, which: str) -> str | None:
        blocked = self.pending | set(self.running)
        candidates = [n for n in self.pending if lane(n) == which and n not in self.running
                      and not self.needs_of(n) & blocked and self.allow(n)]
        return min(candidates, key=priority, default=None)

    def next_for(self, which: str) -> str | None:
        """Under the condition: the lane's next stage, waiting while another lane's work may still unblock one;
        None once nothing can start on any lane."""
        while not self.stopped:
            if new := self.grow():
                self.stages.update(new)
                self.made_by, self.needs = producers(self.stages), {}
                self.pending |= set(new)
            name = self.ready(which)
            if name is not None:
                self.running[name] = None
                return name
            if not self.running and not any(self.ready(other) for other in self.finished):
                self.cond.notify_all()
                return None
            if which == TRAINER and (self.partial or not any(
                    lane(n) == TRAINER and self.allow(n) for n in self.pending)):
                return None  # stopped for the deadline, or no train left to wait for: the machine can go
            self.cond.wait(timeout=5)
        return None

    def work(self, which: str) -> None:
        try:
            while which == TRAINER and not self.gate.wait(0.5):
                if self.stopped:
                    return
            while True:
                with self.cond:
                    name = self.next_for(which)
                if name is None:
                    return
                start = time.time()
                finished = self.finished_unrecorded(name)
                code = 0 if finished else self.run_stage(name, which)
                if code == 0:
                    if not finished:
                        write_json(self.journal(name), self.fingerprint(name))
                    with self.commit_lock:
                        code = self.record(name)
                    if code == 0:
                        self.journal(name).unlink(missing_ok=True)
                with self.cond:
                    self.runs.append(Run(name, which, start, time.time(), code))
                    del self.running[name]
                    failed = code != 0 and not (which == TRAINER and code == PARTIAL) and not self.stopped
                    if code == 0:
                        self.pending.discard(name)
                        self.done(name)
                    elif code == PARTIAL and which == TRAINER:
                        self.partial = True  # stopped for the deadline: the next session continues it
                    elif failed:
                        self.error = f"{name} failed (exit {code}); see logs/{name.replace('@', '/')}.log"
                    self.cond.notify_all()
                if failed:
                    self.stop()
        finally:
            with self.cond:
                self.finished[which].set()
                self.cond.notify_all()

    def run_stage(self, name: str, which: str) -> int:
        with self.cond:
            if self.stopped:
                return 1
            # Its own group, so that stop() ends it and what it started; SIGTERM when this process dies, even by
            # SIGKILL, so that no stage outlives its session to race the next one.
            proc = subprocess.Popen([*ON_DEATH, *argv(self.stages[name].cmd)], cwd=self.root,
                                    env=self.env[which], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            self.running[name] = proc
        for line in proc.stdout:
            say(f"{name}| {line.rstrip()}")
        return proc.wait()

    def journal(self, name: str) -> Path:
        return self.root / JOURNAL / f"{name}.json"

    def fingerprint(self, name: str) -> dict:
        """Size and modification time of every file the stage read and wrote: outputs are written by renaming,
        so a file that was rewritten since has another time."""
        stage = self.stages[name]
        return {path: [[str(f.relative_to(self.root)), f.stat().st_size, f.stat().st_mtime_ns]
                       for f in sorted(_files(self.root / path))] for path in stage.deps + stage.outs}

    def finished_unrecorded(self, name: str) -> bool:
        """Whether a session that died between the stage's exit 0 and its `dvc commit` left its outputs as they
        were: then it is recorded, not run again (a train stage is never trained twice)."""
        journal = self.journal(name)
        try:
            same = json.loads(journal.read_text()) == self.fingerprint(name)
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        if same:
            say(f"lanes: {name} finished before its session ended and was not recorded: recording it")
        else:
            journal.unlink()
        return same

    def record(self, name: str) -> int:
        done = subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", "--quiet", name], cwd=self.root,
                              env=self.env[HOME], capture_output=True, text=True)
        if done.returncode:
            say(f"lanes: `dvc commit {name}` failed: {done.stderr.strip()}")
        return done.returncode

    def start(self) -> None:
        for which in (HOME, TRAINER):
            threading.Thread(target=self.work, args=(which,), daemon=True, name=which).start()

    def wait(self, which: str | None = None) -> None:
        """Until lane `which` (both when None) has nothing more to run; the signals of the main thread still arrive."""
        for event in [self.finished[which]] if which else self.finished.values():
            while not event.wait(0.5):
                pass

    def stop(self) -> None:
        """Start nothing more, and end the stages running: SIGTERM, then SIGKILL after 30 s."""
        with self.cond:
            self.stopped = True
            procs = [p for p in self.running.values() if p is not None and p.poll() is None]
            self.cond.notify_all()
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def say(line: str) -> None:
    """Best effort: a closed terminal (SIGHUP) must not stop a lane."""
    try:
        print(line, flush=True)
    except OSError:
        pass
