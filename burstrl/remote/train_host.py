"""Run the train stage on another machine over SSH, as if it had run here.

With BURSTRL_TRAIN_HOST=[user@]host:/absolute/dir in the environment, `stages/train.py N P` ships what the
stage reads to that directory with rsync (the tracked files of this working tree, so the code DVC hashed;
the scored rollouts; the parent checkpoint; any saved progress of this stage), runs the same command there
with the same deadline, streams its output, and brings its outputs back, so DVC records them here as the
stage's outputs (metrics/train/ITER.json gains `transfer_seconds`, the time spent shipping and bringing home).
While it runs, complete checkpoints come home every `interval` seconds: a lost machine
costs at most one checkpoint interval, and the next run, on any host, continues from the newest one.

The remote directory needs a Python environment with the project installed (`make setup EXTRA=cuda` on a
GPU host); BURSTRL_REMOTE_PYTHON names its interpreter (default `.venv/bin/python` in that directory).
SSH options come from BURSTRL_TRAIN_RSH (set by burstrl.remote.rent for the machine it rented), else RSYNC_RSH, as
for sync. Nothing secret is passed on a command line or logged: BURSTRL_TRAIN_SECRETS names a file on the
host (relative to the SSH user's home) that the training sources, which burstrl.remote.rent fills over SSH stdin.
"""

import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from burstrl.atomic import write_json
from burstrl.errors import LINK_LOST, ConfigError, SyncError
from burstrl.pipeline import faults, resume
from burstrl.remote.sync import Target, ssh_command

# The only environment the remote stage gets from here, besides the deadline: the kill and pause points for tests.
FORWARDED_ENV = ("BURSTRL_KILL_AT", "BURSTRL_PAUSE_AT")
# Where the remote run keeps its process id, for the on-host time limit that burstrl.remote.rent arms.
TRAIN_PID = ".burstrl/train.pid"


def home_path(path: str) -> str:
    """`path` on the remote shell's command line: relative paths are under the SSH user's home."""
    return shlex.quote(path) if path.startswith("/") else f'"$HOME"/{shlex.quote(path)}'


def watched(command: str, pidfile: str | None = None) -> str:
    """`command` for the remote shell, stopped when the SSH channel's stdin closes.

    Without a terminal a remote command outlives a dropped connection or a Ctrl-C here, and a second run
    would then train beside it. The channel's stdin closes when the local ssh ends, however it ends.
    (A shell gives background jobs /dev/null as stdin, hence the copy of it on descriptor 3.)"""
    record = f"echo $pid > {shlex.quote(pidfile)}; " if pidfile else ""
    forget = f"s=$?; rm -f {shlex.quote(pidfile)}; exit $s; " if pidfile else ""
    return (f"exec 3<&0 && {{ {command} < /dev/null 3<&- & pid=$!; {record}"
            f"{{ cat <&3 > /dev/null; kill $pid; }} > /dev/null 2>&1 & wait $pid; {forget}}}")


