"""One rollout batch, two paths: this project's train step and TRL's own GRPOTrainer with its vLLM
importance-sampling correction on. Same loss and same gradients, to float32 round-off.

TRL's path is the stock trainer with one substitution: `_generate_single_turn`, the call into vLLM,
replays the batch's completions and sampler logprobs, because TRL's colocated vLLM cannot run in a CPU
test. Everything after it is TRL's: reward aggregation, group advantages, the proximal forward pass,
the IS ratio, its reference model's logprobs, the loss and its normalizer.
"""

import datasets
import pyarrow as pa
import pytest
import torch
from conftest import completion_logprobs
from trl import GRPOConfig, GRPOTrainer

from burstrl.config import TrainConfig
from burstrl.data.contract import SCORED_FIELDS
from burstrl.rl.advantages import group_advantages
from burstrl.training.tinymodel import build_model, build_tokenizer
from burstrl.training.trainer import RolloutGRPOTrainer, grpo_config

PROMPTS = ["12+30=", "7+8="]
G, MAX_TOKENS, BETA = 4, 4, 0.05


class ReplayedSampler(GRPOTrainer):
    """TRL's GRPOTrainer whose sampler returns fixed completions and their logprobs, prompt by prompt."""

    def __init__(self, *, replay: dict, **kwargs):
        super().__init__(**kwargs)
        self.replay = replay

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        served: dict = {}
        completions, logprobs = [], []
        for ids in prompt_ids:
            k = served[tuple(ids)] = served.get(tuple(ids), -1) + 1
            completion, lps = self.replay[tuple(ids)][k]
            completions.append(completion)
            logprobs.append(lps)
        return completions, logprobs


def loss_and_grads(trainer, inputs):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop before each step
    loss = trainer.compute_loss(trainer.model, trainer._prepare_inputs(inputs))
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in trainer.model.named_parameters()}


def make_batch(tokenizer, prompt_ids, policy, reference):
    """Two groups of G distinct completions (one cut off without EOS), rewards, and sampler logprobs that
    stray from the trainer's enough that some importance weights hit the cap."""
    gen = torch.Generator().manual_seed(1)
    digits = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789"]
    rows = []
    for pid, ids in enumerate(prompt_ids):
        for k in range(G):
            body = [digits[(3 * pid + k) % 10], digits[(k * 7 + 1) % 10]]
            completion = body + [digits[k]] * 2 if k == 3 else body + [tokenizer.eos_token_id]
            noise = torch.rand(len(completion), generator=gen) * 2 - 1  # ratios pi_old / mu in [1/e, e]
            sampler = (torch.tensor(completion_logprobs(policy, ids, completion)) + noise).clamp(max=0.0).tolist()
            rows.append({
                "prompt_id": pid, "sample_index": k, "prompt": PROMPTS[pid], "prompt_ids": ids,
                "completion": tokenizer.decode(completion, skip_special_tokens=True), "completion_ids": completion,
                "completion_mask": [1] * len(completion), "sampler_logprobs": sampler,
                "finish_reason": "length" if k == 3 else "stop", "num_turns": 1, "tool_calls": 0, "tool_errors": 0,
                "completion_messages": None, "env_reward": None,
                "policy_version": "000", "policy_hash": "h", "sampler_weights": "checkpoint", "tokenizer_hash": "t",
                "temperature": 1.0,
                "top_p": 1.0, "seed": pid, "rewards": [float(k % 3)], "reward": float(k % 3),
                "ref_logprobs": completion_logprobs(reference, ids, completion),
            })
    return rows


