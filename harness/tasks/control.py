"""Gymnasium control tasks: vector envs per population member and rollout collection.

Autoreset: gymnasium 1.x vector envs default to ``NEXT_STEP`` autoreset. The step that ends
an episode returns the episode's *real* final observation; the following step() resets that
env, ignores its action and returns the reset observation with reward 0. We keep that
reset transition out of training (``mask = 0``) and out of the step budget, and bootstrap a
time-limit truncation from the real final observation (CleanRL's ppo.py trains on the
reset transition's neighbour and treats truncation as termination).

Normalisation (``task.normalize_obs``, ``task.normalize_reward``, ``task.obs_clip``): each
member's vector env is wrapped in gymnasium's own vector wrappers
(:func:`make_member_env`), so the statistics are the member's own (members never share them)
and every formula is gymnasium's: :class:`gymnasium.wrappers.vector.NormalizeObservation`
(running mean and variance of every observation the env returns, reset ones included;
``(o - mean) / sqrt(var + 1e-8)``), then a clip to ``[-obs_clip, obs_clip]``
(:class:`gymnasium.wrappers.vector.TransformObservation`, as CleanRL's ppo_continuous_action and
SB3's ``VecNormalize(clip_obs=10)``), and :class:`gymnasium.wrappers.vector.NormalizeReward`
(rewards divided by ``sqrt(var + 1e-8)`` of the running discounted return
``R <- gamma (1 - terminated) R + r``, gamma the run's ``gamma``, as rl-zoo passes it to
VecNormalize; ablated in "What matters", Andrychowicz et al. 2021). Trained on: the scaled
rewards; reported (``episode_return``, ``eval_return``): the env's own. Evaluation envs use a
frozen copy of the member's observation statistics (``update_running_mean = False``) and no
reward scaling. The statistics are checkpointed (:meth:`MemberEnvs.norm_state`). The wrappers see
every step the envs take: for whole-episode collectors that includes the masked steps of a column
whose episode has ended while others run on, and ReMax's greedy columns (per member, so a member
still equals its lone run).
"""
from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, replace

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ..config import bad_field, is_finite
from ..estimators import AdvantageBatch


@dataclass
class EnvInfo:
    """What the policy needs of an env's spaces (:func:`env_info`) and how its actions reach the
    env: ``act_dim`` categories (Discrete) or dimensions (Box); ``low``/``high`` the Box bounds as
    float32 (the policy's ``tanh`` squashing); ``action_space`` the env's own action space, onto
    which :meth:`to_space` maps the policy's actions."""

    obs_dim: int
    act_dim: int
    discrete: bool
    action_space: gym.spaces.Space
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    def to_space(self, a: np.ndarray) -> np.ndarray:
        """The policy's actions ``a`` as members of the env's action space: a Discrete
        ``(n, start)`` gets ``start + i`` for category index ``i``; a Box gets ``a`` with NaN as 0,
        clipped to its bounds (and to its dtype's finite range) and cast to its dtype, so a
        diverged member's NaN or infinite actions crash no neighbour and every action passes
        the space's own ``contains``. Applying it to an already mapped Box action changes nothing."""
        space = self.action_space
        if self.discrete:
            return (np.asarray(a, np.int64) + int(space.start)).astype(space.dtype)
        finite = np.finfo(space.dtype)
        low, high = np.maximum(space.low, finite.min), np.minimum(space.high, finite.max)
        return np.clip(np.nan_to_num(np.asarray(a, np.float64)), low, high).astype(space.dtype)


def registered_id(env_id: str) -> str:
    """The registry id of ``env_id``. gymnasium's ``module:EnvId`` syntax (a user's own env:
    ``task.env_id=my_pkg.envs:MyEnv-v0``) imports ``module``, whose import registers ``EnvId``,
    and names ``EnvId``; a plain id (gymnasium's, or one the user's code registered) is itself."""
    module, sep, name = str(env_id).rpartition(":")
    if sep and module:
        importlib.import_module(module)
        # the registry answers the full id too (gym.spec(env_id), as a time limit is looked up)
        gym.envs.registry.setdefault(str(env_id), gym.spec(name))
        return name
    return str(env_id)


def time_limit(env_id: str, max_episode_steps: int | None) -> int:
    """Steps an episode can take at most: ``task.max_episode_steps``, else the env's registered
    limit. An env registered without one (``max_episode_steps=None``) and no
    ``task.max_episode_steps`` is refused by name: an episode that never ends would hang
    whole-episode collection and evaluation."""
    if max_episode_steps is not None:
        return int(max_episode_steps)
    limit = gym.spec(registered_id(env_id)).max_episode_steps
    if limit is None:
        bad_field("task.max_episode_steps", f"an integer >= 1: task.env_id={env_id} registers no time limit "
                  "(max_episode_steps=None), so its episodes could run forever", None)
    return int(limit)