class Remote:
    def __init__(self, spec: str, ssh: str):
        target = Target.parse(spec)
        if not target.host or not target.base.startswith("/"):
            raise ConfigError(f"BURSTRL_TRAIN_HOST: got '{spec}', expected [user@]host:/absolute/dir")
        self.host, self.dir = target.host, target.base.rstrip("/")
        self.ssh = ssh
        self.python = os.environ.get("BURSTRL_REMOTE_PYTHON", ".venv/bin/python")
        self.newest_home: str | None = None

    def shell(self, script: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([*shlex.split(self.ssh), self.host, script], **kwargs)

    def run_watched(self, script: str) -> int:
        """Run `script` (built with `watched`) and return its status. The channel's stdin stays open while it
        runs and closes when this process ends, however it ends, which stops the command there."""
        with subprocess.Popen([*shlex.split(self.ssh), self.host, script], stdin=subprocess.PIPE) as ssh:
            return ssh.wait()

    def rsync(self, sources: list[str], dest: str, *extra: str, listing: str | None = None) -> None:
        done = subprocess.run(["rsync", "-a", "--mkpath", "-e", self.ssh, *extra, *sources, dest],
                              input=listing, capture_output=True, text=True)
        if done.returncode != 0:
            raise SyncError(f"rsync {' '.join(sources)} -> {dest} failed ({done.returncode}): {done.stderr.strip()}",
                            code=done.returncode)

    def push(self, paths: list[str]) -> None:
        """Copy the tracked files and these paths (relative to the repository root) to the same place under the
        remote directory."""
        files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout
        self.rsync(["./"], f"{self.host}:{self.dir}/", "-r", "--files-from=-",
                   listing="\n".join([*files.splitlines(), *paths]) + "\n")

    def pull_checkpoints(self, work: Path, tries: int = 3) -> None:
        """Bring home the newest remote checkpoint that is complete now: its files first, then its marker, so a
        checkpoint here counts as complete only when all its files arrived. Older ones here are removed.

        The trainer keeps two checkpoints and deletes the older as a new one completes, so a checkpoint listed
        as newest can vanish while it is copied when steps are fast; then rsync reports missing files (23) or
        vanished ones (24), and the pull starts again from a new listing."""
        remote_work = f"{self.dir}/{work}"
        for attempt in range(tries):
            listed = self.shell(f"cd {shlex.quote(remote_work)} 2>/dev/null && ls -d checkpoint-*/{resume.COMPLETE}",
                                capture_output=True, text=True)
            steps = [int(m[1]) for line in listed.stdout.split()
                     if (m := resume.CHECKPOINT.fullmatch(line.split("/")[0]))]
            if not steps:
                return
            newest = f"checkpoint-{max(steps)}"
            if newest == self.newest_home and (work / newest / resume.COMPLETE).is_file():
                return
            try:
                self.rsync([f"{self.host}:{remote_work}/{newest}"], f"{work}/", "--exclude", resume.COMPLETE)
                # The work directory's key and the prepared batch: without them the checkpoint cannot be resumed.
                self.rsync([f"{self.host}:{remote_work}/inputs.json", f"{self.host}:{remote_work}/batch-*.pt"],
                           f"{work}/")
                self.rsync([f"{self.host}:{remote_work}/./{newest}/{resume.COMPLETE}"], f"{work}/", "--relative")
                break
            except SyncError as err:
                if err.code not in (23, 24) or attempt == tries - 1:
                    raise
        print(f"{newest} is home", flush=True)
        self.newest_home = newest
        for old in work.glob("checkpoint-*"):
            if old.name != newest:
                shutil.rmtree(old)

    def pull(self, paths: list[str]) -> None:
        self.rsync([f"{self.host}:{self.dir}/./{p}" for p in paths], "./", "--relative", "--delete")


def run_train(spec: str, ssh_configured: str, iteration: str, parent: str, params: str, deadline: float | None,
              interval: float = 60.0) -> int:
    """Run `stages/train.py iteration parent` at `spec`; returns its exit status once its outputs are here.
    `deadline` (a time.time() value) goes over as a UTC time, so the remote clock's zone and start do not
    move it."""
    remote = Remote(spec, os.environ.get("BURSTRL_TRAIN_RSH") or ssh_command(ssh_configured))
    if Path(params).is_absolute() or ".." in Path(params).parts:
        raise ConfigError(f"--params: got {params}, expected a params file inside the repository for a remote run")
    work = resume.ROOT / "train" / iteration
    shipped = [f"data/scored/{iteration}.parquet", f"checkpoints/{parent}", params]
    if work.is_dir():
        shipped.append(str(work))
    print(f"train {iteration}: running on {remote.host}:{remote.dir}", flush=True)
    started = time.monotonic()
    remote.push(shipped)
    moving = time.monotonic() - started
    forwarded = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    if deadline is not None:
        forwarded["BURSTRL_DEADLINE"] = datetime.datetime.fromtimestamp(deadline, datetime.UTC).isoformat()
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in forwarded.items())
    train = (f"env PYTHONPATH=. {env} {shlex.quote(remote.python)} stages/train.py {iteration} {parent} "
             f"--params {shlex.quote(params)}")
    secrets = os.environ.get("BURSTRL_TRAIN_SECRETS")
    source = f"if [ -f {home_path(secrets)} ]; then . {home_path(secrets)}; fi && " if secrets else ""
    # A dropped connection stops the remote run; it resumes from its last checkpoint next time.
    command = (f"cd {shlex.quote(remote.dir)} && mkdir -p {Path(TRAIN_PID).parent} && {source}"
               f"{watched(train, TRAIN_PID)}")
    stop = threading.Event()

    def bring_checkpoints_home():
        while not stop.wait(interval):
            try:
                remote.pull_checkpoints(work)
            except SyncError as err:  # a blip: the next round, or the final pull, brings it
                print(f"train {iteration}: could not bring checkpoints home yet: {err}", file=sys.stderr)

    poller = threading.Thread(target=bring_checkpoints_home, daemon=True)
    poller.start()
    try:
        status = remote.run_watched(command)
    finally:
        ended = time.monotonic()
        stop.set()
        poller.join()
        remote.pull_checkpoints(work)
    if status == 0:
        metrics = Path(f"metrics/train/{iteration}.json")
        faults.point("train_pull")
        remote.pull([f"checkpoints/{iteration}", f"data/weights/{iteration}.parquet", str(metrics),
                     f"dvclive/train/{iteration}"])
        # The session's report splits the stage's time into transfers and training with it.
        write_json(metrics, {**json.loads(metrics.read_text()),
                             "transfer_seconds": round(moving + time.monotonic() - ended, 2)})
        shutil.rmtree(work, ignore_errors=True)
    elif status < 0 or status == LINK_LOST:  # ssh's own failure, or ssh killed: the link, not the training
        how = f"ssh ended by {signal.Signals(-status).name}" if status < 0 else "ssh exit 255"
        print(f"train {iteration}: lost the SSH connection to {remote.host} ({how}); the run there stopped with it",
              file=sys.stderr)
        status = LINK_LOST
    else:
        print(f"train {iteration}: the remote run on {remote.host} exited with status {status}", file=sys.stderr)
    return status
