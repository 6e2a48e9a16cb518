"""The progress bar's postfix: an iteration in which no episode ends shows no return of 0."""
from __future__ import annotations

from types import SimpleNamespace

from harness.plan import RunPlan
from harness.config import member_configs
from harness.io import RunDir
from harness.train.control import RECENT_EPISODES, ControlSource
from harness.train.loop import Source
from tests.control_helpers import TINY, make_cfg


def rollout(*member_returns: list[float]) -> SimpleNamespace:
    return SimpleNamespace(episode_returns=list(member_returns))


def test_control_bar_keeps_the_last_episodes_mean_through_iterations_that_end_none(tmp_path):
    cfg = make_cfg(["task=cartpole", "estimator=ppo_gae", *TINY, "population=2", f"results_dir={tmp_path}"])
    source = ControlSource(RunPlan.of(cfg), [RunDir(m) for m in member_configs(cfg)])
    assert source.postfix(rollout([], []), []) == {"ret": "no episode ended yet"}
    assert source.postfix(rollout([10.0], [20.0, 30.0]), []) == {"ret": "20.0"}  # (10 + 20 + 30) / 3
    assert source.postfix(rollout([], []), []) == {"ret": "20.0"}  # none ended: still the last mean
    source.postfix(rollout([100.0] * RECENT_EPISODES, []), [])
    assert source.postfix(rollout([], []), []) == {"ret": "100.0"}  # the older three fell out of the window


def test_a_source_without_returns_this_iteration_says_so():
    assert Source.postfix(None, None, [{"episode_return": None}]) == {"ret": "no episode ended"}
    assert Source.postfix(None, None, [{"episode_return": 1.0}, {"episode_return": 2.0}]) == {"ret": "1.500"}


def test_a_pipeline_stage_shows_its_steps_with_an_eta_and_trains_the_same_without(capsys):
    """A pipeline stage's bar (harness.tasks.lm.pipeline.stage_bar) counts the stage's steps to
    its total, with tqdm's remaining-time field and the last loss; with no title it prints
    nothing, and the training is the same either way (the bar reads the loss, nothing else)."""
    import torch

    from harness.tasks.lm.pipeline import supervised_training

    def train(bar):
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        data = torch.randn(6, 2)
        final, steps = supervised_training(model, iter(range(6)), lambda i: (model(data[i]) ** 2).sum(),
                                           lr=0.1, steps=6, warmup=2, bar=bar)
        return final, steps, [p.detach().clone() for p in model.parameters()]

    quiet = train(None)
    assert capsys.readouterr().err == ""
    shown = train("lm: SFT")
    err = capsys.readouterr().err.replace("\r", "\n")
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("lm: SFT: 100%") and "6/6 [" in last and "<00:00" in last  # elapsed<remaining
    assert float(last.rsplit("loss=", 1)[1].rstrip("]")) >= 0  # a squared error, shown
    assert quiet[:2] == shown[:2] and all(torch.equal(a, b) for a, b in zip(quiet[2], shown[2]))


def test_a_claims_point_line_says_the_time_left_at_the_mean_pace():
    from harness.experiments.run import time_left

    assert time_left([2.0, 4.0], 3, "claim_c4") == "; about 00:09 left in claim_c4"  # 3 points x 3 s
    assert time_left([5000.0], 1, "c") == "; about 1:23:20 left in c"
    assert time_left([2.0], 0, "c") == "" and time_left([], 3, "c") == ""


def test_a_sweep_counts_its_jobs_as_the_basic_sweeper_expands_them():
    """2 estimators x range(0,3) seeds on the command line: 6 jobs; quickstart's own
    hydra.sweeper.params (7 estimators) with a command-line seed list of 2: 14; a command-line
    estimator list replaces the experiment's (the command line wins): 2 x 1."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from hydra import compose
    from omegaconf import open_dict

    from harness.callbacks import sweep_size
    from harness.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="harness.conf", version_base="1.3"):
        def jobs(*overrides: str):  # composed as one job of the sweep; the command line as Hydra records it
            cfg = compose(config_name="config", overrides=[o for o in overrides if "," not in o],
                          return_hydra_config=True)
            with open_dict(cfg):
                cfg.hydra.overrides.task = list(overrides)
            return sweep_size(cfg)

        assert jobs("task=cartpole", "estimator=rloo,grpo", "seed=range(0,3)") == 6
        assert jobs("experiment=quickstart", "seed=0,1") == 14
        assert jobs("experiment=quickstart", "estimator=rloo,grpo") == 2
    GlobalHydra.instance().clear()


def test_a_sweep_line_counts_the_jobs_done_since_it_started(tmp_path, monkeypatch):
    """Jobs done are the job folders whose outcome.json was written after the sweep started (an
    earlier sweep's in the same folder do not count); the time left is the mean pace so far:
    2 of 5 done in 10 s -> 3 x 5 s = 15 s."""
    import os

    from harness.callbacks import SWEEP_PROGRESS_ENV, sweep_progress

    start = 1_000_000.0
    for job, when in (("0", start + 4), ("1", start + 9), ("old", start - 60)):
        (tmp_path / job).mkdir()
        (tmp_path / job / "outcome.json").write_text("{}")
        os.utime(tmp_path / job / "outcome.json", (when, when))
    assert sweep_progress(str(tmp_path), now=start + 10) is None  # no sweep in progress
    monkeypatch.setenv(SWEEP_PROGRESS_ENV, f"5,{start}")
    assert sweep_progress(str(tmp_path), now=start + 10) == "[harness] sweep: 2 of 5 jobs done in 00:10, about 00:15 left"
    monkeypatch.setenv(SWEEP_PROGRESS_ENV, f"2,{start}")
    assert sweep_progress(str(tmp_path), now=start + 10) == "[harness] sweep: 2 of 2 jobs done in 00:10"
