"""Bias / variance statistics of M independent gradient estimates against a truth.

Notation: ``G [M, D]`` holds one estimate per batch, ``t [D]`` the truth (exact on the toy
task), ``gbar`` the mean estimate and ``Sigma`` the covariance of one estimate.

* total variance ``tr Sigma`` by the unbiased sample covariance;
* squared bias ``||E g - t||^2`` by the debiased ``||gbar - t||^2 - tr Sigma_hat / M`` (the plain
  ``||gbar - t||^2`` is biased upward by ``tr Sigma / M``; the debiased one is unbiased and can be
  negative, so its interval contains 0 for an unbiased estimator). Its bootstrap replicates
  subtract ``2 tr Sigma* / M``: a resampled mean carries the sampling noise once more, and the
  replicates must be centred on the point estimate;
* relative versions divide by ``||t||^2``; ``weight`` is ``<E g, t> / ||t||^2`` (1 for an
  unbiased estimator; C17's per-prompt gradient weight);
* ``snr = ||E g||^2 / tr Sigma`` (debiased numerator) - signal per unit of noise in one batch;
  ``mean_sq`` is that numerator, ``||E g||^2`` debiased (``||gbar||^2 - tr Sigma_hat / M``), and
  ``rel_mean_sq`` divides it by ``||t||^2``: its interval contains 0 when ``E g = 0`` (C23's k1 in the loss);
* ``cos`` is the mean over batches of ``cos(g_m, t)``; ``cos_mean`` is ``cos(gbar, t)``;
  ``cos_exp`` is the cosine of the *expected* estimate with the truth, ``<gbar, t> / (|t|
  sqrt(||gbar||^2 - tr Sigma_hat / M))`` (the norm debiased as the squared bias is: ``cos_mean``
  is pulled towards 0 by the noise left in ``gbar``). It is blind to the scale of ``E g``: a
  whitened estimator (``E g ~ grad J / std R``) has ``cos_exp = 1`` where its ``rel_bias_sq`` is
  large, so ``1 - cos_exp`` is the bias in direction (C24). :func:`direction_cosine` gives the
  same statistic against any other direction ``u`` (C25: the gradient of the arcsin objective).

Intervals are percentile intervals of a bootstrap over batches (multinomial resampling weights
``W [reps, M]``, drawn from a fixed seed), the same resampling for every statistic. Beside each
interval ``<name>_low``, ``<name>_high`` the column ``<name>_se`` is the bootstrap standard error
(:func:`bootstrap_se`: the sample std of the same replicates), which the claims report uses to form
normal intervals ``<name> +- z se`` at any level.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95


def resample_weights(M: int, reps: int, seed: int) -> np.ndarray:
    """``[reps, M]`` bootstrap counts (each row sums to M)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(M, np.full(M, 1.0 / M), size=reps).astype(np.float64)


