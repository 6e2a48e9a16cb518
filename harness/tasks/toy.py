"""Exact-gradient toy task: a tabular softmax policy over short token sequences.

Each prompt ``x`` has its own reward table ``R(x, y)`` over the complete responses ``y`` (token
sequences of length ``length``, or ending at an EOS token when ``eos`` is on). The policy is
tabular: one row of logits per *state*, a state being ``(prompt, prefix)``, so

.. math:: \\pi_\\theta(y \\mid x) = \\prod_t \\operatorname{softmax}(\\theta[s_t])_{y_t},
          \\qquad s_t = (x, y_{<t}),

and the objective (prompts uniform, reward at the end of the response, no discount)

.. math:: J(\\theta) = \\frac1X \\sum_x \\sum_y \\pi_\\theta(y \\mid x) R(x, y)

is a finite sum. :meth:`ToyTask.values` evaluates it by the backward recursion
``Q(s, a) = R(leaf) or V(child(s, a))``, ``V(s) = sum_a pi(a|s) Q(s, a)`` (exact, and
differentiable); :meth:`ToyTask.exact_gradient` is its autograd gradient. Every estimator
and loss of the harness runs on samples from the same policy, so bias is measured against
the truth, not a guess (docs/design.md, "Tasks: toy").

Task shape (vocabulary, length, prompts and their reward tables) is a named preset
(``task.env_id``, see :data:`PRESETS`); an optional ``toy`` config node overrides fields.
Reward tables are drawn from ``task_seed`` (fixed per preset), never from the run seed, so
every run of a sweep sees the same task.

Prompt kinds:

* ``binary``: a random subset of the responses is correct (R = 1, else 0); its size is
  ``round(success * n_responses)``, so ``success`` is the success probability under the
  uniform policy (theta = 0) - the knob behind C17's p in {0.05, 0.5, 0.95}.
* ``dense``: R uniform in [0, 1] per response.
* ``first_token``: correct (R = 1) iff the first token is the prompt's answer token; length
  is irrelevant to the reward (the variable-length task of C18).

Training settings (``toy.*`` fields of :class:`harness.config.ToySettings`):

* ``reward: random`` trains on :func:`random_rewards` (Bernoulli(1/2) per sequence, independent
  of the response: C26) while every exact quantity (``J``, ``eval_return``, per-prompt
  success) stays that of the reward table, so the drift of the true J is measured;
* ``log_prompts: true`` adds per-prompt columns (success before the update and
  :meth:`ToyTask.prompt_update_norms`: C28), for presets of at most
  :data:`~harness.config.TOY_LOG_PROMPTS_MAX` prompts.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..config import (TOY_LOG_PROMPTS_MAX, ToySettings, bad_field, check_fits, refuse_unknown_keys,
                      toy_settings_from_config)
from ..estimators import AdvantageBatch

DTYPE = torch.float64  # exact quantities and estimates: float64 keeps rounding far below any bias measured


def _vmap(fn):
    """``torch.func.vmap(fn)``: a population's exact quantities in one pass (imported when first
    used; unlike ``torch.func.grad`` it does not import ``torch._dynamo``)."""
    from torch.func import vmap

    return vmap(fn)


@dataclass(frozen=True)
class PromptSpec:
    kind: str = "binary"  # binary | dense | first_token
    success: float = 0.5  # binary: share of correct responses (success probability at theta = 0)


@dataclass(frozen=True)
class ToySpec:
    vocab: int = 4  # tokens, EOS included when eos is on (EOS = vocab - 1)
    length: int = 3  # tokens per response (the maximum when eos is on)
    eos: bool = False
    prompts: tuple[PromptSpec, ...] = field(default_factory=lambda: (PromptSpec(),))
    task_seed: int = 0


PROMPT_KINDS = ("binary", "dense", "first_token")

PRESETS: dict[str, ToySpec] = {
    # C3-C6, C14, C17, C20, C22: success probabilities 3/64, 32/64, 61/64 at the uniform policy,
    # plus a prompt with a dense reward table. 4 prompts x 21 states x 4 tokens = 336 logits.
    "mixed": ToySpec(vocab=4, length=3, eos=False, prompts=(
        PromptSpec("binary", 0.05), PromptSpec("binary", 0.5), PromptSpec("binary", 0.95),
        PromptSpec("dense"))),
    # C18: 3 content tokens + EOS, at most 4 tokens; correct iff the first token is the answer.
    "varlen": ToySpec(vocab=4, length=4, eos=True, prompts=(
        PromptSpec("first_token"), PromptSpec("first_token"), PromptSpec("first_token"))),
    # C13: one-step bandits (L = 1), where a per-token importance ratio is the sequence ratio.
    "bandit": ToySpec(vocab=4, length=1, eos=False, prompts=(
        PromptSpec("dense"), PromptSpec("dense"), PromptSpec("binary", 0.5))),
    # tests: small enough to check by hand
    "tiny": ToySpec(vocab=2, length=2, eos=False, prompts=(PromptSpec("dense"),)),
}


def _prompt_from(item: Any) -> PromptSpec:
    """``"binary:0.05"``, ``"dense"``, ``{"kind": "binary", "success": 0.05}`` -> PromptSpec."""
    if isinstance(item, PromptSpec):
        return item
    if isinstance(item, str):
        kind, _, arg = item.partition(":")
        return PromptSpec(kind, float(arg)) if arg else PromptSpec(kind)
    if hasattr(item, "get"):
        return PromptSpec(str(item.get("kind", "binary")), float(item.get("success", 0.5)))
    raise ValueError(f"toy.prompts entries must be 'kind[:success]' strings or mappings, got {item!r}")


def spec_from_config(cfg) -> ToySpec:
    """The preset named by ``task.env_id`` (default ``mixed``), then the ``toy`` node's fields."""
    name = cfg.task.get("env_id") or "mixed"
    if name not in PRESETS:
        raise ValueError(f"task.env_id must name a toy preset, one of {sorted(PRESETS)}, got {name!r}")
    spec = PRESETS[name]
    node = cfg.get("toy") if "toy" in cfg else None
    if node:
        kw = {k: node[k] for k in ("vocab", "length", "eos", "task_seed") if node.get(k) is not None}
        if node.get("prompts") is not None:
            kw["prompts"] = tuple(_prompt_from(p) for p in node["prompts"])
        spec = replace(spec, **kw)
    check_spec(spec)
    return spec


