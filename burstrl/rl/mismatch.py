"""How far the sampler mu was from the trainer's policy pi_old, measured on a rollout batch before any update.

Four views of one gap, all from the sampled tokens' logprobs (docs/objective.md, "Measuring the mismatch"):
  - the per-token KL(mu || pi_old) (k3, `sampler_kl`) and the mean |log(pi_old / mu)|;
  - the chi-squared divergence chi2(pi_old || mu) = E_mu[rho^2] - 1 of the raw ratio rho = pi_old / mu, whose
    size bounds the variance the importance weights add;
  - the effective sample size of the weights the loss used, (sum w)^2 / (n sum w^2): 1 when every weight is
    equal, 1/n when one token carries the batch;
  - with the exact policy pi_v the sampler was made from (the unquantized checkpoint of the version that
    sampled), the split of the gap into KL(mu || pi_v), what quantization, precision and the engine's numerics
    cost, and KL(pi_v || pi_old), what staleness costs. Both are k3 estimates on the sampler's tokens.
Pure functions over padded (B, T) tensors and masks, so tests pin them with hand values.
"""

import torch

from burstrl.rl.objective import kl_to_reference, masked_mean, raw_importance_ratio


def effective_sample_size(weights: torch.Tensor, units: torch.Tensor) -> float:
    """(sum w)^2 / (n sum w^2) over the units the mask keeps (tokens, or sequences for the sequence modes)."""
    w = weights * units
    n = units.sum().clamp(min=1.0)
    square_sum = (w**2).sum()
    if square_sum == 0:
        return 0.0  # every weight masked: no sample counts
    return (w.sum() ** 2 / (n * square_sum)).item()


def chi_squared(ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """E_mu[rho^2] - 1 over the masked tokens: 0 when sampler and trainer agree token for token."""
    return masked_mean(ratio**2, mask) - 1.0


def mean_abs_log_ratio(proximal: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> float:
    return masked_mean((proximal - sampler).abs(), mask)


def gap_kl(logps: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """KL(p || q) by k3 on tokens sampled from p, with p's and q's logprobs of them; float round-off clamped."""
    return masked_mean(kl_to_reference(logps, target, "k3").clamp(min=0.0), mask)


def gap_split(sampler: torch.Tensor, exact: torch.Tensor, proximal: torch.Tensor, mask: torch.Tensor) -> dict:
    """The sampler gap (mu vs the exact policy it ran) and the staleness gap (that policy vs pi_old)."""
    return {"quantization_kl": gap_kl(sampler, exact, mask), "staleness_kl": gap_kl(exact, proximal, mask)}


def batch_metrics(proximal, sampler, ratio, weights, mask, units, exact=None) -> dict:
    """Every mismatch metric of one batch: `ratio` is the raw token (or sequence) ratio, `weights` what the loss
    used, `mask` the tokens the loss counts, `units` the mask at the ratio's shape; `exact` may be None (no
    split)."""
    token_ratio = raw_importance_ratio(proximal, sampler, mask, "token_truncate")
    metrics = {
        "sampler_kl": gap_kl(sampler, proximal, mask),
        "log_ratio_abs_mean": mean_abs_log_ratio(proximal, sampler, mask),
        "chi2": chi_squared(token_ratio, mask),
        "is_ess": effective_sample_size(weights, units),
    }
    metrics.update(gap_split(sampler, exact, proximal, mask) if exact is not None
                   else {"quantization_kl": None, "staleness_kl": None})
    return metrics
