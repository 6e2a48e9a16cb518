"""The docs' tables written from the registries and config files, never typed.

Estimators, policy losses, recipes and docs/running.md's option lists:

    python -m harness.docs --write   # rewrite the blocks of README.md, docs/estimators.md, docs/running.md,
                                     # docs/frameworks.md
    python -m harness.docs --check   # exit 1 naming each page whose blocks differ (tests/test_generated_docs.py)

Each page marks a table's place with ``<!-- name:start -->`` ... ``<!-- name:end -->``
(:mod:`harness.docs`); what lies outside the markers is hand prose and stays as it is. What the
tables show comes from where it is defined, nowhere else:

- estimators (:data:`harness.estimators.ESTIMATORS`): the name (in README linked to its YAML), what it
  needs (``needs_critic``, ``needs_groups``, ``needs_greedy``, ``full_episodes``), the defaults its
  ``harness/conf/estimator/<name>.yaml`` sets for ``update``, ``normalize_advantages`` and ``loss_agg``
  (a key it leaves out: the run schema's default, :class:`harness.config.Config`), and ``spec.summary``;
- policy losses (:data:`harness.losses.POLICY_LOSSES`): the name, its knobs with their defaults (the
  fields of ``spec.settings``) and ``spec.summary``;
- the recipes (``harness/conf/recipe/<name>.yaml``, docs/frameworks.md): per recipe file, its ``# recipe:``
  comment block (framework, the algorithm's name there, source file and commit, what differs and why)
  and the values the file sets (its ``override /estimator`` and its keys), read from the file, not composed;
- the option lists: the names of every registry a config key selects from (estimators, policy losses,
  :data:`harness.losses.AGG_MODES`, :data:`harness.estimators.KL_ESTIMATORS`, the ``NORMALIZE``,
  ``GRAD_CLIPS`` and ``LOGGERS`` of :mod:`harness.config`, the task kinds of
  :data:`harness.config.TASK_KINDS`) and the files of the config groups ``harness/conf/<group>/``.

A new estimator or policy loss needs no hand edit of the docs: ``--write`` adds its row.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from .. import config
from ..estimators import ESTIMATORS, KL_ESTIMATORS
from ..experiments import _block_text
from ..losses import AGG_MODES, POLICY_LOSSES
from ..probes import PROBES
from ..reference import REFERENCES
from . import page_path, with_block, write_block

COMMAND = "python -m harness.docs --write"
STAMP = f"Generated from the registries by `{COMMAND}`; edit the registries, not this table."
CONF = Path(config.__file__).parent / "conf"
# the estimator YAML's keys each table row shows, the run schema's default where the YAML leaves one out
YAML_DEFAULTS = ("update", "normalize_advantages", "loss_agg")


def _cell(text: str) -> str:
    """``text`` inside a markdown table cell: a ``|`` would end the cell."""
    return str(text).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _yaml_value(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _names(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


def needs(spec) -> str:
    """What the batch of estimator ``spec`` must carry, in words."""
    words = [w for w, flag in (("critic", spec.needs_critic), ("groups", spec.needs_groups),
                               ("greedy rollout", spec.needs_greedy), ("whole episodes", spec.full_episodes)) if flag]
    return ", ".join(words) or "-"


def estimator_defaults(name: str) -> dict[str, str]:
    """The values of :data:`YAML_DEFAULTS` a run with ``estimator=name`` starts from: its YAML's, else the schema's."""
    schema = {f.name: f.default for f in dataclasses.fields(config.Config)}
    path = CONF / "estimator" / f"{name}.yaml"
    own = OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else {}
    return {k: _yaml_value(own.get(k, schema[k])) for k in YAML_DEFAULTS}


def estimator_table(link: bool) -> str:
    """One row per registered estimator, in registration order; ``link``: the name links to its YAML
    (README; the mkdocs site holds only docs/, so its page shows the bare name)."""
    rows = []
    for name, spec in ESTIMATORS.items():
        label = f"`{name}`"
        if link and (CONF / "estimator" / f"{name}.yaml").exists():
            label = f"[{label}](harness/conf/estimator/{name}.yaml)"
        d = estimator_defaults(name)
        rows.append([label, needs(spec), *(f"`{d[k]}`" for k in YAML_DEFAULTS), spec.summary])
    return _table(["`estimator=`", "needs", *(f"`{k}`" for k in YAML_DEFAULTS), "what it is"], rows)


def loss_knobs(loss) -> str:
    """``knob=default`` for each field of the loss's settings dataclass (its config keys)."""
    return ", ".join(f"`{f.name}={_yaml_value(f.default)}`" for f in dataclasses.fields(loss.settings)) or "-"


