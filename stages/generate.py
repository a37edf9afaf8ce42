"""generate ITER PARENT: sample G completions per prompt from checkpoints/PARENT into data/rollouts/ITER.parquet.

With --weights DIR the sampler runs DIR instead, a copy of PARENT with changed weights (see
burstrl.policy.mark_derived): rows keep PARENT's version and hash and name DIR's variant in `sampler_weights`.
"""

from pathlib import Path

import pyarrow as pa
from transformers import AutoTokenizer

from burstrl import engine
from burstrl.contract import ROLLOUT_FIELDS, read_task, write_table
from burstrl.policy import read_metadata, read_variant
from burstrl.stage import finish, parse, stage, write_json
from burstrl.task import check_fits, draw_prompts

if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration", "parent", "--weights")
    g = cfg.generate
    metrics: dict = {}
    with stage("generate", metrics):
        policy = Path("checkpoints") / args.parent
        meta = read_metadata(policy)
        weights = Path(args.weights) if args.weights else policy
        variant = read_variant(weights, meta) if args.weights else "checkpoint"
        tokenizer = AutoTokenizer.from_pretrained(policy)
        prompts = draw_prompts(read_task(Path("data/task/train.parquet")), g.prompts_per_iteration, seed=cfg.seed,
                               iteration=int(args.iteration))
        prompt_ids = [tokenizer(p)["input_ids"] for p in prompts["prompt"].to_pylist()]
        check_fits(prompts, prompt_ids, g.max_tokens, cfg.model.max_len)
        # One seed per prompt: a group can be regenerated alone and come out the same.
        seeds = [cfg.seed * 1_000_003 + int(args.iteration) * 100_003 + pid for pid in prompts["prompt_id"].to_pylist()]
        with engine.running(weights, cfg.inference, cfg.model.max_len, cfg.seed) as llm:
            groups = engine.sample(llm, prompt_ids, seeds, n=g.num_generations, temperature=g.temperature,
                                   top_p=g.top_p, max_tokens=g.max_tokens)

        rows = [(i, k, s) for i, group in enumerate(groups) for k, s in enumerate(group)]
        take = [i for i, _, _ in rows]
        task_columns = prompts.take(take)
        n = len(rows)
        table = pa.table({
            "sample_index": [k for _, k, _ in rows],
            "prompt_ids": [prompt_ids[i] for i in take],
            "completion": [s.text for _, _, s in rows],
            "completion_ids": [s.completion_ids for _, _, s in rows],
            "sampler_logprobs": [s.logprobs for _, _, s in rows],
            "finish_reason": [s.finish_reason for _, _, s in rows],
            "policy_version": [meta["policy_version"]] * n,
            "policy_hash": [meta["content_hash"]] * n,
            "sampler_weights": [variant] * n,
            "temperature": [g.temperature] * n,
            "top_p": [g.top_p] * n,
            "seed": [seeds[i] for i in take],
        })
        for name in task_columns.column_names:
            table = table.append_column(name, task_columns[name])
        write_table(table, ROLLOUT_FIELDS, Path(f"data/rollouts/{args.iteration}.parquet"))
        lengths = [len(s.completion_ids) for _, _, s in rows]
        metrics.update({
            "rollouts": n,
            "completion_length_mean": sum(lengths) / n,
            "truncated": sum(s.finish_reason == "length" for _, _, s in rows),
            "generated_tokens": sum(lengths),
        })
    write_json(Path(f"metrics/generate/{args.iteration}.json"), metrics)
    print(f"generate {args.iteration}: {n} completions from policy {args.parent} ({variant}) in {metrics['seconds']}s")
    finish()
