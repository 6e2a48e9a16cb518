"""Hostile input to the reference trainers (``reference=sb3|trl``, harness/reference/): a setting
the reference trainer cannot honour, and a reference library installed but broken on import, each
end in one line naming the field (or the package and its error), exit 2, before any run folder
exists. Through the command line's path: :func:`harness.app.main_entry` in this process, or
``python -m harness`` where a broken package must shadow the installed one. Nothing here trains,
and nothing needs stable-baselines3 or TRL installed but the tests that say so: the refusals come
before the library is imported, and the broken libraries are stand-ins."""
from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness.app import main_entry
from harness.validation import validate
from tests.control_helpers import TINY, make_cfg
from tests.test_lm_common import compose

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "pip install 'pg-advantage-harness[bench]'"

SB3 = ["task=cartpole", "estimator=ppo_gae", "reference=sb3", *TINY, "budget.iterations=null",
       "budget.env_steps=96", "threads=1"]
GRPO = ["estimator=grpo", "reference=trl", "lm.reward=gold", "update=clip", "loss_agg=token_mean", "epochs=1",
        "kl.beta=0.04", "kl.estimator=k3", "kl.in_reward=false", "kl.target=ref"]
RLOO = ["estimator=rloo", "reference=trl", "lm.reward=gold", "update=clip", "loss_agg=seq_mean_token_sum",
        "epochs=1", "kl.beta=0.05", "kl.estimator=k1", "kl.in_reward=true", "kl.target=ref"]
WHY_CHECKPOINT = "a reference trainer writes no checkpoints and resumes none"
WHY_LOGGER = "a reference trainer's metric rows go to the run folder alone, to no tracker"


def sb3_cfg(results, *overrides):
    return make_cfg([*SB3, f"results_dir={results}", *overrides])


def trl_cfg(results, base, *overrides):
    return compose(*base, *overrides, results_dir=results)


def needs_tracker(override: str) -> None:
    """``logger=X`` is refused for a missing tracker package first (harness.config.check_logger)."""
    from harness.config import LOGGERS

    key, _, value = override.partition("=")
    for module in LOGGERS[value] if key == "logger" else ():
        pytest.importorskip(module)


def refused(cfg, results: Path, capsys) -> str:
    """The one line ``main_entry`` prints for ``cfg``, asserting exit 2 and nothing under ``results``."""
    with pytest.raises(SystemExit) as e:
        main_entry(cfg)
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert e.value.code == 2, lines
    assert len(lines) == 1, lines
    assert not results.exists() or list(results.iterdir()) == []  # no run folder, nothing else either
    return lines[0]


# --------------------------------------------------------------------------- settings a reference cannot honour

@pytest.mark.parametrize("override, line", [
    ("checkpoint_every=1", f"checkpoint_every must be 0 with reference=sb3 ({WHY_CHECKPOINT}), got 1"),
    ("logger=tensorboard", f"logger must be 'none' with reference=sb3 ({WHY_LOGGER}), got 'tensorboard'"),
    ("logger=wandb", f"logger must be 'none' with reference=sb3 ({WHY_LOGGER}), got 'wandb'"),
    ("logger=mlflow", f"logger must be 'none' with reference=sb3 ({WHY_LOGGER}), got 'mlflow'"),
    ("delta=4.0", "delta must be None with reference=sb3 (SB3's PPO has no other), got 4.0"),
    ("log_ratio_clamp=5.0", "log_ratio_clamp must be None with reference=sb3 (SB3's PPO has no other), got 5.0"),
    ("clip_eps=null", "clip_eps must be a number with reference=sb3 estimator=ppo_gae (SB3's PPO always clips: "
                      "clip_range), got None"),
    ("kl.adaptive=true", "kl.adaptive must be False with reference=sb3 (SB3's PPO has no other), got True"),
    ("kl.log_ratio_clamp=5", "kl.log_ratio_clamp must be None with reference=sb3 (SB3's PPO has no other), got 5.0"),
    ("kl.value_clamp=5", "kl.value_clamp must be None with reference=sb3 (SB3's PPO has no other), got 5.0"),
])
def test_sb3_refuses_what_its_trainer_would_ignore(override, line, tmp_path, capsys):
    needs_tracker(override)
    res = tmp_path / "res"
    assert refused(sb3_cfg(res, override), res, capsys) == f"invalid config: {line}"


@pytest.mark.parametrize("base, override, line", [
    (GRPO, "checkpoint_every=5", f"checkpoint_every must be 0 with reference=trl ({WHY_CHECKPOINT}), got 5"),
    (GRPO, "logger=tensorboard", f"logger must be 'none' with reference=trl ({WHY_LOGGER}), got 'tensorboard'"),
    (GRPO, "logger=mlflow", f"logger must be 'none' with reference=trl ({WHY_LOGGER}), got 'mlflow'"),
    (RLOO, "logger=wandb", f"logger must be 'none' with reference=trl ({WHY_LOGGER}), got 'wandb'"),
    (GRPO, "population_workers=2", "population_workers must be null or 1 with reference=trl (TRL's trainer trains "
                                   "the members one after another in one process), got 2"),
    (RLOO, "population_workers=2", "population_workers must be null or 1 with reference=trl (TRL's trainer trains "
                                   "the members one after another in one process), got 2"),
    (GRPO, "log_ratio_clamp=5.0", "log_ratio_clamp must be None with reference=trl (TRL's GRPOTrainer has no "
                                  "other), got 5.0"),
    (RLOO, "log_ratio_clamp=5.0", "log_ratio_clamp must be None with reference=trl (TRL's RLOOTrainer has no "
                                  "other), got 5.0"),
    (GRPO, "kl.log_ratio_clamp=5", "kl.log_ratio_clamp must be None with reference=trl (TRL's GRPOTrainer has no "
                                   "other), got 5.0"),
    (RLOO, "kl.value_clamp=5", "kl.value_clamp must be None with reference=trl (TRL's RLOOTrainer has no other), "
                               "got 5.0"),
    (GRPO, "group_std_eps=1e-3", "group_std_eps must be 0.0001 (TRL's, added to the group std) or 1e-06 (the "
                                 "default) with reference=trl estimator=grpo std_normalize=true, got 0.001"),
])
def test_trl_refuses_what_its_trainer_would_ignore(base, override, line, tmp_path, capsys):
    needs_tracker(override)
    res = tmp_path / "res"
    assert refused(trl_cfg(res, base, override), res, capsys) == f"invalid config: {line}"


