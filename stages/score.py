"""score ITER: rewards, group-relative advantages and reference logprobs into data/scored/ITER.parquet.

The reference is the frozen bootstrap policy (checkpoints/000), run in vLLM over prompt + completion token
ids with prompt_logprobs, so its logprobs line up token for token with the sampled completion. With
train.beta = 0 there is no KL term, so the reference is not run and `ref_logprobs` is null.
"""

from pathlib import Path

import pyarrow as pa

from burstrl import engine
from burstrl.advantages import group_advantages, zero_variance_groups
from burstrl.contract import ROLLOUT_FIELDS, SCORED_FIELDS, read_rollouts, write_table
from burstrl.policy import read_metadata
from burstrl.rewards import score_table
from burstrl.stage import finish, parse, stage, write_json

REFERENCE = Path("checkpoints/000")

if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration")
    s = cfg.score
    metrics: dict = {}
    with stage("score", metrics):
        source = Path(f"data/rollouts/{args.iteration}.parquet")
        rollouts = read_rollouts(source)
        contract = {f.name for f in ROLLOUT_FIELDS}
        task_columns = [c for c in rollouts.column_names if c not in contract]
        per_function, rewards = score_table(s.reward_funcs, s.reward_weights, source, rollouts, task_columns,
                                            conversational=s.completion_format == "conversational")
        groups = rollouts["prompt_id"].to_pylist()
        advantages = group_advantages(rewards, groups, baseline=s.advantage_baseline, scale=s.scale_rewards)

        if cfg.train.beta:
            read_metadata(REFERENCE)
            with engine.running(REFERENCE, cfg.inference, cfg.model.max_len, cfg.seed) as llm:
                ref = engine.token_logprobs(llm, rollouts["prompt_ids"].to_pylist(),
                                            rollouts["completion_ids"].to_pylist())
        else:
            print("score: train.beta is 0, so no KL term: skipping reference logprobs (ref_logprobs is null)")
            ref = [None] * len(rollouts)

        scored = (rollouts
                  .append_column("rewards", pa.array(list(zip(*per_function, strict=True)), pa.list_(pa.float32())))
                  .append_column("reward", pa.array(rewards, pa.float32()))
                  .append_column("advantage", pa.array(advantages, pa.float32()))
                  .append_column("ref_logprobs", pa.array(ref, pa.list_(pa.float32()))))
        write_table(scored, SCORED_FIELDS, Path(f"data/scored/{args.iteration}.parquet"))
        for name, values in zip(s.reward_funcs, per_function, strict=True):
            present = [v for v in values if v is not None]
            metrics[f"reward/{name}"] = sum(present) / max(1, len(present))
        metrics.update({"reward_mean": sum(rewards) / len(rewards), "rollouts": len(rewards),
                        "groups": len(set(groups)), "groups_zero_variance": len(zero_variance_groups(rewards, groups)),
                        "reference_logprobs": bool(cfg.train.beta)})
    write_json(Path(f"metrics/score/{args.iteration}.json"), metrics)
    print(f"score {args.iteration}: mean reward {metrics['reward_mean']:.3f}, "
          f"{metrics['groups_zero_variance']}/{metrics['groups']} groups without reward variance")
    finish()
