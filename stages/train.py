"""train ITER PARENT: one GRPO update of checkpoints/PARENT on data/scored/ITER.parquet -> checkpoints/ITER."""

import tempfile
from pathlib import Path

import datasets
from transformers import AutoModelForCausalLM, AutoTokenizer

from burstrl.contract import read_scored
from burstrl.policy import publish_policy, read_metadata, staging_dir
from burstrl.stage import parse, stage, write_json
from burstrl.trainer import RolloutGRPOTrainer, grpo_config


def mean_of(history: list[dict], key: str) -> float | None:
    values = [entry[key] for entry in history if key in entry]
    return sum(values) / len(values) if values else None


if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration", "parent")
    metrics: dict = {}
    out = Path("checkpoints") / args.iteration
    with stage("train", metrics):
        source = Path(f"data/scored/{args.iteration}.parquet")
        table = read_scored(source)
        parent = Path("checkpoints") / args.parent
        parent_meta = read_metadata(parent)
        stale = {v for v in table["policy_version"].to_pylist() if v != parent_meta["policy_version"]}
        if stale:
            raise ValueError(f"{source}: field 'policy_version': rollouts from {sorted(stale)}, "
                             f"but training starts from policy {parent_meta['policy_version']}")
        temperatures = set(table["temperature"].to_pylist())
        if cfg.train.beta and temperatures != {1.0}:
            raise ValueError(f"{source}: field 'temperature': KL needs rollouts at temperature 1.0 "
                             f"(reference logprobs are at 1.0), got {sorted(temperatures)}")
        if len(table) != cfg.rollouts_per_iteration:
            raise ValueError(f"{source}: has {len(table)} rows, params expect {cfg.rollouts_per_iteration}")
        tokenizer = AutoTokenizer.from_pretrained(parent)
        model = AutoModelForCausalLM.from_pretrained(parent)
        tmp = staging_dir(out)
        scratch = tempfile.TemporaryDirectory(prefix="burstrl-train-")
        trainer = RolloutGRPOTrainer(
            model=model,
            processing_class=tokenizer,
            args=grpo_config(output_dir=scratch.name, rollouts=len(table), train=cfg.train,
                             temperature=temperatures.pop(), max_completion_length=cfg.generate.max_tokens,
                             num_generations=cfg.generate.num_generations, seed=cfg.seed),
            train_dataset=datasets.Dataset(table),
            beta=cfg.train.beta,
        )
        trainer.train()
        history = trainer.state.log_history
        for key in ("loss", "kl", "entropy", "clip_ratio/region_mean", "grad_norm"):
            value = mean_of(history, key)
            if value is not None:
                metrics[key.replace("/", "_")] = value
        metrics["optimizer_steps"] = trainer.state.global_step
        trainer.save_model(str(tmp))
        tokenizer.save_pretrained(tmp)
        meta = publish_policy(tmp, out, version=args.iteration, parent=args.parent, iteration=int(args.iteration))
    write_json(Path(f"metrics/train/{args.iteration}.json"), metrics)
    print(f"train {args.iteration}: {metrics['optimizer_steps']} steps, kl {metrics.get('kl', 0):.4f} "
          f"in {metrics['seconds']}s")
