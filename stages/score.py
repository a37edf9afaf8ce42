"""score ITER: rewards, group-relative advantages and reference logprobs into data/scored/ITER.parquet.

The reference is the frozen bootstrap policy (checkpoints/000), run in vLLM over prompt + completion token
ids with prompt_logprobs, so its logprobs line up token for token with the sampled completion. With
train.beta = 0 there is no KL term, so the reference is not run and `ref_logprobs` is null. The reference
pass runs in shards of resume.shard_prompts groups' rows; a killed run keeps its finished shards. With
servers.reference set it runs on those vLLM servers (burstrl.inference.client), which must serve checkpoints/000.
For episodes (docs/environments.md) the reward functions get the episode's messages and its counts, and the
reference scores every token, the KL term later using only the policy's. Rewards are recomputed on every run:
rule-based verifiers take milliseconds, a served judge (score.judge, servers.reward) seconds. The task's
verifier (watch.verifier) runs too, for the reward-hacking watch: its agreement with the rewards goes into the
metrics, and the best-paid rollouts it fails into metrics/watch/ITER.json (docs/reward-hacking.md). With
score.zero_variance resample, groups whose rewards are all equal are drawn again by the rollouts' sampler
(burstrl.rl.resample) before the reference pass. With score.teacher (on-policy distillation), the teacher runs
like the reference (offline or on servers.teacher, in shards) and its logprob and top score.teacher_top_k logprobs
at every completion token are stored too (docs/objective.md, On-policy distillation).
"""

import hashlib
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
from transformers import AutoTokenizer

from burstrl.atomic import write_json
from burstrl.data.contract import (
    ROLLOUT_FIELDS,
    SCORED_FIELDS,
    TEACHER_FIELDS,
    check_tokens,
    read_rollouts,
    write_table,
)
from burstrl.data.policy import content_hash, file_sha256, read_metadata, served_name, tokenizer_hash
from burstrl.env.chat import check_episode_tokens
from burstrl.env.rollouts import redraw
from burstrl.errors import ConfigError
from burstrl.inference import client, engine
from burstrl.inference.judge import Judge
from burstrl.pipeline.resume import Shards, WorkDir
from burstrl.pipeline.stage import finish, parse, stage
from burstrl.rl import watch
from burstrl.rl.advantages import group_advantages, zero_variance_groups
from burstrl.rl.resample import resample
from burstrl.rl.rewards import score_table

REFERENCE = Path("checkpoints/000")


def teacher_metadata(teacher: Path) -> dict:
    """A checkpoint's metadata, or for another model directory its content and tokenizer hashes."""
    if (teacher / "burstrl.json").is_file():
        return read_metadata(teacher)
    if not (teacher / "config.json").is_file():
        raise ConfigError(f"score.teacher: {teacher} is not a model directory (no config.json)")
    return {"content_hash": content_hash(teacher), "tokenizer_hash": tokenizer_hash(teacher)}


def served(model: Path) -> str:
    """The name a server of `model` answers to: a checkpoint's served name, else the directory's name
    (`python -m burstrl serve --model DIR --name NAME`)."""
    return served_name(model) if (model / "burstrl.json").is_file() else model.name


def teacher_columns(views) -> pa.Table:
    return pa.Table.from_arrays(
        [pa.array([v.logprobs for v in views], TEACHER_FIELDS[0].type),
         pa.array([v.ids for v in views], TEACHER_FIELDS[1].type),
         pa.array([v.top for v in views], TEACHER_FIELDS[2].type)], schema=pa.schema(TEACHER_FIELDS))

