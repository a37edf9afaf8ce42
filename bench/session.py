"""`python -m bench.session [--params params.yaml] [--measured]`: what a rented session buys on the real hardware.

A planning model, not a measurement (burstrl.remote.estimate.strategies): from stage times and link speeds (the
`planning` params, the documented assumptions of docs/burst-training.md; with --measured, this run's mean stage
seconds from metrics/ instead) and the prices (cost.train_usd_per_hour, cost.inference_usd_per_hour), it prints
for one session window the iterations completed, the wall minutes and GPU-hours per iteration, the dollars per
iteration and the share of rented time spent training, for three ways of running the loop:

- one burst per iteration (rent, set up, ship the parent, train, bring it home, give back; home meanwhile idle),
- a session loop with lag 0 (set up once; home's sync, generate and score and the trainer take turns),
- a session loop with lag 1 (home prepares N+1 while N trains: an iteration takes the longer of the two sides).

Steady state: the first batch is taken as ready (the fleet prepares it), and only whole iterations count.
"""

import argparse

from burstrl.config import load_config
from burstrl.remote.estimate import measured, strategies


def table(rows: list[dict]) -> str:
    head = f"{'':26}{'iterations':>11}{'min/iter':>10}{'GPU-h/iter':>12}{'$/iter':>9}{'training share':>16}"
    lines = [head] + [f"{r['strategy']:26}{r['iterations']:>11}{r['minutes_per_iteration']:>10.1f}"
                      f"{r['gpu_hours_per_iteration']:>12.3f}{r['usd_per_iteration']:>9.2f}"
                      f"{r['training_share']:>16.0%}" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--measured", action="store_true", help="stage minutes from this run's metrics/")
    args = parser.parse_args()
    cfg = load_config(args.params)
    planning = measured(cfg.planning) if args.measured else cfg.planning
    print(f"a {planning.session_hours:g}-hour window at ${cfg.cost.train_usd_per_hour:.2f}/h rented, "
          f"${cfg.cost.inference_usd_per_hour:.2f}/h at home ({'measured' if args.measured else 'planning'} "
          f"stage times)")
    print(table(strategies(planning, cfg.cost.train_usd_per_hour, cfg.cost.inference_usd_per_hour)))
