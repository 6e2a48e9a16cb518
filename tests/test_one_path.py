"""One training path (issue 11): the defects the per-task copies had, each checked against
values worked out by hand or against lone runs.

1. ``loss_agg`` acts on control tasks (episodes / env-column segments are the sequences);
2. population members keep their own learning-rate schedule, adaptive KL beta, budget and
   evaluation schedule: a member equals the lone run of its seed for every estimator;
3. ``seq_mean_token_sum_norm`` weighs the KL and entropy terms by the constant length, not by
   the batch's longest response;
4. one meaning per column and one optimizer for every task (last-epoch diagnostics, Adam eps,
   a non-finite gradient skips the member's step, the logged ``lr`` is the one used).
"""
import math

import pandas as pd
import pytest
import torch

from harness.app import run
from harness.estimators import ESTIMATORS
from harness.losses import KLTerm, aggregate, kl_penalty
from harness.train.control import sequence_ids
from harness.train.update import ADAM_EPS, MemberOptimizer, Members, UpdateBatch, UpdateSettings, update
from tests.control_helpers import TINY, make_cfg, population_against_lone_runs, run_frames
from harness.plan import RunPlan


# ----------------------------------------------------------------- 1. loss_agg on control
def test_aggregation_by_sequence_id_weighs_steps_as_worked_out_by_hand():
    """Two episodes of lengths 1 and 3 laid out step by step ([P=1, T=1, B=4], the control
    layout). d loss / d x_i is the weight of step i:
    token_mean 1/4 each; seq_mean_token_mean 1/2 for the lone step, 1/2 * 1/3 for the others;
    seq_mean_token_sum_norm (L = 5) 1/2 * 1/5 for every step."""
    seq = torch.tensor([[[0, 1, 1, 1]]])
    mask = torch.ones(1, 1, 4)
    expected = {"token_mean": [0.25] * 4,
                "seq_mean_token_mean": [0.5, 1 / 6, 1 / 6, 1 / 6],
                "seq_mean_token_sum_norm": [0.1] * 4}
    for mode, weights in expected.items():
        x = torch.tensor([[[2.0, -1.0, 3.0, 0.5]]], requires_grad=True)
        aggregate(x, mask, mode, norm_len=5, seq_id=seq).sum().backward()
        assert x.grad.flatten().tolist() == pytest.approx(weights), mode
    # a masked step counts for nothing, and an episode with no unmasked step is not a sequence
    x = torch.tensor([[[2.0, -1.0, 3.0, 0.5]]], requires_grad=True)
    aggregate(x, torch.tensor([[[0.0, 1.0, 1.0, 0.0]]]), "seq_mean_token_mean", seq_id=seq).sum().backward()
    assert x.grad.flatten().tolist() == pytest.approx([0.0, 0.5, 0.5, 0.0])


def test_sequence_ids_are_episodes_or_segments_between_resets():
    # one member, two env columns, 5 steps; column 0 ends an episode at t=1 and t=3
    done = torch.zeros(5, 1, 2, dtype=torch.bool)
    done[1, 0, 0] = done[3, 0, 0] = True
    seg = sequence_ids(done, whole_episodes=False)[:, 0]
    assert seg[:, 0].tolist() == [0, 0, 1, 1, 2]  # the step after a done starts a new segment
    assert seg[:, 1].tolist() == [6, 6, 6, 6, 6]  # column 1: one segment, its own id (n * (T + 1))
    whole = sequence_ids(done, whole_episodes=True)[:, 0]
    assert whole[:, 0].tolist() == [0] * 5 and whole[:, 1].tolist() == [1] * 5


@pytest.mark.parametrize("estimator", ["dr_grpo", "ppo_gae"])
def test_loss_agg_changes_the_control_update(estimator, tmp_path):
    """On main at 6566def the control trainer hard-coded token_mean: the three modes gave
    bit-identical losses and gradients under three different run directories."""
    common = ["task=cartpole", f"estimator={estimator}", *TINY, "budget.iterations=3", "eval_every=0",
              "minibatches=1"]
    if estimator == "ppo_gae":  # env-column segments of unequal length within one rollout
        common += ["task.max_episode_steps=6", "task.rollout_steps=16"]
    frames = {}
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        run(make_cfg(common + [f"loss_agg={mode}", f"results_dir={tmp_path}/{mode}"]))
        frames[mode] = run_frames(tmp_path / mode, 0)[1]
        assert (frames[mode]["loss_agg"] == mode).all()
    for a, b in (("token_mean", "seq_mean_token_mean"), ("token_mean", "seq_mean_token_sum_norm"),
                 ("seq_mean_token_mean", "seq_mean_token_sum_norm")):
        assert frames[a]["grad_norm"].iloc[0] != frames[b]["grad_norm"].iloc[0], (a, b)
        # the first iteration samples the same episodes under every mode
        assert frames[a]["episode_return"].iloc[0] == frames[b]["episode_return"].iloc[0]