@pytest.mark.parametrize("cfg", [
    lambda res: sb3_cfg(res, "population=2", "population_workers=2", "deterministic=true"),
    lambda res: trl_cfg(res, GRPO, "group_std_eps=1e-4", "deterministic=true", "population_workers=1"),
    lambda res: trl_cfg(res, GRPO, "std_normalize=false", "group_std_eps=1e-3"),  # no std: eps read by neither side
    lambda res: trl_cfg(res, RLOO, "group_std_eps=1e-3"),  # RLOO reads no group std on either side
], ids=["sb3_workers_deterministic", "trl_eps_of_trl", "trl_grpo_without_std", "trl_rloo"])
def test_what_a_reference_honours_or_neither_side_reads_is_accepted(cfg, tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("trl")
    validate(cfg(tmp_path / "res"))


# --------------------------------------------------------------------------- a library installed but broken

def _fake_package(root: Path, name: str, body: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(body)
    return root


@pytest.mark.parametrize("reference, package, args", [
    ("sb3", "stable_baselines3", ["task=cartpole", "estimator=ppo_gae", "budget.env_steps=96",
                                  "budget.iterations=null"]),
    ("trl", "trl", ["task=lm_summarize", *GRPO[:1], *GRPO[2:]]),
])
def test_a_library_that_raises_on_import_is_one_line_exit_2_before_any_folder(reference, package, args, tmp_path):
    """A package of the library's name that raises on import, ahead of any installed one on the
    path: ``python -m harness`` names the package and its error in one line (it used to record
    each run as failed, the reason in its summary.json)."""
    fake = _fake_package(tmp_path / "fake", package, 'raise RuntimeError("broken on purpose")\n')
    res = tmp_path / "res"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])}
    p = subprocess.run([sys.executable, "-m", "harness", *args, f"reference={reference}", f"results_dir={res}",
                        f"lm.cache_dir={tmp_path / 'cache'}" if reference == "trl" else "threads=1"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert p.returncode == 2, lines
    assert lines == [f"invalid config: reference must be null here: {package} is installed but importing it fails "
                     f"(RuntimeError: broken on purpose); reinstall it ({INSTALL}), got '{reference}'"]
    assert [q.name for q in res.iterdir() if not q.name.startswith(".")] == []  # Hydra's job log alone (.hydra)


class _LazyBroken(types.ModuleType):
    """A stand-in for a library that imports lazily (as TRL does) and whose trainer fails to."""

    def __init__(self, name: str, error: BaseException):
        super().__init__(name)
        self.__spec__ = None
        self._error = error

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise self._error


@pytest.mark.parametrize("error, shown", [
    # TRL's lazy import error, several lines: joined into the one line
    (RuntimeError("Failed to import trl.trainer.grpo_trainer because of the following error:\n\nNo module named 'x'"),
     "RuntimeError: Failed to import trl.trainer.grpo_trainer because of the following error: No module named 'x'"),
    (RuntimeError("y" * 1000), "RuntimeError: " + "y" * (300 - len("RuntimeError: ") - 3) + "..."),  # 300 at most
    (SystemExit(3), "SystemExit: 3"),  # a package that exits on import is named, not obeyed
], ids=["lines", "long", "exit"])
def test_a_trainer_that_fails_to_import_lazily_is_named(error, shown, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", _LazyBroken("trl", error))
    res = tmp_path / "res"
    assert refused(trl_cfg(res, GRPO), res, capsys) == (
        f"invalid config: reference must be null here: trl is installed but importing it fails ({shown}); "
        f"reinstall it ({INSTALL}), got 'trl'")


def test_a_library_missing_what_the_trainer_uses_is_named(tmp_path, capsys, monkeypatch):
    """A ``stable_baselines3`` module without its ``common`` subpackage (a sys.modules entry, no spec)."""
    for name in [m for m in sys.modules if m.startswith("stable_baselines3.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "stable_baselines3", types.ModuleType("stable_baselines3"))
    res = tmp_path / "res"
    line = refused(sb3_cfg(res), res, capsys)
    assert line.startswith("invalid config: reference must be null here: stable_baselines3 is installed but "
                           "importing it fails (ModuleNotFoundError: No module named 'stable_baselines3.common'")
    assert line.endswith(f"reinstall it ({INSTALL}), got 'sb3'")


def test_a_library_not_installed_is_named_as_such(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # what Python reads as "not importable"
    res = tmp_path / "res"
    assert refused(sb3_cfg(res), res, capsys) == (
        f"invalid config: reference must be sb3 installed ({INSTALL}), got 'stable_baselines3 not importable'")