def loss_table() -> str:
    rows = [[f"`{name}`", loss_knobs(loss), loss.summary] for name, loss in POLICY_LOSSES.items()]
    return _table(["`update=`", "its knobs (defaults)", "what it is"], rows)


def _group(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _tasks_by_kind() -> str:
    kinds: dict[str, list[str]] = {k: [] for k in config.TASK_KINDS}
    for name in _group("task"):
        family = OmegaConf.load(CONF / "task" / f"{name}.yaml").task.family
        kinds.setdefault(family, []).append(name)
    return "; ".join(f"{kind}: {_names(names)}" for kind, names in kinds.items() if names)


def options_table() -> str:
    """docs/running.md's option lists: each config key that selects a name, and the names."""
    kinds = [f"`{k.name}` ({'one batched population' if k.population else 'one member after another'}"
             f"{', resumes' if k.resumes else ''}{', `mode=probe`' if k.name in PROBES else ''})" for k in config.TASK_KINDS.values()]
    rows = [
        ["`task=`", f"{_tasks_by_kind()} (`harness/conf/task/`)"],
        ["task kind (`task.family`)", ", ".join(kinds)],
        ["`estimator=`", _names(ESTIMATORS) + " ([table](estimators.md#estimators-and-policy-losses))"],
        ["`update=`", _names(POLICY_LOSSES) + " (the policy loss)"],
        ["`policy_loss=`", _names(_group("policy_loss")) + " (a policy loss with its paper's clip range, "
                                                          "`harness/conf/policy_loss/`)"],
        ["`loss_agg=`", _names(AGG_MODES)],
        ["`loss_type=`", _names(_group("loss_type")) + " (TRL's names for a `loss_agg`, `harness/conf/loss_type/`)"],
        ["`recipe=`", _names(_group("recipe")) + " (an algorithm as a framework ships it, `harness/conf/recipe/`: "
                                                "[frameworks](frameworks.md))"],
        ["`+ablation=`", _names(_group("ablation")) + " (one knob changed from the task's tuned preset, each file "
                                                     "naming its source; `none` is the preset itself, the baseline "
                                                     "arm of a sweep over them, `harness/conf/ablation/`: "
                                                     "[continuous control](continuous.md))"],
        ["`reference=`", _names(REFERENCES) + " (that library's own trainer on the config, written as a harness run: "
                                              "[learning parity](parity.md))"],
        ["`kl.estimator=`", _names(KL_ESTIMATORS)],
        ["`normalize_advantages=`", _names(config.NORMALIZE)],
        ["`grad_clip=`", _names(config.GRAD_CLIPS)],
        ["`logger=`", _names(config.LOGGERS)],
    ]
    return _table(["option", "values"], rows)


RECIPE_HEAD = "# recipe:"  # the metadata block of a recipe file (read as harness.experiments reads a claim block)
RECIPE_FIELDS = ("framework", "algorithm", "source", "differs")


def read_recipe(path: Path) -> dict:
    """The ``# recipe:`` block of the recipe file ``path`` (every field of :data:`RECIPE_FIELDS`, a
    non-empty string) and what the file sets: ``estimator`` (its ``override /estimator``) and
    ``settings`` (``key=value`` for each key, nested keys dotted, in file order). ``ValueError``
    naming the file and the field when the block is missing or incomplete."""
    import yaml
    text = path.read_text()
    block = _block_text(text, RECIPE_HEAD)
    meta = yaml.safe_load(block) if block is not None else None
    if not isinstance(meta, dict):
        raise ValueError(f"{path.name}: no '{RECIPE_HEAD}' block with {list(RECIPE_FIELDS)}")
    for field in RECIPE_FIELDS:
        if not isinstance(meta.get(field), str) or not meta[field].strip():
            raise ValueError(f"{path.name}: its recipe block lacks '{field}' (a non-empty string)")
    unknown = sorted(set(meta) - set(RECIPE_FIELDS))
    if unknown:
        raise ValueError(f"{path.name}: unknown recipe block field(s) {unknown}; allowed: {list(RECIPE_FIELDS)}")
    body = yaml.safe_load(text) or {}
    estimator = next((next(iter(d.values())) for d in body.pop("defaults", []) if isinstance(d, dict)
                      and next(iter(d)) == "override /estimator"), None)

    def flat(node, prefix=""):
        for k, v in node.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}={_yaml_value(v)}"
    return {**meta, "name": path.stem, "estimator": estimator, "settings": list(flat(body))}


