"""Calling a registered policy loss the short way in tests: ``call_loss(fn, logp, old, adv, mask, **kw)``.

``kw`` are split between :class:`harness.losses.PolicyInputs` (``agg``, ``norm_len``, ``seq_id``,
``with_metrics``) and the loss's settings dataclass; a knob of another loss is dropped (one dict of
knobs serves every loss), a key no loss knows is an error (a typo)."""
from __future__ import annotations

import dataclasses

from harness.losses import POLICY_LOSSES, PolicyInputs, PolicyLoss

INPUT_KEYS = {f.name for f in dataclasses.fields(PolicyInputs)} - {"logp", "old_logp", "advantages", "mask"}


def spec_of(fn) -> PolicyLoss:
    if isinstance(fn, PolicyLoss):
        return fn
    (spec,) = [s for s in POLICY_LOSSES.values() if s.fn is fn][:1] or [None]
    if spec is None:
        raise KeyError(f"{fn} is not a registered policy loss")
    return spec


def call_loss(fn, logp, old_logp, advantages, mask, **kw):
    spec = spec_of(fn)
    every_knob = {k for s in POLICY_LOSSES.values() for k in s.knobs}
    unknown = set(kw) - INPUT_KEYS - every_knob
    if unknown:
        raise TypeError(f"no policy loss has the settings {sorted(unknown)}")
    x = PolicyInputs(logp, old_logp, advantages, mask, **{k: v for k, v in kw.items() if k in INPUT_KEYS})
    settings = spec.settings(**{k: v for k, v in kw.items() if k in spec.knobs})
    return spec.fn(x, settings)
