"""The suite's own clock (tests/timing.py): each test charged its own time, shared fixtures charged to themselves,
and a run with a test over the limit failing by name."""

import re
import subprocess
import sys
from pathlib import Path

from timing import Timings, over_limit, table

HERE = Path(__file__).resolve().parent


def test_over_limit_names_slow_tests_and_shared_fixtures_only():
    timings = Timings()
    timings.own.update({"t.py::fast": 12.0, "t.py::slow": 301.0})
    timings.fixtures += [("scored", "session", 420.0, "t.py::fast"), ("tmp_path", "function", 999.0, "t.py::fast"),
                         ("servers", "module", 60.0, "t.py::slow")]
    assert over_limit(timings, 300.0) == [
        "t.py::slow took 301 s of its own: over the 300 s limit for one test",
        "fixture 'scored' (session scope, first needed by t.py::fast) took 420 s: over the 300 s limit for one test",
    ]
    assert over_limit(timings, 500.0) == []
    assert [line.split()[0] for line in table(timings)] == ["420.0", "301.0", "60.0", "12.0"]


def test_a_run_with_a_test_over_the_limit_fails_and_names_it(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import pytest, time, timing\n"
        "timing.LIMIT_SECONDS = 1.0\n"
        "@pytest.fixture(scope='session')\n"
        "def resource():\n"
        "    time.sleep(1.5)\n")
    (tmp_path / "test_clock.py").write_text(
        "import time\n"
        "def test_uses_resource(resource):\n    pass\n"
        "def test_sleeps():\n    time.sleep(1.5)\n"
        "def test_fast():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "timing",
                           str(tmp_path)], cwd=tmp_path, env={"PYTHONPATH": str(HERE), "PATH": ""},
                          capture_output=True, text=True, timeout=120)
    assert "3 passed" in done.stdout and done.returncode == 1, done.stdout
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED the 1 s guard")]
    assert len(failed) == 2, done.stdout
    assert re.fullmatch(r"FAILED the 1 s guard: test_clock.py::test_sleeps took 2 s of its own: over the 1 s "
                        r"limit for one test", failed[0])
    assert failed[1].startswith("FAILED the 1 s guard: fixture 'resource' (session scope, first needed by "
                                "test_clock.py::test_uses_resource) took 2 s")
    # The session fixture is charged to itself, not to the first test that needed it.
    lines = (tmp_path / "build/test-durations.txt").read_text().splitlines()
    assert re.fullmatch(r"pytest wall time: \d+ s, 3 tests", lines[0])
    own = {line.split()[-1]: float(line.split()[0]) for line in lines[2:] if line.split()[1] == "test"}
    assert own["test_clock.py::test_uses_resource"] < 1.0 and own["test_clock.py::test_sleeps"] >= 1.5
    assert sum(line.split()[1] == "fixture" for line in lines[2:]) == 1
