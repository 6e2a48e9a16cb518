"""Speed of the control trainer, measured side by side in one process.

1. ppo_gae on CartPole-v1, 100k steps, rl-baselines3-zoo hyperparameters (8 envs x 32
   steps, batch 256, 20 epochs, lr 1e-3 linearly annealed, gamma 0.98, lambda 0.8, clip 0.2,
   64-64 tanh), against stable-baselines3 PPO with the same settings (``pip install -e
   ".[bench]"``). Wall time of training only; final return from 10 greedy episodes after.
2. Seeds as a batch axis: population=16 vs population=1 (wall time per seed), and the same
   16 seeds as a 2-worker joblib sweep of lone runs (``python -m harness -m ...
   hydra/launcher=joblib``), timed end to end.

Usage: python benchmarks/control_speed.py [--steps 100000] [--skip-sb3] [--skip-joblib] [--docs]
Prints each timing and the ratios; absolute times drift on a shared machine, ratios less. ``--docs``
also writes them as a table into docs/benchmarks.md (block ``control-speed``).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._docs import write_block  # noqa: E402
from harness.config import member_configs  # noqa: E402
from harness.io import RunDir  # noqa: E402
from harness.tasks.control import env_info, evaluate  # noqa: E402
from harness.train.control import ControlSource, default_threads  # noqa: E402
from harness.train.loop import Loop  # noqa: E402
from tests.control_helpers import make_cfg  # noqa: E402

ZOO = ["task=cartpole", "estimator=ppo_gae", "task.num_envs=8", "task.rollout_steps=32", "minibatches=1",
       "epochs=20", "lr=1e-3", "anneal_lr=true", "gamma=0.98", "gae_lambda=0.8", "clip_eps=0.2",
       "ent_coef=0.0", "vf_coef=0.5", "max_grad_norm=0.5", "task.hidden=[64,64]", "task.activation=tanh",
       "eval_every=0", "progress=false"]


def ours(steps: int, population: int, seed: int = 0) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_cfg(ZOO + [f"budget.env_steps={steps}", f"population={population}", f"seed={seed}",
                              f"results_dir={tmp}"])
        runs = [RunDir(m) for m in member_configs(cfg)]
        for r in runs:
            r.start()
        initial_threads = torch.get_num_threads()
        torch.set_num_threads(default_threads(cfg, population))  # as harness.train.control.train
        source = ControlSource(cfg, runs)
        loop = Loop(cfg, source, runs, "control")
        t0 = time.perf_counter()
        loop.run()
        wall = time.perf_counter() - t0
        torch.set_num_threads(initial_threads)
        info = env_info("CartPole-v1")
        returns = evaluate(source.agent, "CartPole-v1", 10, None, info, [10_000 + s for s in source.seeds])
    return wall, returns


def sb3(steps: int, threads: int, seed: int = 0) -> tuple[float, float]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    def linear(v):
        return lambda progress: progress * v

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, learning_rate=linear(1e-3),
                gamma=0.98, gae_lambda=0.8, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                policy_kwargs=dict(net_arch=[64, 64], activation_fn=torch.nn.Tanh), seed=seed, device="cpu",
                verbose=0)
    initial_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - t0
    torch.set_num_threads(initial_threads)
    mean, _ = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=10_000), n_eval_episodes=10,
                              deterministic=True)
    return wall, float(mean)


def joblib_sweep(steps: int, seeds: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "harness", "-m", *[o for o in ZOO if not o.startswith("progress")],
               f"budget.env_steps={steps}", f"seed=range(0,{seeds})", f"results_dir={tmp}", "progress=false",
               "threads=1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--skip-sb3", action="store_true")
    ap.add_argument("--skip-joblib", action="store_true")
    ap.add_argument("--docs", action="store_true",
                    help="also write the table into docs/benchmarks.md's control-speed block, "
                         "stamped with this command and today's date")
    args = ap.parse_args()
    head = (f"ppo_gae on CartPole-v1, {args.steps} env steps per seed, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; training wall time only.")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} env steps per seed")

    rows = [("| comparison | measured | goal |", "| --- | --- | --- |")]
    t1, r1 = ours(args.steps, 1)
    print(f"ours ppo_gae population=1: {t1:.1f} s, final return {r1[0]:.1f}")
    rows.append((f"| ours, population=1 | {t1:.1f} s, final return {r1[0]:.1f} | |",))
    if not args.skip_sb3:
        initial_threads = torch.get_num_threads()
        for threads in sorted({initial_threads, 1}, reverse=True):
            ts, rs = sb3(args.steps, threads)
            print(f"SB3 PPO (same settings, {threads} thread(s)): {ts:.1f} s, final return {rs:.1f}")
            print(f"-> ours / SB3 ({threads} thread(s)) wall time = {t1 / ts:.2f} (goal <= 0.50)")
            rows.append((f"| stable-baselines3 PPO, same settings, {threads} thread(s) | {ts:.1f} s, final return "
                         f"{rs:.1f} | |", f"| ours / SB3 wall time ({threads} thread(s)) | {t1 / ts:.2f} | <= 0.50 |"))
    tp, rp = ours(args.steps, args.population)
    P = args.population
    print(f"ours population={P}: {tp:.1f} s for {P} seeds = {tp / P:.2f} s/seed; "
          f"final returns median {sorted(rp)[P // 2]:.1f} (min {min(rp):.1f})")
    print(f"-> per-seed speed-up vs population=1: {t1 / (tp / P):.2f}x (goal >= 2.5x); "
          f"{P} seeds take {tp / t1:.2f}x one seed's time (goal <= 6.4x)")
    rows.append((f"| population={P}: per-seed speed-up vs population=1 | {t1 / (tp / P):.2f}x ({tp:.1f} s for {P} "
                 f"seeds) | >= 2.5x |",))
    if not args.skip_joblib:
        tj = joblib_sweep(args.steps, P)
        print(f"{P} lone runs as a 2-worker joblib sweep: {tj:.1f} s")
        print(f"-> population={P} / joblib sweep wall time = {tp / tj:.2f} (goal < 1)")
        rows.append((f"| {P} seeds as population={P} vs a 2-worker joblib sweep of {P} lone runs | {tp:.1f} s vs "
                     f"{tj:.1f} s (ratio {tp / tj:.2f}) | < 1 |",))
    if args.docs:
        md = "\n".join(line for r in rows for line in r)
        print(f"wrote {write_block('docs/benchmarks.md', 'control-speed', head + chr(10) + chr(10) + md)}")


if __name__ == "__main__":
    main()
