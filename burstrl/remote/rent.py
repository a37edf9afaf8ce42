"""A burst of training on a rented GPU: `python -m burstrl rent [--dry-run] [--hours H]`, or `reap`.

`make rent-h200` runs this. One session: find the train stages whose inputs are ready (`dvc status`), rent a
machine (burstrl.remote.providers), arm the on-machine time limit, set the machine up and check its GPU, run each
stage with `dvc repro` here while it trains there (burstrl.remote.train_host ships its inputs and brings its outputs
and checkpoints home), then give the machine back. Elapsed time and cost so far are printed as it goes.

The machine is given back exactly once on every way out: success, any failure, Ctrl-C, SIGTERM, SIGHUP.
If this side dies without a word (a laptop closed, a SIGKILL), the limit armed on the machine stops the
training and ends the machine (rent.runpod.self_terminate) at its own clock's `--hours` mark. Training is
given the limit minus rent.reserve_minutes as its deadline, so it stops with a checkpoint in time to send
it home; a session that ends there exits 75 and the next one continues from that checkpoint.

Longer than the package's other modules on purpose: the Session owns the machine from rent to give-back,
so every way out, signals included, ends in the one teardown at the bottom of Session.run, on one page.
"""

import argparse
import datetime
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from burstrl.config import Config, load_config
from burstrl.errors import INTERRUPTED, PARTIAL, ConfigError, ProviderError, SessionError, SyncError
from burstrl.pipeline import iterations, status
from burstrl.remote.providers import Lease, provider
from burstrl.remote.train_host import Remote, home_path, watched

SETUP_MINUTES = 15  # provisioning, install and GPU check of a fresh pod, for the estimate
GUARD = ".burstrl/guard"  # on the machine, under the workspace: guard.pid, guard.log


class Interrupted(BaseException):
    """SIGTERM or SIGHUP, raised like Ctrl-C's KeyboardInterrupt so the same teardown runs."""


def plan(changed: set[str], iters: dict[str, dict]) -> tuple[list[str], list[str]]:
    """(train stages to run, in order; why each other pending train stage must wait). A stage is ready when
    its scored rollouts are done and its parent checkpoint is done or trained earlier in this session."""
    ready, waiting = [], []
    for key in sorted(iters, key=int):
        name, parent = f"train@{key}", iters[key]["parent"]
        if name not in changed:
            continue
        upstream = "bootstrap" if parent == "000" else f"train@{parent}"
        if f"score@{key}" in changed:
            waiting.append(f"{name}: score@{key} is not done (run `dvc repro score@{key}` on the inference box)")
        elif upstream in changed and upstream not in ready:
            waiting.append(f"{name}: checkpoint {parent} is not done")
        else:
            ready.append(name)
    return ready, waiting


def estimate(stages: int, past_seconds: list[float], setup_minutes: float, hours: float,
             usd_per_hour: float) -> tuple[float, float]:
    """(estimated hours, estimated cost): setup plus each stage at the mean of past train stages, capped by
    the session limit; with no past stage to go by, the limit itself."""
    if not past_seconds:
        return hours, hours * usd_per_hour
    expected = min(hours, setup_minutes / 60 + stages * sum(past_seconds) / len(past_seconds) / 3600)
    return expected, expected * usd_per_hour


def past_train_seconds(root: Path = Path(".")) -> list[float]:
    return [json.loads(p.read_text())["seconds"] for p in sorted((root / "metrics/train").glob("*.json"))]


def clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


def guard_script(workspace: str, seconds: float, self_terminate: str, secrets_file: str) -> str:
    """Arms the limit on the machine: a detached process that, `seconds` from now, stops the training,
    deletes the forwarded secrets and runs `self_terminate`. It outlives the SSH session that starts it."""
    inner = (f"sleep {int(seconds)}; echo \"$(date -u +%FT%TZ) session limit reached\"; rm -f guard.pid; "
             f"if [ -f ../train.pid ]; then kill $(cat ../train.pid); fi; rm -f {home_path(secrets_file)}; "
             f"{self_terminate or 'true'}")
    return (f"mkdir -p {shlex.quote(workspace)}/{GUARD} && cd {shlex.quote(workspace)}/{GUARD} && {{ "
            f"{disarm_in_place()}rm -f ../train.pid; setsid sh -c {shlex.quote(inner)} > guard.log 2>&1 < /dev/null & "
            f"echo $! > guard.pid; }}")


def disarm_in_place() -> str:
    # setsid made the guard a process group leader: killing the group ends its sleep too.
    return "if [ -f guard.pid ]; then kill -- -$(cat guard.pid) 2>/dev/null; rm -f guard.pid; fi; "