# gymnasium env families that need an optional simulator: entry-point package -> (the harness's
# extra in pyproject.toml, the module it installs)
EXTRAS = {"gymnasium.envs.mujoco": ("mujoco", "mujoco"), "gymnasium.envs.box2d": ("box2d", "Box2D")}


def missing_extra(env_id: str) -> str | None:
    """The harness extra (``mujoco``, ``box2d``) ``env_id`` needs and this Python lacks, or None
    (also for ids gymnasium does not know: :func:`env_info` names those)."""
    try:
        entry = gym.spec(registered_id(env_id)).entry_point
    except Exception:
        return None
    package = entry.partition(":")[0] if isinstance(entry, str) else ""
    for prefix, (extra, module) in EXTRAS.items():
        if package.startswith(prefix + "."):
            try:
                importlib.import_module(module)
            except ImportError:
                return extra
    return None


def env_info(env_id: str) -> EnvInfo:
    """Spaces of ``env_id``; refuses, naming ``task.env_id``, anything but a 1-D Box observation and
    a Discrete action (any ``start`` its dtype can hold) or a 1-D float Box action with bounds that
    are numbers, ``low <= high`` (infinite ones allowed: ``task.action_bound=tanh`` refuses those
    itself). :meth:`EnvInfo.to_space` maps the policy's actions onto the space."""
    try:
        gym.spec(registered_id(env_id))  # a vector env is looked up by the registry id
        env = gym.make(env_id)
    except Exception as exc:  # gymnasium's message names close ids
        raise ValueError(f"task.env_id {env_id!r} is not a gymnasium environment: {exc}") from None
    try:
        obs, act = env.observation_space, env.action_space
    finally:
        env.close()

    def refuse(what: str, space, allowed: str):
        raise ValueError(f"task.env_id {env_id!r}: {what} space {space} is not supported ({allowed})")

    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1 or obs.shape[0] < 1:
        refuse("observation", obs, "a 1-D Box of at least one dimension is")
    if isinstance(act, gym.spaces.Discrete):
        n, start, kind = int(act.n), int(act.start), np.iinfo(act.dtype)  # gymnasium: an integer dtype
        if n < 1 or not kind.min <= start <= start + n - 1 <= kind.max:
            refuse("action", act, f"n >= 1 and every action start..start+n-1 held by its dtype {kind.dtype}")
        return EnvInfo(obs.shape[0], n, True, act)
    if isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
        if act.shape[0] < 1:
            refuse("action", act, "a 1-D Box of at least one dimension is")
        if not np.issubdtype(act.dtype, np.floating):
            refuse("action", act, f"dtype {act.dtype}: the Gaussian policy's actions are real, a float Box is")
        low, high = np.asarray(act.low, np.float64), np.asarray(act.high, np.float64)
        if low.shape != act.shape or high.shape != act.shape or np.isnan(low).any() or np.isnan(high).any() \
                or (low > high).any():
            refuse("action", act, f"bounds low {low.tolist()}, high {high.tolist()}: numbers with low <= high "
                   "are (infinite ones too)")
        return EnvInfo(obs.shape[0], act.shape[0], False, act, low.astype(np.float32), high.astype(np.float32))
    refuse("action", act, f"{type(act).__name__}: allowed: Discrete, 1-D Box")