def check_spec(spec: ToySpec) -> None:
    def bad(name, allowed, value):
        raise ValueError(f"toy.{name} must be {allowed}, got {value!r}")

    if spec.vocab < 2 + int(spec.eos):
        bad("vocab", f">= {2 + int(spec.eos)} (EOS included)" if spec.eos else ">= 2", spec.vocab)
    if not 1 <= spec.length <= 6:
        bad("length", "in [1, 6] (responses are enumerated)", spec.length)
    if (spec.vocab - int(spec.eos)) ** spec.length > 50_000:
        bad("vocab/length", "small enough to enumerate (<= 50000 responses per prompt)",
            (spec.vocab, spec.length))
    if not spec.prompts:
        bad("prompts", "a non-empty list", spec.prompts)
    for p in spec.prompts:
        if p.kind not in PROMPT_KINDS:
            bad("prompts[].kind", f"one of {list(PROMPT_KINDS)}", p.kind)
        if p.kind == "binary" and not 0.0 < p.success < 1.0:
            bad("prompts[].success", "in (0, 1)", p.success)


def validate_toy(cfg) -> None:
    """Checks for ``task.family=toy`` that can fail before any work starts."""
    refuse_unknown_keys(cfg, "toy", ToySpec, ToySettings)
    spec = spec_from_config(cfg)
    settings = toy_settings_from_config(cfg)
    if settings.log_prompts and len(spec.prompts) > TOY_LOG_PROMPTS_MAX:
        bad_field("toy.log_prompts", f"false for tasks of more than {TOY_LOG_PROMPTS_MAX} prompts (two columns "
                  f"per prompt; task.env_id={cfg.task.get('env_id') or 'mixed'} has {len(spec.prompts)})", True)
    b = cfg.budget
    if b.env_steps is None and b.iterations is None:
        raise ValueError("budget.env_steps must be set (sampled sequences) or budget.iterations, got None")
    k, B = int(cfg.group_size), int(cfg.task.episodes_per_iter)
    if B < 1 or B % k:
        raise ValueError(f"task.episodes_per_iter must be a positive multiple of group_size={k} "
                         f"(sequences per iteration = prompts x group_size), got {B}")
    P, L = int(cfg.population), spec.length
    check_fits({"task.episodes_per_iter": (B, k), "population": (P, 1)},
               lambda v: v["population"] * v["task.episodes_per_iter"] * L * SAMPLED_TOKEN_BYTES,
               f"an iteration's sampled sequences ({L} tokens each, {SAMPLED_TOKEN_BYTES} bytes a token: its id "
               "and log-probability)")