class Session:
    def __init__(self, cfg: Config, hours: float):
        self.cfg, self.hours = cfg, hours
        self.provider = provider(cfg.rent, cfg.sync.ssh_command)
        self.lease: Lease | None = None
        self.remote: Remote | None = None
        self.price = cfg.cost.train_usd_per_hour
        self.started = time.time()
        self.limit = self.started + hours * 3600
        self.repro: subprocess.Popen | None = None
        self.name: str | None = None
        self.done = threading.Event()

    def cost_line(self) -> str:
        elapsed = time.time() - self.started
        return f"{clock(elapsed)} elapsed, ${elapsed / 3600 * self.price:.2f} so far at ${self.price:.2f}/h"

    def ticker(self) -> None:
        while not self.done.wait(self.cfg.rent.report_every_seconds):
            print(f"rent: {self.cost_line()}", flush=True)

    def step(self, what: str, command: str, cwd: bool = True) -> None:
        print(f"rent: {what}: {command}", flush=True)
        script = f"cd {shlex.quote(self.remote.dir)} && {watched(command)}" if cwd else watched(command)
        code = self.remote.run_watched(script)
        if code != 0:
            raise SessionError(f"{what} failed on {self.remote.host} (exit {code}): `{command}`")

    def connect(self) -> None:
        r = self.cfg.rent
        endpoint = self.provider.endpoint(self.lease, r.ssh_timeout_seconds)
        self.price = endpoint.usd_per_hour or self.price
        self.remote = Remote(f"{endpoint.host}:{endpoint.dir}", endpoint.ssh)
        end = time.monotonic() + r.ssh_timeout_seconds
        while self.remote.shell("true", capture_output=True, stdin=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > end:
                raise SessionError(f"SSH to {endpoint.host} never came up within {r.ssh_timeout_seconds:.0f}s")
            time.sleep(2)
        print(f"rent: {endpoint.host}:{endpoint.dir} is up", flush=True)

    def arm(self) -> None:
        seconds = self.limit - time.time()
        script = guard_script(self.remote.dir, seconds, self.provider.self_terminate(self.lease),
                              self.cfg.rent.secrets_file)
        if self.remote.shell(script, stdin=subprocess.DEVNULL).returncode != 0:
            raise SessionError(f"could not arm the time limit on {self.remote.host}")
        print(f"rent: the machine stops itself in {clock(seconds)} (at {self.limit_text()})", flush=True)

    def limit_text(self) -> str:
        return datetime.datetime.fromtimestamp(self.limit, datetime.UTC).isoformat(timespec="seconds")

    def forward_secrets(self) -> None:
        lines = [f"export {name}={shlex.quote(os.environ[name])}\n" for name in self.cfg.rent.forward_env
                 if os.environ.get(name)]
        path = home_path(self.cfg.rent.secrets_file)
        script = f'umask 077 && mkdir -p "$(dirname {path})" && cat > {path}'
        if self.remote.shell(script, input="".join(lines), text=True).returncode != 0:
            raise SessionError(f"could not write the forwarded environment on {self.remote.host}")
        names = [line.split("=")[0].removeprefix("export ") for line in lines]
        print(f"rent: forwarded {', '.join(names) or 'no variables'} (rent.forward_env)", flush=True)

    def train(self, stage: str) -> int:
        env = {**os.environ, "BURSTRL_TRAIN_HOST": f"{self.remote.host}:{self.remote.dir}",
               "BURSTRL_TRAIN_RSH": self.remote.ssh, "BURSTRL_TRAIN_SECRETS": self.cfg.rent.secrets_file,
               "BURSTRL_DEADLINE": datetime.datetime.fromtimestamp(
                   self.limit - self.cfg.rent.reserve_minutes * 60, datetime.UTC).isoformat()}
        print(f"rent: dvc repro {stage}", flush=True)
        # Its own process group, so that teardown stops it and the ssh it runs, whoever got the signal.
        self.repro = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "--single-item", stage], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True)
        partial = False
        for line in self.repro.stdout:
            print(line, end="", flush=True)
            partial = partial or f"exited with {PARTIAL}" in line
        code = self.repro.wait()
        self.repro = None
        return PARTIAL if code and partial else code

    def stop_repro(self) -> None:
        if self.repro is None or self.repro.poll() is not None:
            return
        os.killpg(self.repro.pid, signal.SIGTERM)
        try:
            self.repro.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.repro.pid, signal.SIGKILL)
            self.repro.wait()

    def teardown(self) -> bool:
        """Stop what runs here, give the machine back, then disarm its limit and delete the secrets there (a
        machine that could not be given back keeps its limit). Returns whether it was given back."""
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not cut this short
            signal.signal(signum, signal.SIG_IGN)
        self.stop_repro()
        given_back = self.lease is None
        if self.lease is None and self.name is not None:
            given_back = self.provider.terminate_named(self.name)  # interrupted while the create was in flight
        for attempt in range(3 if self.lease is not None else 0):
            try:
                self.provider.terminate(self.lease)
                given_back = True
                break
            except ProviderError as err:
                say(f"rent: {err}")
                time.sleep(2 * (attempt + 1))
        if not given_back:
            say(f"rent: COULD NOT GIVE BACK {self.lease.id if self.lease else self.name}: terminate it by hand "
                f"(`make reap`); its own limit ends it at {self.limit_text()}")
        elif self.remote is not None:
            disarm = (f"(cd {shlex.quote(self.remote.dir)}/{GUARD} 2>/dev/null && {disarm_in_place()}true); "
                      f"rm -f {home_path(self.cfg.rent.secrets_file)}")
            try:
                failed = self.remote.shell(disarm, capture_output=True, stdin=subprocess.DEVNULL, timeout=60).returncode
            except subprocess.TimeoutExpired:
                failed = True
            if failed and self.provider.name == "static":  # a terminated pod is simply gone
                say(f"rent: could not disarm the limit on {self.remote.host}; it fires at {self.limit_text()}")
        self.done.set()
        say(f"rent: session over: {self.cost_line()}", sys.stdout)
        return given_back

    def run(self, stages: list[str]) -> int:
        code = 1
        try:
            self.name = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
            self.lease = self.provider.create(self.name)
            threading.Thread(target=self.ticker, daemon=True).start()
            self.connect()
            self.arm()
            self.step("prepare", self.cfg.rent.prepare_command, cwd=False)
            self.remote.push([])
            self.step("setup", self.cfg.rent.setup_command)
            self.step("GPU check", self.cfg.rent.check_command)
            self.forward_secrets()
            for stage in stages:
                code = self.train(stage)
                if code == PARTIAL:
                    print(f"rent: {stage} stopped for the session's deadline; its checkpoint is home. "
                          f"`make rent-h200` again continues it", file=sys.stderr)
                    break
                if code:
                    raise SessionError(f"{stage} failed (dvc repro exit {code}); see logs/train/")
                print(f"rent: {stage} done: {self.cost_line()}", flush=True)
        except (ProviderError, SessionError, SyncError) as err:
            say(f"rent: error: {err}")
            code = 1
        except (KeyboardInterrupt, Interrupted):
            say("rent: interrupted: giving the machine back")
            code = INTERRUPTED
        given_back = self.teardown()
        return code if given_back or code else 1


