"""train ITER PARENT: one GRPO update of checkpoints/PARENT on data/scored/ITER.parquet -> checkpoints/ITER.

Also writes data/weights/ITER.parquet (each row's staleness, whether the loss used it, and its per-token
proximal logprobs and importance weights) and metrics/train/ITER.json. Resumable (docs/resume.md): it saves
checkpoints into build/resume/train/ITER and continues from the newest; before a deadline it saves, stops
and exits with status 75 (partial), and the next `dvc repro` continues it. With BURSTRL_TRAIN_HOST set it
runs on that host over SSH and brings the outputs back (burstrl.remote.train_host).
"""

import datetime
import os
import time
from dataclasses import asdict
from pathlib import Path

import datasets
import psutil
import pyarrow as pa
from dvclive import Live
from dvclive.utils import standardize_metric_name
from transformers import AutoModelForCausalLM, AutoTokenizer

from burstrl.atomic import staging_dir, temporary, write_json
from burstrl.data.contract import WEIGHT_FIELDS, check_tokens, read_scored, write_table
from burstrl.data.policy import file_sha256, publish_policy, read_metadata
from burstrl.errors import PARTIAL
from burstrl.pipeline import resume
from burstrl.pipeline.stage import Exit, parse, stage
from burstrl.remote import train_host
from burstrl.rl.selection import check_batch, select_rows, staleness
from burstrl.training import launch, trainstate
from burstrl.training.trainer import RolloutGRPOTrainer, exact_policies, grpo_config


def mean_of(history: list[dict], key: str) -> float | None:
    values = [entry[key] for entry in history if entry.get(key) is not None]
    return sum(values) / len(values) if values else None


def write_curves(directory: str, args, history: list[dict]) -> None:
    """Step-level curves (loss, KL, entropy, clip ratio per optimizer step) for `dvc plots show`, from the
    Trainer's log history, which a resumed Trainer restores: the steps stay continuous across a resume.
    dvcyaml=None keeps DVCLive from editing dvc.yaml, which declares these files itself."""
    live = Live(dir=directory, dvcyaml=None, save_dvc_exp=False)
    live.log_params(args.to_dict())
    for entry in history:
        if "train_runtime" in entry:
            continue
        live.step = entry["step"]
        for key, value in entry.items():
            if key != "step" and isinstance(value, int | float):
                live.log_metric(standardize_metric_name(key, "dvclive.huggingface"), value)
    live.end()


