"""The data contract between stages: every Parquet schema and policy directory, and its invariants.

Rollouts (generate -> score), one row per completion:
  - a group is all rows of one `prompt_id`; its `sample_index` values are exactly 0..n-1 with n >= 2;
  - `prompt_ids` and `completion_ids` are the token ids the sampler saw and produced; text columns are for
    humans and reward functions only and are never re-tokenized;
  - `completion_mask[i]` is 1 where the policy sampled `completion_ids[i]` and 0 where the environment put it
    (a tool result rendered by the chat template, docs/environments.md); same length, starts with 1;
  - `sampler_logprobs[i]` is the sampler's logprob of `completion_ids[i]` at `temperature` where the mask is 1
    (finite, <= 0) and null exactly where it is 0; same length;
  - an episode's `num_turns` >= 1 model turns made `tool_calls` >= `tool_errors` >= 0 calls; a single completion is
    one turn with none. `completion_messages` is its chat (JSON: the assistant and tool messages) or null for a
    single completion; `env_reward` is its environment's `get_reward()` (or numeric `reward`) or null;
  - `policy_version` / `policy_hash` name the checkpoint that sampled the row; `sampler_weights` says which
    copy of it the sampler ran: "checkpoint" for its own files, else the label of a derived copy (quantized,
    or perturbed in tests), whose mismatch the train stage's importance weights correct;
  - `tokenizer_hash` is the sampler's tokenizer (burstrl.data.policy.tokenizer_hash): a stage that feeds the ids
    to another policy checks that it tokenizes the same way (`check_tokens`) and that every id is in its
    vocabulary.
Scored rollouts (score -> train) add:
  - `rewards`: one value per reward function, in the order of `score.reward_funcs`; `reward` their weighted sum;
  - `advantage`: group-relative, so it sums to ~0 within each group;
  - `ref_logprobs`: the frozen reference's logprob of each completion token at temperature 1, same length as
    `completion_ids`, finite, <= 0 (environment tokens too: the KL term uses only the mask's 1s); null in every
    row when score ran with train.beta = 0 (no KL term);
  - with score.teacher only (TEACHER_FIELDS): `teacher_logprobs`, the teacher's logprob of each completion token
    at temperature 1 (as `ref_logprobs`); `teacher_topk_ids` and `teacher_topk_logprobs`, at each token the ids
    and logprobs of the teacher's score.teacher_top_k most likely tokens, most likely first (the same k in
    every row; the tail's mass is 1 - the sum of their probabilities, so at least 0).
Importance weights (train -> people and tests), one row per scored row, in the same order:
  - `staleness`: policy versions the sampler lagged the checkpoint training started from;
  - `keep`: whether the loss used the row (see burstrl.rl.selection.select_rows);
  - `proximal_logprobs`: the trainer's logprob of each completion token when the batch arrived;
  - `is_weights`: the importance weight each token's loss term was multiplied by (burstrl.rl.objective); null at an
    episode's environment tokens, which are no terms of the loss.
Task tables (prepare -> bootstrap, generate, eval): `prompt_id` int64 and unique, `prompt` and `answer`
  strings; any other columns are task fields.
Task columns (e.g. `answer`) ride along unchanged so reward functions receive them as keyword arguments.

Readers call `read_rollouts` / `read_scored`, which check all of the above (and that the file has a row) and raise
`ContractError` naming the file, the row and the field.
"""

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from burstrl.atomic import write_parquet
from burstrl.errors import ContractError

TASK_FIELDS = [pa.field("prompt_id", pa.int64()), pa.field("prompt", pa.string()), pa.field("answer", pa.string())]
ROLLOUT_FIELDS = [
    pa.field("prompt_id", pa.int64()),
    pa.field("sample_index", pa.int32()),
    pa.field("prompt", pa.string()),
    pa.field("prompt_ids", pa.list_(pa.int32())),
    pa.field("completion", pa.string()),
    pa.field("completion_ids", pa.list_(pa.int32())),
    pa.field("completion_mask", pa.list_(pa.int8())),
    pa.field("sampler_logprobs", pa.list_(pa.float32())),
    pa.field("finish_reason", pa.string()),
    pa.field("num_turns", pa.int32()),
    pa.field("tool_calls", pa.int32()),
    pa.field("tool_errors", pa.int32()),
    pa.field("completion_messages", pa.string()),
    pa.field("env_reward", pa.float32()),
    pa.field("policy_version", pa.string()),
    pa.field("policy_hash", pa.string()),
    pa.field("sampler_weights", pa.string()),
    pa.field("tokenizer_hash", pa.string()),
    pa.field("temperature", pa.float32()),
    pa.field("top_p", pa.float32()),
    pa.field("seed", pa.int64()),
]
SCORED_FIELDS = ROLLOUT_FIELDS + [
    pa.field("rewards", pa.list_(pa.float32())),
    pa.field("reward", pa.float32()),
    pa.field("advantage", pa.float32()),
    pa.field("ref_logprobs", pa.list_(pa.float32())),
]
# Present, all three, exactly when score ran with score.teacher (on-policy distillation).
TEACHER_FIELDS = [
    pa.field("teacher_logprobs", pa.list_(pa.float32())),
    pa.field("teacher_topk_ids", pa.list_(pa.list_(pa.int32()))),
    pa.field("teacher_topk_logprobs", pa.list_(pa.list_(pa.float32()))),
]
WEIGHT_FIELDS = [
    pa.field("prompt_id", pa.int64()),
    pa.field("sample_index", pa.int32()),
    pa.field("staleness", pa.int32()),
    pa.field("keep", pa.bool_()),
    pa.field("proximal_logprobs", pa.list_(pa.float32())),
    pa.field("is_weights", pa.list_(pa.float32())),
]
# An episode can also end on its last allowed turn with a call unanswered, or by its environment.
FINISH_REASONS = {"stop", "length", "max_turns", "done"}