def say(line: str, stream=None) -> None:
    """To stderr (or `stream`), best effort: after SIGHUP the terminal may be gone, which must not stop a teardown."""
    try:
        print(line, file=stream or sys.stderr, flush=True)
    except OSError:
        pass


def _raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["run", "reap"], default="run")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its estimated cost; rent nothing")
    parser.add_argument("--hours", type=float, help="session limit (at most rent.max_hours, the default)")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.params)
        hours = cfg.rent.max_hours if args.hours is None else args.hours
        if not 0 < hours <= cfg.rent.max_hours:
            raise ConfigError(f"--hours {hours}: must be > 0 and at most rent.max_hours={cfg.rent.max_hours}")
        if hours * 60 <= cfg.rent.reserve_minutes:
            raise ConfigError(f"--hours {hours}: leaves no time after rent.reserve_minutes={cfg.rent.reserve_minutes}")
    except ConfigError as err:
        print(f"rent: error: {err}", file=sys.stderr)
        return 1
    if args.command == "reap":
        try:
            reaped = provider(cfg.rent, cfg.sync.ssh_command).reap()
        except ProviderError as err:
            print(f"rent: error: {err}", file=sys.stderr)
            return 1
        print(f"rent: reaped {len(reaped)} machine(s) this project started{': ' if reaped else ''}{', '.join(reaped)}")
        return 0
    stages, waiting = plan(status.changed_stages(), iterations.load())
    for reason in waiting:
        print(f"rent: waiting: {reason}")
    if not stages:
        print("rent: no train stage is ready to run: nothing to rent")
        return 0
    r = cfg.rent
    gpus = f"{r.runpod.gpu_count}x {r.runpod.gpu_type}" if r.provider == "runpod" else r.static.host
    expected, usd = estimate(len(stages), past_train_seconds(), SETUP_MINUTES, hours, cfg.cost.train_usd_per_hour)
    print(f"rent: plan: {', '.join(stages)} on {r.provider} ({gpus}), limit {clock(hours * 3600)}, "
          f"training stops {r.reserve_minutes:g} min before it")
    print(f"rent: estimated {clock(expected * 3600)}, ${usd:.2f} at ${cfg.cost.train_usd_per_hour:.2f}/h "
          f"(cost.train_usd_per_hour); at most ${hours * cfg.cost.train_usd_per_hour:.2f} at the limit")
    if args.dry_run:
        return 0
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGHUP, _raise_interrupted)
    try:
        session = Session(cfg, hours)
    except ProviderError as err:
        print(f"rent: error: {err}", file=sys.stderr)
        return 1
    return session.run(stages)


if __name__ == "__main__":
    sys.exit(main())
