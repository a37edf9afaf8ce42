"""The pieces resuming is built from: deadlines, work directories, shards, checkpoint markers, the save
cadence, kill points and the reaper. Real files, real processes and real signals; hand-computed expectations."""

import datetime
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from transformers import TrainerControl, TrainerState

from burstrl.errors import ConfigError
from burstrl.pipeline import resume, status
from burstrl.pipeline.orphans import STAGE_TOKEN, watch
from burstrl.training import trainstate


def test_deadline_is_seconds_after_start_or_an_iso_time_and_the_environment_wins(monkeypatch):
    monkeypatch.delenv("BURSTRL_DEADLINE", raising=False)
    assert resume.deadline(None, started=1000.0) is None
    assert resume.deadline("20", started=1000.0) == 1020.0
    assert resume.deadline("2026-12-02T18:00:00+00:00", started=0.0) == datetime.datetime(
        2026, 12, 2, 18, tzinfo=datetime.UTC).timestamp()
    monkeypatch.setenv("BURSTRL_DEADLINE", "2.5")
    assert resume.deadline("20", started=1000.0) == 1002.5
    monkeypatch.setenv("BURSTRL_DEADLINE", "tonight")
    with pytest.raises(ConfigError, match="BURSTRL_DEADLINE is 'tonight': expected seconds"):
        resume.deadline(None, started=0.0)


def pipeline(root) -> None:
    """Stage scripts for generate and score that import burstrl/code.py, and burstrl/other.py that none imports."""
    for stage in ("generate", "score"):
        (root / "stages").mkdir(exist_ok=True)
        (root / "stages" / f"{stage}.py").write_text("from burstrl import code\n")
    (root / "burstrl").mkdir()
    (root / "burstrl/__init__.py").write_text("")
    (root / "burstrl/code.py").write_text("v = 1\n")
    (root / "burstrl/other.py").write_text("v = 1\n")


