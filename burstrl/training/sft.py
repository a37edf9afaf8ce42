"""Supervised warm-up of the embedded policy: next-token loss on the answer tokens only.

GRPO needs a policy that is sometimes right (a group with all-zero rewards has no gradient), so the
bootstrap stage trains the from-scratch model briefly on (prompt, answer) pairs, stopping well short of
mastery so that the RL iterations have headroom to show.
"""

import time

import torch

from burstrl.env.chat import rendered_episode


def encode_pairs(tokenizer, prompts: list[str], answers: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and labels (-100 everywhere but the answer and its EOS)."""
    rows, labels = [], []
    for prompt, answer in zip(prompts, answers, strict=True):
        p = tokenizer(prompt)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + a)
        labels.append([-100] * len(p) + a)
    return _padded(tokenizer, rows, labels)


def encode_chats(tokenizer, chats: list[list[dict]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Chats rendered by the chat template, labelled only where the assistant writes: as in an episode, the
    prompt and the tool results (mask 0) are context, never targets."""
    rows, labels = [], []
    for messages in chats:
        ids, mask = rendered_episode(tokenizer, messages)
        rows.append(ids)
        labels.append([tok if m else -100 for tok, m in zip(ids, mask, strict=True)])
    return _padded(tokenizer, rows, labels)


def _padded(tokenizer, rows, labels):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
    return ids, lab


def supervised_finetune(model, ids, labels, *, steps: int, batch_size: int, lr: float, seed: int) -> list[float]:
    """AdamW on random minibatches for `steps` steps; returns the loss of each step."""
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    start = time.monotonic()
    for step in range(steps):
        idx = torch.randint(0, ids.shape[0], (batch_size,), generator=generator)
        attention = (ids[idx] != model.config.pad_token_id).long()
        loss = model(input_ids=ids[idx], attention_mask=attention, labels=labels[idx]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 200 == 0:
            print(f"sft step {step}/{steps} loss {loss.item():.3f} ({time.monotonic() - start:.0f}s)", flush=True)
    model.eval()
    return losses