def validate_control(cfg, needs_groups: bool, full_episodes: bool) -> None:
    """Checks for ``task.family=control`` that can fail before any work starts.

    The estimator's needs come as arguments (this module knows no estimator): ``needs_groups``
    (episodes per iteration must be whole groups) and ``full_episodes`` (the budget counts
    whole episodes, not ``num_envs x rollout_steps`` steps)."""
    bad, finite = bad_field, is_finite
    t, b = cfg.task, cfg.budget
    if not t.env_id:
        bad("task.env_id", "a gymnasium environment id", t.env_id)
    extra = missing_extra(t.env_id)
    if extra:
        raise ValueError(f"task={t.name} (task.env_id={t.env_id}) needs the {extra} extra, not installed here: "
                         f'pip install -c constraints.txt -e ".[{extra}]"')
    info = env_info(t.env_id)  # refuses unknown ids and unsupported spaces, naming them
    time_limit(t.env_id, t.max_episode_steps)  # an env without a time limit needs task.max_episode_steps
    if info.discrete:  # the Gaussian policy's switches would be silently ignored
        for key, default in (("log_std", "state_independent"), ("action_bound", "clip")):
            if t[key] != default:
                bad(f"task.{key}", f"{default!r} for a Discrete action space (task.env_id={t.env_id})", t[key])
    elif t.action_bound == "tanh" and not (np.isfinite(info.low).all() and np.isfinite(info.high).all()
                                           and (info.low < info.high).all()):
        bad("task.action_bound", f"'clip' for task.env_id={t.env_id}: tanh squashing needs finite action bounds "
            f"with low < high (low {info.low.tolist()}, high {info.high.tolist()})", t.action_bound)
    if cfg.mode == "probe" and (t.normalize_obs or t.normalize_reward):
        bad("task.normalize_obs" if t.normalize_obs else "task.normalize_reward",
            "false with mode=probe (the probes measure gradients at a frozen policy on raw observations "
            "and rewards)", True)
    for key in ("num_envs", "rollout_steps", "episodes_per_iter"):
        if t[key] < 1:
            bad(f"task.{key}", "an integer >= 1", t[key])
    if needs_groups and t.episodes_per_iter % cfg.group_size:
        bad("task.episodes_per_iter", f"a multiple of group_size={cfg.group_size}",
            t.episodes_per_iter)
    if b.env_steps is None and b.iterations is None and cfg.mode == "train":
        bad("budget.env_steps", "set (or budget.iterations)", None)
    if b.env_steps is not None and cfg.mode == "train":
        per_iter = t.num_envs * t.rollout_steps
        if not full_episodes and b.env_steps < per_iter:
            bad("budget.env_steps",
                f">= one iteration ({t.num_envs} envs x {t.rollout_steps} steps = {per_iter})",
                b.env_steps)
        if full_episodes and b.env_steps < t.episodes_per_iter:
            bad("budget.env_steps", f">= one iteration (at least {t.episodes_per_iter} steps)",
                b.env_steps)
    if len(t.hidden) < 1 or any(h < 1 for h in t.hidden):
        bad("task.hidden", "a non-empty list of positive widths", list(t.hidden))
    if t.activation not in ("tanh", "relu"):
        bad("task.activation", "one of ['relu', 'tanh']", t.activation)
    if not finite(t.init_log_std):
        bad("task.init_log_std", "a finite number", t.init_log_std)
    if cfg.kl.target != "old":  # control runs penalise KL to the pre-update policy only
        bad("kl.target", "'old' for task.family=control (there is no reference policy)", cfg.kl.target)
    if cfg.kl.in_reward:
        bad("kl.in_reward", "false for task.family=control (the KL penalty is a loss term)", cfg.kl.in_reward)


@dataclass(frozen=True)
class Normalization:
    """``task.normalize_obs``, ``task.normalize_reward``, ``task.obs_clip`` (applied to the
    normalised observation; None: no clip) and the discount of the scaled return."""

    obs: bool = False
    reward: bool = False
    obs_clip: float | None = None
    gamma: float = 0.99

    @classmethod
    def from_cfg(cls, cfg) -> "Normalization | None":
        t = cfg.task
        if not (t.normalize_obs or t.normalize_reward):
            return None
        return cls(bool(t.normalize_obs), bool(t.normalize_reward),
                   None if t.obs_clip is None else float(t.obs_clip), float(cfg.gamma))


class RawReward(gym.vector.VectorWrapper):
    """Keeps the reward the env itself returned at the last step (:attr:`last`), for the
    reported returns, under the wrapper that scales it."""

    last: np.ndarray | None = None

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.last = reward
        return obs, reward, terminated, truncated, info


def make_member_env(env_id: str, num_envs: int, max_episode_steps: int | None, native: bool,
                    norm: Normalization | None):
    """One member's vector env (:func:`make_vector_env`), wrapped in gymnasium's normalisation
    wrappers when ``norm`` asks for them (module docstring). Returns ``(env, wrappers)``:
    ``wrappers`` names the ones :class:`MemberEnvs` reads (``raw``, ``obs``, ``reward``)."""
    env = make_vector_env(env_id, num_envs, max_episode_steps, native)
    found: dict = {}
    if norm is None:
        return env, found
    if norm.reward:
        env = found["raw"] = RawReward(env)
    if norm.obs:
        env = found["obs"] = gym.wrappers.vector.NormalizeObservation(env)
        if norm.obs_clip is not None:
            c = norm.obs_clip
            env = gym.wrappers.vector.TransformObservation(env, lambda o: np.clip(o, -c, c))
    if norm.reward:
        env = found["reward"] = gym.wrappers.vector.NormalizeReward(env, gamma=norm.gamma)
    return env, found


def make_env(env_id: str, max_episode_steps: int | None) -> gym.Env:
    """One env of ``env_id`` (``gym.make``, with ``max_episode_steps`` as its time limit when given):
    a sub-env of :func:`make_vector_env`'s ``SyncVectorEnv`` and each of :class:`EpisodeEnvs`'."""
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    return gym.make(registered_id(env_id), **kwargs)


def make_vector_env(env_id: str, num_envs: int, max_episode_steps: int | None,
                    native: bool = True) -> gym.vector.VectorEnv:
    """gymnasium's native vector env where it has one (one seed for all sub-envs), else
    ``SyncVectorEnv`` (one seed per sub-env, needed for identical group starts)."""
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env_id = registered_id(env_id)  # module:EnvId imports module; the registry knows EnvId
    if native and gym.spec(env_id).vector_entry_point is not None:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    else:
        env = SyncVectorEnv([lambda: make_env(env_id, max_episode_steps) for _ in range(num_envs)],
                            autoreset_mode=AutoresetMode.NEXT_STEP)
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode != AutoresetMode.NEXT_STEP:  # the collection below relies on it
        raise ValueError(f"task.env_id {env_id!r}: vector env autoreset mode {mode} is not supported")
    return env


