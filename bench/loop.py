"""`python -m bench.loop [--iterations 4] [--epochs 100] [--keep]`: how much of a rented session's loop overlaps,
measured on this machine (docs/benchmarks.md).

One scratch workspace of the embedded model has its first batch scored (as the fleet would leave it); then a
session of `--iterations` iterations runs from a copy of it at lag 1 and from another at lag 0, each against a
static host that is a directory reached over a real sshd on 127.0.0.1 (burstrl.remote.loopback). `--epochs`
lengthens the train stage so that the two sides' work is roughly balanced. From each session's report
(metrics/session/<id>.json) it prints, per iteration: the loop's wall time (first stage start to last stage
end), the home side's busy time (generate, score, eval, sync), the rented side's (train), and their ratio
wall / longer side; the rented time's share spent training; and, for one burst per iteration, the share the
same train stages would have had if each had paid this session's set-up and teardown. Results also go to
build/bench/loop.json.

Both sides share this machine's cores, so each runs slower beside the other than alone: the ratio measures
overlap, not speed.
"""

import argparse
import json
import shutil
import subprocess
import sys

from burstrl.atomic import write_json
from burstrl.pipeline import workspace
from burstrl.remote import loopback

OUT = workspace.REPO / "build" / "bench"


def figures(summary: dict, iterations: int) -> dict:
    """Per-iteration wall and busy seconds, their ratio, and the rented shares of one session's report."""
    stages = summary["stages"]
    wall = max(s["end"] for s in stages) - min(s["start"] for s in stages)
    home = sum(s["end"] - s["start"] for s in stages if s["lane"] == "home")
    rented = sum(s["end"] - s["start"] for s in stages if s["lane"] == "trainer")
    r = summary["rented"]
    # One burst per iteration: each train stage pays the set-up and teardown this session paid once.
    burst = r["training_seconds"] / (r["training_seconds"] + r["syncing_seconds"]
                                     + iterations * (r["setup_seconds"] + r["teardown_seconds"]))
    return {"wall_per_iteration": wall / iterations, "home_busy_per_iteration": home / iterations,
            "rented_busy_per_iteration": rented / iterations, "wall_vs_longer_side": wall / max(home, rented),
            "wall_vs_sum": wall / (home + rented), "training_share": r["training_seconds"] / r["total_seconds"],
            "burst_training_share": burst, "rented": r, "iterations_trained": summary["iterations_trained"]}


def session(base, name: str, lag: int, iterations: int, server: loopback.Loopback, env: dict) -> dict:
    root, host = base.parent / name, base.parent / f"{name}-host"
    host.mkdir()
    workspace.clone(base, root, {"rent": {
        "provider": "static", "lag": lag, "max_hours": 2.0, "reserve_minutes": 1.0, "ssh_key": server.key,
        "setup_command": f"ln -sfn {workspace.REPO / '.venv'} .venv", "check_command": "true",
        "secrets_file": str(base.parent / "secrets.env"), "report_every_seconds": 600,
        "static": {"host": f"{server.user}@127.0.0.1:{host}", "on_expiry": ""}}})
    print(f"[loop] lag {lag}: a session of {iterations} iterations", flush=True)
    done = subprocess.run([sys.executable, "-m", "burstrl", "rent", "--iterations", str(iterations)], cwd=root,
                          env={**env, "RSYNC_RSH": server.rsh}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"[loop] lag {lag}: the session failed ({done.returncode}):\n{done.stderr[-3000:]}")
    [report] = sorted((root / "metrics/session").glob("*.json"))
    return figures(json.loads(report.read_text()), iterations)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=100, help="train.epochs: the rented side's share of the work")
    parser.add_argument("--keep", action="store_true", help="keep build/bench/loop/ (workspaces, hosts)")
    args = parser.parse_args()
    work = OUT / "loop"
    shutil.rmtree(work, ignore_errors=True)
    (work / "ws").mkdir(parents=True)
    (work / "sshd").mkdir()
    base = work / "ws"
    env = workspace.scratch(base, {**workspace.SMALL, "train": {**workspace.SMALL["train"], "epochs": args.epochs}})
    print("[loop] bootstrap and the first batch: dvc repro sync-bootstrap score@001", flush=True)
    subprocess.run(["dvc", "repro", "sync-bootstrap", "score@001"], cwd=base, env=env, check=True, capture_output=True)
    server = loopback.start(work / "sshd")
    try:
        results = {f"lag {lag}": session(base, f"lag{lag}", lag, args.iterations, server, env) for lag in (1, 0)}
    finally:
        server.stop()
    print(f"{'':8}{'wall/iter':>10}{'home/iter':>10}{'rented/iter':>12}{'wall/longer':>12}{'wall/sum':>10}"
          f"{'training share':>16}{'one burst each':>16}")
    for name, f in results.items():
        print(f"{name:8}{f['wall_per_iteration']:>10.1f}{f['home_busy_per_iteration']:>10.1f}"
              f"{f['rented_busy_per_iteration']:>12.1f}{f['wall_vs_longer_side']:>12.2f}{f['wall_vs_sum']:>10.2f}"
              f"{f['training_share']:>16.0%}{f['burst_training_share']:>16.0%}")
    write_json(OUT / "loop.json", {"iterations": args.iterations, "epochs": args.epochs, **results})
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