def fail(path, row, field, problem, table=None):
    where = f"row {row}"
    if table is not None and row is not None and {"prompt_id", "sample_index"} <= set(table.column_names):
        where += f" (prompt_id={table['prompt_id'][row].as_py()}, sample_index={table['sample_index'][row].as_py()})"
    raise ContractError(f"{path}: {where if row is not None else 'schema'}: field '{field}': {problem}")


def _read(path: Path, fields: list[pa.Field]) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as err:
        raise ContractError(f"{path}: not a readable Parquet file: {err}") from err
    for f in fields:
        if f.name not in table.column_names:
            fail(path, None, f.name, "column is missing")
        if table.schema.field(f.name).type != f.type:
            fail(path, None, f.name, f"dtype is {table.schema.field(f.name).type}, expected {f.type}")
    return table


def _check_logprobs(path, table, name, masks=None):
    """Logprobs line up with the completion tokens; with `masks`, they are present exactly where the mask is 1."""
    lengths = table["completion_ids"].to_pylist()
    for row, values in enumerate(table[name].to_pylist()):
        if len(values) != len(lengths[row]):
            fail(path, row, name, f"has {len(values)} values for {len(lengths[row])} completion tokens", table)
        mask = masks[row] if masks is not None else [1] * len(values)
        for i, (v, m) in enumerate(zip(values, mask, strict=True)):
            if m == 0 and v is not None:
                fail(path, row, name, f"holds {v} at environment token {i}; it must be null where the mask is 0",
                     table)
            if m == 1 and (v is None or not math.isfinite(v) or v > 0):
                fail(path, row, name, f"holds {v} at token {i}; logprobs must be finite and <= 0", table)


def _check_episodes(path, table):
    lengths = table["completion_ids"].to_pylist()
    masks = table["completion_mask"].to_pylist()
    for row, mask in enumerate(masks):
        if len(mask) != len(lengths[row]):
            fail(path, row, "completion_mask", f"has {len(mask)} values for {len(lengths[row])} completion tokens",
                 table)
        if set(mask) - {0, 1} or (mask and mask[0] != 1):
            fail(path, row, "completion_mask", "must hold only 0 and 1 and start with a policy token (1)", table)
    counts = zip(table["num_turns"].to_pylist(), table["tool_calls"].to_pylist(), table["tool_errors"].to_pylist(),
                 strict=True)
    for row, (turns, calls, errors) in enumerate(counts):
        if turns is None or turns < 1 or calls is None or errors is None or not 0 <= errors <= calls:
            fail(path, row, "num_turns", f"turns={turns}, tool_calls={calls}, tool_errors={errors}: need turns >= 1 "
                 "and tool_calls >= tool_errors >= 0", table)
    for row, text in enumerate(table["completion_messages"].to_pylist()):
        if text is not None:
            try:
                messages = json.loads(text)
            except json.JSONDecodeError as err:
                fail(path, row, "completion_messages", f"is not JSON: {err}", table)
            if not isinstance(messages, list) or not messages:
                fail(path, row, "completion_messages", "must be a non-empty list of chat messages", table)
    return masks


def _check_groups(path, table):
    groups: dict[int, list[tuple[int, int]]] = {}
    pairs = zip(table["prompt_id"].to_pylist(), table["sample_index"].to_pylist(), strict=True)
    for row, (pid, idx) in enumerate(pairs):
        groups.setdefault(pid, []).append((idx, row))
    for pid, members in groups.items():
        indices = sorted(i for i, _ in members)
        first_row = min(r for _, r in members)
        if len(members) < 2:
            fail(path, first_row, "prompt_id", f"group {pid} has {len(members)} completion; GRPO needs >= 2", table)
        if indices != list(range(len(members))):
            fail(path, first_row, "sample_index", f"group {pid} has indices {indices}, expected 0..{len(members) - 1}",
                  table)


def _check_rollouts(path, table):
    if len(table) == 0:
        raise ContractError(f"{path}: has 0 rows; a batch of rollouts needs at least one group")
    for row, ids in enumerate(table["completion_ids"].to_pylist()):
        if not ids:
            fail(path, row, "completion_ids", "is empty", table)
    for row, reason in enumerate(table["finish_reason"].to_pylist()):
        if reason not in FINISH_REASONS:
            fail(path, row, "finish_reason", f"is {reason!r}, expected one of {sorted(FINISH_REASONS)}", table)
    _check_logprobs(path, table, "sampler_logprobs", _check_episodes(path, table))
    _check_groups(path, table)


