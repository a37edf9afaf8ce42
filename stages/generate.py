"""generate ITER PARENT: sample G completions per prompt from checkpoints/PARENT into data/rollouts/ITER.parquet.

With servers.policy set, the completions come from those vLLM servers (burstrl.inference.client), which must serve
PARENT; a server of quantized weights names its variant, which goes into `sampler_weights`. With --weights DIR
the offline sampler runs DIR instead, a copy of PARENT with changed weights (see burstrl.data.policy.mark_derived):
rows keep PARENT's version and hash and name DIR's variant in `sampler_weights`.
With env.tools or env.environment_factory set, each completion is an episode of model turns and tool results
(burstrl.env.episodes; docs/environments.md), its tools run in a sandboxed worker process.
Prompts are sampled in shards of resume.shard_prompts; a killed run keeps its finished shards (docs/resume.md).
"""

import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
from transformers import AutoTokenizer

from burstrl.atomic import write_json
from burstrl.data.contract import ROLLOUT_FIELDS, read_rollouts, read_task, write_table
from burstrl.data.policy import content_hash, file_sha256, policy_name, read_metadata, read_variant
from burstrl.data.task import check_fits, draw_prompts
from burstrl.env import environment
from burstrl.env.chat import check_episode_tokens
from burstrl.env.environment import episode_metrics
from burstrl.env.rollouts import sample_rollouts
from burstrl.errors import ConfigError
from burstrl.inference import client, engine
from burstrl.pipeline.resume import Shards, WorkDir
from burstrl.pipeline.stage import finish, parse, stage

if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration", "parent", "--weights")
    g = cfg.generate
    metrics: dict = {}
    out = Path(f"data/rollouts/{args.iteration}.parquet")
    with stage("generate", metrics):
        policy = Path("checkpoints") / args.parent
        meta = read_metadata(policy)
        if args.weights and cfg.servers.policy:
            raise ConfigError("generate --weights runs the offline engine on those weights: unset servers.policy")
        weights = Path(args.weights) if args.weights else policy
        variant = read_variant(weights, meta) if args.weights else "checkpoint"
        tokenizer = AutoTokenizer.from_pretrained(policy)
        task_file = Path("data/task/train.parquet")
        seed = cfg.rl_seed
        prompts = draw_prompts(read_task(task_file), g.prompts_per_iteration, seed=seed, iteration=int(args.iteration))
        # One seed per prompt: a group, and so a shard, can be regenerated alone and come out the same.
        seeds = [seed * 1_000_003 + int(args.iteration) * 100_003 + pid for pid in prompts["prompt_id"].to_pylist()]
        shard_key = {
            "task": file_sha256(task_file), "policy": meta["content_hash"],
            "weights": content_hash(weights) if args.weights else meta["content_hash"], "seed": seed,
            "max_len": cfg.model.max_len, "inference": asdict(cfg.inference), "generate": asdict(g),
            "shard_prompts": cfg.resume.shard_prompts, "env": asdict(cfg.env),
        }
        timing = {"engine_start_seconds": 0.0, "generation_seconds": 0.0}
        with ExitStack() as stack:
            sandbox = (stack.enter_context(environment.sandbox(cfg.env, tokenizer, policy)) if cfg.env.enabled
                       else None)
            prompt_ids = environment.prompt_ids(tokenizer, prompts, sandbox)
            check_fits(prompts, prompt_ids, g.max_tokens, cfg.model.max_len)
            pool = (stack.enter_context(client.connected(cfg.servers.policy, policy_name(meta), cfg.servers, "policy"))
                    if cfg.servers.policy else None)
            variant = pool.variant if pool else variant
            stamp = {"policy_version": meta["policy_version"], "policy_hash": meta["content_hash"],
                     "sampler_weights": variant, "tokenizer_hash": meta["tokenizer_hash"],
                     "temperature": g.temperature, "top_p": g.top_p}
            # Shards of other weights (a quantized server after a full-precision one) never mix in one file.
            work = WorkDir("generate", args.iteration, {**shard_key, "sampler_weights": variant})
            shards = Shards(work, len(prompt_ids), cfg.resume.shard_prompts)

            def start_engine():
                started = time.monotonic()
                sampler = pool or stack.enter_context(engine.offline(weights, cfg.inference, cfg.model.max_len,
                                                                     cfg.seed))
                timing["engine_start_seconds"] = time.monotonic() - started
                return sampler

            def sample(sampler, lo: int, hi: int) -> pa.Table:
                started = time.monotonic()
                table = sample_rollouts(sampler, cfg, prompts.slice(lo, hi - lo), prompt_ids[lo:hi], seeds[lo:hi],
                                        stamp, tokenizer, sandbox)
                timing["generation_seconds"] += time.monotonic() - started
                return table

            rollouts = shards.fill(sample, start_engine, "generate_shard")
        write_table(rollouts, ROLLOUT_FIELDS, out)
        table = read_rollouts(out)
        if sandbox:
            check_episode_tokens(out, table, tokenizer)
            metrics.update(episode_metrics(table, sandbox.restarts))
        lengths = [len(ids) for ids in table["completion_ids"].to_pylist()]
        n = len(lengths)
        metrics.update({
            "rollouts": n,
            "completion_length_mean": sum(lengths) / n,
            "truncated": table["finish_reason"].to_pylist().count("length"),
            "generated_tokens": sum(lengths),
            "shards": len(shards.bounds),
            "shards_resumed": shards.resumed,
            **{key: round(value, 3) for key, value in timing.items()},
            **({"servers": pool.stats()} if pool else {}),
        })
    write_json(Path(f"metrics/generate/{args.iteration}.json"), metrics)
    work.finish()
    print(f"generate {args.iteration}: {n} completions from policy {args.parent} ({variant}) in {metrics['seconds']}s")
    finish()
