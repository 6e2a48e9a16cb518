"""``Corridor-v0``: walk right along a corridor of 6 cells; reward 1 on reaching the end, -0.01 a step."""
import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import register


class CorridorEnv(gym.Env):
    def __init__(self, length: int = 6):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right
        self.pos = 0

    def _obs(self):
        return np.array([self.pos / self.length], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if int(action) == 1 else -1))
        done = self.pos >= self.length
        return self._obs(), (1.0 if done else -0.01), done, False, {}


if "Corridor-v0" not in gym.registry:
    register(id="Corridor-v0", entry_point=CorridorEnv, max_episode_steps=30)
