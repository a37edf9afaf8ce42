"""Where the suite's time goes, and a guard on it: every test's and every fixture's wall time goes to
build/test-durations.txt, and a run in which one test, or one shared fixture, takes over LIMIT_SECONDS fails
with a message that names it (docs/testing.md).

A test's own time is its setup, call and teardown less the shared (module or session) fixtures built during its
setup: those are paid once for many tests and are charged to themselves, not to whichever test came first.
Fixture times travel with each test's reports (`user_properties`), so under `pytest -n` the controller, which
sees every worker's reports, adds them up and writes the file.
"""

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LIMIT_SECONDS = 300.0
SLOWEST = 20  # lines of the table printed at the end of a run
FIXTURE = "burstrl-fixture-seconds"  # the user_properties key of one fixture's (name, scope, seconds)


@dataclass
class Timings:
    own: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # test id -> its own seconds
    fixtures: list[tuple[str, str, float, str]] = field(default_factory=list)  # (name, scope, seconds, first test)
    started: float = field(default_factory=time.monotonic)
    counted: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # test id -> fixture entries added

    def add(self, report) -> None:
        """One phase's report: its duration, and the fixtures set up since the test's previous report."""
        self.own[report.nodeid] += report.duration
        entries = [value for key, value in report.user_properties if key == FIXTURE]
        for name, scope, seconds in entries[self.counted[report.nodeid]:]:
            self.fixtures.append((name, scope, seconds, report.nodeid))
            if scope != "function":
                self.own[report.nodeid] -= seconds
        self.counted[report.nodeid] = len(entries)


def over_limit(timings: Timings, limit: float) -> list[str]:
    """One line per test or shared fixture that took longer than `limit` seconds."""
    found = [f"{test} took {seconds:.0f} s of its own" for test, seconds in timings.own.items() if seconds > limit]
    found += [f"fixture '{name}' ({scope} scope, first needed by {test}) took {seconds:.0f} s"
              for name, scope, seconds, test in timings.fixtures if scope != "function" and seconds > limit]
    return [f"{line}: over the {limit:.0f} s limit for one test" for line in found]


def table(timings: Timings) -> list[str]:
    """Tests and shared fixtures, slowest first, a line each: seconds, kind and name."""
    rows = [(s, "test", name) for name, s in timings.own.items()]
    rows += [(s, f"fixture ({scope})", f"{name}  [first for {test}]") for name, scope, s, test in timings.fixtures
             if scope != "function"]
    return [f"{s:8.1f}  {kind:18}  {name}" for s, kind, name in sorted(rows, reverse=True)]


TIMINGS = Timings()
RUNNING: list = []  # the test item whose phases run now, in this process
WORKER: list[bool] = [False]  # whether this process is a `pytest -n` worker, whose reports reach the controller


def pytest_configure(config):
    WORKER[0] = hasattr(config, "workerinput")


def pytest_sessionstart(session):
    TIMINGS.started = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    RUNNING[:] = [item]
    yield
    RUNNING.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    # The fixtures a fixture depends on are set up before this hook runs, so each is timed alone.
    started = time.monotonic()
    yield
    if RUNNING:
        RUNNING[0].user_properties.append((FIXTURE, (fixturedef.argname, fixturedef.scope,
                                                     time.monotonic() - started)))


def pytest_runtest_logreport(report):
    if not WORKER[0]:
        TIMINGS.add(report)


def pytest_sessionfinish(session, exitstatus):
    if WORKER[0]:
        return
    wall = time.monotonic() - TIMINGS.started
    out = Path(session.config.rootpath) / "build" / "test-durations.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(f"pytest wall time: {wall:.0f} s, {len(TIMINGS.own)} tests\n"
                   f"{'seconds':>8}  {'kind':18}  name\n" + "\n".join(table(TIMINGS)) + "\n")
    if over_limit(TIMINGS, LIMIT_SECONDS) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    wall = time.monotonic() - TIMINGS.started
    write = terminalreporter.write_line
    terminalreporter.section("wall time")
    write(f"pytest wall time: {wall:.0f} s; every test and fixture: build/test-durations.txt")
    for line in table(TIMINGS)[:SLOWEST]:
        write(line)
    for line in over_limit(TIMINGS, LIMIT_SECONDS):
        write(f"FAILED the {LIMIT_SECONDS:.0f} s guard: {line}", red=True, bold=True)
