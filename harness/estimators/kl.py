r"""Per-sample estimators of KL(pi || ref) from samples x ~ pi (Schulman 2020,
"Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

With the log ratio ``l = log ref(x) - log pi(x)``:

* k1 = -l                      unbiased, high variance, can be negative;
* k2 = l^2 / 2                 biased (low bias near pi = ref), low variance, >= 0;
* k3 = (e^l - 1) - l           unbiased (E_pi[e^l] = 1), low variance, >= 0.

Unbiased here is about the *value* of the KL. The gradient of k3 (or k1) placed in a loss is
not the gradient of the KL: that is claim C22, measured, not assumed.

verl's names (``kl_penalty`` in ``verl/trainer/ppo/core_algos.py``) are registered too:
``low_var_kl`` is k3 with verl's clamps, and a name ending in ``+`` (``k1+``, ``k3+``,
``low_var_kl+``) is the straight-through variant: the value of the named estimator, the
gradient of k2 (whose expected gradient, from samples of pi, is the gradient of KL(pi || ref)).
Config key ``kl.estimator`` takes any key of :data:`KL_ESTIMATORS`.
"""
from __future__ import annotations

import torch


def _log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp must share a shape, got {list(logp.shape)} and {list(ref_logp.shape)}")
    return ref_logp - logp


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log pi(x) - log ref(x)."""
    return -_log_ratio(logp, ref_logp)


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = (log ref(x) - log pi(x))^2 / 2."""
    return 0.5 * _log_ratio(logp, ref_logp).pow(2)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = ref(x)/pi(x) - 1 - log(ref(x)/pi(x))."""
    l = _log_ratio(logp, ref_logp)
    return torch.expm1(l) - l


LOW_VAR_LOG_RATIO_CLAMP = 20.0  # verl clamps l to [-20, 20] before exp ...
LOW_VAR_VALUE_CLAMP = 10.0  # ... and the estimate to [-10, 10]


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    r"""verl's ``low_var_kl``: k3 with two clamps "for numerical stability",

    .. math:: 	ilde l = \operatorname{clamp}(l, -20, 20),\qquad
              \operatorname{clamp}(e^{	ilde l} - 1 - 	ilde l,\ -10,\ 10)

    (``l = log ref(x) - log pi(x)``; k3 >= 0, so the lower value clamp never acts). It equals k3
    while ``k3 <= 10``; beyond, the value is 10 and its gradient 0 (a token with ``l`` above about 2.61 or
    below -11 stops being pulled back). The log-ratio clamp only acts
    where the value clamp already does.
    """
    l = _log_ratio(logp, ref_logp).clamp(-LOW_VAR_LOG_RATIO_CLAMP, LOW_VAR_LOG_RATIO_CLAMP)
    return (torch.expm1(l) - l).clamp(-LOW_VAR_VALUE_CLAMP, LOW_VAR_VALUE_CLAMP)


def straight_through(estimator):
    r"""The ``+`` variant of ``estimator`` (verl ``kl_penalty`` for names ending in ``+``,
    volcengine/verl#2953): the value of ``estimator``, the gradient of k2,

    .. math:: \hat k_{+} = k_2 - \operatorname{sg}(k_2) + \operatorname{sg}(\hat k)

    (``sg``: stop-gradient). The value is exactly ``estimator``'s (``k2 - sg(k2)`` is exactly 0);
    the gradient w.r.t. ``log pi`` is k2's, ``log pi - log ref``, whose expectation under pi is
    the gradient of KL(pi || ref). Gradients reach ``logp`` only through k2."""
    def plus(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        k2 = kl_k2(logp, ref_logp)
        return k2 - k2.detach() + estimator(logp, ref_logp).detach()

    plus.__name__ = f"{estimator.__name__}_plus"
    plus.__doc__ = f"Straight-through: the value of {estimator.__name__}, the gradient of k2."
    return plus


# The only list of KL estimators (config key ``kl.estimator``): name -> estimator(logp, ref_logp).
# "k2+" is left out: it would be k2 under a second name (verl returns k2 for it).
KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "low_var_kl": kl_low_var}
KL_ESTIMATORS.update({f"{name}+": straight_through(KL_ESTIMATORS[name]) for name in ("k1", "k3", "low_var_kl")})


def kl_estimate(name: str, logp: torch.Tensor, ref_logp: torch.Tensor, log_ratio_clamp: float | None = None,
                value_clamp: float | None = None) -> torch.Tensor:
    r"""The per-sample estimate ``name`` (a key of :data:`KL_ESTIMATORS`) of KL(pi || ref), with two
    optional numeric guards (config ``kl.log_ratio_clamp``, ``kl.value_clamp``; None: off):

    * ``log_ratio_clamp = c``: the estimator sees :math:`\operatorname{clamp}(l, -c, c)` for
      ``l = log ref - log pi`` (gradient 0 where the clamp acts);
    * ``value_clamp = v``: the estimate is clamped to ``[-v, v]`` (gradient 0 where it acts):
      OpenRLHF's ``compute_approx_kl`` clamps every estimator (k1, k2, k3) to [-10, 10]
      (OpenRLHF's ``openrlhf/models/utils.py``).

    ``low_var_kl`` carries verl's own clamps (20 and 10) whatever these are; verl's ``"k3"`` name is
    that clamped estimator, this module's ``k3`` is the plain one."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"kl.estimator must be one of {sorted(KL_ESTIMATORS)}, got {name!r}")
    if log_ratio_clamp is not None:  # the estimators depend on l = ref - logp only: give them the clamped l
        ref_logp = logp + _log_ratio(logp, ref_logp).clamp(-log_ratio_clamp, log_ratio_clamp)
    k = KL_ESTIMATORS[name](logp, ref_logp)
    return k if value_clamp is None else k.clamp(-value_clamp, value_clamp)


def kl_guards(kl_cfg) -> dict:
    """``{"log_ratio_clamp", "value_clamp"}`` of a run's ``kl`` node, the keyword arguments of
    :func:`kl_estimate` (a node without them: no clamps)."""
    get = kl_cfg.get if hasattr(kl_cfg, "get") else (lambda k, d=None: getattr(kl_cfg, k, d))
    return {k: None if get(k, None) is None else float(get(k, None)) for k in ("log_ratio_clamp", "value_clamp")}
