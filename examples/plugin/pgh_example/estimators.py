"""Registers, on import, an estimator and a policy loss with the harness's own registries,
and the example env (by importing :mod:`pgh_example.envs`)."""
import torch

from harness.estimators import AdvantageResult, EstimatorSpec, episode_scores, register
from harness.losses import pg_loss, register_policy_loss

from . import envs  # noqa: F401  (registers Corridor-v0 with gymnasium)


def median_baseline(batch, params):
    """A_i = R_i - median of its group's returns, the same for every step of episode i
    (a group baseline that one outlier cannot move)."""
    scores = episode_scores(batch)  # [n_groups, group_size]
    adv = scores - scores.median(dim=1, keepdim=True).values
    adv = adv.reshape(1, -1).expand_as(batch.rewards)
    return AdvantageResult(adv * batch.mask if batch.mask is not None else adv.clone(), None)


register(EstimatorSpec("median_baseline", median_baseline, needs_critic=False, needs_groups=True,
                       full_episodes=True))


@register_policy_loss("clamped_pg")
def clamped_pg_loss(logp, old_logp, advantages, mask, clip_eps=None, clip_eps_high=None, agg="token_mean",
                    norm_len=None, with_metrics=True, seq_id=None, delta=None, **_):
    """Vanilla policy gradient on advantages clamped to [-clip_eps, clip_eps] (1 when clip_eps is null)."""
    bound = 1.0 if clip_eps is None else float(clip_eps)
    return pg_loss(logp, old_logp, torch.clamp(advantages, -bound, bound), mask, agg=agg, norm_len=norm_len,
                   with_metrics=with_metrics, seq_id=seq_id, delta=delta)