# ----------------------------------------------------------------- 2. members are lone runs
@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_population_member_equals_its_lone_run_with_schedules(estimator, tmp_path):
    """anneal_lr and adaptive KL, budget in env steps so members stop at different iterations:
    each member of a population of 3 equals the lone run of its seed (same samples, losses to
    float rounding); the logged lr is lr0 * (1 - env steps before the iteration / budget)."""
    budget = 1100
    common = ["task=cartpole", f"estimator={estimator}", "task.num_envs=2", "task.rollout_steps=16",
              "task.episodes_per_iter=4", "group_size=2", "task.hidden=[16]", "eval_every=0",
              "eval_every_steps=250", "eval_episodes=2", "progress=false", "anneal_lr=true", "lr=3e-3",
              "kl.adaptive=true", "kl.beta=0.05", "kl.kl_target=0.002", "epochs=2", "minibatches=2",
              f"budget.env_steps={budget}", "budget.iterations=null"]
    run(make_cfg(common + ["seed=0", "population=3", f"results_dir={tmp_path}/pop"]))
    lengths = set()
    for seed in range(3):
        run(make_cfg(common + [f"seed={seed}", f"results_dir={tmp_path}/lone"]))
        name_p, a = run_frames(tmp_path / "pop", seed)
        name_l, b = run_frames(tmp_path / "lone", seed)
        assert name_p == name_l
        assert a["env_steps"].tolist() == b["env_steps"].tolist()  # same samples, same budget use
        assert a["episode_return"].equals(b["episode_return"])
        pd.testing.assert_frame_equal(a, b, atol=1e-5, rtol=1e-4)
        before = [0] + a["env_steps"].tolist()[:-1]
        assert a["lr"].tolist() == pytest.approx([3e-3 * max(1 - s / budget, 0.0) for s in before], rel=1e-12)
        lengths.add(len(a))
        assert a["kl_beta"].nunique() > 1  # the adaptive beta moved
        assert a["eval_return"].notna().sum() >= 3
    if estimator in STOP_APART:  # checked for the shipped presets: the setting makes members stop apart
        assert len(lengths) > 1, "members should stop at different iterations for this test to bite"


# whole-episode presets whose members reach the budget at different iterations in the test above
STOP_APART = {"reinforce", "baseline", "grpo", "rloo", "remax", "dr_grpo", "reinforce_pp"}


# ----------------------------------------------------------------- 3. Dr. GRPO's constant L
def test_kl_and_entropy_use_the_constant_length_not_the_batch_width():
    """The same tokens padded to width 8 or 16: with seq_mean_token_sum_norm and L = 16 the KL
    term is sum(k3) / 16 / S whatever the width (main divided by the batch's width: 2x at 8)."""
    torch.manual_seed(0)
    logp8, ref8 = -torch.rand(8, 3), -torch.rand(8, 3)
    mask8 = torch.ones(8, 3)
    mask8[5:, 1] = 0
    pad = lambda x: torch.cat([x, torch.zeros(8, 3)])  # noqa: E731
    k3 = (torch.exp(ref8 - logp8) - (ref8 - logp8) - 1) * mask8
    by_hand = float(k3.sum() / 16 / 3)
    for lp, rf, m in ((logp8, ref8, mask8), (pad(logp8), pad(ref8), pad(mask8))):
        loss, _ = kl_penalty(lp, rf, m, KLTerm("k3"), agg="seq_mean_token_sum_norm", norm_len=16)
        assert float(loss) == pytest.approx(by_hand)
    # the update step passes lm.max_response_len to every term
    cfg = make_cfg(["task=lm_summarize", "estimator=dr_grpo", "kl.beta=0.1"])
    s = UpdateSettings.from_plan(RunPlan.of(cfg), int(cfg.lm.max_response_len))
    assert s.loss_agg == "seq_mean_token_sum_norm" and s.norm_len == int(cfg.lm.max_response_len) and s.kl_loss


