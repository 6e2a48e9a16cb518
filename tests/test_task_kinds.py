"""Task kinds: what differs between ``task.family=control|lm|toy`` for the schema and the loop
(how the members train, whether a run resumes) is one :class:`harness.config.TaskKind` entry each;
its functions are registered by the same name where they are called: the trainer in
:data:`harness.app.TRAINERS`, the checks in :data:`harness.validation.TASK_CHECKS`, the probe in
:data:`harness.probes.PROBES`. A new kind is one entry in each (here a test kind)."""
from __future__ import annotations

import dataclasses

import pytest

from harness import app, probes, validation
from harness.config import TASK_KINDS, TaskKind, task_kind
from harness.io import checkpoint as ckpt
from harness.probes import PROBES, Probe
from harness.train import workers as train_workers
from harness.validation import TASK_CHECKS, validate
from tests.control_helpers import make_cfg
from types import SimpleNamespace

# where each registry's functions are defined: a layer its caller may import (.importlinter: app > train,
# probes > tasks)
REGISTRIES = {"trainer": (app.TRAINERS, "harness.train."), "checks": (TASK_CHECKS, "harness.validation"),
              "probe": ({k: p.run for k, p in PROBES.items()}, "harness.probes."),
              "probe validation": ({k: p.validate for k, p in PROBES.items()}, "harness.probes.")}


def test_the_three_kinds_and_what_each_says():
    """The table: control and toy train a batched population, LM one member after another; every
    kind resumes; control and toy have a probe, LM none."""
    got = {k.name: (k.population, k.resumes, k.name in PROBES, k.node, k.budget) for k in TASK_KINDS.values()}
    assert got == {"control": (True, True, True, None, "env_steps"),
                   "lm": (False, True, False, "lm", "tokens"),
                   "toy": (True, True, True, "toy", "env_steps")}


def test_every_kind_has_a_trainer_and_checks_and_nothing_else_is_registered():
    assert list(app.TRAINERS) == list(TASK_KINDS) == list(TASK_CHECKS) == ["control", "lm", "toy"]
    assert list(PROBES) == ["control", "toy"]
    assert [app.get_trainer(name).__module__ for name in TASK_KINDS] == [
        "harness.train.control", "harness.train.lm", "harness.train.toy"]


@pytest.mark.parametrize("registry", sorted(REGISTRIES))
def test_each_registered_function_is_defined_in_a_layer_its_caller_may_import(registry):
    functions, layer = REGISTRIES[registry]
    for name, fn in functions.items():
        assert callable(fn) and fn.__module__.startswith(layer), (name, fn.__module__)


def test_an_unknown_kind_is_one_line_naming_the_field_and_the_kinds():
    with pytest.raises(ValueError, match=r"^task.family must be one of \['control', 'lm', 'toy'\], got 'nope'$"):
        task_kind("nope")


@pytest.mark.parametrize("name, how", [("control", "population"), ("lm", "one_by_one"), ("toy", "population")])
def test_the_loop_trains_each_kind_the_way_its_entry_says(name, how, monkeypatch):
    calls = []
    monkeypatch.setattr(train_workers, "train_population", lambda *a, **k: calls.append("population"))
    monkeypatch.setattr(train_workers, "train_one_by_one", lambda *a, **k: calls.append("one_by_one"))
    train_workers.train_members(SimpleNamespace(kind=TASK_KINDS[name]), [], None)
    assert calls == [how]
    monkeypatch.setitem(TASK_KINDS, name, dataclasses.replace(TASK_KINDS[name], population=how != "population"))
    train_workers.train_members(SimpleNamespace(kind=TASK_KINDS[name]), [], None)
    assert calls == [how, "one_by_one" if how == "population" else "population"]


# ----------------------------------------------------------------------------- a new kind: one entry

SEEN: list[str] = []


def check_test_kind(cfg, spec) -> None:
    """The test kind's validation: records the call, refuses group_size=3."""
    SEEN.append(f"validate {spec.name}")
    if cfg.group_size == 3:
        raise ValueError("group_size must be 2 for task.family=test_kind, got 3")