@pytest.mark.parametrize(("loss_type", "is_mode", "scale", "mask_truncated", "kl_correction"), [
    ("dapo", "token_truncate", "group", False, True),
    ("grpo", "token_mask", "none", True, False),
    ("bnpo", "sequence_truncate", "batch", False, True),
    ("dr_grpo", "sequence_mask", "group", True, False),
])
def test_same_loss_and_gradients_as_trl_with_vllm_is_correction(tmp_path, loss_type, is_mode, scale, mask_truncated,
                                                                kl_correction):
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=64, layers=2, max_len=32).save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    reference = build_model(tokenizer, hidden_size=64, layers=2, max_len=32).eval()
    cap = 1.5
    common = dict(per_device_train_batch_size=2 * G, gradient_accumulation_steps=1, steps_per_generation=1,
                  num_generations=G, max_completion_length=MAX_TOKENS, loss_type=loss_type, epsilon=0.2,
                  epsilon_high=0.28, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", seed=0)

    stock = ReplayedSampler(
        model=str(tmp_path / "policy"), processing_class=tokenizer, replay={},
        reward_funcs=[lambda prompts, completions, completion_ids, **kw: [
            float(rewards[(p, tuple(c))]) for p, c in zip(prompts, completion_ids, strict=True)]],
        args=GRPOConfig(output_dir=str(tmp_path / "stock"), beta=BETA, scale_rewards=scale,
                        mask_truncated_completions=mask_truncated, use_bias_correction_kl=kl_correction,
                        vllm_importance_sampling_mode=is_mode,
                        vllm_importance_sampling_clip_max=cap, **common),
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
    )
    # TRL takes the IS branch only when it drives vLLM itself; the replay stands in for that vLLM.
    stock.use_vllm = stock.vllm_importance_sampling_correction = True
    stock.ref_model.load_state_dict(reference.state_dict())  # TRL loaded the policy's weights as its reference
    prompt_ids = stock._tokenize_prompts(PROMPTS)[0]
    rows = make_batch(tokenizer, prompt_ids, stock.model, reference)
    rewards = {(r["prompt"], tuple(r["completion_ids"])): r["reward"] for r in rows}
    stock.replay = {tuple(ids): [(r["completion_ids"], r["sampler_logprobs"]) for r in rows if r["prompt_id"] == p]
                    for p, ids in enumerate(prompt_ids)}
    advantages = group_advantages([r["reward"] for r in rows], [r["prompt_id"] for r in rows], scale=scale)
    table = pa.Table.from_pylist(rows).append_column("advantage", pa.array(advantages, pa.float32()))
    table = table.select([f.name for f in SCORED_FIELDS]).cast(pa.schema(SCORED_FIELDS))

    train = TrainConfig(batch_size=2 * G, beta=BETA, loss_type=loss_type, epsilon_high=0.28, learning_rate=1e-3,
                        kl_ratio_correction=kl_correction, is_mode=is_mode, is_cap=cap, mask_truncated=mask_truncated)
    keep = [not (mask_truncated and r["finish_reason"] == "length") for r in rows]
    ours = RolloutGRPOTrainer(
        model=str(tmp_path / "policy"), processing_class=tokenizer, train=train,
        args=grpo_config(output_dir=str(tmp_path / "ours"), rollouts=len(rows), train=train, temperature=1.0,
                         max_completion_length=MAX_TOKENS, num_generations=G, seed=0),
        train_dataset=datasets.Dataset(table),
    )

    expected_loss, expected_grads = loss_and_grads(stock, [{"prompt": p} for p in PROMPTS for _ in range(G)])
    loss, grads = loss_and_grads(ours, [{**row, "keep": k} for row, k in zip(table.to_pylist(), keep, strict=True)])

    assert ours.start_metrics["is_clipped_fraction"] > 0  # the cap was reached, so the variant matters
    assert loss == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-7)


MULTI_TURN_PROMPTS = ["12+30+5=", "7+8+9="]


def scripted_episodes(tokenizer, prompt: str) -> list[list[tuple[str, str | None]]]:
    """Four episodes of one prompt as (model turn text, tool result or None) pairs: a direct answer, one call then a
    wrong answer, two calls then the answer, and a call with the wrong operands."""
    a, b, c = (int(x) for x in prompt.rstrip("=").split("+"))
    eos = tokenizer.eos_token
    return [
        [(f"{a + b + c}{eos}", None)],
        [(f"[add{{a:{a},b:{b}}}]{eos}", str(a + b)), (f"{a + b}{eos}", None)],
        [(f"[add{{a:{a},b:{b}}}]{eos}", str(a + b)), (f"[add{{a:{a + b},b:{c}}}]{eos}", str(a + b + c)),
         (f"{a + b + c}{eos}", None)],
        [(f"[add{{a:{a},b:{c}}}]{eos}", str(a + c)), (f"{c}{eos}", None)],
    ]