def seeds_from(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, 2**31 - 1, (n,), generator=gen).tolist()


class _MemberDraws:
    """The ``np_random`` of one gymnasium ``CartPoleVectorEnv`` that steps every member's ``N``
    envs side by side (``P * N`` envs, member-major), so that each member draws what its own
    ``N``-env vector env would.

    ``CartPoleVectorEnv`` draws its start states as ``np_random.uniform(low, high, size=(4, k))``
    for the ``k`` envs it resets, in env order: all of them in ``reset``, and in ``step`` those its
    last step ended (``prev_done``). Here each member's share of the ``k`` comes from the member's
    own generator, seeded as gymnasium seeds a member's env (``seeding.np_random(seed)``), drawn
    with the same call, and the shares are joined in member order: the columns of the envs reset.
    The physics is gymnasium's own step, elementwise, so a member's trajectory is its lone env's bit
    for bit (``tests/test_control.py::test_stacked_cartpole_is_each_members_own_vector_env``)."""

    def __init__(self, env, population: int):
        self.env, self.P = env, population
        self.gens: list[np.random.Generator] = []

    def seed(self, seeds: list[int]) -> None:
        self.gens = [gym.utils.seeding.np_random(s)[0] for s in seeds]

    def uniform(self, low, high, size):
        if self.P == 1:  # a lone run's k are all its own: its generator's one draw
            return self.gens[0].uniform(low=low, high=high, size=size)
        rows, k = size
        n = self.env.num_envs // self.P
        # every env (reset; or a step after all of them ended at once) or the ones that ended
        counts = [n] * self.P if k == self.env.num_envs else self.env.prev_done.reshape(self.P, n).sum(axis=1)
        return np.concatenate([g.uniform(low=low, high=high, size=(rows, int(c)))
                               for g, c in zip(self.gens, counts)], axis=1)