def test_work_directory_keeps_progress_for_the_same_inputs_and_code_only(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    pipeline(tmp_path)
    work = resume.WorkDir("generate", "001", {"policy": "abc"})
    (work.path / "shard-00000-of-00002.parquet").write_text("x")
    assert (resume.WorkDir("generate", "001", {"policy": "abc"}).path / "shard-00000-of-00002.parquet").exists()
    assert capsys.readouterr().out == ""
    again = resume.WorkDir("generate", "001", {"policy": "abd"})
    assert "generate 001: discarding saved progress in build/resume/generate/001" in capsys.readouterr().out
    assert [p.name for p in again.path.iterdir()] == ["inputs.json"]
    (again.path / "shard-00000-of-00002.parquet").write_text("x")
    (tmp_path / "burstrl/other.py").write_text("v = 2\n")  # code the stage does not run
    assert (resume.WorkDir("generate", "001", {"policy": "abd"}).path / "shard-00000-of-00002.parquet").exists()
    (tmp_path / "burstrl/code.py").write_text("v = 2\n")
    assert not (resume.WorkDir("generate", "001", {"policy": "abd"}).path / "shard-00000-of-00002.parquet").exists()
    assert "made from other inputs or code" in capsys.readouterr().out
    again.finish()
    assert not again.path.exists()


def test_a_finished_run_with_its_outputs_in_place_is_done_and_only_for_the_same_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pipeline(tmp_path)
    out = tmp_path / "checkpoints/001"
    work = resume.WorkDir("generate", "001", {"policy": "abc"}, outputs=(out,))
    assert not work.finished and work.path.is_dir()
    out.mkdir(parents=True)
    work.finish()
    assert not work.path.exists() and json.loads(work.receipt.read_text()) == {"key": work.key}
    done = resume.WorkDir("generate", "001", {"policy": "abc"}, outputs=(out,))
    assert done.finished and not done.path.exists()  # nothing to resume, nothing kept
    other = resume.WorkDir("generate", "001", {"policy": "abd"}, outputs=(out,))
    assert not other.finished and not work.receipt.exists() and other.path.is_dir()
    other.finish()
    out.rmdir()  # as DVC deletes a stage's outputs before it runs the stage
    assert not resume.WorkDir("generate", "001", {"policy": "abd"}, outputs=(out,)).finished
    assert not work.receipt.exists()
    assert not resume.WorkDir("generate", "001", {"policy": "abd"}).finished  # no outputs named: never done


def test_shards_cover_the_rows_once_and_an_unreadable_one_is_redone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    pipeline(tmp_path)
    shards = resume.Shards(resume.WorkDir("score", "002", {}), total=10, size=4)
    assert shards.bounds == [(0, 4), (4, 8), (8, 10)]
    assert shards.pending() == [0, 1, 2]
    for k in (0, 2):
        lo, hi = shards.bounds[k]
        shards.save(k, pa.table({"row": list(range(lo, hi))}))
    assert shards.pending() == [1]
    shards.path(2).write_bytes(b"PAR1 cut short")
    assert shards.pending() == [1, 2]
    assert "redoing unreadable shard" in capsys.readouterr().out
    for k in (1, 2):
        lo, hi = shards.bounds[k]
        shards.save(k, pa.table({"row": list(range(lo, hi))}))
    assert shards.load()["row"].to_pylist() == list(range(10))
    assert status.progress("score", "002", tmp_path) == "3/3 shards"


def test_the_shard_loop_starts_its_worker_only_for_missing_shards_and_resumes_the_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    pipeline(tmp_path)
    monkeypatch.delenv("BURSTRL_KILL_AT", raising=False)
    started, computed = [], []

    def start():
        started.append(1)
        return 100  # the worker: computes row + 100

    def compute(worker, lo, hi):
        computed.append((lo, hi))
        return pa.table({"row": [worker + r for r in range(lo, hi)]})

    shards = resume.Shards(resume.WorkDir("generate", "003", {}), total=7, size=3, what="test shards")
    shards.save(1, pa.table({"row": [103, 104, 105]}))
    assert shards.fill(compute, start, "generate_shard")["row"].to_pylist() == list(range(100, 107))
    assert (started, computed, shards.resumed, shards.started) == ([1], [(0, 3), (6, 7)], 1, 100)
    assert "generate 003: resuming: 1/3 test shards saved by an interrupted run" in capsys.readouterr().out
    again = resume.Shards(resume.WorkDir("generate", "003", {}), total=7, size=3)
    assert again.fill(compute, start, "generate_shard")["row"].to_pylist() == list(range(100, 107))
    assert (len(started), again.resumed, again.started) == (1, 3, None)  # nothing left to compute: no engine
    assert resume.shard_progress(again.work.path) == (3, 3)


def test_only_marked_checkpoints_count_and_older_ones_are_dropped(tmp_path):
    for step in (2, 4, 6, 8):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "checkpoint-2" / resume.COMPLETE).write_text("{}")
    trainstate.mark_complete(tmp_path / "checkpoint-4", 4)
    assert [s for s, _ in resume.checkpoints(tmp_path)] == [2, 4]
    trainstate.mark_complete(tmp_path / "checkpoint-6", 6)
    assert [s for s, _ in resume.checkpoints(tmp_path)] == [4, 6]  # 2 dropped once two newer were complete
    assert json.loads((tmp_path / "checkpoint-6" / resume.COMPLETE).read_text()) == {"step": 6}
    assert trainstate.discard_incomplete(tmp_path) == [tmp_path / "checkpoint-8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-6"]


def test_train_progress_reads_the_newest_complete_checkpoint(tmp_path):
    work = tmp_path / resume.ROOT / "train" / "003"
    (work / "checkpoint-6").mkdir(parents=True)
    assert status.progress("train", "003", tmp_path) == "started, no checkpoint yet"
    (work / "checkpoint-6" / "trainer_state.json").write_text(json.dumps({"max_steps": 16}))
    trainstate.mark_complete(work / "checkpoint-6", 6)
    assert status.progress("train", "003", tmp_path) == "step 6/16"
    assert status.progress("train", "004", tmp_path) is None


def step(cadence: trainstate.Cadence, global_step: int, max_steps: int = 100) -> TrainerControl:
    state, control = TrainerState(), TrainerControl()
    state.global_step, state.max_steps = global_step, max_steps
    cadence.on_step_begin(None, state, control)
    cadence.on_step_end(None, state, control)
    return control