@pytest.mark.parametrize(("loss_type", "is_mode"), [("dapo", "token_truncate"), ("grpo", "sequence_mask")])
def test_multi_turn_episodes_same_loss_and_gradients_as_trl_tool_calling(tmp_path, loss_type, is_mode):
    """TRL runs the tool itself and builds its tool_mask; this project's rows carry the same episodes with
    completion_mask 0 on the tool-result tokens and no sampler logprob there."""
    from burstrl.env.calculator import add
    from burstrl.env.chat import tool_suffix

    torch.manual_seed(0)
    tokenizer = build_tokenizer(chat=True)
    build_model(tokenizer, hidden_size=64, layers=2, max_len=96).save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    reference = build_model(tokenizer, hidden_size=64, layers=2, max_len=96).eval()
    g, max_tokens, cap = 4, 64, 1.5
    common = dict(per_device_train_batch_size=2 * g, gradient_accumulation_steps=1, steps_per_generation=1,
                  num_generations=g, max_completion_length=max_tokens, loss_type=loss_type, epsilon=0.2,
                  epsilon_high=0.28, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", seed=0)
    stock = ReplayedSampler(
        model=str(tmp_path / "policy"), processing_class=tokenizer, replay={}, tools=[add],
        reward_funcs=[lambda prompts, completions, completion_ids, **kw: [
            float(rewards[tuple(c)]) for c in completion_ids]],
        args=GRPOConfig(output_dir=str(tmp_path / "stock"), beta=BETA, max_tool_calling_iterations=4,
                        vllm_importance_sampling_mode=is_mode, vllm_importance_sampling_clip_max=cap, **common),
        train_dataset=datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": p}]
                                                             for p in MULTI_TURN_PROMPTS]}),
    )
    stock.use_vllm = stock.vllm_importance_sampling_correction = True
    stock.vllm_mode = "server"  # the context ceiling then comes from the model's config, as no engine runs here
    stock.ref_model.load_state_dict(reference.state_dict())
    prompt_ids = stock._tokenize_prompts([[{"role": "user", "content": p}] for p in MULTI_TURN_PROMPTS])[0]

    gen = torch.Generator().manual_seed(1)
    rows, rewards, replay = [], {}, {}
    for pid, (prompt, ids) in enumerate(zip(MULTI_TURN_PROMPTS, prompt_ids, strict=True)):
        for k, turns in enumerate(scripted_episodes(tokenizer, prompt)):
            completion, mask, sampler = [], [], []
            for text, result in turns:
                turn = tokenizer(text, add_special_tokens=False)["input_ids"]
                true = completion_logprobs(stock.model, ids, completion + turn)[len(completion):]
                noise = (torch.rand(len(turn), generator=gen) * 2 - 1).tolist()
                lps = [min(0.0, t + n) for t, n in zip(true, noise, strict=True)]
                replay.setdefault(tuple(ids + completion), []).append((turn, lps))
                completion, mask, sampler = completion + turn, mask + [1] * len(turn), sampler + lps
                if result is not None:
                    suffix = tool_suffix(tokenizer, [{"role": "tool", "name": "add", "content": result}])
                    completion, mask = completion + suffix, mask + [0] * len(suffix)
                    sampler = sampler + [None] * len(suffix)
            reward = float((k * 2 + pid) % 3)
            rewards[tuple(completion)] = reward
            rows.append({
                "prompt_id": pid, "sample_index": k, "prompt": prompt, "prompt_ids": ids,
                "completion": tokenizer.decode(completion, skip_special_tokens=True), "completion_ids": completion,
                "completion_mask": mask, "sampler_logprobs": sampler, "finish_reason": "stop",
                "num_turns": len(turns), "tool_calls": len(turns) - 1, "tool_errors": 0,
                "completion_messages": None,
                "env_reward": None, "policy_version": "000", "policy_hash": "h", "sampler_weights": "checkpoint",
                "tokenizer_hash": "t", "temperature": 1.0, "top_p": 1.0, "seed": pid, "rewards": [reward],
                "reward": reward, "ref_logprobs": completion_logprobs(reference, ids, completion),
            })
    stock.replay = replay
    advantages = group_advantages([r["reward"] for r in rows], [r["prompt_id"] for r in rows], scale="group")
    table = pa.Table.from_pylist(rows).append_column("advantage", pa.array(advantages, pa.float32()))
    table = table.select([f.name for f in SCORED_FIELDS]).cast(pa.schema(SCORED_FIELDS))
    train = TrainConfig(batch_size=2 * g, beta=BETA, loss_type=loss_type, epsilon_high=0.28, learning_rate=1e-3,
                        is_mode=is_mode, is_cap=cap)
    ours = RolloutGRPOTrainer(
        model=str(tmp_path / "policy"), processing_class=tokenizer, train=train,
        args=grpo_config(output_dir=str(tmp_path / "ours"), rollouts=len(rows), train=train, temperature=1.0,
                         max_completion_length=max_tokens, num_generations=g, seed=0),
        train_dataset=datasets.Dataset(table),
    )

    expected_loss, expected_grads = loss_and_grads(stock, [{"prompt": [{"role": "user", "content": p}]}
                                                           for p in MULTI_TURN_PROMPTS for _ in range(g)])
    loss, grads = loss_and_grads(ours, [{**row, "keep": True} for row in table.to_pylist()])

    assert stock._metrics["train"]["tools/call_frequency"]  # TRL ran the tool calls itself
    assert loss == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-7)
