"""The metric schema: every column of ``metrics.parquet``, its Arrow type, and which are required.

One module for the writer (:class:`harness.io.RunDir` writes every column below, null where
a value does not apply, plus any extra keys a trainer logs) and the reader
(:func:`analysis.load`, which gives every column below to the loaded frame, null for files
written before a column existed). docs/design.md, "Outputs": missing values are null, not absent.

Groups (the order is the column order of the written file):

* :data:`IDENTITY`: which run and task a row belongs to;
* :data:`VARIANTS`: string settings that change the algorithm itself (``update``, the policy
  loss name registered in :data:`harness.losses.POLICY_LOSSES`, and ``loss_agg``); analysis
  never pools runs that differ in one of them;
* :data:`PROGRESS`: where in training the row is and the scores;
* :data:`HYPERPARAMETERS`: the numeric knobs that vary in sweeps;
* :data:`DIAGNOSTICS`: per-update statistics (critics add ``value_loss``,
  ``explained_variance``);
* :data:`LM_COLUMNS`: language-model runs;
* :data:`TOY_COLUMNS`: exact quantities of the toy task (``exact_entropy``: the response
  entropy by enumeration, :meth:`harness.tasks.toy.ToyTask.prompt_entropy`, averaged over prompts).

Opt-in per-prompt columns (:data:`PER_PROMPT_COLUMNS`, the toy task's ``toy.log_prompts``) are
``<prefix><x>`` for prompt ``x`` (``success_prompt0``, ``update_prompt0``, ...); they are written
only by runs that ask for them, with the type registered here (:func:`column_type`).

:data:`REQUIRED` are the columns every training row must fill (non-null); the rest may be
null. A trainer builds each row with ``row["update"] = cfg.update`` and
``row["loss_agg"] = cfg.loss_agg`` next to the identity columns.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import pyarrow as pa

_S, _I, _F = pa.string(), pa.int64(), pa.float64()

IDENTITY: dict[str, pa.DataType] = {"run_id": _S, "task": _S, "estimator": _S, "seed": _I}
VARIANTS: dict[str, pa.DataType] = {"update": _S, "loss_agg": _S}
PROGRESS: dict[str, pa.DataType] = {
    "iteration": _I, "env_steps": _I, "wall_time_s": _F, "episode_return": _F, "eval_return": _F,
}
HYPERPARAMETERS: dict[str, pa.DataType] = {
    "gamma": _F, "gae_lambda": _F, "clip_eps": _F, "kl_beta": _F, "n_steps": _I, "group_size": _I,
    "lr": _F,
}
DIAGNOSTICS: dict[str, pa.DataType] = {
    "policy_loss": _F, "entropy": _F, "approx_kl": _F, "clip_frac": _F, "grad_norm": _F,
    "adv_mean": _F, "adv_std": _F, "value_loss": _F, "explained_variance": _F,
}
LM_COLUMNS: dict[str, pa.DataType] = {
    "reward": _F, "gold_reward": _F, "kl_ref": _F, "response_len": _F, "tokens": _I,
}
TOY_COLUMNS: dict[str, pa.DataType] = {"exact_entropy": _F}
#: Per-prompt column prefixes (``<prefix><x>``): the exact success probability of prompt x under
#: the policy that sampled the batch (before the update; null for prompts without correct
#: answers), and the norm of the change of prompt x's logits rows over the iteration's update.
PER_PROMPT_COLUMNS: dict[str, pa.DataType] = {"success_prompt": _F, "update_prompt": _F}

#: Every column of the output contract, name -> Arrow type, in file order.
METRIC_COLUMNS: dict[str, pa.DataType] = {
    **IDENTITY, **VARIANTS, **PROGRESS, **HYPERPARAMETERS, **DIAGNOSTICS, **LM_COLUMNS, **TOY_COLUMNS,
}
#: Columns every training row fills (non-null): identity, the algorithm variant, progress.
REQUIRED: tuple[str, ...] = (*IDENTITY, *VARIANTS, "iteration", "env_steps", "wall_time_s")
#: The string-typed columns (everything else is numeric).
STRING_COLUMNS: tuple[str, ...] = tuple(k for k, t in METRIC_COLUMNS.items() if pa.types.is_string(t))


def metric_schema() -> pa.Schema:
    """The Arrow schema of :data:`METRIC_COLUMNS` (all fields nullable)."""
    return pa.schema(list(METRIC_COLUMNS.items()))


def missing_required(row: Mapping) -> list[str]:
    """Names in :data:`REQUIRED` that ``row`` lacks or leaves null (``[]`` when complete)."""
    return [k for k in REQUIRED if row.get(k) is None]


def prompt_column(prefix: str, x: int) -> str:
    """The name of per-prompt column ``prefix`` (a key of :data:`PER_PROMPT_COLUMNS`) for prompt ``x``."""
    if prefix not in PER_PROMPT_COLUMNS:
        raise KeyError(f"{prefix!r} is not a per-prompt column; known: {sorted(PER_PROMPT_COLUMNS)}")
    return f"{prefix}{int(x)}"


def column_type(key: str) -> pa.DataType | None:
    """The registered type of ``key``: a schema column or a per-prompt one; None if neither."""
    if key in METRIC_COLUMNS:
        return METRIC_COLUMNS[key]
    for prefix, typ in PER_PROMPT_COLUMNS.items():
        if key.startswith(prefix) and key[len(prefix):].isdigit():
            return typ
    return None


def infer_type(value) -> pa.DataType:
    """Arrow type of an extra (non-schema) column from one of its values."""
    if isinstance(value, str):
        return _S
    if isinstance(value, int) and not isinstance(value, bool):
        return _I
    return _F


def rows_table(rows: list[Mapping], columns: Mapping[str, pa.DataType] | None = None) -> pa.Table:
    """The metric rows as the Arrow table ``metrics.parquet`` holds (:func:`columns_for`'s columns
    and types, or ``columns``, nulls where a row has no value). Raises ``pa.ArrowInvalid``/``ArrowTypeError``/
    ``TypeError``/``OverflowError`` for a value its column's type cannot hold (a string return):
    the writer's check, and the one a checkpoint's rows pass before a run resumes from them."""
    columns = columns_for(rows) if columns is None else columns
    return pa.table({k: pa.array([r.get(k) for r in rows], type=t) for k, t in columns.items()})


def columns_for(rows: Iterable[Mapping], start: Mapping[str, pa.DataType] | None = None) -> dict[str, pa.DataType]:
    """The schema's columns followed by any extra keys the rows carry, with their types (a key's
    type from its first row). ``start``: the columns of rows that come before ``rows``, so that
    ``columns_for(b, columns_for(a)) == columns_for(a + b)``."""
    columns = dict(METRIC_COLUMNS if start is None else start)
    for row in rows:
        for key, value in row.items():
            if key not in columns:
                columns[key] = column_type(key) or infer_type(value)
    return columns
