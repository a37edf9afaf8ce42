"""eval ITER: greedy accuracy of checkpoints/ITER on the fixed held-out set -> metrics/eval/ITER.json.

With an environment (env.*), greedy episodes: accuracy with and without tool use and the tool-use rate too.
"""

from pathlib import Path

from transformers import AutoTokenizer

from burstrl.atomic import write_json
from burstrl.data.contract import read_task
from burstrl.data.policy import read_metadata
from burstrl.inference import engine
from burstrl.pipeline.stage import finish, parse, stage
from burstrl.rl.evaluate import evaluate

if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration")
    metrics: dict = {}
    with stage("eval", metrics):
        policy = Path("checkpoints") / args.iteration
        meta = read_metadata(policy)
        tokenizer = AutoTokenizer.from_pretrained(policy)
        heldout = read_task(Path("data/task/heldout.parquet"))
        with engine.running(policy, cfg.inference, cfg.model.max_len, cfg.seed) as llm:
            metrics.update(evaluate(llm, tokenizer, heldout, cfg, policy))
        metrics["policy_version"] = meta["policy_version"]
    write_json(Path(f"metrics/eval/{args.iteration}.json"), metrics)
    print(f"eval {args.iteration}: held-out accuracy {metrics['heldout_accuracy']:.3f}")
    finish()
