"""train ITER PARENT: one GRPO update of checkpoints/PARENT on data/scored/ITER.parquet -> checkpoints/ITER."""

import tempfile
from pathlib import Path

import datasets
from transformers import AutoModelForCausalLM, AutoTokenizer

from burstrl.contract import read_scored
from burstrl.policy import publish_policy, read_metadata, staging_dir
from burstrl.stage import parse, stage, write_json
from burstrl.trainer import RolloutGRPOTrainer, check_batch, grpo_config


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
        temperature = check_batch(source, table, parent=read_metadata(parent), beta=cfg.train.beta,
                                  expected_rows=cfg.rollouts_per_iteration)
        tokenizer = AutoTokenizer.from_pretrained(parent)
        model = AutoModelForCausalLM.from_pretrained(parent)
        tmp = staging_dir(out)
        scratch = tempfile.TemporaryDirectory(prefix="burstrl-train-")
        trainer = RolloutGRPOTrainer(
            model=model,
            processing_class=tokenizer,
            args=grpo_config(output_dir=scratch.name, rollouts=len(table), train=cfg.train,
                             temperature=temperature, max_completion_length=cfg.generate.max_tokens,
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
        trainer.model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        publish_policy(tmp, out, version=args.iteration, parent=args.parent, iteration=int(args.iteration))
    write_json(Path(f"metrics/train/{args.iteration}.json"), metrics)
    print(f"train {args.iteration}: {metrics['optimizer_steps']} steps, kl {metrics.get('kl', 0):.4f} "
          f"in {metrics['seconds']}s")
