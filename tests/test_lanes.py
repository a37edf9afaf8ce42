"""The two lanes of a session (burstrl.pipeline.lanes) and the loop that feeds them (burstrl.remote.loop): what
each stage waits for, in which order home works, and a real loop over a small DVC pipeline of shell stages
whose every stage ends up recorded by `dvc commit`, with home's work of one iteration overlapping the train of
the one before."""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
import yaml
from conftest import REPO
from dvc.repo import Repo

from burstrl.pipeline import iterations
from burstrl.pipeline.lanes import HOME, TRAINER, Lanes, argv, load, needs, priority, unroll
from burstrl.remote.fleet import Prefetch
from burstrl.remote.loop import Loop, report

LAGGED = {"001": {"parent": "000", "sampler": "000"}, "002": {"parent": "001", "sampler": "000"},
          "003": {"parent": "002", "sampler": "001"}}


def test_unrolled_stages_are_the_ones_dvc_resolves(tmp_path):
    for name in ("dvc.yaml", "params.yaml"):
        (tmp_path / name).write_text((REPO / name).read_text())
    iterations.save(LAGGED, tmp_path / "iterations.yaml")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    ours = load(LAGGED, tmp_path)
    theirs = Repo(str(tmp_path)).index.stages
    assert sorted(ours) == sorted(s.name for s in theirs)
    for stage in theirs:
        mine = ours[stage.name]
        assert mine.cmd == stage.cmd
        assert set(mine.deps) == {str(d.def_path) for d in stage.deps} - {"params.yaml"}
        assert set(mine.outs) == {str(o.def_path) for o in stage.outs}


def test_each_stage_waits_for_the_stages_whose_outputs_it_reads():
    stages = load(LAGGED, REPO)
    # 002 samples from 000 (lag 1): its rollouts need only the bootstrap policy, published by sync-bootstrap.
    assert needs("generate@002", stages) == {"prepare", "bootstrap", "sync-bootstrap"}
    assert needs("generate@003", stages) == {"prepare", "train@001", "sync@001"}
    assert needs("score@002", stages) == {"generate@002", "bootstrap"}
    assert needs("train@002", stages) == {"score@002", "train@001"}
    assert needs("eval@002", stages) == needs("sync@002", stages) == {"prepare", "train@002"}


def test_home_runs_what_the_trainer_needs_first_and_eval_last():
    ready = ["eval@001", "generate@003", "sync@001", "score@002"]
    assert sorted(ready, key=priority) == ["score@002", "sync@001", "generate@003", "eval@001"]


# Stand-ins for the five stages of an iteration: shell commands that read their inputs and write their outputs,
# train slower than the others, so that one iteration's home work fits inside the previous train.
PIPELINE = {
    "vars": ["iterations.yaml"],
    "stages": {
        "bootstrap": {"cmd": "mkdir -p ck sy && echo 0 > ck/000 && echo 0 > sy/000", "outs": ["ck/000", "sy/000"]},
        **{name: {"foreach": "${iterations}", "do": spec} for name, spec in {
            "generate": {"cmd": "sleep 0.3 && mkdir -p ro && cat ck/${item.sampler} sy/${item.sampler} > ro/${key}",
                         "deps": ["ck/${item.sampler}", "sy/${item.sampler}"], "outs": ["ro/${key}"]},
            "score": {"cmd": "sleep 0.3 && mkdir -p sc && cat ro/${key} > sc/${key}", "deps": ["ro/${key}"],
                      "outs": ["sc/${key}"]},
            "train": {"cmd": "sleep 4 && cat sc/${key} ck/${item.parent} > ck/${key}",
                      "deps": ["sc/${key}", "ck/${item.parent}"], "outs": ["ck/${key}"]},
            "eval": {"cmd": "sleep 0.3 && mkdir -p ev && wc -c < ck/${key} > ev/${key}", "deps": ["ck/${key}"],
                     "metrics": [{"ev/${key}": {"cache": False}}]},
            "sync": {"cmd": "sleep 0.3 && cp ck/${key} sy/${key}", "deps": ["ck/${key}"],
                     "outs": [{"sy/${key}": {"cache": False}}]},
        }.items()},
    },
}


