"""bootstrap: build the starting policy (checkpoints/000, also the frozen reference) and evaluate it.

model.source "tiny" builds the embedded character-level Llama and warms it up with a short supervised
run on the task (for task "tools", on chats that use the calculator tool or answer directly); any other
source is a Hugging Face causal LM, copied in (and warmed up if sft_steps > 0).
"""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from burstrl.atomic import staging_dir, write_json
from burstrl.data.contract import read_task
from burstrl.data.policy import publish_policy
from burstrl.env.calculator import tool_demonstrations
from burstrl.inference import engine
from burstrl.pipeline.stage import finish, parse, stage
from burstrl.rl.evaluate import evaluate
from burstrl.training.sft import encode_chats, encode_pairs, supervised_finetune
from burstrl.training.tinymodel import build_model, build_tokenizer, save_policy

OUT = Path("checkpoints/000")

if __name__ == "__main__":
    args, cfg = parse(__doc__)
    metrics: dict = {}
    with stage("bootstrap", metrics):
        torch.manual_seed(cfg.seed)
        if cfg.model.source == "tiny":
            tokenizer = build_tokenizer(chat=cfg.env.enabled)
            model = build_model(tokenizer, cfg.model.hidden_size, cfg.model.layers, cfg.model.max_len)
        else:
            tokenizer = AutoTokenizer.from_pretrained(cfg.model.source)
            model = AutoModelForCausalLM.from_pretrained(cfg.model.source)
            if tokenizer.pad_token is None:  # GPT-2 and others ship none; padding never reaches the loss
                tokenizer.pad_token = tokenizer.eos_token
        train = read_task(Path("data/task/train.parquet"))
        if cfg.bootstrap.sft_steps:
            prompts, answers = train["prompt"].to_pylist(), train["answer"].to_pylist()
            if cfg.env.enabled:  # episodes: warm up on chats, as generate will prompt
                share = cfg.bootstrap.tool_demos if cfg.task.name == "tools" else 0.0
                ids, labels = encode_chats(tokenizer, tool_demonstrations(prompts, answers, share, cfg.seed))
            else:
                ids, labels = encode_pairs(tokenizer, prompts, answers)
            losses = supervised_finetune(model, ids, labels, steps=cfg.bootstrap.sft_steps,
                                         batch_size=cfg.bootstrap.batch_size, lr=cfg.bootstrap.learning_rate,
                                         seed=cfg.seed)
            metrics["sft_final_loss"] = round(sum(losses[-20:]) / len(losses[-20:]), 4)
        tmp = staging_dir(OUT)
        save_policy(model, tokenizer, tmp)
        publish_policy(tmp, OUT, version="000", parent=None, iteration=0)
        metrics["parameters"] = sum(p.numel() for p in model.parameters())

        heldout = read_task(Path("data/task/heldout.parquet"))
        with engine.running(OUT, cfg.inference, cfg.model.max_len, cfg.seed) as llm:
            accuracy = evaluate(llm, tokenizer, heldout, cfg, OUT)
    write_json(Path("metrics/bootstrap.json"), metrics)
    write_json(Path("metrics/eval/000.json"), {**accuracy, "policy_version": "000"})
    print(f"bootstrap: {metrics['parameters']} parameters, held-out accuracy {accuracy['heldout_accuracy']:.3f}")
    finish()
