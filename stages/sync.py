"""sync ITER: rsync checkpoints/ITER to every inference target, verify, publish atomically, write a receipt.

With sync.quantize set, the targets get GPTQ W4A16 weights of the checkpoint instead (burstrl.inference.quantize), in
inference.dtype, calibrated on the first sync.calibration_prompts task prompts with their answers; a server of
them names the variant (`w4a16-gptq-<hash8>`), so the rollouts it samples record it in `sampler_weights`.
"""

import shutil
from pathlib import Path

from transformers import AutoTokenizer

from burstrl.atomic import write_json
from burstrl.data.contract import read_task
from burstrl.data.policy import read_metadata
from burstrl.inference.quantize import quantized_copy
from burstrl.pipeline.stage import parse, stage
from burstrl.remote.sync import sync_checkpoint

if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration")
    metrics: dict = {}
    with stage("sync", metrics):
        src = Path("checkpoints") / args.iteration
        meta = read_metadata(src)
        variant = None
        if cfg.sync.quantize != "none":
            tokenizer = AutoTokenizer.from_pretrained(src)
            rows = read_task(Path("data/task/train.parquet")).slice(0, cfg.sync.calibration_prompts).to_pylist()
            calibration = [tokenizer(r["prompt"] + r["answer"])["input_ids"][:cfg.model.max_len] for r in rows]
            out = Path("build/quantized") / args.iteration
            variant = quantized_copy(src, meta, out, method=cfg.sync.quantize, python=cfg.sync.quantize_python,
                                     dtype=cfg.inference.dtype, calibration=calibration, max_len=cfg.model.max_len)
            src = out
        targets = [sync_checkpoint(src, args.iteration, meta["content_hash"], spec, cfg.sync.ssh_command, variant)
                   for spec in cfg.sync.targets]
        if variant:
            shutil.rmtree(src)  # shipped; the checkpoint and params make it again
    write_json(Path(f"data/sync/{args.iteration}.json"), {
        "policy_version": meta["policy_version"],
        "content_hash": meta["content_hash"],
        "weights": variant or "checkpoint",
        "targets": targets,
        "seconds": metrics["seconds"],
    })
    print(f"sync {args.iteration}: published {variant or 'the checkpoint'} to {', '.join(t['path'] for t in targets)} "
          f"in {metrics['seconds']}s")