# ----------------------------------------------------------------- 4. one meaning per column
class ShiftLearner:
    """log pi = old log pi + w (one scalar parameter per member): the ratio is exp(w)."""

    def __init__(self, P):
        self.population = P
        self.w = torch.zeros(P, 1, requires_grad=True)
        self.params = [self.w]

    def forward(self, inputs, idx, need_entropy):
        old = inputs if idx is None else inputs.gather(2, idx.view(idx.shape[0], 1, -1))
        logp = old + self.w.view(-1, 1, 1)
        return logp, torch.zeros_like(logp) if need_entropy else None, None

    def clip_grads(self, max_norm, per_network):
        return self.w.grad.abs().view(1, -1)

    def finite_members(self):
        return torch.isfinite(self.w.detach()).all(dim=1)


def _settings(**kw):
    cfg = make_cfg(["task=cartpole", "estimator=reinforce", "update=pg", "epochs=2", "minibatches=1",
                    "normalize_advantages=none", "max_grad_norm=null"])
    s = UpdateSettings.from_plan(RunPlan.of(cfg), None)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def test_diagnostics_are_the_last_epochs():
    """Epoch 1 at w = 0 (ratio 1, approx KL 0); Adam's first step moves w by exactly lr
    (m_hat / sqrt(v_hat) = sign of the gradient), so epoch 2 sees log ratio w = lr > 0 (the
    advantage is positive) and approx KL = e^w - 1 - w. An average over epochs would halve it."""
    P, lr = 1, 0.1
    learner = ShiftLearner(P)
    opt = MemberOptimizer(learner.params, P, lr)
    old = -torch.ones(P, 1, 6)
    batch = UpdateBatch(adv=torch.ones(P, 1, 6), mask=torch.ones(P, 1, 6), old_logp=old, inputs=old)
    stats = update(learner, opt, batch, _settings(), Members([torch.Generator().manual_seed(0)],
                   torch.ones(P, dtype=torch.bool), torch.full((P,), lr, dtype=torch.float64), torch.zeros(P)))
    w = float(learner.w.detach()[0, 0])
    assert w == pytest.approx(2 * lr, rel=1e-4)  # two steps of lr (epoch 2's gradient has the same sign)
    assert float(stats["approx_kl"][0]) == pytest.approx(math.exp(lr) - 1 - lr, rel=1e-4)
    assert float(stats["policy_loss"][0]) == pytest.approx(-(-1 + lr), rel=1e-4)  # -mean(logp * A) at w = lr


def test_a_member_with_a_non_finite_gradient_takes_no_step_and_its_neighbours_do():
    P, lr = 2, 0.1
    learner = ShiftLearner(P)
    opt = MemberOptimizer(learner.params, P, lr)
    old = -torch.ones(P, 1, 4)
    adv = torch.ones(P, 1, 4)
    adv[1, 0, 2] = float("nan")
    batch = UpdateBatch(adv=adv, mask=torch.ones(P, 1, 4), old_logp=old, inputs=old)
    stats = update(learner, opt, batch, _settings(epochs=1), Members([torch.Generator().manual_seed(i) for i in range(P)],
                   torch.ones(P, dtype=torch.bool), torch.full((P,), lr, dtype=torch.float64), torch.zeros(P)))
    assert learner.w.detach()[:, 0].tolist() == pytest.approx([lr, 0.0], rel=1e-4)  # Adam: lr * g / (|g| + eps)
    assert stats["nonfinite"].tolist() == [0, 1]  # member 1: non-finite loss


def test_member_learning_rates_scale_each_members_step():
    """Adam's first step is lr * sign(g): members with lr 0.1, 0.05 and 0 (finished) move by that."""
    P = 3
    learner = ShiftLearner(P)
    opt = MemberOptimizer(learner.params, P, 0.1)
    old = -torch.ones(P, 1, 4)
    batch = UpdateBatch(adv=torch.ones(P, 1, 4), mask=torch.ones(P, 1, 4), old_logp=old, inputs=old)
    update(learner, opt, batch, _settings(epochs=1), Members([torch.Generator().manual_seed(i) for i in range(P)],
           torch.ones(P, dtype=torch.bool), torch.tensor([0.1, 0.05, 0.0], dtype=torch.float64), torch.zeros(P)))
    assert learner.w.detach()[:, 0].tolist() == pytest.approx([0.1, 0.05, 0.0], rel=1e-4)  # eps=1e-5 in Adam


