"""One stable-baselines3 PPO run on CartPole-v1 with the rl-baselines3-zoo settings, as a whole
process: ``python benchmarks/sb3_ppo.py SEED STEPS [THREADS]`` trains, then scores 10 greedy
episodes, and prints one JSON line ``{"seed", "train_s", "final_return"}``.

Used by :mod:`benchmarks.control_speed` (whole-process timings: interpreter start and imports
count) and kept free of the harness's imports so that SB3's start-up is its own.
"""
import json
import sys
import time

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy


def main() -> None:
    seed, steps = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, learning_rate=lambda p: p * 1e-3,
                gamma=0.98, gae_lambda=0.8, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                policy_kwargs=dict(net_arch=[64, 64], activation_fn=torch.nn.Tanh), seed=seed, device="cpu",
                verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    train = time.perf_counter() - t0
    mean, _ = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=10_000 + seed), n_eval_episodes=10,
                              deterministic=True)
    print(json.dumps({"seed": seed, "train_s": train, "final_return": float(mean)}))


if __name__ == "__main__":
    main()
