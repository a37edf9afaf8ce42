"""score ITER: rewards, group-relative advantages and reference logprobs into data/scored/ITER.parquet.

The reference is the frozen bootstrap policy (checkpoints/000), run in vLLM over prompt + completion token
ids with prompt_logprobs, so its logprobs line up token for token with the sampled completion.
"""

from pathlib import Path

import pyarrow as pa

from burstrl import engine
from burstrl.advantages import group_advantages
from burstrl.contract import ROLLOUT_FIELDS, SCORED_FIELDS, read_rollouts, write_table
from burstrl.policy import read_metadata
from burstrl.rewards import resolve, weighted_total
from burstrl.stage import parse, stage, write_json

REFERENCE = Path("checkpoints/000")

if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration")
    s = cfg.score
    metrics: dict = {}
    with stage("score", metrics):
        funcs = [resolve(name) for name in s.reward_funcs]
        source = Path(f"data/rollouts/{args.iteration}.parquet")
        rollouts = read_rollouts(source)
        contract = {f.name for f in ROLLOUT_FIELDS}
        columns = {c: rollouts[c].to_pylist() for c in rollouts.column_names if c not in contract}
        prompts = rollouts["prompt"].to_pylist()
        completions = rollouts["completion"].to_pylist()
        completion_ids = rollouts["completion_ids"].to_pylist()
        per_function = []
        for name, fn in zip(s.reward_funcs, funcs, strict=True):
            values = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
            if len(values) != len(prompts):
                raise ValueError(f"reward function {name} returned {len(values)} values for {len(prompts)} rows")
            per_function.append(values)
            present = [v for v in values if v is not None]
            metrics[f"reward/{name}"] = sum(present) / max(1, len(present))
        rewards = weighted_total(per_function, s.reward_weights)
        unrewarded = [i for i, r in enumerate(rewards) if r != r]
        if unrewarded:
            raise ValueError(f"{source}: row {unrewarded[0]}: field 'reward': no reward function returned a value")
        advantages = group_advantages(rewards, rollouts["prompt_id"].to_pylist(), scale=s.scale_rewards)

        read_metadata(REFERENCE)
        with engine.running(REFERENCE, cfg.inference, cfg.model.max_len, cfg.seed) as llm:
            ref = engine.token_logprobs(llm, rollouts["prompt_ids"].to_pylist(), completion_ids)

        scored = (rollouts
                  .append_column("rewards", pa.array(list(zip(*per_function, strict=True)), pa.list_(pa.float32())))
                  .append_column("reward", pa.array(rewards, pa.float32()))
                  .append_column("advantage", pa.array(advantages, pa.float32()))
                  .append_column("ref_logprobs", pa.array(ref, pa.list_(pa.float32()))))
        write_table(scored, SCORED_FIELDS, Path(f"data/scored/{args.iteration}.parquet"))
        groups = rollouts["prompt_id"].to_pylist()
        spread: dict[int, set[float]] = {}
        for reward, group in zip(rewards, groups, strict=True):
            spread.setdefault(group, set()).add(reward)
        zero_var = sum(len(values) == 1 for values in spread.values())
        metrics.update({"reward_mean": sum(rewards) / len(rewards), "rollouts": len(rewards),
                        "groups_zero_variance": zero_var, "groups": len(spread)})
    write_json(Path(f"metrics/score/{args.iteration}.json"), metrics)
    print(f"score {args.iteration}: mean reward {metrics['reward_mean']:.3f}, "
          f"{zero_var}/{metrics['groups']} groups without reward variance")