if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration")
    s = cfg.score
    metrics: dict = {}
    with stage("score", metrics):
        source = Path(f"data/rollouts/{args.iteration}.parquet")
        rollouts = read_rollouts(source)
        if rollouts["completion_messages"].null_count < len(rollouts):
            # Episodes: their environment tokens are what the tools returned, as the reference tokenizes them.
            check_episode_tokens(source, rollouts, AutoTokenizer.from_pretrained(REFERENCE))
        contract = {f.name for f in ROLLOUT_FIELDS}
        task_columns = [c for c in rollouts.column_names if c not in contract]
        with ExitStack() as stack:
            extra, judge_pool = {}, None
            if "burstrl.rl.rewards.judge" in s.reward_funcs:
                judge_pool = stack.enter_context(client.connected(cfg.servers.reward, s.judge.model, cfg.servers,
                                                                   "reward"))
                extra["judge"] = Judge(judge_pool, s.judge)

            def rewards_of(table):
                return score_table(s.reward_funcs, s.reward_weights, source, table, task_columns,
                                   conversational=s.completion_format == "conversational", extra=extra)

            per_function, rewards = rewards_of(rollouts)
            flat = len(zero_variance_groups(rewards, rollouts["prompt_id"].to_pylist()))
            resampled = {}
            if s.zero_variance == "resample" and flat:
                with ExitStack() as sampling:  # closed before the reference pass starts its own engine
                    done = resample(rollouts, rewards, s.resample_rounds,
                                    draw=redraw(sampling, source, rollouts, cfg), score=lambda t: rewards_of(t)[1])
                if done.table is not rollouts:  # some group was replaced: its new rows need their rewards
                    per_function, rewards = rewards_of(done.table)
                rollouts, resampled = done.table, done.counts
            w = cfg.watch
            verified = (per_function[s.reward_funcs.index(w.verifier)] if w.verifier in s.reward_funcs else
                        score_table([w.verifier], [1.0], source, rollouts, task_columns,
                                    conversational=s.completion_format == "conversational", extra=extra)[0][0])
        groups = rollouts["prompt_id"].to_pylist()
        advantages = group_advantages(rewards, groups, baseline=s.advantage_baseline, scale=s.scale_rewards)

        def model_pass(role: str, model: Path, meta: dict, urls: list[str], compute, derived: bool = True):
            """compute(model runner, rows) -> columns, over the rows in shards of resume.shard_prompts groups (a
            killed run keeps its finished ones), on the offline engine or on `urls`, which must serve `model`."""
            check_tokens(source, rollouts, model, meta)
            work = WorkDir("score", args.iteration if role == "reference" else f"{args.iteration}.{role}", {
                "rollouts": file_sha256(source), role: meta["content_hash"], "seed": cfg.seed,
                # Resampled groups change the rows scored: their seeds name them.
                "seeds": hashlib.sha256(str(rollouts["seed"].to_pylist()).encode()).hexdigest(),
                "max_len": cfg.model.max_len, "inference": asdict(cfg.inference),
                "shard_prompts": cfg.resume.shard_prompts, "top_k": s.teacher_top_k if role == "teacher" else None,
            })
            shards = Shards(work, len(rollouts), cfg.resume.shard_prompts * cfg.generate.num_generations,
                            what=f"{role} shards")
            with ExitStack() as stack:

                def start():
                    if urls:
                        return stack.enter_context(client.connected(urls, served(model), cfg.servers, role,
                                                                    derived=derived))
                    return stack.enter_context(engine.offline(model, cfg.inference, cfg.model.max_len, cfg.seed))

                def shard(runner, lo: int, hi: int) -> pa.Table:
                    part = rollouts.slice(lo, hi - lo)
                    return compute(runner, part["prompt_ids"].to_pylist(), part["completion_ids"].to_pylist())

                table = shards.fill(shard, start, "score_shard")
            prefix = "" if role == "reference" else f"{role}_"
            metrics[f"{prefix}shards_resumed"] = shards.resumed
            if urls and shards.started:
                metrics[f"{prefix}servers"] = shards.started.stats()
            return table, work

        works, metrics["shards_resumed"] = [], 0
        if cfg.train.beta:
            # The KL term is against the reference itself: a server of its quantized weights is refused.
            ref, work = model_pass("reference", REFERENCE, read_metadata(REFERENCE), cfg.servers.reference,
                                   lambda runner, p, c: pa.table({"ref_logprobs": pa.array(
                                       runner.token_logprobs(p, c), pa.list_(pa.float32()))}), derived=False)
            ref_column = ref["ref_logprobs"]
            works.append(work)
        else:
            print("score: train.beta is 0, so no KL term: skipping reference logprobs (ref_logprobs is null)")
            ref_column = pa.nulls(len(rollouts), pa.list_(pa.float32()))
        teacher = None
        if s.teacher:
            teacher_dir = Path(s.teacher)
            teacher_meta = teacher_metadata(teacher_dir)
            teacher, work = model_pass("teacher", teacher_dir, teacher_meta, cfg.servers.teacher,
                                       lambda runner, p, c: teacher_columns(runner.top_logprobs(p, c, s.teacher_top_k)))
            works.append(work)
            metrics.update(teacher=str(teacher_dir), teacher_hash=teacher_meta["content_hash"])

        scored = (rollouts
                  .append_column("rewards", pa.array(list(zip(*per_function, strict=True)), pa.list_(pa.float32())))
                  .append_column("reward", pa.array(rewards, pa.float32()))
                  .append_column("advantage", pa.array(advantages, pa.float32()))
                  .append_column("ref_logprobs", ref_column))
        for column in teacher.column_names if teacher is not None else []:
            scored = scored.append_column(column, teacher[column])
        write_table(scored, SCORED_FIELDS, Path(f"data/scored/{args.iteration}.parquet"))
        for name, values in zip(s.reward_funcs, per_function, strict=True):
            present = [v for v in values if v is not None]
            metrics[f"reward/{name}"] = sum(present) / max(1, len(present))
        metrics.update({"reward_mean": sum(rewards) / len(rewards), "rollouts": len(rewards),
                        "groups": len(set(groups)), "groups_zero_variance_sampled": flat,
                        "groups_zero_variance": len(zero_variance_groups(rewards, groups)), **resampled,
                        "reference_logprobs": bool(cfg.train.beta),
                        **({"judge_servers": judge_pool.stats()} if judge_pool else {})})
        shown = ["prompt_id", "sample_index", "prompt", "completion", *task_columns]
        suspects = watch.suspects(rollouts.select(shown).to_pylist(), rewards, verified, cfg.watch.top_k)
        applies = [v for v in verified if v is not None]
        metrics.update({"verified_rate": sum(applies) / len(applies) if applies else None,
                        "verifier_correlation": watch.verifier_correlation(rewards, verified),
                        "length_correlation": watch.length_correlation(
                            rewards, [sum(m) for m in rollouts["completion_mask"].to_pylist()]),
                        "reward_disagreement": watch.disagreement(per_function), "suspects": len(suspects)})
    write_json(Path(f"metrics/watch/{args.iteration}.json"), {"verifier": cfg.watch.verifier, "suspects": suspects})
    write_json(Path(f"metrics/score/{args.iteration}.json"), metrics)
    for work in works:
        work.finish()
    print(f"score {args.iteration}: mean reward {metrics['reward_mean']:.3f}, "
          f"{metrics['groups_zero_variance']}/{metrics['groups']} groups without reward variance")
    finish()
