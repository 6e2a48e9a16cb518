"""Sampling-side options (harness.train.sampling): DAPO's dynamic sampling and soft overlong
punishment, TRL's truncated-completion masking; values worked out by hand."""
from __future__ import annotations

import pytest
import torch

from harness.plan import RunPlan
from harness.app import run
from harness.tasks.toy import build_task
from harness.train.sampling import dynamic_sample, overlong_penalty, zero_std_groups
from harness.train.toy import ToySource
from tests.control_helpers import make_cfg


def test_zero_std_groups_by_hand():
    scores = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.25]])
    assert zero_std_groups(scores).tolist() == [True, False, True, False]


class Script:
    """Generation batches with given group scores; a batch is the list of its group ids."""

    def __init__(self, draws):
        self.draws, self.i = draws, 0

    def __call__(self):
        scores = torch.tensor(self.draws[self.i], dtype=torch.float64)
        ids = [f"d{self.i}g{g}" for g in range(scores.shape[0])]
        self.i += 1
        return ids, scores


def _sample(script, n_groups, max_draws):
    return dynamic_sample(script, lambda b: b[1], lambda b, idx: [b[0][i] for i in idx.tolist()],
                          lambda parts: [g for p in parts for g in p], n_groups, max_draws)


def test_dynamic_sampling_keeps_informative_groups_in_order_and_counts_every_draw():
    # draw 0: groups 1 and 3 informative; draw 1: groups 0, 2, 3 informative -> keep d1g0, d1g2 (3 needed... 4)
    script = Script([[[1, 1], [0, 1], [0, 0], [1, 0]],
                     [[0, 1], [1, 1], [1, 0], [0, 1]]])
    batch, drawn = _sample(script, n_groups=4, max_draws=5)
    assert batch == ["d0g1", "d0g3", "d1g0", "d1g2"]  # the surplus d1g3 is dropped
    assert (drawn.draws, drawn.groups, drawn.zero_std) == (2, 8, 3)
    assert drawn.zero_std_frac == pytest.approx(3 / 8)


def test_dynamic_sampling_stops_at_max_draws_with_what_it_found():
    script = Script([[[1, 1], [0, 1]], [[0, 0], [1, 1]], [[0, 1], [1, 0]]])
    batch, drawn = _sample(script, n_groups=2, max_draws=2)
    assert batch == ["d0g1"] and drawn.draws == 2 and drawn.zero_std == 3


def test_dynamic_sampling_with_nothing_informative_trains_on_the_last_draw():
    script = Script([[[1, 1]], [[0, 0]]])
    batch, drawn = _sample(script, n_groups=1, max_draws=2)
    assert batch[0] == ["d1g0"] and drawn.draws == 2 and drawn.zero_std_frac == 1.0


def test_overlong_penalty_by_hand():
    # L_max = 8, L_cache = 4: free up to 4 tokens, then -(|y| - 4) / 4, -1 past 8
    length = torch.tensor([1, 4, 5, 6, 8, 9])
    assert overlong_penalty(length, 8, 4).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError):
        overlong_penalty(length, 8, 9)


def _source(*overrides):
    cfg = make_cfg(["task=toy", "estimator=grpo", "seed=3", *overrides])
    return ToySource(RunPlan.of(cfg), build_task(cfg))


def test_toy_dynamic_sampling_trains_on_informative_groups_and_charges_every_draw():
    src = _source("dynamic_sampling=true", "dynamic_sampling_max_draws=20")
    batch = src.collect()
    k = src.k
    reward, prompts = batch.reward[0], batch.prompts[0]  # a lone source's member
    assert not zero_std_groups(reward.view(-1, k)).any()
    assert prompts.shape[0] == src.n_groups * k
    (drawn,) = src.drawn
    assert drawn.draws >= 2 and drawn.zero_std > 0  # this seed's first draw has constant groups
    assert batch.cost.tolist() == [drawn.draws * src.n_groups * k] == src.sequences


def test_toy_truncated_responses_leave_the_loss_but_keep_their_scores():
    src = _source("task.env_id=varlen", "mask_truncated=true", "group_size=4", "task.episodes_per_iter=64")
    src.kl_beta_now = torch.zeros(1)
    batch = src.collect()
    cut = src.truncated(batch)[0]  # a lone source's member
    tokens, length, reward = batch.tokens[0], batch.length[0], batch.reward[0]
    assert 0 < int(cut.sum()) < len(cut)
    # by hand: a truncated response has the full length and no EOS at its end
    for i in range(len(cut)):
        ended = int(tokens[i, int(length[i]) - 1]) == src.task.eos_token
        assert bool(cut[i]) == (int(length[i]) == src.norm_len and not ended)
    ab = src.advantage_batch(batch)
    ub = src.update_batch(batch, ab.rewards * 0 + 1.0, None, None)
    assert ub.mask[0][:, cut].sum() == 0
    torch.testing.assert_close(ub.mask[0][:, ~cut], ab.mask[:, ~cut])
    # a cut response's score still enters the estimator (its group's baseline): the reward on its last token
    torch.testing.assert_close((ab.rewards * ab.mask).sum(0)[cut], reward[cut].to(ab.rewards.dtype))


@pytest.mark.parametrize("override,field", [("dynamic_sampling=true", "dynamic_sampling"),
                                            ("mask_truncated=true", "mask_truncated"),
                                            ("overlong_cache=4", "overlong_cache")])
def test_control_tasks_refuse_the_sampling_options_by_name(tmp_path, override, field):
    with pytest.raises(ValueError, match=f"^{field} must be .* on control tasks"):
        run(make_cfg(["task=cartpole", "estimator=grpo", override, f"results_dir={tmp_path}"]))
    assert not any(tmp_path.iterdir())
