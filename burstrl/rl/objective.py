"""The GRPO objective on padded (B, T) token tensors: importance weights, KL estimators, clipped surrogate, loss.

docs/objective.md writes the objective out and maps each symbol to a Parquet column or a param. Three
policies meet here: the sampler mu (whatever vLLM ran: a stale, quantized or fp16 copy), the proximal policy
pi_old (the trainer's weights when the rollout batch arrives) and pi_theta (the weights being optimized).
The clipped ratio pi_theta / pi_old is PPO's trust region; the importance weight pi_old / mu corrects for
having sampled from mu at all, truncated or masked so one improbable token cannot dominate (TRL's vLLM
importance-sampling correction, verl's TIS/MIS). Functions are pure so tests pin them with hand values.
"""

from dataclasses import dataclass

import torch

from burstrl.config import IS_MODES, KL_ESTIMATORS, LOSS_TYPES

MAX_LOG_RATIO = 50.0


def kl_to_reference(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the sampled token's logprobs (Schulman's k1, k2, k3).

    With r = log pi_ref - log pi_theta: k1 = -r, k2 = r^2 / 2, k3 = exp(r) - r - 1 (unbiased and >= 0).
    """
    log_ratio = ref_logps - logps
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.exp(log_ratio) - log_ratio - 1
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def raw_importance_ratio(proximal: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """pi_old / mu per token (B, T), or per sequence (B, 1) for the sequence modes (the product of the token
    ratios, or for sequence_geo_mask their geometric mean); padding counts as ratio 1.

    The log ratio is capped at 50 so a long sequence's product stays finite in float32 (and in the metrics);
    any cap or floor a user sets is far inside that, so truncation and masking are unchanged."""
    log_ratio = (proximal - sampler) * mask
    if mode == "sequence_geo_mask":  # the geometric mean of the token ratios: a length-independent band
        log_ratio = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    elif mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)
    return torch.exp(log_ratio.clamp(max=MAX_LOG_RATIO))


def importance_weights(ratio: torch.Tensor, mode: str, cap: float, floor: float) -> torch.Tensor:
    """Truncate the ratio into [floor, cap], or zero it outside that range (the masking variants)."""
    if mode == "none":
        return torch.ones_like(ratio)
    if mode.endswith("truncate"):
        return ratio.clamp(min=floor, max=cap)
    if mode.endswith("mask"):
        return ratio.masked_fill((ratio < floor) | (ratio > cap), 0.0)
    raise ValueError(f"unknown importance-sampling mode {mode!r}; expected one of {IS_MODES}")


def topk_reverse_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """(B, T) reverse KL of the student from the teacher at each position, over the teacher's top k tokens and
    one bucket for the rest: sum_v p_s(v) (log p_s(v) - log p_t(v)) + p_s(tail) (log p_s(tail) - log p_t(tail)),
    from both models' logprobs at those k tokens, (B, T, K). It is the exact KL of the two distributions seen
    through those k + 1 outcomes, so at most the full KL, and differentiable in `student`."""
    tail_s = (1 - student.exp().sum(-1)).clamp(min=1e-8)
    tail_t = (1 - teacher.exp().sum(-1)).clamp(min=1e-8)
    return (student.exp() * (student - teacher)).sum(-1) + tail_s * (tail_s.log() - tail_t.log())


def clipped_surrogate(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, eps_low: float,
                      eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token loss -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) with rho = pi_theta / pi_old,
    and where the clip was binding (what clip fraction counts)."""
    ratio = torch.exp(logps - old_logps)
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    loss = -torch.min(ratio * advantages, ratio.clamp(1 - eps_low, 1 + eps_high) * advantages)
    clipped = ((ratio < 1 - eps_low) & (advantages < 0)) | ((ratio > 1 + eps_high) & (advantages > 0))
    return loss, clipped


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, *, max_completion_length: int,
              token_normalizer: torch.Tensor | float) -> torch.Tensor:
    """Reduce (B, T) to the scalar loss, as TRL names the choices:
    grpo: mean over sequences of each sequence's token mean; bnpo: mean over this batch's tokens;
    dr_grpo: sum / (B * max_completion_length); dapo: sum / `token_normalizer` (the optimizer step's tokens)."""
    masked = per_token * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token.size(0) * max_completion_length)
    if loss_type == "dapo":
        return masked.sum() / token_normalizer
    raise ValueError(f"unknown loss type {loss_type!r}; expected one of {LOSS_TYPES}")


@dataclass
class Terms:
    """The loss and the per-token tensors its metrics are computed from."""

    loss: torch.Tensor
    kl: torch.Tensor | None
    clipped: torch.Tensor


def grpo_loss(logps, old_logps, advantages, is_weights, ref_logps, mask, *, beta: float, kl_estimator: str,
              kl_ratio_correction: bool, eps_low: float, eps_high: float, loss_type: str,
              max_completion_length: int, token_normalizer, entropies=None, entropy_coef: float = 0.0,
              distill=None, distill_coef: float = 0.0, rewards: bool = True) -> Terms:
    """L = agg( w * surrogate + beta * c * KL - entropy_coef * H + distill_coef * D ): the IS weight w scales the
    policy-gradient term only, as in TRL; c = pi_theta / pi_old with kl_ratio_correction (its value is 1 until
    the weights move, its gradient is not 0), else 1; H is the policy's entropy at each token, a bonus against
    entropy collapse; D the per-token reverse KL to a teacher (`topk_reverse_kl`). Without `rewards` the
    surrogate is left out: distillation alone."""
    surrogate, clipped = clipped_surrogate(logps, old_logps, advantages, eps_low, eps_high)
    per_token = surrogate * is_weights if rewards else torch.zeros_like(logps)
    kl = None
    if beta != 0.0:
        kl = kl_to_reference(logps, ref_logps, kl_estimator)
        penalty = kl * torch.exp(logps - old_logps) if kl_ratio_correction else kl
        per_token = per_token + beta * penalty
    if entropy_coef != 0.0:
        per_token = per_token - entropy_coef * entropies
    if distill is not None:
        per_token = per_token + distill_coef * distill
    loss = aggregate(per_token, mask, loss_type, max_completion_length=max_completion_length,
                     token_normalizer=token_normalizer)
    return Terms(loss, kl, clipped)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return ((values * mask).sum() / mask.sum().clamp(min=1.0)).item()
