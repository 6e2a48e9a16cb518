"""Advantage estimators: pure functions over time-major tensors, plus a name registry.

Public API (stable): :func:`gae`, :func:`n_step`, :func:`reward_to_go`, :func:`grpo`,
:func:`rloo`, :func:`remax`, :func:`reinforce_pp_baseline`, :func:`opo`, :func:`gpg`,
:func:`grpo_passk`, :func:`kl_k1`, :func:`kl_k2`, :func:`kl_k3`, :func:`kl_low_var`, :func:`straight_through`,
:func:`get_estimator`, :func:`estimator_names`, :func:`register_estimator`, :data:`ESTIMATORS`.

A new estimator is its function under ``@register_estimator("name")`` in a module of this
package imported below (a module of its own is one more import line here) and its YAML,
``harness/conf/estimator/<name>.yaml``.
"""
from .group import gpg, grpo, grpo_passk, opo, reinforce_pp_baseline, remax, rloo
from .kl import KL_ESTIMATORS, kl_estimate, kl_guards, kl_k1, kl_k2, kl_k3, kl_low_var, straight_through
from .registry import (
    ESTIMATORS,
    AdvantageBatch,
    AdvantageResult,
    EstimatorParams,
    EstimatorSpec,
    episode_scores,
    estimator_names,
    get_estimator,
    register,
    register_estimator,
)
from .returns import gae, n_step, reward_to_go

__all__ = [
    "gae", "n_step", "reward_to_go", "grpo", "rloo", "remax", "reinforce_pp_baseline", "opo", "gpg", "grpo_passk",
    "kl_k1", "kl_k2", "kl_k3", "kl_low_var", "straight_through", "kl_estimate", "kl_guards", "KL_ESTIMATORS",
    "ESTIMATORS", "AdvantageBatch", "AdvantageResult", "EstimatorParams", "EstimatorSpec",
    "episode_scores", "estimator_names", "get_estimator", "register", "register_estimator",
]
