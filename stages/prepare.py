"""prepare: write the task's fixed train and held-out prompt tables to data/task/."""

from pathlib import Path

from burstrl.atomic import write_parquet
from burstrl.data.task import load_task
from burstrl.pipeline.stage import parse, stage

if __name__ == "__main__":
    args, cfg = parse(__doc__)
    with stage("prepare", {}):
        t = cfg.task
        train, heldout = load_task(t.name, seed=cfg.seed, heldout_size=t.heldout_size, train_split=t.train_split,
                                   heldout_split=t.heldout_split, prompt_column=t.prompt_column,
                                   answer_column=t.answer_column)
        write_parquet(train, Path("data/task/train.parquet"))
        write_parquet(heldout, Path("data/task/heldout.parquet"))
        print(f"prepare: {len(train)} train and {len(heldout)} held-out prompts")
