r"""Per-sample estimators of KL(pi || ref) from samples x ~ pi (Schulman 2020,
"Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

With the log ratio ``l = log ref(x) - log pi(x)``:

* k1 = -l                      unbiased, high variance, can be negative;
* k2 = l^2 / 2                 biased (low bias near pi = ref), low variance, >= 0;
* k3 = (e^l - 1) - l           unbiased (E_pi[e^l] = 1), low variance, >= 0.

Unbiased here is about the *value* of the KL. The gradient of k3 (or k1) placed in a loss is
not the gradient of the KL: that is claim C22, measured, not assumed.
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


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(name: str, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    if name not in KL_ESTIMATORS:
        raise ValueError(f"kl.estimator must be one of {sorted(KL_ESTIMATORS)}, got {name!r}")
    return KL_ESTIMATORS[name](logp, ref_logp)
