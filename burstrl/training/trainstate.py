"""Resumable training: when to save a checkpoint, which saved one to continue from, and the deadline.

The Trainer writes `checkpoint-<step>/` (weights, optimizer, scheduler, RNG states, trainer state) into the
train stage's work directory (burstrl.pipeline.resume). It writes those files one by one, so a checkpoint counts only
once `COMPLETE` is in it; the rollout batch as the trainer prepared it (proximal logprobs, shuffled and
sliced into steps) is saved beside them once, so a resumed run continues with exactly the data it left.
"""

import os
import shutil
import time
from pathlib import Path

import torch.distributed as dist
from transformers import TrainerCallback

from burstrl.atomic import write_json
from burstrl.pipeline import faults
from burstrl.pipeline.resume import COMPLETE, checkpoints

BATCH = "batch-{rank}.pt"  # one per process: each holds its own share of the batch


def discard_incomplete(work: Path) -> list[Path]:
    """Remove checkpoints a kill interrupted while they were being written; returns what was removed."""
    broken = [p for p in work.glob("checkpoint-*") if p.is_dir() and not (p / COMPLETE).is_file()]
    for path in broken:
        shutil.rmtree(path)
    return broken


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_complete(checkpoint: Path, step: int, keep: int = 2) -> None:
    """Declare `checkpoint` whole once its files are on disk, then drop older complete ones beyond the newest
    `keep` (two: a copy in flight, e.g. to home over rsync, still has its source when the next one lands)."""
    for path in checkpoint.rglob("*"):
        if path.is_file():
            _fsync(path)
    _fsync(checkpoint)
    write_json(checkpoint / COMPLETE, {"step": step})
    for _, old in checkpoints(checkpoint.parent)[:-keep]:
        shutil.rmtree(old)


def agreed(flags: list[bool]) -> list[bool]:
    """Rank 0's flags on every rank. Clocks differ between processes, and ranks that disagree on saving or
    stopping would wait for each other in the next collective forever."""
    if not (dist.is_available() and dist.is_initialized()):
        return flags
    shared = [flags]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


class Cadence(TrainerCallback):
    """Asks the Trainer for a checkpoint every `every_steps` steps or `every_minutes`, and for a checkpoint and
    a stop when the next step and save might not finish `margin` seconds before `deadline` (time.time())."""

    def __init__(self, every_steps: int, every_minutes: float, deadline: float | None, margin: float):
        self.every_steps, self.every_seconds = every_steps, every_minutes * 60
        self.deadline, self.margin = deadline, margin
        self.last_save = self.step_started = self.save_started = time.time()
        self.step_seconds: list[float] = []
        self.longest_save = 0.0
        self.stopped_for_deadline = False

    @property
    def longest_step(self) -> float:
        # The first step of a run also prepares the whole batch: it stands for a step only until another ran.
        later = self.step_seconds[1:] or self.step_seconds
        return max(later, default=0.0)

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_started = time.time()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        faults.point("optimizer_step")  # gradients computed, weights not yet updated

    def on_step_end(self, args, state, control, **kwargs):
        now = time.time()
        self.step_seconds.append(now - self.step_started)
        # No checkpoint after the last step: the stage publishes the policy at once.
        more = state.global_step < state.max_steps
        if more and self.every_steps and state.global_step % self.every_steps == 0:
            control.should_save = True
        if more and self.every_seconds and now - self.last_save >= self.every_seconds:
            control.should_save = True
        # Until a save has been timed, assume one costs as much as a step.
        save = self.longest_save or self.longest_step
        if self.deadline is not None and more and now + self.longest_step + save + self.margin >= self.deadline:
            control.should_save = True
            control.should_training_stop = True
            self.stopped_for_deadline = True
        control.should_save, control.should_training_stop, self.stopped_for_deadline = agreed(
            [control.should_save, control.should_training_stop, self.stopped_for_deadline])
        self.save_started = now

    def on_save(self, args, state, control, **kwargs):
        self.last_save = time.time()
        self.longest_save = max(self.longest_save, self.last_save - self.save_started)
