"""A session on a rented GPU: `python -m burstrl rent [--dry-run] [--hours H] [--iterations N] [--budget USD]`;
`python -m burstrl rent reap` ends leftover pods.

`make rent-h200` runs this. One session: start home's stages of the loop (burstrl.remote.loop) at once, rent a
machine (burstrl.remote.providers), arm the on-machine time limit, set the machine up and check its GPU once,
then open the loop's trainer lane, whose train stages run here while they train there (burstrl.remote.train_host
ships their inputs and brings their outputs and checkpoints home), and give the machine back as soon as the
trainer is done. Elapsed time and cost so far are printed as it goes, the session's split at the end.

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
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time

from burstrl.config import Config, load_config
from burstrl.errors import INTERRUPTED, PARTIAL, ConfigError, ProviderError, SessionError, SyncError
from burstrl.pipeline import faults, iterations, status
from burstrl.pipeline.catalog import BOOTSTRAP_STAGES
from burstrl.pipeline.lanes import HOME, TRAINER
from burstrl.remote import fleet
from burstrl.remote.estimate import clock, estimate, loop_outlook, past_train_seconds, plan
from burstrl.remote.loop import (
    Interrupted,
    Loop,
    home_env,
    lines,
    raise_interrupted,
    report,
    transfer_seconds,
    write_report,
)
from burstrl.remote.providers import Lease, provider
from burstrl.remote.train_host import Remote, home_path, watched

GUARD = ".burstrl/guard"  # on the machine, under the workspace: guard.pid, guard.log
TERMINATE_TRIES = 3


def guard_script(workspace: str, seconds: float, self_terminate: str, secrets_file: str, session: str) -> str:
    """Arms the limit on the machine: a detached process that, `seconds` from now, stops the training,
    deletes the forwarded secrets and runs `self_terminate`. It outlives the SSH session that starts it.
    A limit an earlier session left armed (that session died without a word) is disarmed first. Every arm,
    disarm and firing is a line of the machine's ledger.log, naming the session."""
    fired = f"{stamp()} fired for {session}"
    inner = (f"sleep {int(seconds)}; echo \"$(date -u +%FT%TZ) session limit reached\"; rm -f guard.pid; "
             f"echo \"{fired}\" >> ledger.log; "
             f"if [ -f ../train.pid ]; then kill $(cat ../train.pid); fi; rm -f {home_path(secrets_file)}; "
             f"{self_terminate or 'true'}")
    return (f"mkdir -p {shlex.quote(workspace)}/{GUARD} && cd {shlex.quote(workspace)}/{GUARD} && {{ "
            f"{disarm_in_place(session)}rm -f ../train.pid; setsid sh -c {shlex.quote(inner)} > guard.log 2>&1 "
            f"< /dev/null & echo $! > guard.pid; echo {shlex.quote(session)} > guard.session; "
            f"echo \"{stamp()} armed {session}\" >> ledger.log; }}")


def disarm_in_place(by: str) -> str:
    """Disarms the armed limit, if any, and writes to the ledger whose it was and which session disarmed it.
    setsid made the guard a process group leader: killing the group ends its sleep too."""
    return ("if [ -f guard.pid ]; then kill -- -$(cat guard.pid) 2>/dev/null; rm -f guard.pid; "
            f"echo \"{stamp()} disarmed $(cat guard.session 2>/dev/null) by {by}\" >> ledger.log; fi; ")


def stamp() -> str:
    return "$(date -u +%FT%TZ)"


