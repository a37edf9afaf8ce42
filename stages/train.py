"""train ITER PARENT: one GRPO update of checkpoints/PARENT on data/scored/ITER.parquet -> checkpoints/ITER.

Also writes data/weights/ITER.parquet (each row's staleness, whether the loss used it, and its per-token
proximal logprobs and importance weights) and metrics/train/ITER.json.
"""

from pathlib import Path

import datasets
import pyarrow as pa
from dvclive import Live
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.integrations import DVCLiveCallback

from burstrl.batch import check_batch, select_rows, staleness
from burstrl.contract import WEIGHT_FIELDS, read_scored, write_table
from burstrl.policy import publish_policy, read_metadata, staging_dir
from burstrl.stage import parse, stage, write_json
from burstrl.trainer import RolloutGRPOTrainer, grpo_config


def mean_of(history: list[dict], key: str) -> float | None:
    values = [entry[key] for entry in history if entry.get(key) is not None]
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
        temperature = check_batch(source, table, beta=cfg.train.beta, expected_rows=cfg.rollouts_per_iteration)
        lags = staleness(source, table, parent_meta)
        selection = select_rows(source, table, lags, cfg.train)
        tokenizer = AutoTokenizer.from_pretrained(parent)
        model = AutoModelForCausalLM.from_pretrained(parent)
        tmp = staging_dir(out)
        # Step-level curves (loss, KL, entropy, clip ratio per optimizer step) for `dvc plots show`;
        # dvcyaml=None keeps DVCLive from editing dvc.yaml, which declares these files itself.
        live = Live(dir=f"dvclive/train/{args.iteration}", dvcyaml=None, save_dvc_exp=False)
        trainer = RolloutGRPOTrainer(
            model=model,
            processing_class=tokenizer,
            # A fixed scratch path (TRL saves nothing there), so DVCLive's copy of the arguments is stable.
            args=grpo_config(output_dir=f"build/trainer/{args.iteration}", rollouts=len(table), train=cfg.train,
                             temperature=temperature, max_completion_length=cfg.generate.max_tokens,
                             num_generations=cfg.generate.num_generations, seed=cfg.seed),
            train_dataset=datasets.Dataset(table.append_column("keep", pa.array(selection.keep))),
            train=cfg.train,
            callbacks=[DVCLiveCallback(live=live)],
        )
        trainer.train()
        history = trainer.state.log_history
        for key in ("loss", "kl", "entropy", "clip_ratio", "grad_norm"):
            value = mean_of(history, key)
            if value is not None:
                metrics[key] = value
        metrics.update(trainer.start_metrics)
        metrics.update(selection.counts)
        metrics["staleness"] = selection.staleness
        metrics["optimizer_steps"] = trainer.state.global_step
        trainer.model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        publish_policy(tmp, out, version=args.iteration, parent=parent_meta, iteration=int(args.iteration))
        weights = pa.table({
            "prompt_id": table["prompt_id"], "sample_index": table["sample_index"], "staleness": lags,
            "keep": selection.keep, **trainer.row_report,
        })
        write_table(weights, WEIGHT_FIELDS, Path(f"data/weights/{args.iteration}.parquet"))
    write_json(Path(f"metrics/train/{args.iteration}.json"), metrics)
    print(f"train {args.iteration}: {metrics['optimizer_steps']} steps on {metrics['rows_kept']}/{len(table)} rows, "
          f"sampler KL {metrics['sampler_kl']:.4f}, IS weights clipped {metrics['is_clipped_fraction']:.1%}, "
          f"kl {metrics.get('kl', 0):.4f} in {metrics['seconds']}s")
