"""The objective's pieces on tiny tensors, and the row selection, against values computed by hand."""

import math
from pathlib import Path

import pytest
import torch
from conftest import as_table, rollout_rows

from burstrl.config import TrainConfig
from burstrl.data.contract import SCORED_FIELDS
from burstrl.rl import mismatch, objective
from burstrl.rl.selection import check_batch, select_rows, staleness

LOG = math.log


def approx(values):
    return pytest.approx(values, abs=1e-6)


@pytest.mark.parametrize(("estimator", "expected"), [
    # token 1: pi = 0.5, ref = 0.25, r = log(ref / pi) = -log 2; token 2: pi = 0.25, ref = 0.5, r = log 2
    ("k1", [LOG(2), -LOG(2)]),
    ("k2", [LOG(2) ** 2 / 2, LOG(2) ** 2 / 2]),
    ("k3", [0.5 + LOG(2) - 1, 2 - LOG(2) - 1]),
])
def test_kl_estimators(estimator, expected):
    logps, ref = torch.tensor([[LOG(0.5), LOG(0.25)]]), torch.tensor([[LOG(0.25), LOG(0.5)]])
    assert objective.kl_to_reference(logps, ref, estimator)[0].tolist() == approx(expected)


def test_kl_estimators_vanish_when_policies_agree():
    logps = torch.tensor([[LOG(0.3), LOG(0.9)]])
    for estimator in ("k1", "k2", "k3"):
        assert objective.kl_to_reference(logps, logps.clone(), estimator).abs().max().item() == 0.0


# pi_old = 0.5, 0.2 and mu = 0.1, 0.4 on two tokens: ratios 5 and 0.5, their product 2.5.
PROXIMAL, SAMPLER = torch.tensor([[LOG(0.5), LOG(0.2)]]), torch.tensor([[LOG(0.1), LOG(0.4)]])
FULL = torch.ones(1, 2)


@pytest.mark.parametrize(("mode", "cap", "floor", "expected"), [
    ("token_truncate", 2.0, 0.0, [[2.0, 0.5]]),
    ("token_truncate", 2.0, 0.6, [[2.0, 0.6]]),
    ("token_mask", 2.0, 0.0, [[0.0, 0.5]]),
    ("token_mask", 2.0, 0.6, [[0.0, 0.0]]),
    ("token_mask", 6.0, 0.0, [[5.0, 0.5]]),
    ("sequence_truncate", 2.0, 0.0, [[2.0]]),
    ("sequence_truncate", 3.0, 0.0, [[2.5]]),
    ("sequence_mask", 2.0, 0.0, [[0.0]]),
    ("sequence_mask", 3.0, 0.0, [[2.5]]),
    # IcePop's two-sided token mask: the ratio 0.5 is below the floor, 5 inside the cap.
    ("token_mask", 6.0, 0.6, [[5.0, 0.0]]),
    # The geometric mean sqrt(5 * 0.5) = 1.5811, inside [0.6, 2] and above a band of [0.6, 1.5].
    ("sequence_geo_mask", 2.0, 0.6, [[math.sqrt(2.5)]]),
    ("sequence_geo_mask", 1.5, 0.6, [[0.0]]),
    ("none", 2.0, 0.0, [[1.0, 1.0]]),
])
def test_importance_weight_variants(mode, cap, floor, expected):
    ratio = objective.raw_importance_ratio(PROXIMAL, SAMPLER, FULL, mode)
    assert objective.importance_weights(ratio, mode, cap, floor).tolist() == [approx(expected[0])]


