"""On-policy distillation through the real stages: score stores an offline teacher's logprobs and top-k (a
model directory that is no checkpoint: checkpoint 000 with noise in its weights), equal to a forward pass of the
teacher; train with train.objective distill follows the per-token reverse KL over the teacher's top k and moves
the student's next-token distributions towards the teacher's on the batch it trained on. The served teacher is in
tests/test_serving.py, the loss by hand in tests/test_objective.py."""

import json

import pyarrow.parquet as pq
import pytest
from conftest import check_teacher_columns, clone, completion_logprobs, noisy_weights, run, teacher_by_hand
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow

K = 3
PARAMS = {"score": {"teacher": "build/teacher", "teacher_top_k": K},
          "train": {"objective": "distill", "epochs": 4, "beta": 0.0}}


def k1_to_teacher(model, teacher, rows) -> float:
    """Mean over the completion tokens of log pi_model - log pi_teacher: the k1 estimate on the model's samples."""
    gaps = []
    for row in rows:
        student = completion_logprobs(model, row["prompt_ids"], row["completion_ids"])
        target = completion_logprobs(teacher, row["prompt_ids"], row["completion_ids"])
        gaps += [s - t for s, t in zip(student, target, strict=True)]
    return sum(gaps) / len(gaps)


def full_kl(model, teacher, rows) -> float:
    """Mean over the batch's completion positions of the whole next-token reverse KL(model || teacher)."""
    kls = []
    for row in rows:
        *_, student = teacher_by_hand(model, row["prompt_ids"], row["completion_ids"], 1)
        *_, target = teacher_by_hand(teacher, row["prompt_ids"], row["completion_ids"], 1)
        kls += (student.exp() * (student - target)).sum(-1).tolist()
    return sum(kls) / len(kls)


def test_distillation_stores_the_teachers_top_k_and_moves_the_student_towards_it(scored, tmp_path):
    root = tmp_path / "ws"
    env = clone(scored, root, PARAMS)
    noisy_weights(root / "checkpoints/000", root / "build/teacher")
    out = run(["dvc", "repro", "train@001"], root, env).stdout
    assert "Running stage 'score@001'" in out

    rows = pq.read_table(root / "data/scored/001.parquet").to_pylist()
    teacher = AutoModelForCausalLM.from_pretrained(root / "build/teacher")
    check_teacher_columns(rows, teacher, K)
    score = json.loads((root / "metrics/score/001.json").read_text())
    assert score["teacher"] == "build/teacher" and score["teacher_shards_resumed"] == 0

    # The start metric is the k1 KL of checkpoint 000 from the teacher on its own batch, by hand...
    train = json.loads((root / "metrics/train/001.json").read_text())
    start = AutoModelForCausalLM.from_pretrained(root / "checkpoints/000")
    assert train["teacher_kl"] == pytest.approx(k1_to_teacher(start, teacher, rows), abs=1e-4)
    assert 0 < train["distill_kl"]
    # ...and the update, following the teacher alone, brought the student's whole next-token distribution
    # closer to the teacher's at the batch's positions.
    before = full_kl(start, teacher, rows)
    after = full_kl(AutoModelForCausalLM.from_pretrained(root / "checkpoints/001"), teacher, rows)
    assert before > 0.05  # the noise made a teacher worth distilling
    assert after < 0.3 * before, (before, after)
