"""Loss aggregations (``loss_agg``, :data:`harness.losses.AGG_MODES`) by hand, and the TRL
``loss_type`` presets (``harness/conf/loss_type/``) against TRL's documented formulas on the same tensors.

(Kept apart from test_losses.py, which the policy-loss work edits.)"""
from pathlib import Path

import pytest
import torch
import yaml

from harness.losses import AGG_MODES, aggregate

LOSS_TYPES = Path(__file__).resolve().parents[1] / "harness" / "conf" / "loss_type"

# Two sequences (columns) in T = 4: lengths 1 (value 4) and 3 (values 1, 2, 3; sum 6).
X = torch.tensor([[4.0, 1.0], [9.0, 2.0], [9.0, 3.0], [9.0, 9.0]])
M = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0]])

BY_HAND = {
    "token_mean": (4 + 1 + 2 + 3) / 4,  # 2.5
    "seq_mean_token_mean": (4 / 1 + 6 / 3) / 2,  # 3
    "seq_mean_token_sum_norm": (4 / 4 + 6 / 4) / 2,  # L = T = 4: 1.25
    "token_sum": 4 + 1 + 2 + 3,  # 10
    "seq_mean_token_sum": (4 + 6) / 2,  # 5
}


def test_every_mode_has_a_hand_value():
    assert set(BY_HAND) == set(AGG_MODES)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregation_modes_by_hand(mode):
    assert aggregate(X, M, mode).item() == pytest.approx(BY_HAND[mode])


@pytest.mark.parametrize("mode", ["token_sum", "seq_mean_token_sum"])
def test_new_modes_with_sequence_ids_population_and_empty_columns(mode):
    # the same two sequences as one column each of steps (control's layout): ids 0 and 1
    flat_x = torch.tensor([[4.0, 1.0, 2.0, 3.0, 7.0]])
    flat_m = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    seq = torch.tensor([[0, 1, 1, 1, 2]])
    assert aggregate(flat_x, flat_m, mode, seq_id=seq).item() == pytest.approx(BY_HAND[mode])
    # a population of two members: each its own number; an empty third column changes nothing
    xp = torch.stack([torch.cat([X, torch.zeros(4, 1)], 1), 2 * torch.cat([X, torch.zeros(4, 1)], 1)])
    mp = torch.cat([M, torch.zeros(4, 1)], 1).expand(2, 4, 3)
    assert aggregate(xp, mp, mode).tolist() == pytest.approx([BY_HAND[mode], 2 * BY_HAND[mode]])


def test_seq_mean_token_sum_is_seq_mean_token_sum_norm_with_unit_length():
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    m = (torch.rand(6, 5, generator=torch.Generator().manual_seed(1)) > 0.3).float()
    assert torch.allclose(aggregate(x, m, "seq_mean_token_sum"), aggregate(x, m, "seq_mean_token_sum_norm", norm_len=1))


def test_an_unknown_mode_names_every_mode():
    with pytest.raises(ValueError) as e:
        aggregate(X, M, "sum")
    for mode in AGG_MODES:
        assert mode in str(e.value)


# ------------------------------------------------------------------ TRL loss_type presets
# TRL GRPOTrainer._compute_loss, written from its documented formulas on batch-major [B, L]
# tensors of one process, no gradient accumulation (num_processes = 1, one micro-batch per step).
MAX_COMPLETION_LENGTH = 10


def _trl(loss_type: str, per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * MAX_COMPLETION_LENGTH)
    if loss_type == "dapo":
        num_items_in_batch, num_processes = mask.sum(), 1
        return (per_token_loss * mask).sum() / (num_items_in_batch.clamp(min=1.0) / num_processes)
    raise KeyError(loss_type)


PRESETS = sorted(p.stem for p in LOSS_TYPES.glob("*.yaml"))


def test_the_trl_presets_are_the_four_aggregation_names():
    assert PRESETS == ["bnpo", "dapo", "dr_grpo", "grpo"]


@pytest.mark.parametrize("loss_type", PRESETS)
def test_trl_preset_equals_trls_formula(loss_type):
    cfg = yaml.safe_load((LOSS_TYPES / f"{loss_type}.yaml").read_text())
    assert set(cfg) == {"loss_agg"} and cfg["loss_agg"] in AGG_MODES
    g = torch.Generator().manual_seed(7)
    T, B = MAX_COMPLETION_LENGTH, 6
    lengths = torch.tensor([1, 3, 10, 4, 7, 2])
    x = torch.randn(T, B, generator=g, dtype=torch.float64)
    m = (torch.arange(T)[:, None] < lengths[None, :]).double()
    ours = aggregate(x, m, cfg["loss_agg"], norm_len=MAX_COMPLETION_LENGTH)  # the LM passes lm.max_response_len
    assert ours.item() == pytest.approx(_trl(loss_type, x.T, m.T).item(), rel=1e-12)
    # and on the hand example (T = 4 padded to the same L, lengths 1 and 3)
    assert aggregate(X, M, cfg["loss_agg"], norm_len=MAX_COMPLETION_LENGTH).item() == pytest.approx(
        _trl(loss_type, X.T, M.T).item())


def test_trl_grpo_differs_where_a_sequence_is_empty():
    """TRL's grpo mean runs over every sequence, an empty one included; the harness's over sequences
    with a token (the difference the preset's comment states)."""
    x = torch.cat([X, torch.zeros(4, 1)], 1)
    m = torch.cat([M, torch.zeros(4, 1)], 1)
    assert aggregate(x, m, "seq_mean_token_mean").item() == pytest.approx(3.0)
    assert _trl("grpo", x.T, m.T).item() == pytest.approx(2.0)  # (4 + 2 + 0) / 3


def test_loss_type_group_overrides_the_estimators_loss_agg():
    from tests.control_helpers import make_cfg

    assert make_cfg(["estimator=dr_grpo"]).loss_agg == "seq_mean_token_sum_norm"
    assert make_cfg(["estimator=dr_grpo", "loss_type=dapo"]).loss_agg == "token_mean"
    assert make_cfg(["estimator=grpo", "loss_type=dr_grpo"]).loss_agg == "seq_mean_token_sum_norm"
    assert make_cfg(["estimator=grpo", "loss_type=grpo", "loss_agg=token_sum"]).loss_agg == "token_sum"