class MemberEnvs:
    """One vector env per population member; actions/observations stacked as ``[P, N, ...]``.
    With ``norm``, each member's env carries its own normalisation wrappers (module docstring).

    gymnasium's native CartPole vector env without normalisation is built once for all members
    (``P * N`` envs, each member's resets drawn from its own generator: :class:`_MemberDraws`):
    one step call instead of ``P``, each member still its own env bit for bit."""

    def __init__(self, env_id: str, population: int, num_envs: int, max_episode_steps: int | None,
                 info: EnvInfo, native: bool, norm: Normalization | None = None):
        self._args = (env_id, num_envs, max_episode_steps, native, norm)
        self._build(population)
        self.norm = norm
        self.info = info
        self.population, self.num_envs = population, num_envs
        self.native = native
        # Set to a list to record every action array :meth:`step` is given (``[1, P, N, ...]`` per
        # step; Box ones as sent, category indices before :meth:`EnvInfo.to_space` shifts them by a
        # Discrete start): the control trainer's checkpoints replay them to restore the envs' state exactly.
        self.action_log: list[np.ndarray] | None = None

    def _build(self, population: int) -> None:
        env_id, num_envs, max_episode_steps, native, norm = self._args
        self.stacked = None
        if native and norm is None:
            env = make_vector_env(env_id, population * num_envs, max_episode_steps, native)
            if type(env) is CartPoleVectorEnv:  # exactly gymnasium's: _MemberDraws relies on its step
                self.stacked, self.draws = env, _MemberDraws(env, population)
                env.np_random = self.draws
                self.envs, self.wrappers = [env], [{} for _ in range(population)]
                return
            env.close()
        built = [make_member_env(*self._args) for _ in range(population)]
        self.envs = [env for env, _ in built]
        self.wrappers = [w for _, w in built]

    def reset(self, seeds: list[int | list[int]]) -> np.ndarray:
        if self.stacked is not None:
            self.draws.seed(seeds)
            return np.ascontiguousarray(self.stacked.reset()[0].reshape(self.population, self.num_envs, -1))
        return np.stack([env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)]).astype(np.float32)

    def step(self, actions: torch.Tensor):
        a = actions.numpy()
        if not self.info.discrete:  # finite and in the space when logged (mapping them again changes nothing)
            a = self.info.to_space(a)
        if self.action_log is not None:  # category indices (not yet shifted by a Discrete start), Box actions
            self.action_log.append(np.array(a, copy=True)[None])  # [1, P, N, ...]: concatenable
        return self.step_numpy(a)

    def freeze_observation_statistics(self, source: "MemberEnvs") -> None:
        """Normalise observations with a copy of ``source``'s statistics, member by member, and
        never update them (evaluation: call before :meth:`reset`)."""
        for mine, theirs in zip(self.wrappers, source.wrappers):
            if "obs" in mine:
                mine["obs"].obs_rms = copy.deepcopy(theirs["obs"].obs_rms)
                mine["obs"].update_running_mean = False

    def norm_state(self) -> dict[str, torch.Tensor]:
        """Each member's normalisation statistics, stacked ``[P, ...]``: the observations' running
        mean, variance and count, the discounted return's, and the return accumulated per env."""
        out: dict[str, torch.Tensor] = {}
        for kind, attr in (("obs", "obs_rms"), ("reward", "return_rms")):
            if self.wrappers and kind in self.wrappers[0]:
                stats = [getattr(w[kind], attr) for w in self.wrappers]
                out[f"{kind}_mean"] = torch.from_numpy(np.stack([np.asarray(r.mean) for r in stats]))
                out[f"{kind}_var"] = torch.from_numpy(np.stack([np.asarray(r.var) for r in stats]))
                out[f"{kind}_count"] = torch.tensor([float(r.count) for r in stats], dtype=torch.float64)
        if self.wrappers and "reward" in self.wrappers[0]:
            out["reward_accumulated"] = torch.from_numpy(np.stack([w["reward"].accumulated_reward
                                                                   for w in self.wrappers]))
        return out

    def load_norm_state(self, tensors: dict[str, torch.Tensor], check: bool = False) -> None:
        """Set the statistics :meth:`norm_state` saved (names, shapes checked first: ValueError).
        ``check``: they must equal the live ones already (after :meth:`replay`, which rebuilds them)."""
        live = self.norm_state()
        if set(tensors) != set(live):
            raise ValueError(f"normalisation state {sorted(tensors)}, the envs keep {sorted(live)}")
        for k, t in tensors.items():
            if tuple(t.shape) != tuple(live[k].shape):
                raise ValueError(f"normalisation state {k}: saved {tuple(t.shape)}, expected {tuple(live[k].shape)}")
            if check and not torch.equal(t.to(live[k].dtype), live[k]):
                raise ValueError(f"replaying the saved actions does not reproduce the saved normalisation "
                                 f"statistics ({k})")
        for p, w in enumerate(self.wrappers):
            for kind, attr in (("obs", "obs_rms"), ("reward", "return_rms")):
                if kind in w:
                    rms = getattr(w[kind], attr)
                    # numpy values of the saved dtype; the count a Python float, as gymnasium keeps it
                    # (a numpy float64 count would promote float32 statistics: NEP 50)
                    rms.mean = tensors[f"{kind}_mean"][p].numpy().copy()
                    rms.var = tensors[f"{kind}_var"][p].numpy().copy()
                    rms.count = float(tensors[f"{kind}_count"][p])
            if "reward" in w:
                w["reward"].accumulated_reward[:] = tensors["reward_accumulated"][p].numpy()

    def replay(self, seeds: list[int | list[int]], actions: np.ndarray) -> np.ndarray | None:
        """Reset with ``seeds`` and step through ``actions [S, P, N, ...]`` (as logged in
        :attr:`action_log`): gymnasium envs are deterministic given their seed and actions, so
        this rebuilds every env's internal state (physics, time limit, RNG) exactly, and the
        normalisation wrappers' statistics too: the envs are built afresh first, so statistics
        gathered before (the collector's own first reset) are not counted twice. Returns the last
        observation (the reset one when ``S == 0``)."""
        self.close()
        self._build(self.population)
        obs = self.reset(seeds)
        for a in actions:
            obs = self.step_numpy(a)[0]
        return obs

    def step_numpy(self, a: np.ndarray):
        """``(obs, reward, terminated, truncated, env_reward)``, each ``[P, N]`` (obs ``[P, N, D]``),
        for the policy's actions ``a``, sent as members of the env's action space
        (:meth:`EnvInfo.to_space`): ``reward`` is what training sees (scaled with
        ``task.normalize_reward``), ``env_reward`` the env's own (the same array without reward scaling)."""
        if self.stacked is not None:
            P, N = self.population, self.num_envs
            o, r, te, tr, _ = self.stacked.step(self.info.to_space(a).reshape(P * N))
            rew = r.reshape(P, N)
            return np.ascontiguousarray(o.reshape(P, N, -1)), rew, te.reshape(P, N), tr.reshape(P, N), rew
        obs, rew, term, trunc = [], [], [], []
        for env, act in zip(self.envs, self.info.to_space(a)):
            o, r, te, tr, _ = env.step(act)
            obs.append(o); rew.append(r); term.append(te); trunc.append(tr)  # noqa: E702
        rew = np.stack(rew).astype(np.float32)
        raw = rew
        if self.norm is not None and self.norm.reward:
            raw = np.stack([w["raw"].last for w in self.wrappers]).astype(np.float32)
        return np.stack(obs).astype(np.float32), rew, np.stack(term), np.stack(trunc), raw

    def close(self) -> None:
        for env in self.envs:
            env.close()