def percentile_interval(reps: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    reps = np.asarray(reps, dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        return float("nan"), float("nan")
    tail = 100.0 * (1.0 - confidence) / 2.0
    lo, hi = np.percentile(reps, [tail, 100.0 - tail])
    return float(lo), float(hi)


def bootstrap_se(reps: np.ndarray) -> float:
    """Bootstrap standard error: the sample standard deviation (``ddof = 1``) of the finite
    replicates, ``sqrt(sum_r (x_r - xbar)^2 / (R - 1))``; nan with fewer than 2 finite ones."""
    reps = np.asarray(reps, dtype=float)
    reps = reps[np.isfinite(reps)]
    return float(reps.std(ddof=1)) if reps.size >= 2 else float("nan")


def bootstrap_columns(name: str, reps: np.ndarray, confidence: float = CONFIDENCE) -> dict[str, float]:
    """``<name>_low``, ``<name>_high`` (:func:`percentile_interval`) and ``<name>_se``
    (:func:`bootstrap_se`) of one statistic's bootstrap replicates."""
    lo, hi = percentile_interval(reps, confidence)
    return {f"{name}_low": lo, f"{name}_high": hi, f"{name}_se": bootstrap_se(reps)}


def per_batch_scalars(G: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    """Scalars of each batch's estimate: the columns of ``probe_batches.parquet``.

    ``dev_sq`` is scaled by M/(M-1) so its mean is the unbiased ``tr Sigma_hat``.
    """
    M = G.shape[0]
    gbar = G.mean(0)
    tn2 = float(truth @ truth)
    sq = np.einsum("md,md->m", G, G)
    dev = G - gbar
    out = {
        "sq_norm": sq,
        "dev_sq": np.einsum("md,md->m", dev, dev) * M / max(M - 1, 1),
        "dot_true": G @ truth,
    }
    with np.errstate(all="ignore"):
        out["err_proj"] = (out["dot_true"] - tn2) / tn2 if tn2 > 0 else np.full(M, np.nan)
        norms = np.sqrt(sq) * np.sqrt(tn2)
        out["cos_true"] = np.where(norms > 0, out["dot_true"] / np.where(norms > 0, norms, 1.0), np.nan)
    return out


def direction_cosine(gbar: np.ndarray, gbar_reps: np.ndarray, tr: float, tr_reps: np.ndarray, M: int,
                     u: np.ndarray) -> tuple[float, np.ndarray]:
    """``cos(E g, u)`` estimated by ``<gbar, u> / (|u| sqrt(||gbar||^2 - tr / M))`` and its bootstrap
    replicates (whose squared norms subtract ``2 tr* / M``, centred like the squared bias's).
    ``(point, replicates [reps])``; nan where the debiased norm is not positive."""
    un = float(np.sqrt(u @ u))
    with np.errstate(all="ignore"):
        n2 = float(gbar @ gbar) - tr / M
        point = float(gbar @ u) / (un * np.sqrt(n2)) if n2 > 0 and un > 0 else float("nan")
        n2_reps = np.einsum("rd,rd->r", gbar_reps, gbar_reps) - 2.0 * tr_reps / M
        reps = np.where(n2_reps > 0, (gbar_reps @ u) / (un * np.sqrt(np.abs(n2_reps))), np.nan) if un > 0 \
            else np.full(gbar_reps.shape[0], np.nan)
    return point, reps


@dataclass(frozen=True)
class NoisyTruth:
    """A truth that is itself an estimate (a high-sample reference: the mean of ``R`` independent
    estimates): its bootstrap replicates ``reps [reps, D]`` (the resampled reference means), its
    noise ``noise = tr Sigma_ref / R`` and that noise's replicates ``noise_reps [reps]`` (None: the
    point value in every replicate)."""

    reps: np.ndarray
    noise: float
    noise_reps: np.ndarray | None = None


def gradient_summary(G: np.ndarray, truth: np.ndarray, W: np.ndarray, gbar_reps: np.ndarray | None = None,
                     confidence: float = CONFIDENCE, noisy_truth: NoisyTruth | None = None,
                     directions: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """Point estimates, bootstrap intervals and standard errors (:func:`bootstrap_columns`) of
    bias, variance, cosine and SNR.

    ``W`` is :func:`resample_weights`; ``gbar_reps = W @ G / M`` may be passed in when a caller
    slices it for several column subsets (scopes) of the same resampling.

    ``directions`` (name -> ``u [D]``) adds ``cos_<name>`` = :func:`direction_cosine` of ``E g``
    with ``u`` and ``cos_<name>_gap = cos_<name> - cos_exp``, each with its interval (the gap's
    from the same replicates: a paired comparison of the two directions).

    A *noisy* truth (:class:`NoisyTruth`) passes its own bootstrap replicates and noise (and the
    noise's replicates): the squared bias subtracts it as it subtracts the probe's own noise.
    """
    truth_reps = None if noisy_truth is None else noisy_truth.reps
    truth_noise = 0.0 if noisy_truth is None else noisy_truth.noise
    truth_noise_reps = None if noisy_truth is None else noisy_truth.noise_reps
    M, D = G.shape
    pb = per_batch_scalars(G, truth)
    gbar = G.mean(0)
    tn2 = float(truth @ truth)
    tr = float(pb["dev_sq"].mean())
    mean_sq = float(gbar @ gbar)
    bias_sq = float((gbar - truth) @ (gbar - truth)) - tr / M
    if gbar_reps is None:
        gbar_reps = W @ G / M
    sq_reps = W @ pb["sq_norm"] / M
    gb2_reps = np.einsum("rd,rd->r", gbar_reps, gbar_reps)
    tr_reps = (sq_reps - gb2_reps) * M / max(M - 1, 1)
    bias_sq -= truth_noise
    diff = gbar_reps - (truth if truth_reps is None else truth_reps)
    # A resampled mean carries the sampling noise twice (E*||gbar* - t||^2 = ||gbar - t||^2 +
    # tr Sigma / M), so quadratic replicates subtract 2 tr*/M: centred on the debiased point.
    bias_sq_reps = np.einsum("rd,rd->r", diff, diff) - 2.0 * tr_reps / M
    if truth_reps is not None:
        noise_reps = truth_noise if truth_noise_reps is None else truth_noise_reps
        bias_sq_reps = bias_sq_reps - 2.0 * noise_reps
    mean_sq_reps = gb2_reps - 2.0 * tr_reps / M
    with np.errstate(all="ignore"):
        snr_reps = mean_sq_reps / tr_reps
        snr = (mean_sq - tr / M) / tr if tr > 0 else float("nan")
        cos_reps = W @ np.nan_to_num(pb["cos_true"]) / M
        weight_reps = (gbar_reps @ truth) / tn2 if tn2 > 0 else np.full(W.shape[0], np.nan)
    out: dict[str, float] = {
        "grad_dim": D, "true_grad_norm": float(np.sqrt(tn2)), "mean_grad_norm": float(np.sqrt(mean_sq)),
        "total_var": tr, "bias_sq": bias_sq, "bias_norm": float(np.linalg.norm(gbar - truth)),
        "mean_sq": mean_sq - tr / M,
        "snr": snr, "cos": float(np.nanmean(pb["cos_true"])),
        "cos_mean": float(gbar @ truth / np.sqrt(mean_sq * tn2)) if mean_sq > 0 and tn2 > 0 else float("nan"),
        "weight": float(gbar @ truth / tn2) if tn2 > 0 else float("nan"),
    }
    cos_exp, cos_exp_reps = direction_cosine(gbar, gbar_reps, tr, tr_reps, M, truth)
    out["cos_exp"] = cos_exp
    named = [("total_var", tr_reps), ("bias_sq", bias_sq_reps), ("snr", snr_reps), ("cos", cos_reps),
             ("weight", weight_reps), ("cos_exp", cos_exp_reps), ("mean_sq", mean_sq_reps)]
    for name, u in (directions or {}).items():
        point, reps = direction_cosine(gbar, gbar_reps, tr, tr_reps, M, np.asarray(u, dtype=float))
        out[f"cos_{name}"], out[f"cos_{name}_gap"] = point, point - cos_exp
        named += [(f"cos_{name}", reps), (f"cos_{name}_gap", reps - cos_exp_reps)]
    for name, reps in named:
        out.update(bootstrap_columns(name, reps, confidence))
    for name in ("total_var", "bias_sq", "mean_sq"):
        for suffix in ("", "_low", "_high", "_se"):
            out[f"rel_{name}{suffix}"] = out[f"{name}{suffix}"] / tn2 if tn2 > 0 else float("nan")
    out["rel_bias"] = float(np.sign(out["rel_bias_sq"]) * np.sqrt(abs(out["rel_bias_sq"]))) \
        if np.isfinite(out["rel_bias_sq"]) else float("nan")
    return out


def value_summary(values: np.ndarray, truth: float, W: np.ndarray,
                  confidence: float = CONFIDENCE) -> dict[str, float]:
    """Bias and variance of a scalar estimate (one per batch) against its exact value, each with
    its interval and standard error (:func:`bootstrap_columns`)."""
    M = values.shape[0]
    mean_reps = W @ values / M
    var_reps = (W @ values**2 / M - mean_reps**2) * M / max(M - 1, 1)
    out = {"value_true": float(truth), "value_mean": float(values.mean()),
           "value_bias": float(values.mean() - truth), "value_var": float(values.var(ddof=1)) if M > 1 else float("nan")}
    out.update(bootstrap_columns("value_bias", mean_reps - truth, confidence))
    out.update(bootstrap_columns("value_var", var_reps, confidence))
    return out


def ratio_of_means_interval(num: np.ndarray, den: np.ndarray, *, reps: int = 1000, seed: int = 0,
                            paired: bool = True, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``mean(num) / mean(den)`` with a bootstrap interval; ``paired`` resamples the same batch
    indices for both (common random numbers: both were computed on the same batches)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    point = float(num.mean() / den.mean())
    rng = np.random.default_rng(seed)
    i = rng.integers(0, num.size, size=(reps, num.size))
    j = i if paired else rng.integers(0, den.size, size=(reps, den.size))
    if paired and num.size != den.size:
        raise ValueError(f"paired ratio needs equal batch counts, got {num.size} and {den.size}")
    r = num[i].mean(1) / den[j].mean(1)
    lo, hi = percentile_interval(r, confidence)
    return point, lo, hi