SAMPLED_TOKEN_BYTES = 12  # a sampled token's int64 id and float32 log-probability (at least)


def random_rewards(n: int, generator: torch.Generator | None) -> torch.Tensor:
    """``toy.reward=random``: ``n`` rewards ``R_i ~ Bernoulli(1/2)``, i.i.d. and drawn from
    ``generator`` alone, so independent of the responses they are paired with (C26: the random
    rewards of Oertell et al., "Heuristics considered harmful", and Shao et al. 2025, "Spurious
    rewards"). Given the responses, every group-relative advantage of them (RLOO's, GRPO's with
    or without the std) is then symmetric about 0 (``R -> 1 - R`` flips its sign), so any
    systematic drift comes from how the update uses it, not from the signal."""
    return torch.bernoulli(torch.full((n,), 0.5, dtype=DTYPE), generator=generator)


@dataclass
class ToyBatch:
    """Sampled responses, batch-major ``[N, L]`` (N sequences, L = max length)."""

    prompts: torch.Tensor  # [N] long
    tokens: torch.Tensor  # [N, L] long (0 on padding)
    states: torch.Tensor  # [N, L] long (0 on padding)
    mask: torch.Tensor  # [N, L] float, 1 on response tokens (EOS included)
    length: torch.Tensor  # [N] long
    leaf: torch.Tensor  # [N] long, index of the complete response
    reward: torch.Tensor  # [N] float


