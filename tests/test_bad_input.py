"""Bad input to a real stage: one clear line naming the file, row and field (or the endpoint), exit status 1, and
nothing already written changed. Each case writes its input under iteration 009 of a clone of the scored
workspace, runs the stage on it, and compares every file under data/, checkpoints/ and metrics/, and dvc.lock,
with what they held before."""

import hashlib
import json
import shutil
import socket
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import clone, run, with_tests_on_path

from burstrl.data.policy import tokenizer_hash

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def ws(scored, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad") / "ws"
    env = clone(scored, root)
    return root, with_tests_on_path(env)


def snapshot(root: Path) -> dict[str, str]:
    files = [root / "dvc.lock", *(p for d in ("data", "checkpoints", "metrics") for p in (root / d).rglob("*")
                                  if p.is_file())]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def fails(ws, cmd: list[str], params: dict | None = None) -> str:
    """Run stage `cmd` with `params` merged over params.yaml; check that it exits 1 and changes nothing; return the
    last line it printed to stderr."""
    root, env = ws
    if params:
        merged = yaml.safe_load((root / "params.yaml").read_text())
        for section, values in params.items():
            merged[section].update(values)
        (root / "bad-params.yaml").write_text(yaml.safe_dump(merged))
        cmd = [*cmd, "--params", "bad-params.yaml"]
    before = snapshot(root)
    done = run([sys.executable, *cmd], root, env, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert snapshot(root) == before
    return done.stderr.strip().splitlines()[-1]


def bad_rollouts(ws, change) -> list[dict]:
    """data/rollouts/009.parquet: iteration 001's rollouts with `change(rows)` applied; returns the rows."""
    root, _ = ws
    table = pq.read_table(root / "data/rollouts/001.parquet")
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), root / "data/rollouts/009.parquet")
    return rows


def identity(rows: list[dict], row: int) -> str:
    return f"row {row} (prompt_id={rows[row]['prompt_id']}, sample_index={rows[row]['sample_index']})"


def test_empty_completion_ids(ws):
    def empty(rows):
        rows[2].update(completion_ids=[], completion_mask=[], sampler_logprobs=[])
    where = identity(bad_rollouts(ws, empty), 2)
    assert fails(ws, ["stages/score.py", "009"]) == (
        f"score: error: data/rollouts/009.parquet: {where}: field 'completion_ids': is empty")


def test_unknown_finish_reason(ws):
    where = identity(bad_rollouts(ws, lambda rows: rows[2].update(finish_reason="abort")), 2)
    assert fails(ws, ["stages/score.py", "009"]) == (
        f"score: error: data/rollouts/009.parquet: {where}: field 'finish_reason': is 'abort', expected one of "
        "['done', 'length', 'max_turns', 'stop']")


def test_a_file_of_no_rows(ws):
    bad_rollouts(ws, lambda rows: rows.clear())
    assert fails(ws, ["stages/score.py", "009"]) == (
        "score: error: data/rollouts/009.parquet: has 0 rows; a batch of rollouts needs at least one group")


def test_ref_logprobs_null_in_some_rows_only(ws):
    root, _ = ws
    table = pq.read_table(root / "data/scored/001.parquet")
    rows = table.to_pylist()
    rows[2]["ref_logprobs"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), root / "data/scored/009.parquet")
    assert fails(ws, ["stages/train.py", "009", "000"]) == (
        f"train: error: data/scored/009.parquet: {identity(rows, 2)}: field 'ref_logprobs': is null in some rows "
        "only; it is all or nothing")


def test_a_teacher_that_tokenizes_otherwise(ws):
    root, _ = ws
    teacher = root / "build/other-teacher"
    shutil.copytree(root / "checkpoints/000", teacher, ignore=shutil.ignore_patterns("burstrl.json"))
    vocabulary = json.loads((teacher / "tokenizer.json").read_text())
    vocabulary["added_tokens"] = vocabulary.get("added_tokens", []) + [  # one token more: other ids for text
        {"id": 99999, "content": "<extra>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}]
    (teacher / "tokenizer.json").write_text(json.dumps(vocabulary))
    rows = bad_rollouts(ws, lambda rows: None)
    line = fails(ws, ["stages/score.py", "009"], {"score": {"teacher": "build/other-teacher"}, "train": {"beta": 0.0}})
    assert line == (f"score: error: data/rollouts/009.parquet: {identity(rows, 0)}: field 'tokenizer_hash': is "
                    f"{rows[0]['tokenizer_hash'][:12]}, but build/other-teacher tokenizes with "
                    f"{tokenizer_hash(teacher)[:12]}: its token ids would mean other text")


def test_distillation_from_a_batch_scored_without_a_teacher(ws):
    root, _ = ws
    shutil.copy(root / "data/scored/001.parquet", root / "data/scored/009.parquet")
    assert fails(ws, ["stages/train.py", "009", "000"], {"score": {"teacher": "checkpoints/000"},
                                                          "train": {"objective": "grpo+distill"}}) == (
        "train: error: data/scored/009.parquet: field 'teacher_logprobs': scored without a teacher (score.teacher "
        "was empty when score ran), but train.objective is grpo+distill")


@pytest.mark.parametrize(("name", "shown"), [("nan", "nan"), ("inf", "inf"), ("text", "'1.0'")])
def test_a_reward_function_returning_a_non_number(ws, name, shown):
    where = identity(bad_rollouts(ws, lambda rows: None), 1)
    params = {"score": {"reward_funcs": [f"reward_faults.{name}"], "reward_weights": [1.0]}}
    assert fails(ws, ["stages/score.py", "009"], params) == (
        f"score: error: data/rollouts/009.parquet: {where}: field 'rewards': reward "
        f"function reward_faults.{name} returned {shown}; it must return a finite number, or None for a row it "
        "does not apply to")


def test_a_reward_function_returning_too_few_values(ws):
    bad_rollouts(ws, lambda rows: None)
    params = {"score": {"reward_funcs": ["reward_faults.short"], "reward_weights": [1.0]}}
    assert fails(ws, ["stages/score.py", "009"], params) == (
        "score: error: data/rollouts/009.parquet: reward function reward_faults.short returned 31 values for 32 rows")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_endpoint_down(ws):
    urls = [f"http://127.0.0.1:{closed_port()}" for _ in range(2)]
    line = fails(ws, ["stages/generate.py", "009", "000"], {"servers": {"policy": urls, "wait_seconds": 2.0}})
    assert line.startswith(f"generate: error: no endpoint of servers.policy answered for 2s: {urls[0]}: ")
    assert f"; {urls[1]}: " in line and "Connection refused" in line
