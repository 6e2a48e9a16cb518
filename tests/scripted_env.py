"""A tiny deterministic environment whose rollouts can be worked out by hand.

Observation = [position, start_offset]. Each step moves position by +1 whatever the action
and pays reward 1. The episode terminates when position reaches ``goal`` (terminated) or is cut by
the TimeLimit wrapper (truncated). The reset state depends on the seed: start_offset = seed % 7,
so identical seeds give identical starts and different seeds (almost always) differ.
"""
import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import register


class ChainEnv(gym.Env):
    def __init__(self, goal: int = 3):
        self.goal = goal
        self.observation_space = gym.spaces.Box(-100.0, 100.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0
        self.offset = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.offset = int(self.np_random.integers(0, 7))
        self.pos = 0
        return np.array([self.pos, self.offset], dtype=np.float32), {}

    def step(self, action):
        self.pos += 1
        terminated = self.pos >= self.goal
        return np.array([self.pos, self.offset], dtype=np.float32), 1.0, terminated, False, {}


if "ChainTest-v0" not in gym.envs.registry:
    register(id="ChainTest-v0", entry_point=ChainEnv, max_episode_steps=10, kwargs={"goal": 3})
    register(id="ChainTrunc-v0", entry_point=ChainEnv, max_episode_steps=2, kwargs={"goal": 100})
    register(id="ChainBox-v0", entry_point="tests.scripted_env:ChainBoxEnv", max_episode_steps=4)
    register(id="ChainMultiDiscrete-v0", entry_point="tests.scripted_env:ChainMultiDiscreteEnv")


class ChainBoxEnv(ChainEnv):
    def __init__(self):
        super().__init__(goal=3)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)


class ChainMultiDiscreteEnv(ChainEnv):
    def __init__(self):
        super().__init__(goal=3)
        self.action_space = gym.spaces.MultiDiscrete([2, 2])
