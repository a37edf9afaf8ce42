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
(burstrl.rl.resample) before the reference pass.
"""

import hashlib
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
from transformers import AutoTokenizer

from burstrl.atomic import write_json
from burstrl.data.contract import ROLLOUT_FIELDS, SCORED_FIELDS, check_tokens, read_rollouts, write_table
from burstrl.data.policy import file_sha256, policy_name, read_metadata
from burstrl.env.chat import check_episode_tokens
from burstrl.env.rollouts import redraw
from burstrl.inference import client, engine
from burstrl.inference.judge import Judge
from burstrl.pipeline.resume import Shards, WorkDir
from burstrl.pipeline.stage import finish, parse, stage
from burstrl.rl import watch
from burstrl.rl.advantages import group_advantages, zero_variance_groups
from burstrl.rl.resample import resample
from burstrl.rl.rewards import score_table

REFERENCE = Path("checkpoints/000")

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

        shards_resumed = 0
        reference_pool = None
        if cfg.train.beta:
            reference = read_metadata(REFERENCE)
            check_tokens(source, rollouts, REFERENCE, reference)
            work = WorkDir("score", args.iteration, {
                "rollouts": file_sha256(source), "reference": reference["content_hash"], "seed": cfg.seed,
                # Resampled groups change the rows the reference scores: their seeds name them.
                "seeds": hashlib.sha256(str(rollouts["seed"].to_pylist()).encode()).hexdigest(),
                "max_len": cfg.model.max_len, "inference": asdict(cfg.inference),
                "shard_prompts": cfg.resume.shard_prompts,
            })
            shards = Shards(work, len(rollouts), cfg.resume.shard_prompts * cfg.generate.num_generations,
                            what="reference shards")
            with ExitStack() as stack:

                def start_reference():
                    if cfg.servers.reference:
                        # The KL term is against the reference itself: a server of its quantized weights is refused.
                        return stack.enter_context(client.connected(
                            cfg.servers.reference, policy_name(reference), cfg.servers, "reference", derived=False))
                    return stack.enter_context(engine.offline(REFERENCE, cfg.inference, cfg.model.max_len, cfg.seed))

                def reference_logprobs(sampler, lo: int, hi: int) -> pa.Table:
                    part = rollouts.slice(lo, hi - lo)
                    ref = sampler.token_logprobs(part["prompt_ids"].to_pylist(), part["completion_ids"].to_pylist())
                    return pa.table({"ref_logprobs": pa.array(ref, pa.list_(pa.float32()))})

                ref_column = shards.fill(reference_logprobs, start_reference, "score_shard")["ref_logprobs"]
            shards_resumed = shards.resumed
            reference_pool = shards.started if cfg.servers.reference else None
        else:
            print("score: train.beta is 0, so no KL term: skipping reference logprobs (ref_logprobs is null)")
            work = None
            ref_column = pa.nulls(len(rollouts), pa.list_(pa.float32()))

        scored = (rollouts
                  .append_column("rewards", pa.array(list(zip(*per_function, strict=True)), pa.list_(pa.float32())))
                  .append_column("reward", pa.array(rewards, pa.float32()))
                  .append_column("advantage", pa.array(advantages, pa.float32()))
                  .append_column("ref_logprobs", ref_column))
        write_table(scored, SCORED_FIELDS, Path(f"data/scored/{args.iteration}.parquet"))
        for name, values in zip(s.reward_funcs, per_function, strict=True):
            present = [v for v in values if v is not None]
            metrics[f"reward/{name}"] = sum(present) / max(1, len(present))
        metrics.update({"reward_mean": sum(rewards) / len(rewards), "rollouts": len(rewards),
                        "groups": len(set(groups)), "groups_zero_variance_sampled": flat,
                        "groups_zero_variance": len(zero_variance_groups(rewards, groups)), **resampled,
                        "reference_logprobs": bool(cfg.train.beta), "shards_resumed": shards_resumed,
                        **({"servers": reference_pool.stats()} if reference_pool else {}),
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
    if work is not None:
        work.finish()
    print(f"score {args.iteration}: mean reward {metrics['reward_mean']:.3f}, "
          f"{metrics['groups_zero_variance']}/{metrics['groups']} groups without reward variance")
    finish()
