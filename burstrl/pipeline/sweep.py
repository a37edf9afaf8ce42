"""`python -m burstrl sweep conf/sweep/kl.yaml`: an ablation as DVC experiments, every arm under every seed.

A sweep file names its seeds (values of generate.seed, so every arm shares the task split and the bootstrap
policy) and its arms, each a set of params overrides as `dvc exp run -S` takes them (a config group too):

    seeds: [0, 1, 2]
    arms:
      beta-0.02: {train.beta: 0.02}
      no-kl: {train.beta: 0}

The sweep queues one `dvc exp run --queue` per arm and seed, named SWEEP-ARM-sSEED (SWEEP: the file's stem),
runs the queue with DVC's workers (`dvc exp run --run-all`, --jobs at a time) and waits for it. Each experiment
starts from the commit checked out: stages its overrides do not reach are not rerun. Then
`python -m burstrl compare FILE` puts the arms side by side (burstrl.reporting.compare). An experiment that
failed is named, with the command that shows its log, and the sweep exits 1.
"""

import argparse
import dataclasses
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from burstrl.config import Config
from burstrl.errors import FAILED, BurstrlError, ConfigError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SEED_KEY = "generate.seed"


@dataclass(frozen=True)
class Experiment:
    name: str
    arm: str
    seed: int
    overrides: tuple[str, ...]
    """`-S` overrides of `dvc exp run`, the arm's and the seed's."""


@dataclass(frozen=True)
class Sweep:
    name: str
    seeds: tuple[int, ...]
    arms: dict[str, dict]

    def experiments(self) -> list[Experiment]:
        """Arm by arm, seed by seed: the order the queue runs them in."""
        return [Experiment(f"{self.name}-{arm}-s{seed}", arm, seed,
                           (*(f"{key}={_hydra(value)}" for key, value in values.items()), f"{SEED_KEY}={seed}"))
                for arm, values in self.arms.items() for seed in self.seeds]


def _hydra(value) -> str:
    """A value as Hydra's override grammar reads it back: YAML's spelling of scalars, lists in brackets."""
    if isinstance(value, list):
        return "[" + ",".join(_hydra(v) for v in value) + "]"
    if isinstance(value, str):
        return value if re.fullmatch(r"[\w./:-]+", value) else "'" + value.replace("'", "\\'") + "'"
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()


def _known(key: str, groups: set[str]) -> bool:
    """A params key of Config, or a Hydra config group of conf/ (such as `hardware`)."""
    if key in groups:
        return True
    node = Config
    for part in key.split("."):
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in fields:
            return False
        node = fields[part].type
    return True


def _groups(conf: Path) -> set[str]:
    """The config groups conf/config.yaml composes, such as hardware and task."""
    source = conf / "config.yaml"
    defaults = yaml.safe_load(source.read_text()).get("defaults", []) if source.is_file() else []
    return {group for entry in defaults if isinstance(entry, dict) for group in entry}


def load(path: Path, conf: Path = Path("conf")) -> Sweep:
    """The sweep file at `path`, checked: a bad one names the file, the arm and the key."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read the sweep file: {err}") from err
    if not isinstance(raw, dict) or set(raw) != {"seeds", "arms"}:
        raise ConfigError(f"{path}: a sweep file has exactly two keys, seeds and arms; got "
                          f"{sorted(raw) if isinstance(raw, dict) else type(raw).__name__}")
    seeds, arms = raw["seeds"], raw["arms"]
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise ConfigError(f"{path}: seeds must be a list of distinct integers >= 0 (values of {SEED_KEY}); "
                          f"got {seeds!r}")
    if not isinstance(arms, dict) or not arms:
        raise ConfigError(f"{path}: arms must map each arm's name to its overrides; got {arms!r}")
    groups = _groups(conf)
    for arm, values in arms.items():
        if not isinstance(arm, str) or not NAME.fullmatch(arm):
            raise ConfigError(f"{path}: arm {arm!r}: a name of letters, digits, '.', '_' and '-' (it becomes part "
                              "of a Git ref)")
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: arm {arm}: overrides must be a mapping of params keys to values; "
                              f"got {values!r}")
        for key in values:
            if key == SEED_KEY:
                raise ConfigError(f"{path}: arm {arm}: {SEED_KEY} is the sweep's seed; list it under seeds")
            if not isinstance(key, str) or not _known(key, groups):
                raise ConfigError(f"{path}: arm {arm}: {key!r} is not a params key (params.yaml) nor a config "
                                  f"group of {conf / 'config.yaml'}")
    return Sweep(path.stem, tuple(seeds), {arm: dict(values) for arm, values in arms.items()})


def baseline(cwd: Path = Path(".")) -> str:
    """The commit the experiments start from."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def experiment_refs(cwd: Path = Path(".")) -> dict[str, str]:
    """{experiment name: commit} of the experiments DVC keeps for the commit checked out."""
    head = baseline(cwd)
    listed = subprocess.run(["git", "for-each-ref", "--format=%(refname) %(objectname)",
                             f"refs/exps/{head[:2]}/{head[2:]}/"], cwd=cwd, capture_output=True, text=True,
                            check=True).stdout
    return {ref.rsplit("/", 1)[1]: sha for ref, sha in (line.split() for line in listed.splitlines())}


def queue_commands(sweep: Sweep, force: bool) -> list[list[str]]:
    return [["dvc", "exp", "run", "--queue", "-n", e.name, *(["-f"] if force else []),
             *(arg for override in e.overrides for arg in ("-S", override))] for e in sweep.experiments()]


def run(sweep: Sweep, jobs: int, force: bool) -> list[str]:
    """Queue and run the sweep's experiments; returns the names of those that produced no experiment."""
    names = [e.name for e in sweep.experiments()]
    existing = sorted(set(names) & set(experiment_refs()))
    if existing and not force:
        raise ConfigError(f"experiments {', '.join(existing)} already exist for this commit: `dvc exp remove` them, "
                          "or pass --force to replace them")
    for command in queue_commands(sweep, force):
        if subprocess.run(command).returncode != 0:
            raise BurstrlError(f"`{' '.join(command)}` failed; nothing of the sweep has run (`dvc queue remove "
                               "--queued` empties the queue)")
    subprocess.run(["dvc", "exp", "run", "--run-all", "--jobs", str(jobs)])
    # The workers stay up a while for more work; nothing more is coming.
    subprocess.run(["dvc", "queue", "stop"], capture_output=True)
    made = experiment_refs()
    return [name for name in names if name not in made]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="sweep file, such as conf/sweep/kl.yaml")
    parser.add_argument("--jobs", type=int, default=1, help="experiments run at once (default 1)")
    parser.add_argument("--force", action="store_true", help="replace experiments of the same names")
    parser.add_argument("--dry-run", action="store_true", help="print the queue commands, run nothing")
    args = parser.parse_args(argv)
    try:
        sweep = load(args.sweep)
        if args.dry_run:
            print("\n".join(" ".join(command) for command in queue_commands(sweep, args.force)))
            return 0
        failed = run(sweep, args.jobs, args.force)
    except BurstrlError as err:
        print(f"sweep: error: {err}", file=sys.stderr)
        return FAILED
    done = len(sweep.arms) * len(sweep.seeds) - len(failed)
    print(f"sweep {sweep.name}: {done} experiments; `python -m burstrl compare {args.sweep}` compares the arms")
    for name in failed:
        print(f"sweep {sweep.name}: experiment {name} failed: `dvc queue logs {name}` shows its output",
              file=sys.stderr)
    return FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