def dvc(root, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True,
                          check=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})


@pytest.fixture
def pipeline(tmp_path):
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
    iterations.save({"001": {"parent": "000", "sampler": "000"}}, tmp_path / "iterations.yaml")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    dvc(tmp_path, "init", "-q")
    dvc(tmp_path, "repro", "-q", "bootstrap")
    return tmp_path


def pending_of(root) -> set[str]:
    return {name.split(":")[-1] for name in json.loads(dvc(root, "status", "--json").stdout or "{}")}


@pytest.mark.slow
def test_a_lagged_loop_overlaps_home_with_training_and_dvc_records_every_stage(pipeline):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    loop = Loop(pending_of(pipeline), {HOME: env, TRAINER: env}, lag=1, max_trains=3, budget=None,
                cost_so_far=lambda: 0.0, train_cost=0.0, root=pipeline)
    loop.lanes.start()
    loop.lanes.wait()
    assert loop.lanes.error is None
    assert iterations.load(pipeline / "iterations.yaml") == LAGGED  # appended with lag 1, three trains in all
    runs = {r.stage: r for r in loop.lanes.runs}
    assert sorted(runs) == sorted(f"{s}@{k}" for s in ("generate", "score", "train", "eval", "sync") for k in LAGGED)
    assert all(r.code == 0 for r in runs.values())
    # Iteration 003 samples from checkpoint 001: it was generated and scored while train@002 ran.
    train = runs["train@002"]
    for name in ("generate@003", "score@003"):
        assert train.start < runs[name].start and runs[name].end < train.end, (name, runs[name], train)
    assert runs["train@002"].start < runs["eval@001"].end  # home's eval waited for nothing the trainer needs
    # Lines: ck/001 = ro/001 (ck/000 + sy/000) + ck/000 = 3; ck/002 = ro/002 (from 000: 2) + ck/001 = 5;
    # ck/003 = ro/003 (ck/001 + sy/001, from 001: 6) + ck/002 = 11. Each stage read what the one before wrote.
    assert (pipeline / "ck/003").read_text() == "0\n" * 11
    assert pending_of(pipeline) == set()
    assert "Running stage" not in dvc(pipeline, "repro").stdout
    marks = {"started": min(r.start for r in runs.values()) - 5, "lanes": min(r.start for r in runs.values())}
    marks["trainer_done"] = marks["given_back"] = runs["train@003"].end
    marks["home_done"] = max(r.end for r in runs.values())
    summary = report("s1", loop.lanes.runs, marks, usd=3.0, syncing=1.5)
    assert summary["iterations_trained"] == ["001", "002", "003"] and summary["usd_per_iteration"] == 1.0
    rented = summary["rented"]
    assert rented["setup_seconds"] == 5.0 and rented["syncing_seconds"] == 1.5
    trainer = sum(r.end - r.start for r in loop.lanes.runs if r.lane == TRAINER)
    assert rented["training_seconds"] == round(trainer - 1.5, 1)  # the transfers are not training
    assert summary["per_iteration"]["002"]["rented_busy_seconds"] == round(train.end - train.start, 1)


@pytest.mark.slow
def test_a_failed_stage_stops_both_lanes_and_names_itself(pipeline):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    stages = unroll({**PIPELINE, "stages": {**PIPELINE["stages"]}}, {"001": LAGGED["001"]})
    stages["score@001"].cmd = "exit 3"
    lanes = Lanes(stages, pending_of(pipeline), {HOME: env, TRAINER: env}, root=pipeline)
    lanes.start()
    lanes.wait()
    assert lanes.error == "score@001 failed (exit 3); see logs/score/001.log"
    assert [(r.stage, r.code) for r in lanes.runs] == [("generate@001", 0), ("score@001", 3)]
    assert pending_of(pipeline) == {"score@001", "train@001", "eval@001", "sync@001"}