def read_task(path: Path) -> pa.Table:
    table = _read(path, TASK_FIELDS)
    seen: set[int] = set()
    for row, pid in enumerate(table["prompt_id"].to_pylist()):
        if pid in seen:
            fail(path, row, "prompt_id", f"{pid} appears twice")
        seen.add(pid)
    return table


def read_rollouts(path: Path) -> pa.Table:
    table = _read(path, ROLLOUT_FIELDS)
    _check_rollouts(path, table)
    return table


def _check_teacher(path, table):
    _check_logprobs(path, table, "teacher_logprobs")
    lengths = [len(ids) for ids in table["completion_ids"].to_pylist()]
    ids, top = table["teacher_topk_ids"].to_pylist(), table["teacher_topk_logprobs"].to_pylist()
    k = len(ids[0][0]) if ids and ids[0] else None
    for row, (row_ids, row_top) in enumerate(zip(ids, top, strict=True)):
        for name, values in (("teacher_topk_ids", row_ids), ("teacher_topk_logprobs", row_top)):
            if len(values) != lengths[row]:
                fail(path, row, name, f"has {len(values)} positions for {lengths[row]} completion tokens", table)
        for i, (at_ids, at_top) in enumerate(zip(row_ids, row_top, strict=True)):
            if len(at_ids) != k or len(at_top) != k:
                fail(path, row, "teacher_topk_ids", f"has {len(at_ids)} ids and {len(at_top)} logprobs at token {i}; "
                     f"row 0 has {k} (score.teacher_top_k)", table)
            if any(not math.isfinite(v) or v > 0 for v in at_top) or at_top != sorted(at_top, reverse=True):
                fail(path, row, "teacher_topk_logprobs", f"holds {at_top} at token {i}; logprobs must be finite, <= 0 "
                     "and most likely first", table)
            if (mass := sum(math.exp(v) for v in at_top)) > 1 + 1e-3:
                fail(path, row, "teacher_topk_logprobs", f"at token {i} sums to probability {mass:.4f} > 1", table)


def read_scored(path: Path) -> pa.Table:
    table = _read(path, SCORED_FIELDS)
    _check_rollouts(path, table)
    nulls = table["ref_logprobs"].null_count
    if nulls == 0:
        _check_logprobs(path, table, "ref_logprobs")
    elif nulls != len(table):
        row = table["ref_logprobs"].is_null().to_pylist().index(True)
        fail(path, row, "ref_logprobs", "is null in some rows only; it is all or nothing", table)
    if any(f.name in table.column_names for f in TEACHER_FIELDS):
        _check_teacher(path, _read(path, TEACHER_FIELDS))
    for name in ("reward", "advantage"):
        for row, value in enumerate(table[name].to_pylist()):
            if value is None or not math.isfinite(value):
                fail(path, row, name, f"is {value}; must be finite", table)
    sums: dict[int, list[float]] = {}
    for row, (pid, adv) in enumerate(zip(table["prompt_id"].to_pylist(), table["advantage"].to_pylist(), strict=True)):
        entry = sums.setdefault(pid, [0.0, 0.0, row])
        entry[0] += adv
        entry[1] += abs(adv)
    for pid, (total, magnitude, first_row) in sums.items():
        if abs(total) > 1e-3 * max(1.0, magnitude):
            fail(path, first_row, "advantage", f"group {pid} sums to {total:.4g}; group-relative advantages sum to 0",
                  table)
    return table


def check_tokens(path: Path, table: pa.Table, policy: Path, meta: dict) -> None:
    """The rows' token ids mean the same text to `policy` (metadata `meta`) and fit its vocabulary."""
    expected = meta["tokenizer_hash"]
    for row, value in enumerate(table["tokenizer_hash"].to_pylist()):
        if value != expected:
            fail(path, row, "tokenizer_hash", f"is {value[:12]}, but {policy} tokenizes with {expected[:12]}: "
                 "its token ids would mean other text", table)
    vocab = json.loads((policy / "config.json").read_text()).get("vocab_size")
    for name in ("prompt_ids", "completion_ids"):
        flat = pc.list_flatten(table[name])
        if vocab is not None and len(flat) and not (0 <= pc.min(flat).as_py() and pc.max(flat).as_py() < vocab):
            row = next(r for r, ids in enumerate(table[name].to_pylist()) if any(not 0 <= i < vocab for i in ids))
            fail(path, row, name, f"holds a token id outside {policy}'s vocabulary of {vocab}", table)


def write_table(table: pa.Table, fields: list[pa.Field], path: Path) -> None:
    """Write with the contract's column order and types first, then tmp + rename so readers never see half a file."""
    names = [f.name for f in fields]
    extra = [c for c in table.column_names if c not in names]
    write_parquet(table.select(names + extra).cast(pa.schema(fields + [table.schema.field(c) for c in extra])), path)