@dataclass
class Rollout:
    """Time-major storage ``[T, P, N, ...]`` of one iteration."""

    obs: torch.Tensor
    next_obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    mask: torch.Tensor
    episode_returns: list[list[float]]  # per member, episodes finished this iteration
    steps: torch.Tensor  # [P] real env steps taken (reset transitions excluded)
    greedy_returns: torch.Tensor | None = None  # [P, n_groups]
    horizon: list[int] | None = None  # per member, the steps its own episodes took (greedy ones
    # included): the T of its lone run; rows past it are the population's padding


def _noise(agent, gens, shape_tail, steps) -> torch.Tensor:
    if agent.discrete:
        return torch.stack([torch.rand(steps, *shape_tail, generator=g) for g in gens], dim=1)
    return torch.stack([torch.randn(steps, *shape_tail, generator=g) for g in gens], dim=1)


class StepCollector:
    """Fixed-length rollouts from persistent envs (a2c, ppo_gae): T steps of N envs per member."""

    def __init__(self, envs: MemberEnvs, gens: list[torch.Generator], rollout_steps: int):
        self.envs, self.gens, self.T = envs, gens, rollout_steps
        self.reset_seeds = [seeds_from(g, 1)[0] for g in gens]
        self.obs = torch.from_numpy(envs.reset(self.reset_seeds))
        P, N = envs.population, envs.num_envs
        self.after_done = np.zeros((P, N), bool)  # the next step is a reset transition
        self.running = np.zeros((P, N), np.float32)

    @torch.no_grad()
    def collect(self, agent) -> Rollout:
        T, P, N = self.T, self.envs.population, self.envs.num_envs
        noise = _noise(agent, self.gens, (N, agent.act_dim), T)
        obs_buf, next_buf, act_buf, logp_buf = [], [], [], []
        # bookkeeping in numpy: these arrays are tiny and numpy's per-call cost is lower
        rew = np.zeros((T, P, N), np.float32)
        term = np.zeros((T, P, N), bool)
        trunc = np.zeros((T, P, N), bool)
        valid = np.zeros((T, P, N), bool)
        finished: list[list[float]] = [[] for _ in range(P)]
        after_done, running = self.after_done, self.running
        obs = self.obs
        policy = agent.policy()
        for t in range(T):
            params = policy(obs)
            actions = agent.sample(params, noise[t])
            logp = agent.log_prob(params, actions)
            o, r, te, tr, r_env = self.envs.step(agent.env_actions(actions))
            ok = ~after_done
            next_obs = torch.from_numpy(o)
            obs_buf.append(obs); next_buf.append(next_obs); act_buf.append(actions); logp_buf.append(logp)
            rew[t] = np.where(ok, r, 0.0)
            term[t] = te & ok
            trunc[t] = tr & ok
            valid[t] = ok
            running += np.where(ok, r_env, 0.0)  # the reported return: the env's own rewards
            done = term[t] | trunc[t]
            if done.any():
                for p, n in zip(*np.nonzero(done)):
                    finished[p].append(float(running[p, n]))
                running[done] = 0.0
            after_done = done
            obs = next_obs
        self.after_done, self.running, self.obs = after_done, running, obs
        mask = torch.from_numpy(valid).float()
        return Rollout(torch.stack(obs_buf), torch.stack(next_buf), torch.stack(act_buf),
                       torch.stack(logp_buf), torch.from_numpy(rew), torch.from_numpy(term).float(),
                       torch.from_numpy(trunc).float(), mask, finished, mask.sum(dim=(0, 2)))


@dataclass(frozen=True)
class EpisodeLayout:
    """A member's columns of whole episodes: ``episodes`` of them in groups of ``group_size`` that
    reset with one seed; ``greedy`` adds one greedy column per group (ReMax's baseline)."""

    episodes: int
    group_size: int = 1
    greedy: bool = False