def test_a_simple_command_runs_without_a_shell_that_would_outlive_it():
    assert argv("python stages/train.py 002 001") == ["python", "stages/train.py", "002", "001"]
    assert argv("sleep 1 && cat a > b") == ["sh", "-c", "sleep 1 && cat a > b"]
    assert argv("exit 3") == ["sh", "-c", "exit 3"]  # a builtin: no program of that name


@pytest.mark.slow
def test_no_stage_outlives_its_session_killed_with_sigkill(pipeline):
    # The session's process holds the lanes; its stage (a simple command) must end with it, not race the next one.
    script = ("import sys; from burstrl.pipeline.lanes import *; stages = load({'001': {'parent': '000', "
              "'sampler': '000'}}); stages['generate@001'].cmd = 'sleep 300'; "
              "lanes = Lanes(stages, {'generate@001'}, {HOME: None, TRAINER: None}); lanes.start(); lanes.wait()")
    session = subprocess.Popen([sys.executable, "-c", script], cwd=pipeline,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    end = time.monotonic() + 30
    while not (stage := [p for p in psutil.Process(session.pid).children() if p.cmdline()[:2] == ["sleep", "300"]]):
        assert time.monotonic() < end and session.poll() is None, "the stage never started"
        time.sleep(0.1)
    session.kill()
    session.wait()
    assert psutil.wait_procs(stage, timeout=10)[1] == []  # SIGTERM reached it when its session died


@pytest.mark.slow
def test_the_fleet_prepares_as_far_as_staleness_allows_and_a_session_then_only_trains(pipeline):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    fleet = Prefetch(pending_of(pipeline), env, max_staleness=1, root=pipeline)
    fleet.lanes.start()
    fleet.lanes.wait()
    # Nothing trained yet: 002 trains from 001 on rollouts of 000, one version stale; a third would be two.
    assert iterations.load(pipeline / "iterations.yaml") == {k: LAGGED[k] for k in ("001", "002")}
    assert sorted(r.stage for r in fleet.lanes.runs) == ["generate@001", "generate@002", "score@001", "score@002"]
    session = Loop(pending_of(pipeline), {HOME: env, TRAINER: env}, lag=1, max_trains=2, budget=None,
                   cost_so_far=lambda: 0.0, train_cost=0.0, root=pipeline)
    session.lanes.start()
    session.lanes.wait()
    assert sorted(r.stage for r in session.lanes.runs) == sorted(
        f"{s}@{k}" for s in ("train", "eval", "sync") for k in ("001", "002"))  # nothing sampled again
    assert pending_of(pipeline) == set()


@pytest.mark.slow
def test_a_stage_that_finished_but_was_not_recorded_is_recorded_not_run_again(pipeline):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    stages = load({"001": LAGGED["001"]}, pipeline)
    stages["generate@001"].cmd += " && echo ran >> generate-runs.log"

    class DiesBeforeCommit(Lanes):  # what a SIGKILL between the stage's exit and its `dvc commit` leaves
        def record(self, name):
            return 1

    first = DiesBeforeCommit(stages, {"generate@001"}, {HOME: env, TRAINER: env}, root=pipeline)
    first.start()
    first.wait()
    assert (pipeline / "build/lanes/generate@001.json").is_file() and "generate@001" in pending_of(pipeline)
    again = Lanes(stages, {"generate@001"}, {HOME: env, TRAINER: env}, root=pipeline)
    again.start()
    again.wait()
    assert again.error is None and pending_of(pipeline) == {"score@001", "train@001", "eval@001", "sync@001"}
    assert (pipeline / "generate-runs.log").read_text() == "ran\n"  # it ran once, in the first session
    assert not (pipeline / "build/lanes/generate@001.json").exists()
    # Outputs changed since (here by hand): the journal no longer matches, so the stage runs again.
    first = DiesBeforeCommit(stages, {"generate@001"}, {HOME: env, TRAINER: env}, root=pipeline)
    first.start()
    first.wait()
    (pipeline / "ro/001").write_text("changed\n")
    again = Lanes(stages, {"generate@001"}, {HOME: env, TRAINER: env}, root=pipeline)
    again.start()
    again.wait()
    assert (pipeline / "generate-runs.log").read_text() == "ran\n" * 3