def recipes() -> list[dict]:
    """Every recipe file of ``harness/conf/recipe/`` (:func:`read_recipe`), by framework then name."""
    found = [read_recipe(p) for p in sorted((CONF / "recipe").glob("*.yaml"))]
    return sorted(found, key=lambda r: (r["framework"].lower(), r["name"]))


def recipe_table() -> str:
    """docs/frameworks.md: one row per recipe."""
    rows = [[f"`recipe={r['name']}`", r["framework"], r["algorithm"], r["source"], f"`{r['estimator']}`",
             " ".join(f"`{s}`" for s in r["settings"]), r["differs"]] for r in recipes()]
    return _table(["recipe", "framework", "the framework's algorithm", "source (file @ commit)", "estimator",
                   "what the recipe sets", "what differs, and why"], rows)


# page -> its blocks: name -> the function writing the block's markdown
BLOCKS: dict[str, dict[str, Callable[[], str]]] = {
    "README.md": {"estimator-table": lambda: estimator_table(link=True), "loss-table": loss_table},
    "docs/estimators.md": {"estimator-table": lambda: estimator_table(link=False), "loss-table": loss_table},
    "docs/running.md": {"option-lists": options_table},
    "docs/frameworks.md": {"recipe-table": recipe_table},
}


def generated(page: str, text: str) -> str:
    """``text`` (the page ``page``) with each of its blocks as :data:`BLOCKS` writes it."""
    for name, make in BLOCKS[page].items():
        text = with_block(text, name, make(), STAMP, where=page)
    return text


def stale_pages() -> list[str]:
    """The pages of :data:`BLOCKS` whose committed blocks differ from the generated ones."""
    return [page for page in BLOCKS if generated(page, text := page_path(page).read_text()) != text]


def write() -> None:
    for page, blocks in BLOCKS.items():
        for name, make in blocks.items():
            write_block(page, name, make(), stamp=STAMP)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.docs --write | --check``; returns the exit code (``--check``: 1 when a page is stale)."""
    ap = argparse.ArgumentParser(prog="python -m harness.docs", description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the generated blocks of the pages")
    mode.add_argument("--check", action="store_true", help="exit 1 when a page's blocks differ from the generated ones")
    args = ap.parse_args(argv)
    if args.write:
        write()
        return 0
    stale = stale_pages()
    for page in stale:
        print(f"{page}: its generated tables differ from the registries; run `{COMMAND}`", file=sys.stderr)
    return 1 if stale else 0
