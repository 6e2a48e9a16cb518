"""Speed of the control trainer against stable-baselines3, every side a whole process.

ppo_gae on CartPole-v1 with rl-baselines3-zoo hyperparameters (8 envs x 32 steps, batch 256, 20
epochs, lr 1e-3 linearly annealed, gamma 0.98, lambda 0.8, clip 0.2, 64-64 tanh), against
stable-baselines3 PPO with the same settings (``pip install -e ".[bench]"``;
:mod:`benchmarks.sb3_ppo`, one process per seed). Every timing is a whole process, interpreter
start and imports included, launched the way a user would launch it (``python -m harness ...``);
each ends with a 10-episode greedy evaluation (ours: ``eval_every_steps=<steps>``, inside the
run; SB3: ``evaluate_policy`` after ``learn``), whose mean is the run's final return. The goals:

1. ``population=16`` (16 seeds in one process) vs SB3's 16 seeds as 2 parallel worker
   processes: wall time ratio <= 1/3 at equal median final return; and the per-seed cost of
   ``population=16`` >= 3x lower than ``population=1``'s.
2. A lone run (``population=1``) vs one SB3 run: wall time ratio <= 0.5. Beside it, measured
   in the same run, what a plain PPO pays before it collects a step: a hand-written PPO update
   step times the run's minibatches (:func:`update_floor`), plus a process that only imports torch and makes an
   Adam (:func:`startup_floor`); and the lone floor: that start-up with the Adam made without importing
   ``torch._dynamo`` (as the harness makes it), the same step with fused Adam (the harness's), and the run's collection and evaluation written the plainest way (CartPole's own
   vector env and one plain actor forward per step, :func:`collection_floor`). Beside them, the harness's own collection of the
   run's rollouts against that plainest one, alternating in one process (:func:`harness_collection`). Beside the population's ratio (the goal: <= 0.20), the same for
   the population: the plain step written batched for one worker's slice of the members
   (:func:`population_floor`), times the minibatches, plus that start-up.

``population=16`` runs with the harness's default layout (one worker process per core, each
training a slice of the members on one torch thread; the table names the split it used);
``--one-process`` also times it in one process (``population_workers=1``). Also printed: the
in-run times (ours: the run's ``wall_time_s``, training plus its final evaluation; SB3:
``learn`` alone), and with ``--joblib`` the 16 seeds as a 2-worker joblib sweep of lone runs
(``python -m harness -m ... hydra/launcher=joblib``).

Usage: python benchmarks/control_speed.py [--steps 100000] [--population 16] [--rounds 1]
       [--skip-sb3] [--joblib] [--one-process] [--docs]
``--rounds`` repeats the lone comparison (ours and SB3 interleaved) and reports medians. Absolute
times drift on a shared machine, ratios less. ``--docs`` also writes the table into
docs/benchmarks.md (block ``control-speed``).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Callable
from harness.plan import RunPlan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.docs import write_block  # noqa: E402

ZOO = ["task=cartpole", "estimator=ppo_gae", "task.num_envs=8", "task.rollout_steps=32", "minibatches=1",
       "epochs=20", "lr=1e-3", "anneal_lr=true", "gamma=0.98", "gae_lambda=0.8", "clip_eps=0.2",
       "ent_coef=0.0", "vf_coef=0.5", "max_grad_norm=0.5", "task.hidden=[64,64]", "task.activation=tanh",
       "eval_every=0", "progress=false"]
SB3_WORKER = ROOT / "benchmarks" / "sb3_ppo.py"


def ours_process(steps: int, population: int, seed: int = 0, extra: tuple[str, ...] = ()) -> dict:
    """``python -m harness <ZOO> population=P [extra]``, timed whole: ``wall`` (s), each member's
    ``run_s`` (its summary's wall_time_s), ``returns`` (its final 10-episode evaluation) and
    ``layout`` (the run's log line naming its worker processes, if it split the population)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "harness", *ZOO, f"budget.env_steps={steps}", f"population={population}",
               f"seed={seed}", f"eval_every_steps={steps}", "eval_episodes=10", f"results_dir={tmp}/results",
               f"hydra.run.dir={tmp}/hydra", *extra]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        layout = next((line.split("population of ", 1)[1] for line in (out.stdout + out.stderr).splitlines()
                       if "population of " in line), None)
        summaries = [json.loads(p.read_text()) for p in sorted(Path(tmp, "results").rglob("summary.json"))]
    if len(summaries) != population or any(s["status"] != "completed" for s in summaries):
        raise RuntimeError(f"expected {population} completed runs, got {[s['status'] for s in summaries]}")
    return {"wall": wall, "run_s": [float(s["wall_time_s"]) for s in summaries],
            "returns": [float(s["final"]["eval_return"]) for s in summaries], "layout": layout}


def sb3_process(steps: int, seed: int) -> dict:
    """One SB3 run as a whole process (:mod:`benchmarks.sb3_ppo`, one torch thread)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(SB3_WORKER), str(seed), str(steps), "1"], check=True,
                         capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    res = json.loads(out.strip().splitlines()[-1])
    return {"wall": wall, "train_s": res["train_s"], "return": res["final_return"]}


def sb3_sweep(steps: int, seeds: int, workers: int) -> dict:
    """``seeds`` SB3 runs, ``workers`` fresh processes at a time; wall time of the whole sweep."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        runs = list(pool.map(lambda s: sb3_process(steps, s), range(seeds)))
    return {"wall": time.perf_counter() - t0, "returns": [r["return"] for r in runs]}


def joblib_sweep(steps: int, seeds: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "harness", "-m", *ZOO, f"budget.env_steps={steps}", f"seed=range(0,{seeds})",
               f"results_dir={tmp}", "threads=1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
               f"hydra.sweep.dir={tmp}/hydra"]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        return time.perf_counter() - t0


def zoo_step_settings(steps: int) -> SimpleNamespace:
    """:data:`ZOO`'s update-step settings, read once for both floors: ``size`` (the minibatch,
    ``num_envs x rollout_steps``, both given too), ``hidden``, ``clip``, ``vf_coef``, ``max_norm``, ``lr``,
    ``epochs`` and ``n_minibatches`` (``ceil(steps / size)`` iterations x ``epochs``)."""
    zoo = dict(a.split("=", 1) for a in ZOO)
    assert zoo["task.activation"] == "tanh" and zoo["minibatches"] == "1", "the floors time ZOO's step"
    num_envs, rollout_steps = int(zoo["task.num_envs"]), int(zoo["task.rollout_steps"])
    size = num_envs * rollout_steps
    return SimpleNamespace(size=size, num_envs=num_envs, rollout_steps=rollout_steps,
                           hidden=json.loads(zoo["task.hidden"]), clip=float(zoo["clip_eps"]),
                           vf_coef=float(zoo["vf_coef"]), max_norm=float(zoo["max_grad_norm"]), lr=float(zoo["lr"]),
                           epochs=int(zoo["epochs"]), n_minibatches=-(-steps // size) * int(zoo["epochs"]))


def floor_problem(steps: int, fused_adam: bool = False, activation: Callable | None = None):
    """What :func:`update_floor` times, built once: a namespace with ``pi``, ``vf`` (the zoo's
    64-64 tanh MLPs for CartPole's 4 inputs, 2 actions and the value), ``params``, ``opt`` (Adam at
    ``lr`` with the harness's eps; ``fused_adam``: ``fused=True``), ``batch`` (one minibatch of
    ``num_envs x rollout_steps`` samples: ``(obs, act, old_logp, adv, ret)``, seeded), ``loss(*batch)``
    (clipped policy loss + ``vf_coef`` x value loss), ``step(loss_fn=loss, batch=batch)`` (zero the
    gradients, ``loss_fn``, backward, clipping at ``max_grad_norm``, Adam; returns the loss),
    ``n_minibatches`` (``ceil(steps / batch)`` iterations x ``epochs``) and ``new_batch(gen)``.
    :data:`ZOO`'s settings; weights from ``torch.manual_seed(0)``, so two problems start equal.
    ``activation``: a module class in place of ``nn.Tanh`` (``benchmarks/tanh_floor.py``)."""
    import torch
    from torch import nn

    from harness.train.update import ADAM_EPS

    z = zoo_step_settings(steps)
    size, clip, vf_coef, max_norm = z.size, z.clip, z.vf_coef, z.max_norm
    torch.manual_seed(0)

    def mlp(out: int) -> nn.Module:
        sizes, layers = [4, *z.hidden], []
        for a, b in zip(sizes, sizes[1:]):
            layers += [nn.Linear(a, b), (activation or nn.Tanh)()]
        return nn.Sequential(*layers, nn.Linear(sizes[-1], out))

    pi, vf = mlp(2), mlp(1)
    params = [*pi.parameters(), *vf.parameters()]
    opt = torch.optim.Adam(params, lr=z.lr, eps=ADAM_EPS, **({"fused": True} if fused_adam else {}))

    def new_batch(gen: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
        return (torch.randn(size, 4, generator=gen), torch.randint(0, 2, (size,), generator=gen),
                torch.randn(size, generator=gen) * 0.1 - 0.7, torch.randn(size, generator=gen),
                torch.randn(size, generator=gen))

    def loss(obs, act, old, adv, ret) -> torch.Tensor:
        logp = torch.log_softmax(pi(obs), -1).gather(1, act[:, None]).squeeze(1)
        ratio = torch.exp(logp - old)
        out = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
        return out + vf_coef * ((vf(obs).squeeze(1) - ret) ** 2).mean()

    batch = new_batch()

    def step(loss_fn: Callable = loss, batch: tuple = batch) -> torch.Tensor:
        out = loss_fn(*batch)
        opt.zero_grad(set_to_none=True)
        out.backward()
        nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
        return out

    return SimpleNamespace(pi=pi, vf=vf, params=params, opt=opt, batch=batch, loss=loss, step=step,
                           new_batch=new_batch, n_minibatches=z.n_minibatches)


def time_step(step: Callable[[], object], reps: int) -> float:
    """Seconds per call of ``step`` over ``reps`` calls, after ``reps // 10`` warm-up calls."""
    for _ in range(reps // 10):
        step()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - t0) / reps


def harness_tanh() -> type:
    """The harness's control tanh (:func:`harness.models.mlp.tanh`: numpy's on CPU) as a module
    class, for :func:`floor_problem`'s ``activation``: the floors the harness is held to use the
    same kernel it does (``benchmarks/tanh_floor.py`` compares it with ``nn.Tanh``)."""
    from torch import nn

    from harness.models.mlp import tanh

    class HarnessTanh(nn.Module):
        def forward(self, x):
            return tanh(x)

    return HarnessTanh


def update_floor(steps: int, reps: int = 2000, activation: Callable | None = None,
                 fused_adam: bool = False) -> tuple[float, int]:
    """``(seconds per minibatch, minibatches)``: a plain hand-written PPO update step with
    :data:`ZOO`'s settings (CartPole's 4 inputs and 2 actions, the zoo's hidden sizes with tanh for
    actor and critic, one minibatch of ``num_envs x rollout_steps`` samples: clipped policy loss,
    value loss x ``vf_coef``, backward, gradient clipping at ``max_grad_norm``, Adam at ``lr`` with
    the harness's eps; :func:`floor_problem`), timed on one torch thread in this process, and how
    many of them ``steps`` env steps make (``ceil(steps / batch)`` iterations x ``epochs``). What
    any eager-PyTorch PPO pays for its updates on this CPU written the plain way (the harness's own
    step is below it: one fused actor-critic pass, fused Adam), before collecting a step.
    ``benchmarks/compile_floor.py`` times the same step under ``torch.compile``. ``activation``: as
    :func:`floor_problem`'s (``main`` passes :func:`harness_tanh`); ``fused_adam``: Adam's fused kernel
    (the harness's Adam), which ``main`` times too."""
    import torch

    torch.set_num_threads(1)  # this process only launches the others: its own threads are this timing's
    prob = floor_problem(steps, fused_adam=fused_adam, activation=activation)
    return time_step(prob.step, reps), prob.n_minibatches


def collection_problem(steps: int, eval_episodes: int = 10, seed: int = 0):
    """What :func:`collection_floor` times, built once: a namespace with ``run()`` (collect and
    evaluate once; returns the vector steps taken and the actions sent; ``run(between)`` calls
    ``between()`` after each iteration's rollout, with grad on: :func:`interleaved_floor`), ``iterations``,
    ``rollout_steps``, ``eval_steps`` and the env counts. :data:`ZOO`'s collection written the plainest
    way: gymnasium's own CartPole vector env (as the harness makes it, ``num_envs`` envs) stepped
    ``rollout_steps`` times per iteration for ``ceil(steps / batch)`` iterations, each step the
    zoo's 64-64 actor as three ``addmm`` with the harness's tanh (numpy's), a Gumbel-max sample
    from uniforms drawn once per rollout, and the sample's log-probability; per rollout one critic
    pass over its observations and one over the next ones (the values GAE needs); then the final
    evaluation: ``eval_episodes`` envs stepped greedily for a CartPole-v1 episode's 500 steps (both
    sides' runs end at return 500). No bookkeeping, no buffers beyond the observations."""
    import numpy as np
    import torch

    from harness.models.mlp import tanh
    from harness.tasks.control import make_vector_env

    z = zoo_step_settings(steps)
    n_envs, T = z.num_envs, z.rollout_steps
    iterations, eval_steps = -(-steps // z.size), 500
    gen = torch.Generator().manual_seed(seed)
    sizes = [4, *z.hidden]

    def mlp(out: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.randn(a, b, generator=gen) / a ** 0.5, torch.zeros(b)) for a, b in zip(sizes, [*sizes[1:], out])]

    pi, vf = mlp(2), mlp(1)

    def forward(layers, x):
        for i, (w, b) in enumerate(layers):
            x = torch.addmm(b, x, w)
            x = tanh(x) if i < len(layers) - 1 else x
        return x

    @torch.no_grad()
    def run(between: Callable[[], object] | None = None, evaluate: bool = True) -> tuple[int, list[np.ndarray]]:
        sent = []
        env = make_vector_env("CartPole-v1", n_envs, None, native=True)
        obs, _ = env.reset(seed=seed)
        for _ in range(iterations):
            gumbel = -torch.log(-torch.log(torch.rand(T, n_envs, 2, generator=gen).clamp(1e-20, 1.0 - 1e-7)))
            seen, nxt = [], []
            for t in range(T):
                o = torch.from_numpy(obs)
                logits = forward(pi, o)
                a = (logits + gumbel[t]).argmax(-1)
                torch.log_softmax(logits, -1).gather(1, a[:, None])
                obs, *_ = env.step(a.numpy())
                sent.append(a.numpy())
                seen.append(o)
                nxt.append(torch.from_numpy(obs))
            forward(vf, torch.cat(seen))
            forward(vf, torch.cat(nxt))
            if between is not None:  # the iteration's update, as a PPO run takes it after each rollout
                with torch.enable_grad():
                    between()
        env.close()
        if not evaluate:
            return iterations * T, sent
        env = make_vector_env("CartPole-v1", eval_episodes, None, native=True)
        obs, _ = env.reset(seed=seed + 1)
        for _ in range(eval_steps):
            obs, *_ = env.step(forward(pi, torch.from_numpy(obs)).argmax(-1).numpy())
        env.close()
        return iterations * T + eval_steps, sent

    return SimpleNamespace(run=run, iterations=iterations, rollout_steps=T, eval_steps=eval_steps, num_envs=n_envs,
                           eval_episodes=eval_episodes)


def collection_floor(steps: int, rounds: int = 3) -> tuple[float, int]:
    """``(seconds, vector steps)``: :func:`collection_problem`'s collection and evaluation, best of
    ``rounds``, on one torch thread in this process: what any PPO run of :data:`ZOO` pays, beyond its
    updates and start-up, to collect its env steps and evaluate, at the least (CartPole's own
    steps and the plainest actor forward each)."""
    import torch

    torch.set_num_threads(1)
    prob = collection_problem(steps)
    best, n = float("inf"), 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        n, _ = prob.run()
        best = min(best, time.perf_counter() - t0)
    return best, n


def interleaved_floor(steps: int, rounds: int = 2) -> tuple[float, float]:
    """``(interleaved, apart)`` seconds: :func:`update_floor`'s cheapest step (fused Adam, the
    harness's tanh) and :func:`collection_problem`'s collection and evaluation, run as a PPO run runs
    them, each iteration's rollout followed by its ``epochs`` minibatches (best of ``rounds``), and
    the same work timed apart, the step ``n_minibatches`` times back to back plus the collection
    alone (best of ``rounds`` each), on one torch thread. The two differ by what the steps pay for
    coming after a rollout (the caches the rollout's code and data left: an update right after
    another is faster than one right after a rollout), which the floors timed apart leave out and
    every PPO run, the harness's and SB3's, pays."""
    import torch

    torch.set_num_threads(1)
    z = zoo_step_settings(steps)
    prob = floor_problem(steps, fused_adam=True, activation=harness_tanh())
    coll = collection_problem(steps)

    def update() -> None:
        for _ in range(z.epochs):
            prob.step()

    best_inter = best_coll = best_steps = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        coll.run(between=update)
        best_inter = min(best_inter, time.perf_counter() - t0)
        t0 = time.perf_counter()
        coll.run()
        best_coll = min(best_coll, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(z.n_minibatches):
            prob.step()
        best_steps = min(best_steps, time.perf_counter() - t0)
    return best_inter, best_coll + best_steps


def harness_collection(steps: int, rounds: int = 3) -> tuple[float, float]:
    """``(harness, plain)`` seconds: the harness's own collection of :data:`ZOO`'s run (its
    ``ControlSource``, made from the run's config: each iteration's ``collect`` and the critic's
    values of the rollout, ``advantage_batch``; weights as initialised, no update) against
    :func:`collection_problem`'s plainest one, both without the evaluation (an untrained greedy
    policy's episodes end early in the harness's evaluation, which steps only running episodes),
    alternating in this process, best of ``rounds`` each, on one torch thread: what the harness's
    collection costs beyond the plainest, on the same env (CartPole's own vector env)."""
    import torch

    from harness.testing import compose
    from harness.train.control import ControlSource

    torch.set_num_threads(1)
    cfg = compose([*ZOO, f"budget.env_steps={steps}", "seed=0"])
    prob = collection_problem(steps)

    def ours() -> None:
        src = ControlSource(RunPlan.of(cfg), [SimpleNamespace(cfg=cfg)])  # a run's source reads only its config
        for _ in range(prob.iterations):
            src.advantage_batch(src.collect())
        src.close()

    best_h = best_p = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        ours()
        best_h = min(best_h, time.perf_counter() - t0)
        t0 = time.perf_counter()
        prob.run(evaluate=False)
        best_p = min(best_p, time.perf_counter() - t0)
    return best_h, best_p


def population_problem(members: int, seed: int = 0, dtype=None, tanh: Callable | None = None,
                       layer: Callable | None = None):
    """:func:`floor_problem`'s plain PPO update step for ``members`` independent members at once,
    written the plain batched way: each layer one ``baddbmm`` on ``[members, ...]`` weights (actor and
    critic apart), the members' losses summed (each member's gradient is its own), gradient clipping
    per member, one Adam over the stacked weights. A namespace with ``pi``, ``vf`` (lists of
    ``(weight [M, in, out], bias [M, 1, out])``), ``params``, ``opt``, ``batch`` (``(obs, act, old,
    adv, ret)``, each ``[M, ...]``, seeded) and ``step()`` (returns each member's loss, ``[M]``);
    ``dtype``: of the weights and data (default float32; the tests use float64); ``tanh``: a function
    in place of ``torch.tanh`` (``benchmarks/tanh_floor.py``); ``layer``: a function ``(b, x, w)`` in
    place of ``torch.baddbmm`` (``main`` passes the harness's,
    :func:`harness.models.mlp.population_layer`)."""
    import torch

    from harness.train.update import ADAM_EPS

    dtype = dtype or torch.float32
    z = zoo_step_settings(0)
    size, clip, vf_coef, max_norm, M = z.size, z.clip, z.vf_coef, z.max_norm, members
    gen = torch.Generator().manual_seed(seed)
    sizes = [4, *z.hidden]

    def mlp(out: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [((torch.randn(M, a, b, generator=gen, dtype=dtype) / a ** 0.5).requires_grad_(),
                 (torch.randn(M, 1, b, generator=gen, dtype=dtype) * 0.1).requires_grad_())
                for a, b in zip(sizes, [*sizes[1:], out])]

    def forward(layers, x):
        for i, (w, b) in enumerate(layers):
            x = (layer or torch.baddbmm)(b, x, w)
            x = (tanh or torch.tanh)(x) if i < len(layers) - 1 else x
        return x

    pi, vf = mlp(2), mlp(1)
    params = [t for layer in (*pi, *vf) for t in layer]
    opt = torch.optim.Adam(params, lr=z.lr, eps=ADAM_EPS)
    batch = (torch.randn(M, size, 4, generator=gen, dtype=dtype), torch.randint(0, 2, (M, size, 1), generator=gen),
             *(torch.randn(M, size, generator=gen, dtype=dtype) for _ in range(3)))

    def step() -> torch.Tensor:
        obs, act, old, adv, ret = batch
        logp = torch.log_softmax(forward(pi, obs), -1).gather(2, act).squeeze(2)
        ratio = torch.exp(logp - old)
        loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean(1)
        loss = loss + vf_coef * ((forward(vf, obs).squeeze(2) - ret) ** 2).mean(1)
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        norms = torch.stack([p.grad.pow(2).flatten(1).sum(1) for p in params]).sum(0).sqrt()
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for p in params:
            p.grad.mul_(coef.view(M, 1, 1))
        opt.step()
        return loss.detach()

    return SimpleNamespace(pi=pi, vf=vf, params=params, opt=opt, batch=batch, step=step)


def population_floor(members: int, reps: int = 500, tanh: Callable | None = None,
                     layer: Callable | None = None) -> float:
    """Seconds per minibatch of :func:`population_problem`'s step for ``members`` members, on one
    torch thread in this process: what one worker of a population pays per minibatch for its slice
    of the members, before collecting a step (the harness's own population step fuses actor and
    critic and uses fused Adam). ``tanh``, ``layer``: as :func:`population_problem`'s (``main`` passes
    the harness's, :func:`harness.models.mlp.tanh` and :func:`harness.models.mlp.population_layer`)."""
    import torch

    torch.set_num_threads(1)
    prob = population_problem(members, tanh=tanh, layer=layer)
    return time_step(prob.step, reps)


def startup_floor(dynamo: bool = True) -> float:
    """Seconds of a whole ``python -c`` process that imports torch and makes one Adam, started as
    ``python -m harness`` starts (:func:`harness.__main__.end_startup`: the cyclic collector off
    over the imports, then what they made frozen). ``dynamo``: the Adam as torch makes it, which imports
    ``torch._dynamo`` (what a torch PPO process such as SB3's pays before its first step);
    otherwise made as the harness makes it, without that import
    (:func:`harness.train.update.adam_without_dynamo`): the least start-up."""
    code = ("import gc; gc.disable(); import torch, torch._dynamo; gc.freeze(); gc.enable(); "
            "torch.optim.Adam([torch.zeros(1, requires_grad=True)])") if dynamo else (
            "import gc; gc.disable(); import torch; from harness.train.update import adam_without_dynamo; "
            "gc.freeze(); gc.enable(); adam_without_dynamo([torch.zeros(1, requires_grad=True)])")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="parallel SB3 processes in the seed sweep")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the lone comparison (interleaved)")
    ap.add_argument("--skip-sb3", action="store_true")
    ap.add_argument("--joblib", action="store_true", help="also time a 2-worker joblib sweep of lone runs")
    ap.add_argument("--one-process", action="store_true",
                    help="also time the population in one process (population_workers=1, every core a torch thread)")
    ap.add_argument("--docs", action="store_true",
                    help="also write the table into docs/benchmarks.md's control-speed block, "
                         "stamped with this command and today's date")
    args = ap.parse_args()
    import torch  # after the harness's settings would apply; only for the versions printed

    from harness.allocator import tune_allocator

    tune_allocator()  # the floors timed in this process, with the allocator as `python -m harness` sets it

    P, steps = args.population, args.steps
    med = statistics.median
    print(f"torch {torch.__version__}, {steps} env steps per seed; whole processes (start-up included)", flush=True)
    head = (f"ppo_gae on CartPole-v1, {steps} env steps per seed, rl-baselines3-zoo settings, torch "
            f"{torch.__version__}; every time is a whole process (`python -m harness ...`, or one "
            f"`benchmarks/sb3_ppo.py` process per SB3 seed, interpreter start included), each ending with "
            f"a 10-episode greedy evaluation (the final return). \"in-run\": ours the run's wall_time_s "
            f"(training + that evaluation), SB3 `learn` alone.")
    rows = ["| comparison | measured | goal |", "| --- | --- | --- |"]

    lone, sb3 = [], []
    for r in range(args.rounds):
        lone.append(ours_process(steps, 1))
        print(f"round {r}: ours population=1: {lone[-1]['wall']:.1f} s whole (in-run {lone[-1]['run_s'][0]:.1f} s), "
              f"final return {lone[-1]['returns'][0]:.1f}", flush=True)
        if not args.skip_sb3:
            sb3.append(sb3_process(steps, 0))
            print(f"round {r}: SB3 PPO, 1 thread: {sb3[-1]['wall']:.1f} s whole (learn {sb3[-1]['train_s']:.1f} s), "
                  f"final return {sb3[-1]['return']:.1f}", flush=True)
    t1, t1_run = med([x["wall"] for x in lone]), med([x["run_s"][0] for x in lone])
    rows.append(f"| ours, population=1 (median of {args.rounds}) | {t1:.1f} s whole, {t1_run:.1f} s in-run; final "
                f"return {med([x['returns'][0] for x in lone]):.1f} | |")
    if sb3:
        ts, ts_run = med([x["wall"] for x in sb3]), med([x["train_s"] for x in sb3])
        ratio = t1 / ts
        each = [x["wall"] / y["wall"] for x, y in zip(lone, sb3)]
        print(f"-> lone: ours / SB3 whole process = {ratio:.3f} (rounds {min(each):.3f}-{max(each):.3f}; goal <= 0.50: "
              f"{verdict(ratio <= 0.5)}); in-run {t1_run / ts_run:.2f}", flush=True)
        rows.append(f"| SB3 PPO, same settings, 1 thread (median of {args.rounds}) | {ts:.1f} s whole, {ts_run:.1f} s "
                    f"`learn`; final return {med([x['return'] for x in sb3]):.1f} | |")
        rows.append(f"| lone run: ours / SB3 wall time, whole process, of the medians (in-run); each round's own | "
                    f"**{ratio:.3f}** ({t1_run / ts_run:.3f}); {min(each):.3f}-{max(each):.3f} | <= 0.50: {verdict(ratio <= 0.5)} |")
        # beside the lone ratio: what a plain eager-PyTorch PPO process pays before it collects a step,
        # and with the cheapest step measured (fused Adam) and the least collection and evaluation
        per_mb, n_mb = update_floor(steps, activation=harness_tanh())
        per_mb_f, _ = update_floor(steps, activation=harness_tanh(), fused_adam=True)
        t_start = med([startup_floor() for _ in range(3)])
        t_least_start = med([startup_floor(dynamo=False) for _ in range(3)])
        t_collect, n_vec = collection_floor(steps)
        floor = per_mb * n_mb + t_start
        least = per_mb_f * n_mb + t_least_start + t_collect
        print(f"-> plain PPO update step {per_mb * 1e3:.2f} ms x {n_mb} minibatches = {per_mb * n_mb:.1f} s, "
              f"+ start-up (python, import torch, first Adam) {t_start:.1f} s = {floor:.1f} s = {floor / ts:.2f} of "
              f"SB3's whole process, before collecting a step", flush=True)
        print(f"-> with fused Adam {per_mb_f * 1e3:.2f} ms a step, start-up without torch._dynamo "
              f"{t_least_start:.1f} s, + collection and evaluation at the least "
              f"({n_vec} vector steps) {t_collect:.1f} s: {least:.1f} s = {least / ts:.2f} of SB3's whole process; "
              f"ours = {t1 / least:.2f}x that", flush=True)
        rows.append(f"| a plain hand-written PPO update step (same networks, batch, loss terms, clipping, Adam; "
                    f"the harness's tanh, numpy's; 1 thread) x {n_mb} minibatches | {per_mb * n_mb:.1f} s ({per_mb * 1e3:.2f} ms each) | |")
        rows.append(f"| a whole process that only imports torch and makes one Adam, the collector paused over the "
                    f"imports as in `python -m harness` (median of 3) | {t_start:.1f} s | |")
        rows.append(f"| the two above / SB3's whole process (no env step collected, no evaluation) | **{floor / ts:.2f}** | |")
        rows.append(f"| the same step with fused Adam (the harness's Adam), x {n_mb} | {per_mb_f * n_mb:.1f} s "
                    f"({per_mb_f * 1e3:.2f} ms each) | |")
        rows.append(f"| the start-up above with the Adam made as the harness makes it, without importing "
                    f"`torch._dynamo` (median of 3) | {t_least_start:.1f} s | |")
        rows.append(f"| collecting the run's steps and evaluating at the least: CartPole's own vector env "
                    f"({n_vec} steps: 8 envs x 32 steps per iteration, then 500 steps of the 10 evaluation envs), each "
                    f"with the plainest actor forward (three `addmm`, numpy's tanh) and sample, a critic pass per "
                    f"rollout (best of 3) | {t_collect:.1f} s | |")
        rows.append(f"| the lone floor: that start-up + fused-Adam steps + that collection, / SB3's whole process; ours "
                    f"over it | **{least / ts:.2f}**; {t1 / least:.2f}x | |")
        t_inter, t_apart = interleaved_floor(steps)
        inter = t_least_start + t_inter
        print(f"-> the same steps and collection interleaved as a PPO run interleaves them: {t_inter:.1f} s against "
              f"{t_apart:.1f} s timed apart; + that start-up = {inter:.1f} s = {inter / ts:.2f} of SB3's whole process; "
              f"ours = {t1 / inter:.2f}x that", flush=True)
        rows.append(f"| those fused-Adam steps and that collection interleaved as a PPO run interleaves them (each "
                    f"iteration's rollout, then its {zoo_step_settings(steps).epochs} minibatches; "
                    f"best of 2), against the two timed apart in the same rounds | {t_inter:.1f} s against "
                    f"{t_apart:.1f} s | |")
        rows.append(f"| the lone floor, interleaved: that start-up + that, / SB3's whole process; ours over it | "
                    f"**{inter / ts:.2f}**; {t1 / inter:.2f}x | |")
        t_ours, t_plain = harness_collection(steps)
        print(f"-> the harness's collection of the run's rollouts (its ControlSource: collect and the critic's values) "
              f"{t_ours:.2f} s against the plainest {t_plain:.2f} s, alternating: {t_ours / t_plain:.2f}x; the "
              f"difference {(t_ours - t_plain) / ts:.3f} of SB3's whole process", flush=True)
        rows.append(f"| the harness's own collection of the run's rollouts (its `ControlSource`: `collect` and the "
                    f"critic's values; no evaluation) against the plainest above without its evaluation, alternating "
                    f"in one process (best of 3) | {t_ours:.2f} s against {t_plain:.2f} s: **{t_ours / t_plain:.2f}x**; "
                    f"the difference {(t_ours - t_plain) / ts:.3f} of SB3's whole process | |")

    pop = ours_process(steps, P)
    tp, tp_run = pop["wall"], max(pop["run_s"])
    split = f" ({pop['layout']})" if pop["layout"] else " (one process)"
    print(f"ours population={P}{split}: {tp:.1f} s whole (in-run {tp_run:.1f} s); final returns median "
          f"{med(pop['returns']):.1f} (min {min(pop['returns']):.1f})", flush=True)
    per_seed, per_seed_run = t1 / (tp / P), t1_run / (tp_run / P)
    print(f"-> per-seed cost: population=1 / (population={P} / {P}) = {per_seed:.2f}x whole process, "
          f"{per_seed_run:.2f}x in-run (goal >= 3x: {verdict(per_seed >= 3)})", flush=True)
    rows.append(f"| ours, population={P}{split} | {tp:.1f} s whole, {tp_run:.1f} s in-run; final returns median "
                f"{med(pop['returns']):.1f} (min {min(pop['returns']):.1f}) | |")
    if args.one_process:
        one = ours_process(steps, P, extra=("population_workers=1",))
        print(f"ours population={P} in one process (population_workers=1): {one['wall']:.1f} s whole; final "
              f"returns median {med(one['returns']):.1f} -> split / one process = {tp / one['wall']:.2f}", flush=True)
        rows.append(f"| ours, population={P} in one process (`population_workers=1`, every core a torch thread) | "
                    f"{one['wall']:.1f} s whole; final returns median {med(one['returns']):.1f} (min "
                    f"{min(one['returns']):.1f}); the split takes **{tp / one['wall']:.2f}** of its time | |")
    rows.append(f"| per-seed cost, population=1 over population={P} (whole process; in-run) | **{per_seed:.2f}x** "
                f"({per_seed_run:.2f}x) | >= 3x: {verdict(per_seed >= 3)} |")
    if not args.skip_sb3:
        sw = sb3_sweep(steps, P, args.workers)
        ratio = tp / sw["wall"]
        print(f"SB3 PPO, {P} seeds, {args.workers} worker processes: {sw['wall']:.1f} s; final returns median "
              f"{med(sw['returns']):.1f} (min {min(sw['returns']):.1f})", flush=True)
        print(f"-> population={P} / SB3 {args.workers}-worker sweep = {ratio:.2f} (goal <= 0.20: "
              f"{verdict(ratio <= 0.2)}); median final return ours {med(pop['returns']):.1f}, SB3 "
              f"{med(sw['returns']):.1f}", flush=True)
        rows.append(f"| SB3 PPO, {P} seeds, {args.workers} worker processes at a time | {sw['wall']:.1f} s; final "
                    f"returns median {med(sw['returns']):.1f} (min {min(sw['returns']):.1f}) | |")
        rows.append(f"| population={P} / SB3 {args.workers}-worker sweep, wall time | **{ratio:.2f}** (median "
                    f"final return {med(pop['returns']):.1f} vs {med(sw['returns']):.1f}) | <= 0.20 (was 0.33), equal "
                    f"median return: {verdict(ratio <= 0.2 and med(pop['returns']) >= med(sw['returns']))} |")
        # beside the population ratio: what one worker's slice pays for plain batched updates alone
        workers = int(re.search(r"(\d+) worker process", pop["layout"]).group(1)) if pop["layout"] else 1
        per_worker = -(-P // workers)
        from harness.models.mlp import population_layer, tanh

        per_mb = population_floor(per_worker, tanh=tanh, layer=population_layer)
        n_mb = zoo_step_settings(steps).n_minibatches
        t_start = t_start if sb3 else med([startup_floor() for _ in range(3)])  # the lone section's, if it ran
        floor = per_mb * n_mb + t_start
        print(f"-> plain batched PPO update step, {per_worker} members: {per_mb * 1e3:.2f} ms x {n_mb} minibatches "
              f"= {per_mb * n_mb:.1f} s, + start-up {t_start:.1f} s = {floor:.1f} s = {floor / sw['wall']:.2f} of SB3's "
              f"sweep, {floor / tp:.2f} of our population's whole process", flush=True)
        rows.append(f"| a plain batched PPO update step for one worker's {per_worker} members (`baddbmm` layers, "
                    f"the harness's tanh and narrow output layers, per-member clipping, one Adam; 1 thread) x {n_mb} minibatches, + the start-up | "
                    f"{per_mb * n_mb:.1f} s ({per_mb * 1e3:.2f} ms each) + {t_start:.1f} s | |")
        rows.append(f"| that / SB3's {args.workers}-worker sweep (the workers run side by side; no env step "
                    f"collected, no evaluation); / our population's whole process | **{floor / sw['wall']:.2f}**; "
                    f"{floor / tp:.2f} | |")
    if args.joblib:
        tj = joblib_sweep(steps, P)
        print(f"{P} lone runs as a 2-worker joblib sweep: {tj:.1f} s -> population={P} / joblib = {tp / tj:.2f}",
              flush=True)
        rows.append(f"| population={P} vs a 2-worker joblib sweep of {P} lone runs | {tp:.1f} s vs {tj:.1f} s "
                    f"(ratio {tp / tj:.2f}) | < 1 |")
    if args.docs:
        print(f"wrote {write_block('docs/benchmarks.md', 'control-speed', head + chr(10) + chr(10) + chr(10).join(rows))}")


if __name__ == "__main__":
    main()
