"""The embedded verifiable tasks: two-digit addition ("addition") and three-number addition for the calculator
tool ("tools", burstrl.env.calculator), each with fixed train and held-out splits.

A task file is Parquet with one row per prompt: `prompt_id` (int64, unique), `prompt` (the text the
policy sees) and `answer` (the text a correct completion must equal after stripping). Any other
columns are passed to reward functions as keyword arguments, as TRL does with dataset columns.
"""

import random

import pyarrow as pa

from burstrl.data.contract import TASK_FIELDS
from burstrl.errors import ConfigError, ContractError

TOOLS_TRAIN_SIZE = 20_000


def addition_problems(seed: int, heldout_size: int, max_operand: int = 99) -> tuple[pa.Table, pa.Table]:
    """Every `a+b=` with operands in [0, max_operand], split by a seeded shuffle.

    Returns (train, heldout); heldout is the first `heldout_size` pairs of the shuffle, so it is the same
    for every run with the same seed and never overlaps train.
    """
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if not 0 < heldout_size < len(pairs):
        raise ConfigError(f"task.heldout_size must be in (0, {len(pairs)}), got {heldout_size}")
    random.Random(seed).shuffle(pairs)

    def table(rows: list[tuple[int, int]], first_id: int) -> pa.Table:
        return pa.table(
            {
                "prompt_id": [first_id + i for i in range(len(rows))],
                "prompt": [f"{a}+{b}=" for a, b in rows],
                "answer": [str(a + b) for a, b in rows],
            },
            schema=pa.schema(TASK_FIELDS),
        )

    return table(pairs[heldout_size:], heldout_size), table(pairs[:heldout_size], 0)


def three_number_problems(seed: int, heldout_size: int, max_operand: int = 99) -> tuple[pa.Table, pa.Table]:
    """(train, heldout) tables of distinct `a+b+c=` prompts, heldout first in a seeded draw so the splits never
    overlap."""
    if not 0 < heldout_size < TOOLS_TRAIN_SIZE:
        raise ConfigError(f"task.heldout_size must be in (0, {TOOLS_TRAIN_SIZE}) for task tools, got {heldout_size}")
    rng = random.Random(f"tools:{seed}")
    seen: set[tuple[int, int, int]] = set()
    while len(seen) < TOOLS_TRAIN_SIZE + heldout_size:
        seen.add((rng.randint(0, max_operand), rng.randint(0, max_operand), rng.randint(0, max_operand)))
    triples = sorted(seen)
    rng.shuffle(triples)

    def table(rows, first_id):
        return pa.table({"prompt_id": list(range(first_id, first_id + len(rows))),
                         "prompt": [f"{a}+{b}+{c}=" for a, b, c in rows],
                         "answer": [str(a + b + c) for a, b, c in rows]}, schema=pa.schema(TASK_FIELDS))

    return table(triples[heldout_size:], heldout_size), table(triples[:heldout_size], 0)


def load_task(name: str, *, seed: int, heldout_size: int, train_split: str, heldout_split: str,
              prompt_column: str, answer_column: str) -> tuple[pa.Table, pa.Table]:
    """(train, heldout) task tables: the embedded addition task, or any `datasets` dataset with the two columns."""
    if name == "addition":
        return addition_problems(seed, heldout_size)
    if name == "tools":
        return three_number_problems(seed, heldout_size)
    import datasets

    tables = []
    first_id = 0
    for split, limit in ((train_split, None), (heldout_split, heldout_size)):
        ds = datasets.load_dataset(name, split=split)
        for column in (prompt_column, answer_column):
            if column not in ds.column_names:
                raise ContractError(f"task {name} split {split}: column '{column}' missing (has {ds.column_names})")
        if limit is not None:
            ds = ds.select(range(min(limit, len(ds))))
        table = ds.data.table
        # The contract's names are added beside the task's own, so a reward function that asks for the
        # task's column by its name (TRL's accuracy_reward wants `solution`) still receives it.
        for name, column in (("prompt", prompt_column), ("answer", answer_column)):
            if name not in table.column_names:
                table = table.append_column(name, table[column])
        ids = pa.array(range(first_id, first_id + len(table)), pa.int64())
        tables.append(table.add_column(0, "prompt_id", ids))
        first_id += len(table)
    return tables[0], tables[1]


def check_fits(prompts: pa.Table, prompt_ids: list[list[int]], max_tokens: int, max_len: int) -> None:
    """Prompt plus the longest completion must stay below max_len: the score stage feeds the pair back to
    vLLM as a prompt, and vLLM needs room for one more token after it."""
    for row, ids in enumerate(prompt_ids):
        if len(ids) + max_tokens >= max_len:
            pid = prompts["prompt_id"][row].as_py()
            raise ContractError(f"data/task/train.parquet: prompt_id {pid}: field 'prompt': {len(ids)} tokens + "
                                f"generate.max_tokens={max_tokens} must be < model.max_len={max_len}")


def draw_prompts(train: pa.Table, n: int, *, seed: int, iteration: int) -> pa.Table:
    """The `n` prompts of one iteration: a seeded draw without replacement, the same on every re-run."""
    if n > len(train):
        raise ConfigError(f"generate.prompts_per_iteration={n} exceeds the {len(train)} train prompts")
    rows = random.Random(f"{seed}:{iteration}").sample(range(len(train)), n)
    return train.take(sorted(rows))
