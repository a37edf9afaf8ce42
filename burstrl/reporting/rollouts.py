"""Print a few scored rollouts of an iteration, token by token: `python -m burstrl inspect ITER`.

For eyeballing reward hacking and the off-policy correction. Each rollout shows its prompt, completion,
reward and each reward function's value, advantage, finish reason, staleness and whether the loss used it.
Then each token, with the sampler's, the trainer's (proximal) and the reference's logprob and the
importance weight its loss term got. The last two columns need the train stage to have run. An episode
(docs/environments.md) is shown turn by turn: a header before each model turn and each tool result, its
counts of turns, calls and errors, and a `mask` column (1: sampled by the policy, 0: the environment's, with no
sampler logprob and no loss term).
"""

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq
from transformers import AutoTokenizer

from burstrl.config import load_config
from burstrl.data.contract import read_scored
from burstrl.errors import ContractError


def _cell(values: list | None, i: int, fmt: str = "{:+.3f}") -> str:
    return fmt.format(values[i]) if values and values[i] is not None else "-"


def describe(row: dict, weights: dict | None, reward_funcs: list[str], token_text) -> str:
    # Names from the current params; rows scored under other params show positional names instead.
    names = reward_funcs if len(reward_funcs) == len(row["rewards"]) else [f"r{i}" for i in range(len(row["rewards"]))]
    parts = ", ".join(f"{name.split('.')[-1]} {value}" for name, value in zip(names, row["rewards"], strict=True))
    episode = row["completion_messages"] is not None
    lines = [
        f"prompt_id {row['prompt_id']} sample {row['sample_index']}: reward {row['reward']:.3f} ({parts}), "
        f"advantage {row['advantage']:+.3f}, finish {row['finish_reason']}, sampled by {row['policy_version']} "
        f"({row['sampler_weights']})"
        + (f", staleness {weights['staleness']}, {'used' if weights['keep'] else 'left out'}" if weights else ""),
        *([f"  episode: {row['num_turns']} turns, {row['tool_calls']} tool calls, {row['tool_errors']} errors"
           + (f", environment reward {row['env_reward']}" if row["env_reward"] is not None else "")]
          if episode else []),
        f"  prompt:     {row['prompt']!r}",
        f"  completion: {row['completion']!r}",
        f"  {'token':>10}  {'mask':>4}  {'sampler':>8}  {'trainer':>8}  {'ref':>8}  {'is_weight':>9}",
    ]
    proximal = weights["proximal_logprobs"] if weights else None
    is_weights = weights["is_weights"] if weights else None
    mask, turn = row["completion_mask"], 0
    for i, token in enumerate(row["completion_ids"]):
        if episode and (i == 0 or mask[i] != mask[i - 1]):
            turn += mask[i]
            lines.append(f"  -- turn {turn}: model" if mask[i] else "  -- tool result")
        policy = mask[i] == 1
        lines.append(f"  {token_text(token)!r:>10}  {mask[i]:>4}  {_cell(row['sampler_logprobs'], i):>8}  "
                     f"{_cell(proximal, i):>8}  {_cell(row['ref_logprobs'], i):>8}  "
                     f"{_cell(is_weights, i, '{:.3f}') if policy else '-':>9}")
    return "\n".join(lines)


def choose(rows: list[dict], count: int, lowest: bool, prompt_id: int | None) -> list[int]:
    """Indices of the rollouts to show: one prompt's group, or the highest (lowest) rewards."""
    if prompt_id is not None:
        return [i for i, r in enumerate(rows) if r["prompt_id"] == prompt_id]
    order = sorted(range(len(rows)), key=lambda i: rows[i]["reward"], reverse=not lowest)
    return order[:count]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("iteration")
    parser.add_argument("-n", "--rows", type=int, default=4, help="how many rollouts (default 4)")
    parser.add_argument("--lowest", action="store_true", help="the lowest rewards instead of the highest")
    parser.add_argument("--prompt-id", type=int, help="every rollout of this prompt's group instead")
    args = parser.parse_args()
    try:
        scored = read_scored(Path(f"data/scored/{args.iteration}.parquet")).to_pylist()
    except ContractError as err:
        sys.exit(f"inspect: error: {err}")
    weights_path = Path(f"data/weights/{args.iteration}.parquet")
    weights = {(w["prompt_id"], w["sample_index"]): w for w in pq.read_table(weights_path).to_pylist()} \
        if weights_path.is_file() else {}
    tokenizer = AutoTokenizer.from_pretrained(Path("checkpoints/000"))
    funcs = load_config().score.reward_funcs
    for i in choose(scored, args.rows, args.lowest, args.prompt_id):
        row = scored[i]
        print(describe(row, weights.get((row["prompt_id"], row["sample_index"])), funcs,
                       lambda t: tokenizer.decode([t])) + "\n")
