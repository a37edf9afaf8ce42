"""A deliberately mismatched sampler, end to end: rollouts sampled by a perturbed copy of the policy (what a
quantized or stale inference box amounts to), scored and trained on by the real stages.

The train stage must see the gap (its sampler-vs-trainer KL, chi-squared, effective sample size, and on a
stale batch the gap split into the sampler's part and staleness), weight each token by pi_old / sampler truncated
at the cap (checked by hand against a separate Hugging Face forward pass), and still train to finite weights.
The workspace is a clone of the session's bootstrapped one.
"""

import json
import math
import shutil

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import NOISE, clone, completion_logprobs, noisy_weights, run
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from burstrl.data.policy import mark_derived, read_metadata

pytestmark = pytest.mark.slow

PARAMS = {"generate": {"prompts_per_iteration": 16}, "train": {"batch_size": 32, "is_cap": 1.5}}


def mismatch_by_hand(sampler, exact, proximal) -> dict:
    """The mismatch metrics of flat token lists (every token counted; train's default is_mode truncates at 1.5)."""

    def k3(r):
        return math.exp(r) - r - 1

    def mean(values):
        return sum(values) / len(values)

    rho = [math.exp(p - s) for p, s in zip(proximal, sampler, strict=True)]
    weights = [min(r, 1.5) for r in rho]
    return {
        "sampler_kl": mean([k3(p - s) for p, s in zip(proximal, sampler, strict=True)]),
        "log_ratio_abs_mean": mean([abs(p - s) for p, s in zip(proximal, sampler, strict=True)]),
        "chi2": mean([r * r for r in rho]) - 1,
        "is_ess": sum(weights) ** 2 / (len(weights) * sum(w * w for w in weights)),
        "quantization_kl": mean([k3(e - s) for e, s in zip(exact, sampler, strict=True)]),
        "staleness_kl": mean([k3(p - e) for p, e in zip(proximal, exact, strict=True)]),
    }


def test_mismatched_sampler_is_measured_and_corrected(bootstrapped, tmp_path):
    root = tmp_path / "ws"
    env = clone(bootstrapped, root, PARAMS)
    noisy_weights(root / "checkpoints/000", root / "build/perturbed")
    mark_derived(root / "build/perturbed", read_metadata(root / "checkpoints/000"), f"perturbed-{NOISE}")
    run(["python", "stages/generate.py", "001", "000", "--weights", "build/perturbed"], root, env)
    # Score cannot draw again with weights only generate's --weights ran: resampling is refused, by name.
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["score"]["zero_variance"] = "resample"
    (root / "resample.yaml").write_text(yaml.safe_dump(params))
    refused = run(["python", "stages/score.py", "001", "--params", "resample.yaml"], root, env, check=False)
    assert refused.returncode == 1 and (f"score.zero_variance resample: data/rollouts/001.parquet was sampled by "
                                        f"perturbed-{NOISE}, which score cannot run offline") in refused.stderr
    assert not (root / "data/scored/001.parquet").exists()
    run(["python", "stages/score.py", "001"], root, env)
    out = run(["python", "stages/train.py", "001", "000"], root, env).stdout

    rollouts = pq.read_table(root / "data/rollouts/001.parquet").to_pylist()
    weights = pq.read_table(root / "data/weights/001.parquet").to_pylist()
    metrics = json.loads((root / "metrics/train/001.json").read_text())
    assert {r["sampler_weights"] for r in rollouts} == {f"perturbed-{NOISE}"}
    assert {r["policy_version"] for r in rollouts} == {"000"}  # sampled "by" 000, through its perturbed copy

    # The gap, by hand: KL(sampler || trainer) estimated with k3 on the sampled tokens.
    policy = AutoModelForCausalLM.from_pretrained(root / "checkpoints/000").eval()
    exact = [completion_logprobs(policy, row["prompt_ids"], row["completion_ids"]) for row in rollouts]
    sampler = [t for row in rollouts for t in row["sampler_logprobs"]]
    hand_weights = [[min(math.exp(p - s), 1.5) for p, s in zip(proximal, row["sampler_logprobs"], strict=True)]
                    for proximal, row in zip(exact, rollouts, strict=True)]
    hand = mismatch_by_hand(sampler, [t for row in exact for t in row], [t for row in exact for t in row])
    assert {k: metrics[k] for k in hand} == pytest.approx(hand, rel=1e-3, abs=1e-6)
    assert metrics["sampler_kl"] > 0.05, "a perturbed sampler must show a gap; the same weights show ~0"
    # Sampled by 000's perturbed copy, trained from 000 itself: the whole gap is the sampler's, none staleness.
    assert metrics["quantization_kl"] == pytest.approx(metrics["sampler_kl"]) and metrics["staleness_kl"] == 0
    assert 0 < metrics["is_clipped_fraction"] < 1 and metrics["is_weight_max"] == pytest.approx(1.5)
    for row, hand in zip(weights[:5], hand_weights[:5], strict=True):
        assert row["is_weights"] == pytest.approx(hand, rel=1e-4)
    assert "sampler KL" in out

    assert math.isfinite(metrics["loss"]) and metrics["optimizer_steps"] == 2
    trained = load_file(root / "checkpoints/001/model.safetensors")
    assert all(torch.isfinite(t).all() for t in trained.values())
    assert read_metadata(root / "checkpoints/001")["lineage"][1]["policy_version"] == "000"

    # The same rollouts one version stale: 002 trains from 001, so the gap splits into the sampler's (perturbed
    # 000 against 000) and staleness (000 against 001), each computed here from Hugging Face forward passes.
    shutil.copy(root / "data/scored/001.parquet", root / "data/scored/002.parquet")
    run(["python", "stages/train.py", "002", "001"], root, env)
    stale = json.loads((root / "metrics/train/002.json").read_text())
    trainer = AutoModelForCausalLM.from_pretrained(root / "checkpoints/001").eval()
    proximal = [t for row in rollouts for t in completion_logprobs(trainer, row["prompt_ids"], row["completion_ids"])]
    hand = mismatch_by_hand(sampler, [t for row in exact for t in row], proximal)
    assert {k: stale[k] for k in hand} == pytest.approx(hand, rel=1e-3, abs=1e-6)
    assert stale["staleness"] == {"1": len(rollouts)} and stale["staleness_kl"] > 0

    # Without a KL term, score runs no reference engine and says so; train needs no reference logprobs.
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["beta"] = 0.0
    (root / "beta0.yaml").write_text(yaml.safe_dump(params))
    out = run(["python", "stages/score.py", "001", "--params", "beta0.yaml"], root, env).stdout
    assert "skipping reference logprobs" in out
    assert pq.read_table(root / "data/scored/001.parquet")["ref_logprobs"].null_count == len(rollouts)
    run(["python", "stages/train.py", "001", "000", "--params", "beta0.yaml"], root, env)
    assert "kl" not in json.loads((root / "metrics/train/001.json").read_text())
