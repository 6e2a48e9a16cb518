"""Which runs a report compares, and the labels that keep different configs apart.

A run's config is its config.yaml's hashed part less the seed (:func:`analysis.load.run_configs`),
with the settings the metrics record (:data:`analysis.load.HYPERPARAMETERS`,
:data:`analysis.load.VARIANT_KEYS`, the first logged value) for a run without one. Two runs are
pooled only when these are equal:

* a budget key (:data:`GROUP_KEYS`) that differs between runs of one task splits the folder into
  *comparison groups*, one per combination of its values: runs at different budgets are never in
  one table or figure (their curves, AUC and final scores are over different numbers of samples);
* any other setting that differs between runs of one estimator on one task goes into the
  estimator's label, ``ppo_gae[gae_lambda=0.9]`` (:func:`analysis.load.variant_label`), so each
  row of a table is one config.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .load import HYPERPARAMETERS, RUN_KEYS, VARIANT_KEYS, variant_label
from .stats import first_values

__all__ = ["GROUP_KEYS", "SAMPLE_BUDGET_KEYS", "Group", "config_frame", "comparison_groups", "config_labels",
           "sample_budgets"]

#: Budget settings: runs that differ in one on a task are in different comparison groups.
GROUP_KEYS = ("budget.env_steps", "budget.tokens", "budget.iterations")
#: The budget in samples, in the order read: LM tasks count tokens (budget.tokens), others env steps.
SAMPLE_BUDGET_KEYS = ("budget.tokens", "budget.env_steps")
#: A metrics column named otherwise in config.yaml.
_CONFIG_NAME = {"kl_beta": "kl.beta"}
_ID = ["run_dir", "seed", "task", "estimator_name"]
#: Config keys that name the run's task or estimator (the tables' own axes).
_IDENTITY = ("estimator", "estimator.name", "task.name", "task.env_id", "task.id")
#: A key a run's config does not record (an older run, or one without config.yaml): not a
#: value of its own, so it never sets runs apart.
ABSENT = "<absent>"


@dataclass(frozen=True)
class Group:
    """One comparison group: ``settings`` (``(key, value)`` of :data:`GROUP_KEYS` that set it
    apart; empty for a folder with one group) and its runs' directories."""

    settings: tuple
    run_dirs: frozenset

    @property
    def name(self) -> str:
        return ", ".join(f"{k}={text(v)}" for k, v in self.settings)

    @property
    def folder(self) -> str:
        return re.sub(r"[^\w.=-]+", "_", self.name.replace(", ", "_"))


def text(value) -> str:
    """A setting as a label shows it: ``null`` for none, numbers in shortest form."""
    if isinstance(value, str) and value == ABSENT:
        return ABSENT
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    if isinstance(value, (float, np.floating)) and not isinstance(value, bool):
        return f"{float(value):g}"
    return str(value)


def config_frame(df: pd.DataFrame, configs: Mapping[str, dict] | None = None) -> pd.DataFrame:
    """One row per run (:data:`RUN_KEYS`) of the loaded frame ``df``: ``task``,
    ``estimator_name`` and one column per config key, ``configs[run_dir]`` where given (from
    :func:`analysis.load.run_configs`), else the first logged value of each hyperparameter and
    variant setting."""
    have = [c for c in (*HYPERPARAMETERS, *VARIANT_KEYS) if c in df.columns]
    name = "estimator_name" if "estimator_name" in df.columns else "estimator"
    runs = first_values(df, ["task", name, *have]).rename(columns={name: "estimator_name"}).reset_index()
    rows = []
    for rec in runs.to_dict("records"):
        own = (configs or {}).get(rec["run_dir"]) or {}
        row = {k: rec[k] for k in _ID}
        for c in have:
            if _CONFIG_NAME.get(c, c) not in own:
                row[_CONFIG_NAME.get(c, c)] = rec[c]
        row.update({k: v for k, v in own.items() if k not in _IDENTITY})
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=_ID)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return pd.DataFrame([[row.get(k, ABSENT) for k in keys] for row in rows], columns=keys)