@pytest.mark.parametrize("fused, dtype", [(True, torch.float32), (False, torch.float32), (False, torch.float64)])
def test_direct_adam_is_adams_own_step(fused, dtype, monkeypatch):
    """MemberOptimizer's direct Adam step (fused: the kernel called directly; not fused, the toy
    task's: ``torch.optim.adam.adam``, once every parameter has state and a gradient) against the
    same optimizer stepping through ``torch.optim.Adam.step`` (``direct`` off): the same weights,
    moments and step counts (their dtype too: float64 under a float64 default dtype, unfused) bit
    for bit over steps with a changing learning rate, a frozen member, members' own rates, a
    parameter without a gradient and a state restored from ``state_dict`` (a checkpoint), and the
    direct path is the one taken."""
    monkeypatch.setattr(torch, "get_default_dtype", lambda: dtype)  # what Adam's step dtype follows
    P = 3
    gen = torch.Generator().manual_seed(0)
    shapes = [(2 * P, 4, 8), (2 * P, 1, 8), (P, 1, 2)]
    start = [torch.randn(*s, generator=gen) for s in shapes]
    mine = [torch.nn.Parameter(x.clone()) for x in start]
    ref = [torch.nn.Parameter(x.clone()) for x in start]
    opt, via_step = MemberOptimizer(mine, P, 1e-2, fused=fused), MemberOptimizer(ref, P, 1e-2, fused=fused)
    assert opt.direct
    via_step.direct = False
    calls = []
    step = torch.optim.Adam.step
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, *a, **k: calls.append(self) or step(self, *a, **k))
    no = torch.zeros(P, dtype=torch.bool)
    plan = [(torch.full((P,), 1e-2), no, None), (torch.full((P,), 5e-3), no, None),
            (torch.tensor([4e-3, 2e-3, 1e-3]), no, None),  # members' own rates (annealing)
            (torch.full((P,), 2e-3), torch.tensor([False, True, False]), None),  # a frozen member
            (torch.full((P,), 1e-3), no, 2)]  # parameter 2 has no gradient: Adam skips it
    for k, (lr, frozen, skip) in enumerate(plan * 2):
        if k == len(plan):  # a checkpoint restore rebuilds both optimizers' state
            for o in (opt, via_step):
                o.optim.load_state_dict(o.optim.state_dict())
        grads = [torch.randn(*s, generator=gen) for s in shapes]
        for i, (p, q, g) in enumerate(zip(mine, ref, grads)):
            p.grad, q.grad = (None, None) if i == skip else (g.clone(), g.clone())
        opt.step(lr.double(), frozen)
        via_step.step(lr.double(), frozen)
        for p, q in zip(mine, ref):
            assert torch.equal(p, q), k
            assert opt.optim.state[p].keys() == via_step.optim.state[q].keys(), k
            for key, a in opt.optim.state[p].items():  # a state Adam made itself or one we made
                b = via_step.optim.state[q][key]
                assert torch.equal(a, b) and (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), (k, key)
    assert not torch.equal(mine[0], start[0])
    own = [c for c in calls if c is opt.optim]
    assert len(own) == 2  # the two steps with a parameter without a gradient (the first one is direct)
    mine_groups, their_groups = opt.optim.state_dict()["param_groups"], via_step.optim.state_dict()["param_groups"]
    assert mine_groups == their_groups


def test_adam_made_without_dynamo_is_adams_own():
    """:func:`adam_without_dynamo` is ``torch.optim.Adam``'s constructor: the same groups and
    settings, fused or not (that it imports nothing and leaves torch's wrapper as it was:
    ``tests/test_startup.py::test_a_control_or_toy_run_trains_without_importing_torch_dynamo``)."""
    from harness.train.update import adam_without_dynamo

    params = [torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.zeros(4))]
    for kwargs in ({"lr": 3e-4, "eps": 1e-5}, {"lr": 1e-3, "eps": 1e-5, "fused": True}):
        made, plain = adam_without_dynamo(params, **kwargs), torch.optim.Adam(params, **kwargs)
        assert type(made) is torch.optim.Adam
        assert made.state_dict() == plain.state_dict() and made.defaults == plain.defaults
        assert [g["params"] for g in made.param_groups] == [g["params"] for g in plain.param_groups]


def _family_cfg(family: str, results, lm_iterations: int = 1):
    """A grpo run of ``family``, its results under ``results``: control (CartPole at TINY), toy (2
    iterations) or LM (the LM tests' tiny config, ``lm_iterations`` iterations)."""
    if family == "lm":
        from tests.test_lm_common import compose

        return compose("estimator=grpo", f"budget.iterations={lm_iterations}", "eval_every=0", results_dir=results)
    task = ["task=cartpole", *TINY] if family == "control" else ["task=toy", "budget.iterations=2"]
    return make_cfg(task + ["estimator=grpo", f"results_dir={results}"])


