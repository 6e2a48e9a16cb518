"""The plain floors that benchmarks/control_speed.py reports beside its ratios compute what they say.

``population_problem`` (the population's floor) is the lone plain step of ``floor_problem`` written
batched: checked against the same step done member by member, by hand, on each member's weights.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks.control_speed import ZOO, floor_problem, population_problem


def _lone_step(weights, batch, opt_lr, eps):
    """One member's plain update with torch.nn modules: clipped policy loss + 0.5 x value loss,
    backward, clip_grad_norm_ at 0.5, Adam (the zoo's settings, as floor_problem)."""
    zoo = dict(a.split("=", 1) for a in ZOO)
    clip, vf_coef, max_norm = float(zoo["clip_eps"]), float(zoo["vf_coef"]), float(zoo["max_grad_norm"])

    def net(layers):
        mods = []
        for i, (w, b) in enumerate(layers):
            lin = nn.Linear(w.shape[0], w.shape[1]).double()
            with torch.no_grad():
                lin.weight.copy_(w.T)
                lin.bias.copy_(b[0])
            mods += [lin] + ([nn.Tanh()] if i < len(layers) - 1 else [])
        return nn.Sequential(*mods)

    pi, vf = net(weights[0]), net(weights[1])
    params = [*pi.parameters(), *vf.parameters()]
    opt = torch.optim.Adam(params, lr=opt_lr, eps=eps)
    obs, act, old, adv, ret = batch
    logp = torch.log_softmax(pi(obs), -1).gather(1, act).squeeze(1)
    ratio = torch.exp(logp - old)
    loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
    loss = loss + vf_coef * ((vf(obs).squeeze(1) - ret) ** 2).mean()
    loss.backward()
    nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()
    return loss.detach(), [(lin.weight.detach().T, lin.bias.detach()) for lin in (*pi[::2], *vf[::2])]


@pytest.mark.parametrize("layer", ["baddbmm", "harness"])
def test_the_population_floor_step_is_each_members_lone_plain_step(layer):
    # float64: the comparison is of the computation, not of float32 summation order. "harness": the
    # harness's own layer (narrow output layers taken transposed), which control_speed.py's floor uses
    from harness.models.mlp import population_layer

    prob = population_problem(3, seed=1, dtype=torch.float64, layer=population_layer if layer == "harness" else None)
    before = [[(w[m].detach().clone(), b[m].detach().clone()) for w, b in layers] for layers in (prob.pi, prob.vf)
              for m in range(3)]
    losses = prob.step()
    for m in range(3):
        weights = (before[m], before[3 + m])
        loss, after = _lone_step(weights, tuple(t[m] for t in prob.batch), prob.opt.defaults["lr"],
                                 prob.opt.defaults["eps"])
        assert torch.allclose(losses[m], loss, rtol=1e-12, atol=0)
        batched = [(w[m], b[m][0]) for w, b in (*prob.pi, *prob.vf)]
        for (w1, b1), (w2, b2) in zip(batched, after):
            assert torch.allclose(w1, w2, rtol=0, atol=1e-12) and torch.allclose(b1, b2, rtol=0, atol=1e-12)
    # the members differ (independent weights and data), so the check is not of one member thrice
    assert not torch.allclose(losses[0], losses[1])


def test_the_floors_count_the_same_minibatches():
    # 100k steps / (8 envs x 32 steps) = 391 iterations x 20 epochs
    assert floor_problem(100_000).n_minibatches == 391 * 20


def count_env_steps(monkeypatch) -> list[list[int]]:
    """``[num_envs, steps]`` of every vector env ``harness.tasks.control.make_vector_env`` makes from
    now on, counted on the envs themselves; each step's actions checked to be CartPole's (0 or 1)."""
    import harness.tasks.control as control

    made = []
    make = control.make_vector_env

    def counting(env_id, num_envs, max_episode_steps, native=True):
        env = make(env_id, num_envs, max_episode_steps, native)
        made.append([num_envs, 0])
        step = env.step

        def counted(a):
            assert a.shape == (num_envs,) and set(a.tolist()) <= {0, 1}
            made[-1][1] += 1
            return step(a)

        env.step = counted
        return env

    monkeypatch.setattr(control, "make_vector_env", counting)
    return made


def test_the_collection_floor_steps_the_runs_envs_and_evaluation(monkeypatch):
    """collection_problem steps CartPole's vector env as the zoo run does: 1,000 env steps are
    ceil(1000 / 256) = 4 iterations of 8 envs x 32 steps, then 500 steps of the 10 evaluation envs
    (counted here on the envs themselves), each action a valid one from the actor's sample."""
    from benchmarks.control_speed import collection_problem

    made = count_env_steps(monkeypatch)
    prob = collection_problem(1000)
    n, sent = prob.run()
    assert made == [[8, 4 * 32], [10, 500]]
    assert n == 4 * 32 + 500 and len(sent) == 4 * 32
    # the samples are the actor's, not one action throughout
    assert 0 < sum(a.sum() for a in sent) < 4 * 32 * 8


def test_the_interleaved_floor_updates_after_each_rollout(monkeypatch):
    """interleaved_floor's run: ``between`` (the iteration's minibatches) is called once after each
    iteration's 32 vector steps, with grad on, and never during the evaluation."""
    from benchmarks.control_speed import collection_problem

    made = count_env_steps(monkeypatch)
    calls = []
    n, _ = collection_problem(1000).run(between=lambda: calls.append((len(made), made[-1][1], torch.is_grad_enabled())))
    assert calls == [(1, 32 * i, True) for i in range(1, 5)]
    assert made == [[8, 4 * 32], [10, 500]] and n == 4 * 32 + 500


def test_the_harness_collection_and_the_plain_one_step_the_same_envs(monkeypatch):
    """harness_collection times the harness's ControlSource and the plain collection over the same
    env steps: for 1,000 env steps each side makes one CartPole vector env of the run's 8 envs and
    steps it 4 iterations x 32 times (no evaluation on either side), once per round."""
    from benchmarks.control_speed import harness_collection

    made = count_env_steps(monkeypatch)
    t_ours, t_plain = harness_collection(1000, rounds=2)
    assert made == [[8, 4 * 32]] * 4 and t_ours > 0 and t_plain > 0