def _differing(frame: pd.DataFrame, by: list[str], keys: list[str]) -> set[str]:
    """The keys that take more than one value (None and NaN one value, ``null``; :data:`ABSENT`
    none) within a group of ``by``."""
    out = set()
    for _, g in frame.groupby(by, dropna=False, sort=False):
        for k in keys:
            if k not in out:
                values = g[k].map(text)
                out |= {k} if values[values != ABSENT].nunique() > 1 else set()
    return out


def _settings(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c not in _ID]


def comparison_groups(frame: pd.DataFrame) -> tuple[list[str], list[Group]]:
    """``(keys, groups)``: the :data:`GROUP_KEYS` that differ between runs of one task in the
    :func:`config_frame` ``frame``, and one :class:`Group` per combination of their values
    (sorted); one group of every run where none differs."""
    keys = [k for k in GROUP_KEYS if k in _differing(frame, ["task"], [k for k in GROUP_KEYS if k in frame])]
    if not keys:
        return [], [Group((), frozenset(frame["run_dir"]))]
    values = frame[keys].map(text)
    groups = []
    for _, g in frame.groupby([values[k] for k in keys], sort=False):
        settings = tuple((k, frame.loc[g.index[0], k]) for k in keys)
        groups.append(Group(settings, frozenset(g["run_dir"])))
    # by value: budgets in increasing order (none and absent first)
    def order(g: Group) -> list:
        number = [isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for _, v in g.settings]
        return [(n, float(v) if n else text(v)) for n, (_, v) in zip(number, g.settings)]

    return keys, sorted(groups, key=order)


def config_labels(frame: pd.DataFrame) -> tuple[pd.Series, dict[str, list[str]]]:
    """``(labels, swept)``: each run's estimator label (index :data:`RUN_KEYS`) and, per
    estimator name, the settings its labels show: those that differ between its runs on one task
    (variant settings first, then hyperparameters, then the rest by name). A name whose runs
    share one config keeps the plain name."""
    keys = _settings(frame)
    order = {k: i for i, k in enumerate([*VARIANT_KEYS, *(_CONFIG_NAME.get(h, h) for h in HYPERPARAMETERS)])}
    swept = {}
    for name, g in frame.groupby("estimator_name", sort=True, dropna=False):
        differ = _differing(g, ["task"], keys)
        swept[name] = sorted(differ, key=lambda k: (order.get(k, len(order)), k))
    def shown(value) -> str:
        return "null" if text(value) == ABSENT else text(value)

    labels = [variant_label(r["estimator_name"], [f"{k}={shown(r[k])}" for k in swept[r["estimator_name"]]])
              for r in frame.to_dict("records")]
    index = pd.MultiIndex.from_frame(frame[RUN_KEYS]) if len(frame) else pd.MultiIndex.from_arrays([[], []],
                                                                                                names=RUN_KEYS)
    return pd.Series(labels, index=index, dtype=object), {k: v for k, v in swept.items() if v}


def sample_budgets(frame: pd.DataFrame) -> pd.DataFrame:
    """Each run's budget in samples (index :data:`RUN_KEYS`): ``sample_budget``, its config's
    ``budget.tokens``, else ``budget.env_steps`` (NaN for a run with neither: a budget in
    iterations only), and ``sample_axis``, the metrics column that budget counts (``tokens`` or
    ``env_steps``: on the toy task sampled sequences, though it logs tokens too; None with neither)."""
    index = pd.MultiIndex.from_frame(frame[RUN_KEYS]) if len(frame) else None
    out = pd.DataFrame({"sample_budget": pd.Series(np.nan, index=index, dtype=float),
                        "sample_axis": pd.Series(None, index=index, dtype=object)})
    for key in reversed(SAMPLE_BUDGET_KEYS):
        if key in frame and len(frame):
            v = pd.to_numeric(frame[key], errors="coerce").to_numpy(dtype=float)
            set_here = np.isfinite(v)
            out.loc[set_here, "sample_budget"] = v[set_here]
            out.loc[set_here, "sample_axis"] = key.split(".", 1)[1]
    return out