class ToyTask:
    """The enumerated task: states, responses (leaves), rewards, exact values and gradients."""

    def __init__(self, spec: ToySpec):
        check_spec(spec)
        self.spec = spec
        V, L = spec.vocab, spec.length
        self.eos_token = V - 1 if spec.eos else None
        gen = torch.Generator().manual_seed(int(spec.task_seed))
        state_prompt, state_depth, child, leaf_of, roots = [], [], [], [], []
        leaves: list[tuple[int, tuple[int, ...]]] = []
        for x, _ in enumerate(spec.prompts):
            frontier = [()]
            roots.append(len(state_prompt))
            ids = {(): len(state_prompt)}
            state_prompt.append(x)
            state_depth.append(0)
            child.append([-1] * V)
            leaf_of.append([-1] * V)
            while frontier:
                nxt = []
                for prefix in frontier:
                    s = ids[prefix]
                    for a in range(V):
                        seq = prefix + (a,)
                        if len(seq) == L or (spec.eos and a == self.eos_token):
                            leaf_of[s][a] = len(leaves)
                            leaves.append((x, seq))
                        else:
                            ids[seq] = len(state_prompt)
                            child[s][a] = ids[seq]
                            state_prompt.append(x)
                            state_depth.append(len(seq))
                            child.append([-1] * V)
                            leaf_of.append([-1] * V)
                            nxt.append(seq)
                frontier = nxt
        self.n_prompts = len(spec.prompts)
        self.n_states = len(state_prompt)
        self.n_leaves = len(leaves)
        self.state_prompt = torch.tensor(state_prompt)
        self.state_depth = torch.tensor(state_depth)
        self.child = torch.tensor(child)
        self.leaf_of = torch.tensor(leaf_of)
        self.root = torch.tensor(roots)
        self.levels = [torch.nonzero(self.state_depth == d).flatten() for d in range(L)]
        N = self.n_leaves
        self.leaf_prompt = torch.tensor([x for x, _ in leaves])
        self.leaf_len = torch.tensor([len(seq) for _, seq in leaves])
        self.leaf_tokens = torch.zeros(N, L, dtype=torch.long)
        self.leaf_states = torch.zeros(N, L, dtype=torch.long)
        for n, (x, seq) in enumerate(leaves):
            s = roots[x]
            for t, a in enumerate(seq):
                self.leaf_tokens[n, t] = a
                self.leaf_states[n, t] = s
                s = child[s][a]
        self.leaf_mask = (torch.arange(L)[None, :] < self.leaf_len[:, None]).to(DTYPE)
        reward = torch.zeros(N, dtype=DTYPE)
        correct = torch.full((N,), float("nan"), dtype=DTYPE)
        for x, p in enumerate(spec.prompts):
            idx = torch.nonzero(self.leaf_prompt == x).flatten()
            if p.kind == "dense":
                reward[idx] = torch.rand(len(idx), generator=gen, dtype=DTYPE)
            elif p.kind == "binary":
                n_ok = min(max(int(round(p.success * len(idx))), 1), len(idx) - 1)
                ok = idx[torch.randperm(len(idx), generator=gen)[:n_ok]]
                reward[ok] = 1.0
                correct[idx] = 0.0
                correct[ok] = 1.0
            else:  # first_token: the answer is a content token, never EOS
                n_content = V - int(spec.eos)
                answer = int(torch.randint(n_content, (1,), generator=gen))
                ok = (self.leaf_tokens[idx, 0] == answer).to(DTYPE)
                reward[idx] = ok
                correct[idx] = ok
        self.leaf_reward = reward
        self.leaf_correct = correct
        # reward of taking a at s when that ends the response (0 elsewhere; masked by leaf_of)
        self.leaf_reward_sa = torch.where(self.leaf_of >= 0, reward[self.leaf_of.clamp(min=0)],
                                          torch.zeros((), dtype=DTYPE))

    # ------------------------------------------------------------------ parameters
    @property
    def param_shape(self) -> tuple[int, int]:
        return (self.n_states, self.spec.vocab)

    def init_logits(self, scale: float = 0.0, seed: int = 0) -> torch.Tensor:
        """theta = 0 (the uniform policy) or ``scale`` x N(0, 1) logits from ``seed``."""
        theta = torch.zeros(self.param_shape, dtype=DTYPE)
        if scale:
            theta += scale * torch.randn(self.param_shape, generator=torch.Generator().manual_seed(seed),
                                         dtype=DTYPE)
        return theta

    def prompt_rows(self, x: int) -> torch.Tensor:
        """State indices (rows of theta) that belong to prompt ``x``."""
        return torch.nonzero(self.state_prompt == x).flatten()

    # ------------------------------------------------------------------ exact quantities
    def values(self, theta: torch.Tensor, gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact ``V [S]`` and ``Q [S, V]`` of the policy, reward at the end of the response.

        ``gamma = 1`` (default): the undiscounted values whose root is ``J_x``. ``gamma < 1``:
        the discounted ``V^pi_gamma``, ``Q^pi_gamma`` of GAE (Schulman et al. 2016, arXiv:1506.02438,
        section 2): Bellman's ``Q(s, a) = r(s, a) + gamma V(s')`` with ``r`` the leaf reward on the
        last token and 0 before it, so ``V_gamma(s_t) = E[gamma^(n - 1 - t) R]`` for a response of
        ``n`` tokens - the exact critic of an estimator run with that gamma."""
        probs = torch.softmax(theta, dim=-1)
        V = torch.zeros(self.n_states, dtype=theta.dtype)
        Q = torch.zeros(self.param_shape, dtype=theta.dtype)
        for states, children, ends, leaf_r in self._value_levels():  # deepest first: children before parents
            cont = float(gamma) * V[children]
            q = torch.where(ends, leaf_r.to(theta.dtype), cont)
            Q = Q.index_put((states,), q)
            V = V.index_put((states,), (probs[states] * q).sum(-1))
        return V, Q

    def _value_levels(self) -> list[tuple[torch.Tensor, ...]]:
        """What :meth:`values` reads of each level, deepest first: its states, their children
        (clamped to a valid index), where an action ends the response, and the leaf reward there.
        They depend on the task's tables only, so they are built once, and again when a table is
        replaced by another tensor (a test that sets ``leaf_reward_sa``); tables are never changed in place."""
        tables = (self.leaf_reward_sa, self.child, self.leaf_of)
        cached = getattr(self, "_levels", None)
        if cached is None or any(a is not b for a, b in zip(cached[0], tables)):
            ends = self.leaf_of >= 0
            cached = self._levels = (tables, [(st, self.child[st].clamp(min=0), ends[st], self.leaf_reward_sa[st])
                                              for st in reversed(self.levels)])
        return cached[1]

    def prompt_rewards(self, theta: torch.Tensor) -> torch.Tensor:
        """``J_x = E_{y ~ pi(.|x)} R(x, y)`` for every prompt, ``[X]``."""
        return self.values(theta)[0][self.root]

    def expected_reward(self, theta: torch.Tensor) -> torch.Tensor:
        """``J(theta)``: prompts uniform."""
        return self.prompt_rewards(theta).mean()

    @property
    def binary_rewards(self) -> bool:
        """Every response's reward is 0 or 1 (``binary`` and ``first_token`` prompts), so ``J_x`` is a
        success probability."""
        return bool(((self.leaf_reward == 0) | (self.leaf_reward == 1)).all())

    def arcsin_objective(self, theta: torch.Tensor) -> torch.Tensor:
        """``(1/X) sum_x arcsin(sqrt(p_x))`` with ``p_x = J_x`` the success probability of prompt ``x``
        (binary rewards only): the objective whose gradient the population GRPO update follows,
        ``grad = (1/X) sum_x grad p_x / (2 sqrt(p_x (1 - p_x)))`` (Davis and Recht 2025,
        arXiv:2510.13651; claim C25). Differentiable."""
        if not self.binary_rewards:
            raise ValueError("arcsin_objective needs binary rewards (every prompt binary or first_token)")
        return torch.asin(self.prompt_rewards(theta).sqrt()).mean()

    def reward_to_go_moments(self, theta: torch.Tensor, gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-weighted mean and standard deviation of the reward-to-go under ``pi_theta``
        (prompts uniform), by enumeration of the complete responses:

        .. math:: \\mu = \\frac{\\sum_{x,y} P(x, y) \\sum_{t<n_y} G_t}{\\sum_{x,y} P(x, y)\\, n_y}, \\qquad
                  \\sigma^2 = \\frac{\\sum_{x,y} P(x, y) \\sum_{t<n_y} (G_t - \\mu)^2}{\\sum_{x,y} P(x, y)\\, n_y},

        with ``P(x, y) = pi(y | x) / X``, ``n_y`` the response's length (EOS included) and
        ``G_t = gamma^(n_y - 1 - t) R(x, y)`` the reward-to-go of token ``t`` (the reward sits on the
        last token, :func:`time_major`). Every token counts once, as it occurs in a batch, so these
        are the infinite-batch limits of the mean and (biased) std that batch whitening of the
        reward-to-go uses (``normalize_advantages=batch``, REINFORCE++): the whitened estimator's
        expected gradient is then ``grad J / sigma`` at ``gamma = 1`` (the mean multiplies a score
        function of zero expectation). ``(mu, sigma)``, differentiable."""
        w = self.leaf_log_probs(theta).exp()[:, None] * self.leaf_mask / self.n_prompts  # [N, L]
        steps = (self.leaf_len[:, None] - 1 - torch.arange(self.spec.length)[None, :]).clamp(min=0)
        G = float(gamma) ** steps.to(DTYPE) * self.leaf_reward[:, None]
        tokens = w.sum()
        mean = (w * G).sum() / tokens
        return mean, ((w * (G - mean) ** 2).sum() / tokens).sqrt()

    def exact_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        """``grad J`` by autograd through :meth:`values`, shape of theta. A stack of policies
        ``[P, S, V]`` gives each its own gradient, from one pass over all of them
        (``torch.func.vmap`` of :meth:`expected_reward`; each member's gradient is the one it gets
        alone, bit for bit: tests/test_toy_fast_paths.py)."""
        th = theta.detach().clone().requires_grad_(True)
        J = self.expected_reward(th) if th.dim() == 2 else _vmap(self.expected_reward)(th).sum()
        (grad,) = torch.autograd.grad(J, th)
        return grad

    def leaf_log_probs(self, theta: torch.Tensor) -> torch.Tensor:
        """``log pi(y | x)`` of every complete response ``[N]`` (by enumeration)."""
        logpi = torch.log_softmax(theta, dim=-1)
        return (logpi[self.leaf_states, self.leaf_tokens] * self.leaf_mask).sum(-1)

    def sequence_kl(self, theta: torch.Tensor, theta_ref: torch.Tensor) -> torch.Tensor:
        """``KL(pi || ref)`` over whole responses, averaged over prompts (exact, differentiable)."""
        return self._sequence_kl(self.leaf_log_probs(theta), self.leaf_log_probs(theta_ref))

    def _sequence_kl(self, lp: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
        """:meth:`sequence_kl` from the leaf log-probs ``lp`` (policy) and ``lr`` (reference)."""
        per = torch.zeros(self.n_prompts, dtype=lp.dtype).index_add(0, self.leaf_prompt, lp.exp() * (lp - lr))
        return per.mean()

    def prompt_entropy(self, theta: torch.Tensor) -> torch.Tensor:
        """Exact entropy of the response distribution of every prompt, ``[X]`` (nats):

        .. math:: H_x = -\\sum_y \\pi_\\theta(y \\mid x) \\log \\pi_\\theta(y \\mid x),

        by enumeration of the complete responses (equal to the sum over reachable states of
        ``P(reach s) H(pi(.|s))``, the chain rule of entropy). The uniform policy of ``n``
        responses has ``log n``; it falls as the policy concentrates (C26's drift)."""
        return self._prompt_entropy(self.leaf_log_probs(theta))

    def _prompt_entropy(self, lp: torch.Tensor) -> torch.Tensor:
        """:meth:`prompt_entropy` from the leaf log-probs ``lp``."""
        return torch.zeros(self.n_prompts, dtype=lp.dtype).index_add(0, self.leaf_prompt, -lp.exp() * lp)

    def prompt_success(self, theta: torch.Tensor) -> list[float | None]:
        """Exact success probability ``P(correct | x)`` of every prompt (None for ``dense``
        prompts, which have no correct responses)."""
        p = self.leaf_log_probs(theta).exp()
        has = torch.isfinite(self.leaf_correct)
        right = p * torch.nan_to_num(self.leaf_correct)
        ok = torch.zeros(self.n_prompts, dtype=p.dtype).index_add(0, self.leaf_prompt, right)
        graded = torch.zeros(self.n_prompts, dtype=torch.long).index_add(0, self.leaf_prompt, has.long())
        return [float(ok[x]) if int(graded[x]) else None for x in range(self.n_prompts)]

    def prompt_update_norms(self, theta_before: torch.Tensor, theta_after: torch.Tensor) -> torch.Tensor:
        """Size of an update per prompt, ``[X]``: the Frobenius norm of the change of the logits
        rows that belong to prompt ``x`` (:meth:`prompt_rows`),
        ``|| theta_after[rows(x)] - theta_before[rows(x)] ||_2`` (C28: Dr. GRPO, arXiv 2503.20783,
        argues the group-std division gives prompts with p near 0 or 1 larger updates)."""
        sq = (theta_after.detach() - theta_before.detach()).pow(2).sum(-1)  # [S]
        return torch.zeros(self.n_prompts, dtype=sq.dtype).index_add(0, self.state_prompt, sq).sqrt()

    def exact_stats(self, theta: torch.Tensor, ref_log_probs: torch.Tensor | None = None) -> dict[str, Any]:
        """Exact diagnostics of one policy: :meth:`exact_stats_of` of ``theta`` alone."""
        return self.exact_stats_of(theta[None], ref_log_probs)[0]

    def exact_stats_of(self, thetas: torch.Tensor, ref_log_probs: torch.Tensor | None = None) -> list[dict[str, Any]]:
        """Exact diagnostics of each policy of the stack ``thetas [P, S, V]``: J, per-prompt J,
        expected length (all, right, wrong responses), the response entropy averaged over prompts
        (:meth:`prompt_entropy`); given the reference's :meth:`leaf_log_probs` ``ref_log_probs``,
        also ``kl_ref`` = :meth:`sequence_kl` (the policy's leaf log-probs computed once for all of
        them). One pass over the stack (``torch.func.vmap``); each policy's numbers are the ones it
        gets alone, bit for bit (tests/test_toy_fast_paths.py)."""
        with torch.no_grad():
            J_x = _vmap(self.prompt_rewards)(thetas)  # [P, X]
            lp = _vmap(self.leaf_log_probs)(thetas)  # [P, N]
            p = lp.exp() / self.n_prompts
            length = self.leaf_len.to(DTYPE)
            cols = {"J": J_x.mean(-1), "response_len": (p * length).sum(-1),
                    "entropy": _vmap(self._prompt_entropy)(lp).mean(-1)}
            if ref_log_probs is not None:
                cols["kl_ref"] = _vmap(lambda a: self._sequence_kl(a, ref_log_probs))(lp)
            has = torch.isfinite(self.leaf_correct)
            shares = {}
            for name, sel in (("right_len", has & (self.leaf_correct == 1)), ("wrong_len", has & (self.leaf_correct == 0))):
                w = p * sel.to(DTYPE)
                shares[name] = ((w * length).sum(-1), w.sum(-1))
            graded = bool(has.any())
            if graded:
                cols["success"] = (p * torch.nan_to_num(self.leaf_correct)).sum(-1) / (p * has.to(DTYPE)).sum(-1)
            # to Python floats a column at a time (float64: a quotient of two is the tensor one's)
            values = {k: v.tolist() for k, v in cols.items()}
            J_rows = J_x.tolist()
            share_values = {name: (num.tolist(), den.tolist()) for name, (num, den) in shares.items()}
            out = []
            for i in range(thetas.shape[0]):
                row = {k: v[i] for k, v in values.items()}
                row["J_prompt"] = J_rows[i]
                for name, (num, den) in share_values.items():
                    row[name] = num[i] / den[i] if den[i] > 0 else None
                if not graded:
                    row["success"] = None
                out.append(row)
        return out

    # ------------------------------------------------------------------ sampling
    def sample(self, theta: torch.Tensor, prompts: torch.Tensor, generator: torch.Generator | None = None,
               uniforms: torch.Tensor | None = None) -> ToyBatch:
        """Sample one response per entry of ``prompts [N]`` by inverse CDF of ``uniforms [N, L]``.

        The uniforms are drawn first (from ``generator``), independent of theta, so two policies
        (or two estimators) fed the same generator state share their random numbers.
        """
        N, L = prompts.shape[0], self.spec.length
        if uniforms is None:
            uniforms = torch.rand(N, L, generator=generator, dtype=DTYPE)
        probs = torch.softmax(theta.detach(), dim=-1)
        cdf = probs.cumsum(-1)
        s = self.root[prompts]
        alive = torch.ones(N, dtype=torch.bool)
        tokens = torch.zeros(N, L, dtype=torch.long)
        states = torch.zeros(N, L, dtype=torch.long)
        leaf = torch.full((N,), -1, dtype=torch.long)
        for t in range(L):
            a = (uniforms[:, t:t + 1] > cdf[s]).sum(-1).clamp(max=self.spec.vocab - 1)
            tokens[:, t] = torch.where(alive, a, 0)
            states[:, t] = torch.where(alive, s, 0)
            lf = self.leaf_of[s, a]
            ended = alive & (lf >= 0)
            leaf = torch.where(ended, lf, leaf)
            alive = alive & ~ended
            s = torch.where(alive, self.child[s, a], 0)
        length = self.leaf_len[leaf]
        mask = (torch.arange(L)[None, :] < length[:, None]).to(DTYPE)
        return ToyBatch(prompts, tokens, states, mask, length, leaf, self.leaf_reward[leaf])

    def greedy(self, theta: torch.Tensor) -> torch.Tensor:
        """Leaf index of the greedy (argmax) response of every prompt, ``[X]``."""
        s = self.root.clone()
        leaf = torch.full((self.n_prompts,), -1, dtype=torch.long)
        alive = torch.ones(self.n_prompts, dtype=torch.bool)
        for _ in range(self.spec.length):
            a = theta.detach()[s].argmax(-1)
            lf = self.leaf_of[s, a]
            ended = alive & (lf >= 0)
            leaf = torch.where(ended, lf, leaf)
            alive = alive & ~ended
            s = torch.where(alive, self.child[s, a], 0)
        return leaf


def time_major(task: ToyTask, batch: ToyBatch, state_values: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Estimator inputs ``[T = L, B = N]``: reward on the last token, ``terminated`` there (the
    response ends; nothing to bootstrap), and, given a value table ``[S]``, ``values`` /
    ``next_values`` (0 after the last token). ``state_values [P, S]``: one table per population
    member, whose rows are then ``P`` equal member-major blocks of the ``N``."""
    N, L = batch.tokens.shape
    last = torch.nn.functional.one_hot(batch.length - 1, L).to(DTYPE)  # [N, L]
    out = {
        "rewards": (last * batch.reward[:, None]).T.contiguous(),
        "terminated": last.T.contiguous(),
        "truncated": torch.zeros(L, N, dtype=DTYPE),
        "mask": batch.mask.T.contiguous(),
    }
    if state_values is not None:
        if state_values.dim() == 1:
            v = state_values[batch.states] * batch.mask  # [N, L]
        else:  # member p's rows look up its own table
            P = state_values.shape[0]
            v = state_values.gather(1, batch.states.reshape(P, -1)).view(N, L) * batch.mask
        nv = torch.cat([v[:, 1:], torch.zeros(N, 1, dtype=v.dtype)], dim=1) * (1.0 - last)
        out["values"], out["next_values"] = v.T.contiguous(), nv.T.contiguous()
    return out


def advantage_batch(task: ToyTask, batch: ToyBatch, state_values: torch.Tensor | None, greedy: torch.Tensor | None,
                    group_size: int | None, reward_penalty: torch.Tensor | None = None) -> AdvantageBatch:
    """The estimator's input ``[T = L, B = N]`` (:func:`time_major`, which says how a population's
    members lie side by side); ``reward_penalty [L, N]`` is
    subtracted from the per-token rewards (the in-reward KL penalty, InstructGPT style)."""
    tm = time_major(task, batch, state_values)
    rewards = tm["rewards"] if reward_penalty is None else tm["rewards"] - reward_penalty * tm["mask"]
    return AdvantageBatch(rewards=rewards, terminated=tm["terminated"], truncated=tm["truncated"], mask=tm["mask"],
                          values=tm.get("values"), next_values=tm.get("next_values"), greedy_scores=greedy,
                          group_size=group_size)


def build_task(cfg) -> ToyTask:
    return ToyTask(spec_from_config(cfg))


__all__ = ["PRESETS", "PromptSpec", "ToySpec", "ToyTask", "ToyBatch", "build_task", "spec_from_config",
           "time_major", "advantage_batch", "validate_toy", "random_rewards", "DTYPE"]