class EpisodeCollector:
    """Whole episodes from chosen starts (Monte Carlo and group estimators).

    Per member: ``episodes`` columns, group-major; columns of group g reset with one seed, so
    they start from the identical state. With ``greedy``, one extra column per group, from the
    same seed, acts greedily (ReMax's baseline); its steps count against the budget too.
    Every column runs until its first episode ends; later steps are masked out.
    """

    def __init__(self, env_id: str, population: int, layout: EpisodeLayout, max_episode_steps: int | None,
                 info: EnvInfo, gens: list[torch.Generator], norm: Normalization | None = None):
        episodes, group_size, greedy = layout.episodes, layout.group_size, layout.greedy
        self.n_groups = episodes // group_size
        self.episodes, self.group_size, self.greedy = episodes, group_size, greedy
        width = episodes + (self.n_groups if greedy else 0)
        self.envs = MemberEnvs(env_id, population, width, max_episode_steps, info, native=False, norm=norm)
        self.gens = gens

    @torch.no_grad()
    def collect(self, agent) -> Rollout:
        P, E, G, k = self.envs.population, self.episodes, self.n_groups, self.group_size
        seeds = []
        for g in self.gens:
            group_seeds = seeds_from(g, G)
            cols = [group_seeds[i // k] for i in range(E)]
            if self.greedy:
                cols += group_seeds
            seeds.append(cols)
        obs = torch.from_numpy(self.envs.reset(seeds))
        W = obs.shape[1]
        alive = torch.ones(P, W, dtype=torch.bool)
        bufs: dict[str, list[torch.Tensor]] = {k_: [] for k_ in
                                               ("obs", "next", "act", "logp", "rew", "env_rew", "term", "trunc", "mask")}
        chunk = None
        t = 0
        policy = agent.policy()
        while alive.any():
            if t % 256 == 0:
                chunk = _noise(agent, self.gens, (W, agent.act_dim), 256)
            params = policy(obs)
            actions = agent.sample(params, chunk[t % 256])
            if self.greedy:
                actions[:, E:] = agent.greedy(params[:, E:])
            logp = agent.log_prob(params, actions)
            o, r, te, tr, r_env = self.envs.step(agent.env_actions(actions))
            o_t = torch.from_numpy(o)
            m = alive.clone()
            bufs["obs"].append(obs); bufs["next"].append(o_t); bufs["act"].append(actions)
            bufs["logp"].append(logp); bufs["rew"].append(torch.from_numpy(r) * m)
            bufs["env_rew"].append(torch.from_numpy(r_env) * m)
            bufs["term"].append(torch.from_numpy(te) & m); bufs["trunc"].append(torch.from_numpy(tr) & m)
            bufs["mask"].append(m.float())
            alive &= ~torch.from_numpy(te | tr)
            obs = o_t
            t += 1
        stacked = {k_: torch.stack(v) for k_, v in bufs.items()}
        mask = stacked["mask"]
        totals = (stacked["rew"] * mask).sum(0)  # [P, W]: the returns the estimator sees (ReMax's baseline)
        reported = (stacked["env_rew"] * mask).sum(0)  # the env's own (equal without reward scaling)
        finished = [reported[p, :E].tolist() for p in range(P)]
        greedy_returns = totals[:, E:] if self.greedy else None
        sl = slice(0, E)
        alive_rows = mask.amax(dim=2) > 0  # [T, P]
        horizon = [int(alive_rows[:, p].nonzero().max()) + 1 if bool(alive_rows[:, p].any()) else 0 for p in range(P)]
        return Rollout(stacked["obs"][:, :, sl], stacked["next"][:, :, sl], stacked["act"][:, :, sl],
                       stacked["logp"][:, :, sl], stacked["rew"][:, :, sl], stacked["term"][:, :, sl].float(),
                       stacked["trunc"][:, :, sl].float(), mask[:, :, sl], finished, mask.sum(dim=(0, 2)),
                       greedy_returns, horizon)

    def close(self) -> None:
        self.envs.close()


class EpisodeEnvs:
    """Evaluation's envs when observations are not normalised: one gymnasium env
    (:func:`make_env`) per member and episode, ``[P][E]``, stepped only while its episode runs.
    Each env is reset with its own seed and given the same actions as a sub-env of
    :class:`MemberEnvs`' ``SyncVectorEnv`` would be (its row of :meth:`EnvInfo.to_space`'s array), so
    every episode is the same; what is left out is the vector env's bookkeeping and the steps (and
    autoresets) of episodes that have ended while others run on. :meth:`step` returns, for an ended
    episode, its last observation again, reward 0 and neither terminated nor truncated. A member
    left out of ``members`` (default: all) has no envs: its observations are zeros, never running."""

    def __init__(self, env_id: str, population: int, episodes: int, max_episode_steps: int | None, info: EnvInfo,
                 members: list[bool] | None = None):
        self.info, self.episodes = info, episodes
        self.members = np.ones(population, dtype=bool) if members is None else np.asarray(members, dtype=bool)
        self.envs = [[make_env(env_id, max_episode_steps) for _ in range(episodes)] if m else []
                     for m in self.members]
        self.running = np.ones((population, episodes), dtype=bool)
        self.obs: np.ndarray | None = None

    def _obs(self, env: gym.Env, o) -> np.ndarray:  # as SyncVectorEnv stores it (its space's dtype)
        return np.asarray(o, dtype=env.observation_space.dtype)

    def reset(self, seeds: list[list[int]]) -> np.ndarray:
        skipped = np.zeros((self.episodes, self.info.obs_dim), dtype=np.float32)
        self.obs = np.stack([[self._obs(env, env.reset(seed=s)[0]) for env, s in zip(row, ss)] if row else skipped
                             for row, ss in zip(self.envs, seeds)]).astype(np.float32)
        self.running[:] = self.members[:, None]
        return self.obs

    def step(self, actions: torch.Tensor):
        """``(obs, reward, terminated, truncated, env_reward)`` as :meth:`MemberEnvs.step`, for the running episodes."""
        a = self.info.to_space(actions.numpy())
        rew = np.zeros(self.running.shape, dtype=np.float32)
        term, trunc = np.zeros_like(self.running), np.zeros_like(self.running)
        obs = self.obs.copy()
        for p, (row, acts) in enumerate(zip(self.envs, a)):
            for i, (env, act) in enumerate(zip(row, acts)):
                if self.running[p, i]:
                    o, r, term[p, i], trunc[p, i], _ = env.step(act)
                    obs[p, i], rew[p, i] = self._obs(env, o), np.float64(r)
        self.running &= ~(term | trunc)
        self.obs = obs
        return obs, rew, term, trunc, rew

    def close(self) -> None:
        for row in self.envs:
            for env in row:
                env.close()


@dataclass(frozen=True)
class EvalEpisodes:
    """The episodes an evaluation runs: ``episodes`` per member of the env ``env_id`` (time limit
    ``max_episode_steps``, spaces ``info``), episode ``i`` of member ``p`` reset with seed
    ``seeds[p] + i``."""

    env_id: str
    episodes: int
    max_episode_steps: int | None
    info: EnvInfo
    seeds: list[int]


@torch.no_grad()
def evaluate(agent, spec: EvalEpisodes, train_envs: MemberEnvs | None = None,
             members: list[bool] | None = None) -> list[float | None]:
    """Mean undiscounted return (the env's own rewards) of ``spec``'s greedy episodes per member
    (not budgeted), episode ``i`` of member ``p`` reset with seed ``seeds[p] + i``. With normalised
    observations (``train_envs.norm``), each member's are normalised with a frozen copy of its
    training statistics (gymnasium's vector wrappers on a :class:`MemberEnvs`); without, the
    episodes run on :class:`EpisodeEnvs`, which steps only those still running (the same returns).
    ``members``: which members to evaluate (default all; None for the others). A member's return
    is the same whichever others are evaluated (the policy's forward takes every member's rows
    either way): members that reach an evaluation at different iterations no longer pay for
    every member's episodes each time (tests/test_control.py)."""
    env_id, episodes, max_episode_steps, info, seeds = (spec.env_id, spec.episodes, spec.max_episode_steps,
                                                         spec.info, spec.seeds)
    P = agent.population
    members = [True] * P if members is None else [bool(m) for m in members]
    norm = None if train_envs is None or train_envs.norm is None else replace(train_envs.norm, reward=False)
    if norm is not None and norm.obs:  # gymnasium's vector wrappers, with the training statistics frozen
        envs = MemberEnvs(env_id, P, episodes, max_episode_steps, info, native=False, norm=norm)
        envs.freeze_observation_statistics(train_envs)
    else:
        envs = EpisodeEnvs(env_id, P, episodes, max_episode_steps, info, members=members)
    try:
        obs = torch.from_numpy(envs.reset([[s + i for i in range(episodes)] for s in seeds]))
        alive = torch.tensor(members).unsqueeze(1).repeat(1, episodes)
        total = torch.zeros(P, episodes)
        policy = agent.policy()
        while alive.any():
            actions = agent.greedy(policy(obs))
            if not info.discrete:
                actions = torch.nan_to_num(actions)
            o, r, te, tr, _ = envs.step(agent.env_actions(actions))
            total += torch.from_numpy(r) * alive
            alive &= ~torch.from_numpy(te | tr)
            obs = torch.from_numpy(o)
        return [v if m else None for v, m in zip(total.mean(dim=1).tolist(), members)]
    finally:
        envs.close()


def advantage_batch(agent, ro: Rollout, needs_critic: bool, group_size: int | None) -> AdvantageBatch:
    """The estimator's input from a ``[T, P, N]`` rollout: members side by side, ``[T, P*N]``
    (members never mix: every estimator works column-wise or within a group, and groups lie
    inside a member); ``V(s_t)`` and ``V(s_{t+1})`` from the agent's critic when needed."""
    T, P, N = ro.rewards.shape
    flat = lambda x: x.reshape(T, P * N)  # noqa: E731
    values = next_values = None
    if needs_critic:
        with torch.no_grad():
            v = agent.value(ro.obs.transpose(0, 1).reshape(P, T * N, -1)).reshape(P, T, N).transpose(0, 1)
            nv = agent.value(ro.next_obs.transpose(0, 1).reshape(P, T * N, -1)).reshape(P, T, N).transpose(0, 1)
        values, next_values = flat(v), flat(nv)
    greedy = None if ro.greedy_returns is None else ro.greedy_returns.reshape(-1)
    return AdvantageBatch(rewards=flat(ro.rewards), terminated=flat(ro.terminated), truncated=flat(ro.truncated),
                          mask=flat(ro.mask), values=values, next_values=next_values, greedy_scores=greedy,
                          group_size=group_size)