def test_geometric_mean_ignores_padding():
    # The second row's one real token has ratio 4; its padding would halve a plain mean of the log ratios.
    proximal = torch.tensor([[LOG(0.5), LOG(0.2)], [LOG(0.8), 0.0]])
    sampler = torch.tensor([[LOG(0.1), LOG(0.4)], [LOG(0.2), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ratio = objective.raw_importance_ratio(proximal, sampler, mask, "sequence_geo_mask")
    assert ratio.tolist() == [approx([math.sqrt(2.5)]), approx([4.0])]


def test_mismatch_metrics_by_hand():
    # Token ratios rho = 5 and 0.5; the loss used them truncated at 2: w = 2 and 0.5.
    ratio = objective.raw_importance_ratio(PROXIMAL, SAMPLER, FULL, "token_truncate")
    weights = objective.importance_weights(ratio, "token_truncate", 2.0, 0.0)
    exact = torch.tensor([[LOG(0.25), LOG(0.25)]])  # pi_v, the weights the sampler was quantized from

    def k3(r):
        return math.exp(r) - r - 1

    got = mismatch.batch_metrics(PROXIMAL, SAMPLER, ratio, weights, FULL, FULL, exact)
    assert got == {
        "sampler_kl": pytest.approx((k3(LOG(5)) + k3(LOG(0.5))) / 2),
        "log_ratio_abs_mean": pytest.approx((LOG(5) + LOG(2)) / 2),
        "chi2": pytest.approx((25 + 0.25) / 2 - 1),
        "is_ess": pytest.approx(2.5**2 / (2 * (4 + 0.25))),
        # mu -> pi_v: ratios 0.25/0.1 and 0.25/0.4; pi_v -> pi_old: 0.5/0.25 and 0.2/0.25
        "quantization_kl": pytest.approx((k3(LOG(2.5)) + k3(LOG(0.625))) / 2),
        "staleness_kl": pytest.approx((k3(LOG(2)) + k3(LOG(0.8))) / 2),
    }
    no_split = mismatch.batch_metrics(PROXIMAL, SAMPLER, ratio, weights, FULL, FULL)
    assert (no_split["quantization_kl"], no_split["staleness_kl"]) == (None, None)
    # The same weights as the sampler: no gap at all, and every sample counts.
    same = mismatch.batch_metrics(SAMPLER, SAMPLER, torch.ones(1, 2), torch.ones(1, 2), FULL, FULL, SAMPLER)
    assert same == {"sampler_kl": 0.0, "log_ratio_abs_mean": 0.0, "chi2": 0.0, "is_ess": 1.0,
                    "quantization_kl": 0.0, "staleness_kl": 0.0}


@pytest.mark.parametrize(("weights", "units", "expected"), [
    ([[1.0, 1.0, 1.0, 1.0]], [[1.0, 1.0, 1.0, 1.0]], 1.0),
    ([[3.0, 0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0, 1.0]], 0.25),  # one token carries the batch: 1/n
    ([[1.0, 3.0, 9.0, 9.0]], [[1.0, 1.0, 0.0, 0.0]], 16 / (2 * 10)),  # masked units are no samples
    ([[0.0, 0.0]], [[1.0, 1.0]], 0.0),
])
def test_effective_sample_size(weights, units, expected):
    assert mismatch.effective_sample_size(torch.tensor(weights), torch.tensor(units)) == pytest.approx(expected)


def test_padding_and_masked_rows_get_ratio_one():
    mask = torch.tensor([[1.0, 0.0]])
    assert objective.raw_importance_ratio(PROXIMAL, SAMPLER, mask, "token_truncate").tolist() == [approx([5.0, 1.0])]
    assert objective.raw_importance_ratio(PROXIMAL, SAMPLER, mask, "sequence_mask").tolist() == [approx([5.0])]


def test_clipped_surrogate_takes_the_pessimistic_side():
    old = torch.zeros(1, 3)
    logps = torch.tensor([[LOG(1.5), LOG(1.5), LOG(0.5)]])
    loss, clipped = objective.clipped_surrogate(logps, old, torch.tensor([[1.0, -1.0, -1.0]]), 0.2, 0.2)
    # A>0, rho 1.5: clipped to 1.2; A<0, rho 1.5: unclipped 1.5 is worse; A<0, rho 0.5: clipped to 0.8
    assert loss[0].tolist() == approx([-1.2, 1.5, 0.8])
    assert clipped[0].tolist() == [True, False, True]
    high, _ = objective.clipped_surrogate(logps[:, :1], old[:, :1], torch.tensor([1.0]), 0.2, 0.28)
    assert high.item() == pytest.approx(-1.28)


@pytest.mark.parametrize(("loss_type", "expected"), [
    ("grpo", (6 / 3 + 4 / 1) / 2), ("bnpo", 10 / 4), ("dr_grpo", 10 / (2 * 5)), ("dapo", 10 / 8),
])
def test_loss_aggregation(loss_type, expected):
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    value = objective.aggregate(per_token, mask, loss_type, max_completion_length=5, token_normalizer=8.0)
    assert value.item() == pytest.approx(expected)


def test_grpo_loss_weights_the_surrogate_and_adds_the_kl():
    # one token, rho = 1 (logps == old), A = 2: surrogate -2; IS weight 0.5; k1 KL = log(0.5/0.25)
    logps = torch.tensor([[LOG(0.5)]])
    terms = objective.grpo_loss(logps, logps.clone(), torch.tensor([2.0]), torch.tensor([[0.5]]),
                                torch.tensor([[LOG(0.25)]]), torch.ones(1, 1), beta=0.1, kl_estimator="k1",
                                kl_ratio_correction=False,
                                eps_low=0.2, eps_high=0.2, loss_type="bnpo", max_completion_length=1,
                                token_normalizer=1.0)
    assert terms.loss.item() == pytest.approx(-2 * 0.5 + 0.1 * LOG(2))


def test_topk_reverse_kl_by_hand_and_the_distill_loss():
    # k = 2; position 0: student (0.5, 0.25, tail 0.25), teacher (0.25, 0.25, tail 0.5); position 1: equal.
    student = torch.log(torch.tensor([[[0.5, 0.25], [0.6, 0.3]]]))
    teacher = torch.log(torch.tensor([[[0.25, 0.25], [0.6, 0.3]]]))
    kl = objective.topk_reverse_kl(student, teacher)
    assert kl[0].tolist() == pytest.approx([0.5 * LOG(2) + 0.25 * LOG(0.5), 0.0], abs=1e-6)
    # distill: only coef * KL, aggregated as the rest (bnpo over the two tokens); grpo+distill adds the surrogate.
    logps = torch.zeros(1, 2)
    common = dict(beta=0.0, kl_estimator="k3", kl_ratio_correction=True, eps_low=0.2, eps_high=0.2,
                  loss_type="bnpo", max_completion_length=2, token_normalizer=1.0, distill=kl, distill_coef=2.0)
    alone = objective.grpo_loss(logps, logps, torch.tensor([3.0]), torch.ones(1, 2), None, torch.ones(1, 2),
                                rewards=False, **common)
    both = objective.grpo_loss(logps, logps, torch.tensor([3.0]), torch.ones(1, 2), None, torch.ones(1, 2),
                               **common)
    assert alone.loss.item() == pytest.approx(2.0 * (0.5 * LOG(2) + 0.25 * LOG(0.5)) / 2)
    assert both.loss.item() == pytest.approx(alone.loss.item() - 3.0)
    # Its gradient moves the student's top-k towards the teacher's.
    logits = torch.tensor([[[2.0, 1.0, 0.0, 0.0]]], requires_grad=True)
    target = torch.log_softmax(torch.tensor([[[0.0, 1.0, 0.5, 0.5]]]), -1)[..., :2]
    loss = objective.topk_reverse_kl(torch.log_softmax(logits, -1)[..., :2], target).sum()
    loss.backward()
    stepped = torch.log_softmax(logits - 0.5 * logits.grad, -1)[..., :2]
    assert objective.topk_reverse_kl(stepped, target).item() < loss.item()


def test_entropy_bonus_is_subtracted_per_token_and_raises_the_entropy():
    # A = 0 leaves only the bonus: bnpo over the two unmasked tokens of entropies 1.0 and 0.5, the third masked.
    logps = torch.zeros(1, 3)
    entropies = torch.tensor([[1.0, 0.5, 7.0]])
    terms = objective.grpo_loss(logps, logps.clone(), torch.tensor([0.0]), torch.ones(1, 3), None,
                                torch.tensor([[1.0, 1.0, 0.0]]), beta=0.0, kl_estimator="k3",
                                kl_ratio_correction=True, eps_low=0.2, eps_high=0.2, loss_type="bnpo",
                                max_completion_length=3, token_normalizer=1.0, entropies=entropies,
                                entropy_coef=0.1)
    assert terms.loss.item() == pytest.approx(-0.1 * (1.0 + 0.5) / 2)
    # A gradient step on the bonus alone flattens a peaked distribution.
    logits = torch.tensor([[[3.0, 0.0, -1.0]]], requires_grad=True)

    def entropy(z):
        p = torch.softmax(z, -1)
        return -(p * p.log()).sum(-1)

    loss = objective.grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.tensor([0.0]), torch.ones(1, 1), None,
                               torch.ones(1, 1), beta=0.0, kl_estimator="k3", kl_ratio_correction=True,
                               eps_low=0.2, eps_high=0.2, loss_type="bnpo", max_completion_length=1,
                               token_normalizer=1.0, entropies=entropy(logits), entropy_coef=1.0).loss
    loss.backward()
    assert entropy(logits - 0.5 * logits.grad).item() > entropy(logits).item()


LINEAGE = {"policy_version": "002", "lineage": [
    {"policy_version": "002", "content_hash": "h2"}, {"policy_version": "001", "content_hash": "h1"},
    {"policy_version": "000", "content_hash": "h0"},
]}


def stamped(*versions):
    rows = rollout_rows(groups=len(versions), size=2)
    for row in rows:
        version = versions[row["prompt_id"]]
        row["policy_version"], row["policy_hash"] = version, "h" + str(int(version))
    return rows


def test_staleness_is_the_position_in_the_lineage():
    assert staleness(Path("s"), as_table(stamped("002", "000"), SCORED_FIELDS), LINEAGE) == [0, 0, 2, 2]


@pytest.mark.parametrize(("change", "message"), [
    ({"policy_hash": "h9"}, r"row 0 \(prompt_id=0, sample_index=0\): field 'policy_hash': h9 is not policy 002's"),
    ({"policy_version": "007"}, "field 'policy_version': policy 007 is not in the lineage of checkpoint 002"),
])
def test_rollouts_outside_the_lineage_stop_the_stage(change, message):
    rows = stamped("002")
    rows[0].update(change)
    with pytest.raises(ValueError, match=message):
        staleness(Path("s"), as_table(rows, SCORED_FIELDS), LINEAGE)


def test_select_rows_counts_each_reason():
    rows = stamped("002", "001", "000")  # groups 0, 1, 2 with staleness 0, 1, 2
    for row in rows:
        row["reward"] = 1.0 if row["prompt_id"] == 1 else float(row["sample_index"])  # group 1 has no variance
    rows[0]["finish_reason"] = "length"
    table = as_table(rows, SCORED_FIELDS)
    lags = [0, 0, 1, 1, 2, 2]
    default = select_rows(Path("s"), table, lags, TrainConfig(max_staleness=1))
    assert default.keep == [True, True, True, True, False, False]
    assert default.staleness == {"0": 2, "1": 2, "2": 2}
    strict = select_rows(Path("s"), table, lags, TrainConfig(max_staleness=0, drop_zero_variance_groups=True,
                                                  mask_truncated=True))
    assert strict.keep == [False, True, False, False, False, False]
    assert strict.counts == {"rows_kept": 1, "rows_dropped_stale": 4, "rows_dropped_zero_variance": 2,
                             "rows_masked_truncated": 1}
    with pytest.raises(ValueError, match=r"s: no row left to train on \(rows_kept=0, rows_dropped_stale=4"):
        select_rows(Path("s"), table.slice(2), lags[2:], TrainConfig(max_staleness=0))


@pytest.mark.parametrize(("change", "message"), [
    ({"temperature": 0.7}, "the KL term needs rollouts sampled at 1.0"),
    ({"ref_logprobs": None}, "scored without reference logprobs"),
])
def test_check_batch_refuses_what_the_update_cannot_use(change, message):
    rows = rollout_rows()
    for row in rows:
        row.update(change)
    with pytest.raises(ValueError, match=message):
        check_batch(Path("s.parquet"), as_table(rows, SCORED_FIELDS), beta=0.02, expected_rows=4)
    # Without a KL term neither matters; the batch's one temperature comes back.
    temperature = check_batch(Path("s.parquet"), as_table(rows, SCORED_FIELDS), beta=0.0, expected_rows=4)
    assert temperature == pytest.approx(rows[0]["temperature"])
    good = as_table(rollout_rows(), SCORED_FIELDS)
    with pytest.raises(ValueError, match="field 'prompt_id': 4 rows, but"):
        check_batch(Path("s.parquet"), good, beta=0.02, expected_rows=8)
