"""`python -m burstrl COMMAND [ARGS]`: the commands a user runs by hand (the stages run from dvc.yaml).

Each command is a module's own `python -m` entry point; this table gives them short, stable names, so moving a
module does not change a command. `python -m burstrl COMMAND --help` describes one.
"""

import runpy
import sys

COMMANDS = {
    "serve": ("burstrl.inference.serve", "a vLLM server of the newest synced policy, on an inference box"),
    "status": ("burstrl.pipeline.status", "each iteration's stages: done, partial or pending"),
    "iterations": ("burstrl.pipeline.iterations", "add an iteration to iterations.yaml"),
    "report": ("burstrl.reporting.table", "the per-iteration table"),
    "inspect": ("burstrl.reporting.rollouts", "a few scored rollouts of an iteration, token by token"),
    "sweep": ("burstrl.pipeline.sweep", "an ablation: every arm of a sweep file under every seed, as DVC experiments"),
    "compare": ("burstrl.reporting.compare", "a sweep's arms side by side: means and 95% intervals over seeds"),
    "fleet": ("burstrl.remote.fleet", "home keeps the next iterations sampled and scored while nothing is rented"),
    "rent": ("burstrl.remote.rent", "a session of the RL loop on a rented GPU; `rent reap` ends leftover pods"),
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        listing = "\n".join(f"  {name:<11} {doc}" for name, (_, doc) in COMMANDS.items())
        given = f"unknown command '{sys.argv[1]}'; " if len(sys.argv) > 1 and sys.argv[1] not in ("-h", "--help") \
            else ""
        sys.exit(f"usage: python -m burstrl COMMAND [ARGS]\n{given}commands:\n{listing}")
    name = sys.argv[1]
    sys.argv = [f"burstrl {name}", *sys.argv[2:]]
    runpy.run_module(COMMANDS[name][0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