if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration", "parent")
    metrics: dict = {}
    out = Path("checkpoints") / args.iteration
    if os.environ.get("BURSTRL_TRAIN_HOST"):
        with stage("train", metrics):
            deadline = resume.deadline(cfg.resume.deadline, started=psutil.Process().create_time())
            raise Exit(train_host.run_train(os.environ["BURSTRL_TRAIN_HOST"], cfg.sync.ssh_command, args.iteration,
                                            args.parent, args.params, deadline, cfg.resume.pull_every_seconds))
    with stage("train", metrics):
        deadline = resume.deadline(cfg.resume.deadline, started=psutil.Process().create_time())
        # The ranks start later than this process: they get the deadline as a time, not as seconds from now.
        ranks = launch.run_ranks(cfg.launch, cfg.train, {"BURSTRL_DEADLINE": datetime.datetime.fromtimestamp(
            deadline, datetime.UTC).isoformat()} if deadline else {})
        if ranks is not None:
            raise Exit(ranks)
        source = Path(f"data/scored/{args.iteration}.parquet")
        table = read_scored(source)
        parent = Path("checkpoints") / args.parent
        parent_meta = read_metadata(parent)
        check_tokens(source, table, parent, parent_meta)
        temperature = check_batch(source, table, beta=cfg.train.beta, expected_rows=cfg.rollouts_per_iteration,
                                  objective=cfg.train.objective)
        lags = staleness(source, table, parent_meta)
        selection = select_rows(source, table, lags, cfg.train)
        g = cfg.generate
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        grpo_args = grpo_config(output_dir=str(resume.ROOT / "train" / args.iteration), rollouts=len(table),
                                train=cfg.train, temperature=temperature, max_completion_length=g.max_tokens,
                                num_generations=g.num_generations, seed=cfg.rl_seed, processes=processes)
        main = grpo_args.process_index == 0
        # The main process checks, and may discard, saved progress before the other ranks look at it.
        with grpo_args.main_process_first(desc="train work directory"):
            work = resume.WorkDir("train", args.iteration, {
                "scored": file_sha256(source), "parent": parent_meta["content_hash"], "seed": cfg.rl_seed,
                "generate": [g.num_generations, g.max_tokens, g.prompts_per_iteration], "train": asdict(cfg.train),
                "processes": processes,  # each rank saved its own share of the batch and RNG state
            }, outputs=(out, *(Path(p.format(args.iteration)) for p in (
                "data/weights/{}.parquet", "metrics/train/{}.json", "dvclive/train/{}"))))
            if work.finished:
                raise Exit(0, f"train {args.iteration}: already trained from these inputs ({work.receipt}); "
                              "its outputs are kept as that run left them")
            for broken in trainstate.discard_incomplete(work.path) if main else []:
                print(f"train {args.iteration}: discarded {broken}, which a kill interrupted while it was written")
            saved = resume.checkpoints(work.path)
        start_step = saved[-1][0] if saved else 0
        if saved:
            print(f"train {args.iteration}: resuming from {saved[-1][1]} (step {start_step})")
        # Rank 0's clock decides for every rank: one rank leaving alone would hang the others.
        if trainstate.agreed([deadline is not None and deadline - time.time() < cfg.resume.deadline_margin_seconds])[0]:
            raise Exit(PARTIAL, f"train {args.iteration}: the deadline is {deadline - time.time():.0f}s away, "
                                f"inside the {cfg.resume.deadline_margin_seconds:.0f}s margin: not starting")
        tokenizer = AutoTokenizer.from_pretrained(parent)
        model = AutoModelForCausalLM.from_pretrained(parent)
        r = cfg.resume
        cadence = trainstate.Cadence(r.checkpoint_every_steps, r.checkpoint_every_minutes, deadline,
                                     r.deadline_margin_seconds)
        exact, missing = exact_policies(table, parent_meta, Path("checkpoints"))
        if missing:
            print(f"train {args.iteration}: checkpoints of sampler versions {', '.join(missing)} are not here: "
                  "the sampler gap is not split into quantization and staleness")
        trainer = RolloutGRPOTrainer(
            model=model,
            processing_class=tokenizer,
            args=grpo_args,
            train_dataset=datasets.Dataset(table.append_column("keep", pa.array(selection.keep))),
            train=cfg.train,
            work=work.path,
            exact_policies=exact,
            callbacks=[cadence],
        )
        started = time.monotonic()
        trainer.train(resume_from_checkpoint=str(saved[-1][1]) if saved else None)
        metrics["update_seconds"] = round(time.monotonic() - started, 3)  # this run's optimizer steps only
        if not trainer.start_metrics:
            trainer.load_saved_batch()  # resumed after the last step: no step ran to load it
        steps = trainer.state.global_step
        if cadence.stopped_for_deadline:
            raise Exit(PARTIAL, f"train {args.iteration}: stopped for the deadline after step {steps}/"
                                f"{trainer.state.max_steps}; checkpoint in {work.path}/checkpoint-{steps}; "
                                "`dvc repro` continues it")
        history = trainer.state.log_history
        for key in ("loss", "kl", "distill_kl", "entropy", "clip_ratio", "grad_norm"):
            value = mean_of(history, key)
            if value is not None:
                metrics[key] = value
        metrics.update(trainer.start_metrics)
        metrics.update(selection.counts)
        metrics["staleness"] = selection.staleness
        # Which weights sampled the batch (a quantized server names its variant): the IS weights correct for it,
        # and sampler_kl measures how far it was from the policy.
        variants = table["sampler_weights"].to_pylist()
        metrics["sampler_weights"] = {v: variants.count(v) for v in sorted(set(variants))}
        metrics["optimizer_steps"] = steps
        metrics["resumed_from_step"] = start_step
        # Collectives first, on every rank: the row report's shares, then the weights (sharded under FSDP).
        report = trainer.full_row_report(list(zip(table["prompt_id"].to_pylist(), table["sample_index"].to_pylist(),
                                                  strict=True)))
        tmp = staging_dir(out) if main else temporary(out)
        trainer.accelerator.wait_for_everyone()
        trainer.save_model(str(tmp))  # writes on the main process only, the tokenizer with the weights
        if not main:
            raise Exit(0)
        (tmp / "training_args.bin").unlink()  # the Trainer's pickle of its arguments: no part of a policy
        publish_policy(tmp, out, version=args.iteration, parent=parent_meta, iteration=int(args.iteration))
        weights = pa.table({
            "prompt_id": table["prompt_id"], "sample_index": table["sample_index"], "staleness": lags,
            "keep": selection.keep, **report,
        })
        write_table(weights, WEIGHT_FIELDS, Path(f"data/weights/{args.iteration}.parquet"))
        write_curves(f"dvclive/train/{args.iteration}", trainer.args, history)
    write_json(Path(f"metrics/train/{args.iteration}.json"), metrics)
    split = ("" if metrics["quantization_kl"] is None else
             f" ({metrics['quantization_kl']:.4f} sampler, {metrics['staleness_kl']:.4f} staleness)")
    print(f"train {args.iteration}: {steps} steps on {metrics['rows_kept']}/{len(table)} rows, "
          f"sampler KL {metrics['sampler_kl']:.4f}{split}, IS weights clipped {metrics['is_clipped_fraction']:.1%}, "
          f"kl {metrics.get('kl', 0):.4f} in {metrics['seconds']}s", flush=True)
    work.finish()
