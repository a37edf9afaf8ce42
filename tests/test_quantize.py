"""sync.quantize: the sync stage ships GPTQ W4A16 weights of the checkpoint (llm-compressor, in its own environment),
vLLM serves them, and the rollouts they sample say so."""

import json
import re
import sys

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import REPO, clone, completion_logprobs, run
from test_serving import served_params, start_server, stop, wait_for
from transformers import AutoModelForCausalLM

from burstrl.data.policy import content_hash, policy_name, read_metadata

pytestmark = pytest.mark.slow


def test_sync_quantizes_and_the_server_samples_from_the_quantized_weights(scored, tmp_path):
    root = tmp_path / "ws"
    env = clone(scored, root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["inference"]["dtype"] = "float16"
    params["sync"].update(quantize="gptq", quantize_python=str(REPO / ".venv-quantize" / "bin" / "python"),
                          calibration_prompts=16)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    meta = read_metadata(root / "checkpoints" / "000")
    offline = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()  # sampled by vLLM in fp32, unquantized

    run([sys.executable, "stages/sync.py", "000"], root, env)
    receipt = json.loads((root / "data/sync/000.json").read_text())
    variant = receipt["weights"]
    name = f"{policy_name(meta)}@{variant}"
    assert re.fullmatch("w4a16-gptq-[0-9a-f]{8}", variant)
    assert (root / "build/inference/current").readlink().name == name
    shipped = root / "build/inference" / name
    quant = json.loads((shipped / "config.json").read_text())["quantization_config"]
    weights = quant["config_groups"]["group_0"]["weights"]
    assert (quant["quant_method"], weights["num_bits"], weights["group_size"], quant["ignore"]) == (
        "compressed-tensors", 4, 128, ["lm_head"])
    assert json.loads((shipped / "burstrl.json").read_text()) == {
        "derived_from": {"policy_version": "000", "content_hash": meta["content_hash"]}, "variant": variant}
    assert variant.endswith(content_hash(shipped)[:8])
    for vocabulary in ("tokenizer.json", "tokenizer_config.json"):
        assert (shipped / vocabulary).read_bytes() == (root / "checkpoints/000" / vocabulary).read_bytes()

    proc, url = start_server(root, env, "--watch", "build/inference")
    try:
        wait_for(url, name, proc)
        run([sys.executable, "stages/generate.py", "001", "000", "--params", str(served_params(root, policy=[url]))],
            root, env)
    finally:
        stop(proc)
    rows = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    assert {(r["policy_version"], r["policy_hash"], r["sampler_weights"]) for r in rows} == {
        ("000", meta["content_hash"], variant)}
    assert all(len(r["completion_ids"]) == len(r["sampler_logprobs"]) > 0 for r in rows)
    assert all(lp <= 0 for r in rows for lp in r["sampler_logprobs"])
    # The 4-bit weights did the sampling: their logprobs of the tokens they drew stray from the checkpoint's own
    # (a plain fp32 forward pass, at temperature 1 as sampled) well beyond what serving in fp16 alone moves them,
    # measured by the checkpoint's fp16 forward pass over the same tokens. (Measured here: about 6x.)
    model = AutoModelForCausalLM.from_pretrained(root / "checkpoints" / "000").eval()
    half = AutoModelForCausalLM.from_pretrained(root / "checkpoints" / "000", dtype=torch.float16).eval()
    exact = gap(model, offline, lambda r: r["sampler_logprobs"])
    fp16 = gap(model, rows, lambda r: completion_logprobs(half, r["prompt_ids"], r["completion_ids"]))
    quantized = gap(model, rows, lambda r: r["sampler_logprobs"])
    assert exact < 1e-4, exact
    assert quantized > 3 * fp16, (quantized, fp16)


def gap(model, rows: list[dict], logprobs) -> float:
    """Mean |logprobs(row) - the model's logprob| over every completion token of `rows`."""
    diffs = [abs(a - b) for r in rows for a, b in zip(
        logprobs(r), completion_logprobs(model, r["prompt_ids"], r["completion_ids"]), strict=True)]
    return sum(diffs) / len(diffs)