class Session:
    def __init__(self, cfg: Config, hours: float):
        self.cfg, self.hours = cfg, hours
        self.provider = provider(cfg.rent, cfg.sync.ssh_command)
        self.lease: Lease | None = None
        self.remote: Remote | None = None
        self.price = cfg.cost.train_usd_per_hour
        self.started = time.time()
        self.limit = self.started + hours * 3600
        self.loop: Loop | None = None
        self.name: str | None = None
        self.done = threading.Event()

    def cost_line(self) -> str:
        now = time.time()
        return f"{clock(now - self.started)} elapsed, ${self.cost_at(now):.2f} so far at ${self.price:.2f}/h"

    def ticker(self) -> None:
        while not self.done.wait(self.cfg.rent.report_every_seconds):
            print(f"rent: {self.cost_line()}", flush=True)

    def step(self, what: str, command: str, cwd: bool = True) -> None:
        print(f"rent: {what}: {command}", flush=True)
        script = f"cd {shlex.quote(self.remote.dir)} && {watched(command)}" if cwd else watched(command)
        code = self.remote.run_watched(script)
        if code != 0:
            raise SessionError(f"{what} failed on {self.remote.host} (exit {code}): `{command}`")

    def rent(self) -> None:
        self.name = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        self.lease = self.provider.create(self.name)
        threading.Thread(target=self.ticker, daemon=True).start()

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
                              self.cfg.rent.secrets_file, self.name)
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

    def train_env(self) -> dict:
        return {**home_env(), "BURSTRL_TRAIN_HOST": f"{self.remote.host}:{self.remote.dir}",
                "BURSTRL_TRAIN_RSH": self.remote.ssh, "BURSTRL_TRAIN_SECRETS": self.cfg.rent.secrets_file,
                "BURSTRL_DEADLINE": datetime.datetime.fromtimestamp(
                    self.limit - self.cfg.rent.reserve_minutes * 60, datetime.UTC).isoformat()}

    def teardown(self, stop_home: bool) -> bool:
        """Stop the lanes' stages if `stop_home` (after a failure or an interrupt), give the machine back, then
        disarm its limit and delete the secrets there (a machine that could not be given back keeps its limit).
        Returns whether it was given back."""
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not cut this short
            signal.signal(signum, signal.SIG_IGN)
        if stop_home:
            self.loop.lanes.stop()
        given_back = self.lease is None
        if self.lease is None and self.name is not None:
            given_back = self.provider.terminate_session(self.name)  # interrupted while the create was in flight
        for attempt in range(TERMINATE_TRIES if self.lease is not None else 0):
            try:
                self.provider.terminate(self.lease)
                given_back = True
                break
            except ProviderError as err:
                say(f"rent: {err}")
                if attempt + 1 < TERMINATE_TRIES:
                    time.sleep(2 * (attempt + 1))
        if not given_back:
            say(f"rent: COULD NOT GIVE BACK {self.lease.id if self.lease else self.name}: terminate it by hand "
                f"(`make reap`); its own limit ends it at {self.limit_text()}")
        if self.remote is not None:
            # The secrets go whatever happened; the limit stays armed on a machine still being paid for.
            disarm = f"(cd {shlex.quote(self.remote.dir)}/{GUARD} 2>/dev/null && {disarm_in_place(self.name)}true); "
            script = f"{disarm if given_back else ''}rm -f {home_path(self.cfg.rent.secrets_file)}"
            try:
                failed = self.remote.shell(script, capture_output=True, stdin=subprocess.DEVNULL, timeout=60).returncode
            except subprocess.TimeoutExpired:
                failed = True
            if failed and (self.provider.name == "static" or not given_back):  # a terminated pod is simply gone
                say(f"rent: could not disarm the limit or delete the forwarded secrets on {self.remote.host}; the "
                    f"limit fires at {self.limit_text()}")
        self.done.set()
        say(f"rent: session over: {self.cost_line()}", sys.stdout)
        return given_back

    def run(self, loop: Loop) -> int:
        """The session: home starts on the loop's stages at once; the trainer once the machine is set up."""
        self.loop, code = loop, 0
        marks = {"started": self.started}
        loop.lanes.gate.clear()
        loop.lanes.start()
        try:
            r = self.cfg.rent
            for name, do in (("create", self.rent), ("connect", self.connect), ("arm", self.arm),
                             ("prepare", lambda: self.step("prepare", r.prepare_command, cwd=False)),
                             ("push", lambda: self.remote.push([])),
                             ("setup", lambda: self.step("setup", r.setup_command)),
                             ("check", lambda: self.step("GPU check", r.check_command)),
                             ("secrets", self.forward_secrets)):
                faults.point(f"rent_{name}")  # where the tests pause a session to signal it at each step
                do()
            faults.point("rent_train")
            loop.lanes.env[TRAINER] = self.train_env()
            marks["lanes"] = time.time()
            loop.lanes.gate.set()
            loop.lanes.wait(TRAINER)
            if loop.lanes.error:
                raise SessionError(loop.lanes.error)
            if loop.lanes.partial:
                print("rent: training stopped for the session's deadline; its checkpoint is home. "
                      "`make rent-h200` again continues it", file=sys.stderr)
                code = PARTIAL
        except (ProviderError, SessionError, SyncError) as err:
            say(f"rent: error: {err}")
            code = 1
        except (KeyboardInterrupt, Interrupted):
            say("rent: interrupted: giving the machine back")
            code = INTERRUPTED
        marks.setdefault("lanes", time.time())
        marks["trainer_done"] = time.time()
        given_back = self.teardown(stop_home=code not in (0, PARTIAL))
        marks["given_back"] = time.time()
        code = self.finish_home(code)
        marks["home_done"] = time.time()
        trains = [r.stage.split("@")[1] for r in loop.lanes.runs if r.lane == TRAINER and r.code == 0]
        summary = report(self.name or "session", loop.lanes.runs, marks, self.cost_at(marks["given_back"]),
                         transfer_seconds(trains))
        for line in [*lines(summary), f"rent: session report in {write_report(summary)}"]:
            say(line, sys.stdout)
        return code if given_back or code else 1

    def cost_at(self, moment: float) -> float:
        return (moment - self.started) / 3600 * self.price

    def recorded(self, stage: str) -> None:
        print(f"rent: {stage} done: {self.cost_line()}", flush=True)

    def finish_home(self, code: int) -> int:
        """With the machine given back, home ends the eval and sync of what was trained; Ctrl-C stops it."""
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, raise_interrupted)
        signal.signal(signal.SIGHUP, raise_interrupted)
        try:
            self.loop.lanes.wait(HOME)
        except (KeyboardInterrupt, Interrupted):
            say("rent: interrupted: stopping home's stages")
            self.loop.lanes.stop()
            return INTERRUPTED
        if self.loop.lanes.error and code in (0, PARTIAL):
            say(f"rent: error: {self.loop.lanes.error}")
            return 1
        return code