@pytest.mark.parametrize("family", ["control", "toy", "lm"])
def test_every_family_uses_the_one_optimizer_and_logs_the_same_columns(family, tmp_path):
    """Adam eps 1e-5 everywhere (main: 1e-8 on the toy task), and every row carries the policy
    loss's name and the aggregation (analysis never pools them)."""
    from harness.train.loop import Loop, Source

    built = []
    original = Loop.__init__

    def spy(self, plan, source, runs):
        original(self, plan, source, runs)
        built.append(self)

    cfg = _family_cfg(family, tmp_path / "r")
    mp = pytest.MonkeyPatch()
    mp.setattr(Loop, "__init__", spy)
    try:
        assert run(cfg)["completed"] == 1
    finally:
        mp.undo()
    (loop,) = built
    assert isinstance(loop.source, Source)
    assert loop.opt.optim.defaults["eps"] == ADAM_EPS == 1e-5
    (_, df) = run_frames(tmp_path / "r", 0)
    assert (df["update"] == "clip").all() and (df["loss_agg"] == "token_mean").all()
    assert df["lr"].notna().all() and df["kl_beta"].notna().all()


@pytest.mark.parametrize("family", ["control", "toy", "lm"])
def test_wall_times_are_durations_on_a_clock_that_never_steps(family, tmp_path, monkeypatch):
    """``wall_time_s`` (and the LM's ``iter_time_s`` and ``tokens_per_s``) are measured with
    ``time.perf_counter``: a wall clock that steps (here ``time.time`` jumps 10,000 s forward at
    every call, as an NTP step would once) moves none of them. With ``time.time`` they took every
    jump: a control-speed run's members once logged more in-run seconds than their process lasted."""
    import itertools
    import json
    import time

    jumps, real = itertools.count(1), time.time
    monkeypatch.setattr(time, "time", lambda: real() + 1e4 * next(jumps))
    cfg = _family_cfg(family, tmp_path / "r", lm_iterations=2)
    t0 = time.perf_counter()
    assert run(cfg)["completed"] == 1
    elapsed = time.perf_counter() - t0
    (path,) = (tmp_path / "r").rglob("seed0-*/metrics.parquet")
    df = pd.read_parquet(path)
    wall = json.loads((path.parent / "summary.json").read_text())["wall_time_s"]
    assert 0 < wall <= elapsed and df["wall_time_s"].between(0, elapsed).all()
    if family == "lm":
        assert df["iter_time_s"].between(0, elapsed).all() and (df["tokens_per_s"] > 1 / elapsed).all()


def test_a_diverging_member_stops_alone_and_its_neighbours_equal_their_lone_runs(tmp_path):
    """Pendulum a2c at lr 30: seed 1 diverges at iteration 2, seeds 0 and 2 finish; in a
    population the diverged member is frozen and recorded as its lone run is, and the others
    go on exactly as their lone runs."""
    common = ["task=pendulum", "estimator=a2c", *TINY, "lr=3e1", "max_grad_norm=null", "budget.iterations=6",
              "eval_every=0"]
    outcome = {seed: o for seed, (o, _) in population_against_lone_runs(common, tmp_path, atol=1e-5, rtol=1e-4).items()}
    assert outcome[1]["status"] == "diverged" and outcome[0]["status"] == "completed"
    assert outcome[1]["iterations"] < outcome[0]["iterations"] == 6


def test_population_runs_are_the_members_in_seed_order_with_shadows_for_the_rest(tmp_path):
    """``harness.train.workers.population_runs``: every member given, they come back as given in
    seed order; some given, the others are write-nothing shadows of their member configs; runs of
    another config come back as they are."""
    from harness.config import member_configs
    from harness.io import RunDir
    from harness.train.workers import ShadowRun, population_runs, worker_slices

    cfg = make_cfg(TINY + ["task=cartpole", "estimator=rloo", "seed=3", "population=4", f"results_dir={tmp_path}"])
    runs = [RunDir(m) for m in member_configs(cfg)]
    out = population_runs(cfg, runs[::-1])
    assert all(a is b for a, b in zip(out, runs)) and len(out) == 4
    out = population_runs(cfg, [runs[2], runs[0]])
    assert [int(r.cfg.seed) for r in out] == [3, 4, 5, 6] and out[0] is runs[0] and out[2] is runs[2]
    assert [type(r) is ShadowRun for r in out] == [False, True, False, True]
    other = RunDir(make_cfg(TINY + ["task=cartpole", "estimator=rloo", "seed=40", f"results_dir={tmp_path}"]))
    assert population_runs(cfg, [other]) == [other]
    assert worker_slices(5, 2) == [range(0, 3), range(3, 5)] and worker_slices(2, 8) == [range(0, 1), range(1, 2)]
