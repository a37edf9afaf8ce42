"""`python -m bench.distill [--iterations 4] [--layers 1] [--teacher-sft 2000] [--student-sft 520] [--keep]`
(`make distill-demo`): on-policy distillation of a warmed-up default into a smaller student, against GRPO alone
on the same student.

The teacher is the embedded default (4 layers) warmed up for `--teacher-sft` steps, its bootstrap run by `dvc
repro bootstrap` in a scratch workspace. The student is the same architecture with `--layers` layers and a
`--student-sft`-step warm-up (the default's), bootstrapped once. Two copies of the student then run
`--iterations` iterations each, with the same batches, learning rate and optimizer steps: `train.objective`
grpo, and grpo+distill with `score.teacher` the teacher's checkpoint (score stores its top-k logprobs on the
student's own completions). Prints each arm's held-out accuracy per iteration (each iteration is the same
number of updates) and writes build/bench/distill.json (docs/objective.md, On-policy distillation).
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from burstrl.atomic import write_json
from burstrl.pipeline import workspace

OUT = workspace.REPO / "build" / "bench"


def iterations_yaml(count: int) -> str:
    return "iterations:\n" + "".join(f'  "{i:03d}": {{parent: "{i - 1:03d}", sampler: "{i - 1:03d}"}}\n'
                                     for i in range(1, count + 1))


def repro(root: Path, env: dict, *targets: str) -> None:
    done = subprocess.run(["dvc", "repro", *targets], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"[distill] dvc repro {' '.join(targets)} failed in {root}:\n{done.stdout[-3000:]}\n"
                 f"{done.stderr[-3000:]}")


def accuracy(root: Path, count: int) -> list[float]:
    return [json.loads((root / f"metrics/eval/{i:03d}.json").read_text())["heldout_accuracy"]
            for i in range(count + 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1, help="the student's layers (the teacher has 4)")
    parser.add_argument("--teacher-sft", type=int, default=2000, help="the teacher's warm-up steps")
    parser.add_argument("--student-sft", type=int, default=520, help="the student's warm-up steps")
    parser.add_argument("--coef", type=float, default=1.0, help="train.distill_coef")
    parser.add_argument("--keep", action="store_true", help="keep build/bench/distill/ (the workspaces)")
    args = parser.parse_args()
    work = OUT / "distill"
    shutil.rmtree(work, ignore_errors=True)
    for name in ("teacher", "student"):
        (work / name).mkdir(parents=True)

    print(f"[distill] the teacher: the default, {args.teacher_sft} warm-up steps", flush=True)
    env = workspace.scratch(work / "teacher", {"bootstrap": {"sft_steps": args.teacher_sft}})
    repro(work / "teacher", env, "bootstrap")
    teacher = work / "teacher/checkpoints/000"
    student = {"model": {"layers": args.layers}, "bootstrap": {"sft_steps": args.student_sft}}
    print(f"[distill] the student: {args.layers} layer(s), {args.student_sft} warm-up steps", flush=True)
    workspace.scratch(work / "student", student)
    repro(work / "student", env, "bootstrap")

    arms = {"grpo": {"train": {"objective": "grpo"}},
            "grpo+distill": {"score": {"teacher": str(teacher)},
                             "train": {"objective": "grpo+distill", "distill_coef": args.coef}}}
    teacher_accuracy = json.loads((work / "teacher/metrics/eval/000.json").read_text())["heldout_accuracy"]
    results = {"teacher_heldout_accuracy": teacher_accuracy, "layers": args.layers, "teacher_sft": args.teacher_sft,
               "student_sft": args.student_sft, "arms": {}}
    for name, params in arms.items():
        root = work / name.replace("+", "-")
        workspace.clone(work / "student", root, params)
        (root / "iterations.yaml").write_text(iterations_yaml(args.iterations))
        print(f"[distill] {name}: {args.iterations} iterations", flush=True)
        repro(root, env, *(f"eval@{i:03d}" for i in range(1, args.iterations + 1)))
        results["arms"][name] = accuracy(root, args.iterations)

    print(f"held-out accuracy per iteration (teacher: {results['teacher_heldout_accuracy']:.3f})")
    print(f"{'iteration':>12}" + "".join(f"{name:>14}" for name in arms))
    for i in range(args.iterations + 1):
        print(f"{i:>12}" + "".join(f"{results['arms'][name][i]:>14.3f}" for name in arms))
    write_json(OUT / "distill.json", results)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