def say(line: str, stream=None) -> None:
    """To stderr (or `stream`), best effort: after SIGHUP the terminal may be gone, which must not stop a teardown."""
    try:
        print(line, file=stream or sys.stderr, flush=True)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["run", "reap"], default="run")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its estimated cost; rent nothing")
    parser.add_argument("--hours", type=float, help="session limit (at most rent.max_hours, the default)")
    parser.add_argument("--iterations", type=int, help="train at most this many iterations (default: until the limit)")
    parser.add_argument("--budget", type=float, help="start no train stage that would take the cost past this (USD)")
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
    if not args.dry_run and (pid := fleet.stop_running()):
        print(f"rent: stopped the fleet (pid {pid}): the session runs home's stages itself; `make fleet` after it")
    changed = status.changed_stages()
    missing = sorted(name for name in BOOTSTRAP_STAGES.values() if name in changed)
    if missing:
        print(f"rent: error: {', '.join(missing)} not done: run `dvc repro sync-bootstrap` first", file=sys.stderr)
        return 1
    ready, waiting = plan(changed, iterations.load())
    for reason in waiting:
        print(f"rent: waiting: {reason}")
    if args.iterations == 0:
        print("rent: --iterations 0: nothing to rent")
        return 0
    r = cfg.rent
    past = past_train_seconds()
    trains = args.iterations or max(1, len(ready))
    gpus = f"{r.runpod.gpu_count}x {r.runpod.gpu_type}" if r.provider == "runpod" else r.static.host
    until = f"{args.iterations} iteration(s)" if args.iterations else "the limit"
    print(f"rent: plan: a session loop until {until}{f' or ${args.budget:.2f}' if args.budget else ''}, "
          f"sampler {r.lag} checkpoint(s) behind (rent.lag); ready now: {', '.join(ready) or 'none'}; "
          f"on {r.provider} ({gpus}), limit {clock(hours * 3600)}, training stops {r.reserve_minutes:g} min before it")
    expected, usd = estimate(trains, past, cfg.planning.setup_minutes, hours, cfg.cost.train_usd_per_hour)
    if not args.iterations:
        expected, usd = hours, hours * cfg.cost.train_usd_per_hour
    print(f"rent: estimated {clock(expected * 3600)}, ${usd:.2f} at ${cfg.cost.train_usd_per_hour:.2f}/h "
          f"(cost.train_usd_per_hour); at most ${hours * cfg.cost.train_usd_per_hour:.2f} at the limit")
    print(f"rent: {loop_outlook(cfg, hours)}")
    if args.dry_run:
        return 0
    signal.signal(signal.SIGTERM, raise_interrupted)
    signal.signal(signal.SIGHUP, raise_interrupted)
    try:
        session = Session(cfg, hours)
    except ProviderError as err:
        print(f"rent: error: {err}", file=sys.stderr)
        return 1
    train_usd = sum(past) / len(past) / 3600 * cfg.cost.train_usd_per_hour if past else 0.0
    loop = Loop(changed, {HOME: home_env(), TRAINER: {}}, r.lag, args.iterations, args.budget,
                lambda: session.cost_at(time.time()), train_usd, on_done=session.recorded)
    code = session.run(loop)
    if code == 0:
        code = record_report()
    return code


def record_report() -> int:
    """The report stage reads every stage's metrics and the session's: recorded last, so `dvc status` is clean."""
    done = subprocess.run([sys.executable, "-m", "dvc", "repro", "--single-item", "report"], env=home_env())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