def train_test_kind(plan, runs) -> None:
    """The test kind's trainer: records which checkpoint files it found, finishes every run."""
    for r in runs:
        SEEN.append(f"train seed{r.cfg.seed} checkpoint={(r.path / ckpt.CHECKPOINT_FILE).is_file()}")
        r.finish("completed", None, 0.0)


@pytest.fixture
def test_kind(monkeypatch):
    SEEN.clear()
    kind = TaskKind("test_kind", population=False, resumes=False)
    monkeypatch.setitem(TASK_KINDS, kind.name, kind)
    monkeypatch.setitem(app.TRAINERS, kind.name, train_test_kind)
    monkeypatch.setitem(validation.TASK_CHECKS, kind.name, check_test_kind)
    return kind


def _cfg(tmp_path, *extra):
    return make_cfg(["task=toy", "task.family=test_kind", "estimator=rloo", "progress=false",
                     f"results_dir={tmp_path}", *extra])


def test_a_new_kind_is_one_entry_its_validation_and_trainer_are_called(test_kind, tmp_path):
    assert app.run(_cfg(tmp_path, "population=2")) == {"skipped": 0, "completed": 2}
    assert SEEN == ["validate rloo", "train seed0 checkpoint=False", "train seed1 checkpoint=False"]
    with pytest.raises(ValueError, match="^group_size must be 2 for task.family=test_kind, got 3$"):
        validate(_cfg(tmp_path, "group_size=3", "task.episodes_per_iter=3"))


def test_a_kind_that_does_not_resume_refuses_checkpoint_every_and_keeps_no_checkpoint(test_kind, tmp_path):
    with pytest.raises(ValueError, match=r"^checkpoint_every must be 0 for task.family=test_kind \(only the task "
                                         r"families control\|lm\|toy checkpoint\), got 4$"):
        validate(_cfg(tmp_path, "checkpoint_every=4"))
    # a checkpoint left in the run's folder is discarded before its trainer starts ...
    cfg = _cfg(tmp_path)
    (run_dir,) = [app.RunDir(m).path for m in app.member_configs(cfg)]
    run_dir.mkdir(parents=True)
    (run_dir / ckpt.CHECKPOINT_FILE).write_bytes(b"x")
    assert app.run(cfg) == {"skipped": 0, "completed": 1}
    assert SEEN[-1] == "train seed0 checkpoint=False"
    # ... and kept for one that resumes
    TASK_KINDS["test_kind"] = dataclasses.replace(test_kind, resumes=True)
    (run_dir / "summary.json").unlink()
    (run_dir / ckpt.CHECKPOINT_FILE).write_bytes(b"x")
    assert app.run(cfg) == {"skipped": 0, "completed": 1}
    assert SEEN[-1] == "train seed0 checkpoint=True"
    validate(_cfg(tmp_path, "checkpoint_every=4"))


def test_a_kind_without_a_probe_is_refused_in_probe_mode(test_kind, tmp_path):
    with pytest.raises(ValueError, match=r"^mode=probe supports task.family in \['control', 'toy'\], "
                                         r"got 'test_kind'$"):
        validate(_cfg(tmp_path, "mode=probe"))
    with pytest.raises(ValueError, match=r"^mode=probe supports task.family in \['control', 'toy'\], got 'lm'$"):
        validate(make_cfg(["task=lm_arith", "estimator=rloo", "mode=probe", f"results_dir={tmp_path}"]))


def probe_test_kind(plan, run) -> None:
    SEEN.append(f"probe seed{run.cfg.seed}")
    run.finish("completed", None, 0.0, extra={"mode": "probe"})


def validate_test_kind_probe(cfg, settings) -> None:
    SEEN.append(f"validate probe batches={settings.batches}")


def test_a_kind_with_a_probe_is_probed_through_its_entry(test_kind, tmp_path, monkeypatch):
    monkeypatch.setitem(probes.PROBES, test_kind.name, Probe(probe_test_kind, validate_test_kind_probe))
    assert app.run(_cfg(tmp_path, "mode=probe", "++probe.batches=6")) == {"skipped": 0, "completed": 1}
    # validate() checks the probe's settings, once: run_probe probes the plan it returned
    assert SEEN == ["validate rloo", "validate probe batches=6", "probe seed0"]