def test_cadence_saves_by_steps_and_time_and_stops_before_the_deadline():
    cadence = trainstate.Cadence(every_steps=3, every_minutes=0, deadline=None, margin=0)
    assert [step(cadence, s, max_steps=6).should_save for s in (1, 2, 3, 4, 6)] == [False, False, True, False, False]
    by_time = trainstate.Cadence(every_steps=0, every_minutes=1 / 60, deadline=None, margin=0)
    assert not step(by_time, 1).should_save
    by_time.last_save -= 2  # two seconds since the last save, over the one-second interval
    assert step(by_time, 2).should_save
    far = trainstate.Cadence(every_steps=0, every_minutes=0, deadline=time.time() + 60, margin=5)
    control = step(far, 1)
    assert not (control.should_save or control.should_training_stop or far.stopped_for_deadline)
    # The margin alone (5 s) fits before the deadline (10 s); one more 3 s step and a save as long do not.
    near = trainstate.Cadence(every_steps=0, every_minutes=0, deadline=time.time() + 10, margin=5)
    near.step_seconds = [30.0, 3.0]  # the first step, which prepared the batch, does not count
    control = step(near, 3)
    assert control.should_save and control.should_training_stop and near.stopped_for_deadline
    last = trainstate.Cadence(every_steps=0, every_minutes=0, deadline=time.time() + 4, margin=5)
    assert not step(last, 100, max_steps=100).should_training_stop  # the final step needs no stop


def python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_kill_point_fires_on_its_nth_pass_at_once_or_after_a_delay():
    code = ("from burstrl.pipeline import faults\nfor i in range(3):\n    faults.point('p')\n"
            "    print('passed', i, flush=True)")
    done = python(code, BURSTRL_KILL_AT="p@2")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.splitlines() == ["passed 0", "faults: BURSTRL_KILL_AT=p@2: SIGKILL at p"]
    assert python(code, BURSTRL_KILL_AT="q").stdout.count("passed") == 3
    delayed = python("import time\nfrom burstrl.pipeline import faults\nfaults.point('p')\n"
                     "print('running', flush=True)\n"
                     "time.sleep(30)", BURSTRL_KILL_AT="p+0.5")
    assert delayed.returncode == -signal.SIGKILL and "running" in delayed.stdout


def test_pause_point_waits_on_its_nth_pass_until_the_file_is_deleted(tmp_path):
    flag = tmp_path / "flag"
    code = ("from burstrl.pipeline import faults\nfor i in range(3):\n    faults.point('p')\n"
            "    print('passed', i, flush=True)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "BURSTRL_PAUSE_AT": f"p@2:{flag}"})
    deadline = time.monotonic() + 30
    while not flag.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    assert proc.poll() is None  # held at the second pass while the file exists
    flag.unlink()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert [line for line in out.splitlines() if line.startswith("passed")] == ["passed 0", "passed 1", "passed 2"]
    assert out.splitlines()[1].startswith("faults: BURSTRL_PAUSE_AT: paused at p")


def test_reaper_kills_what_a_killed_process_left_behind_but_spares_the_named():
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time\n"
         "a = subprocess.Popen(['sleep', '300'])\nb = subprocess.Popen(['sleep', '301'])\n"
         "print(a.pid, b.pid, flush=True)\ntime.sleep(300)"], stdout=subprocess.PIPE, text=True)
    orphan, spared = map(int, parent.stdout.readline().split())
    killed: list[int] = []
    watcher = threading.Thread(target=lambda: killed.extend(watch(parent.pid, {spared}, poll=0.05)))
    watcher.start()
    time.sleep(0.5)
    parent.kill()
    parent.wait()
    watcher.join(timeout=30)
    assert killed == [orphan]
    os.kill(spared, signal.SIGKILL)


def test_reaper_kills_a_child_no_poll_saw_by_the_token_in_its_environment():
    # The child is started and the parent killed between two polls: only its environment ties it to the stage.
    token = secrets.token_hex(8)
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time\nsys.stdin.readline()\n"
         "a = subprocess.Popen(['sleep', '302'], start_new_session=True)\nprint(a.pid, flush=True)\ntime.sleep(300)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, STAGE_TOKEN: token})
    stranger = subprocess.Popen(["sleep", "303"], env={**os.environ, STAGE_TOKEN: "another stage"})
    killed: list[int] = []
    watcher = threading.Thread(target=lambda: killed.extend(watch(parent.pid, set(), poll=3, token=token)))
    watcher.start()
    time.sleep(0.5)  # the watcher's one poll, before the child exists
    parent.stdin.write("go\n")
    parent.stdin.flush()
    orphan = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    watcher.join(timeout=90)
    assert killed == [orphan] and stranger.poll() is None
    stranger.kill()
    stranger.wait()
