"""The RLHF pipeline in miniature: data -> SFT policy -> reward model, each stage cached.

Two embedded tasks share it (``lm.corpus``): ``summarize`` (the default; a learned reward model
over a programmatic gold score) and ``arith`` (:mod:`.arith`: arithmetic with an exact checker
as the gold score, optimised directly with ``lm.reward=gold``, so there is no reward-model stage).

Stages (Ouyang et al. 2022, InstructGPT, §3.5; Stiennon et al. 2020):

1. **SFT**: the starting policy (the embedded tiny GPT-2 built from ``lm.arch``, or
   ``lm.model``) fine-tuned on document -> reference summary with the token cross-entropy of
   the response. Deliberately short (``lm.sft.steps``) so RL has headroom.
2. **Reward model**: the SFT trunk with a scalar head (``AutoModelForSequenceClassification``,
   ``num_labels=1``) trained with the Bradley-Terry loss ``-log sigmoid(r(x, y_w) - r(x, y_l))``
   on pairs of SFT samples ranked by the gold score: a learned, imperfect proxy. Its output is
   then mapped to gold units by a least-squares fit ``a r + b`` on held-out samples, so the
   optimized ``reward`` and ``gold_reward`` are on one scale and their gap is visible (C10, C21).
3. The frozen SFT policy is the reference of the KL term; RL starts from it.

Each stage lives in ``<lm.cache_dir>/<stage>-<hash>/`` where the hash covers every setting
that stage depends on (including the stages before it); a changed setting builds a new
folder, an unchanged one is loaded. A stage is built in a temporary folder and renamed into
place when complete (``stage.json`` written last), so concurrent sweep jobs never read half a
model. Models are written with ``save_pretrained`` (safetensors) and never unpickled.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from omegaconf import DictConfig, OmegaConf

from ...models.lm import (DecodeSettings, PooledRewardModel, Responses, TinyArch, disable_dropout, generate,
                          load_pretrained, pretrained_source, response_forward, tiny_causal_lm)
from .corpus import Example, vocabulary
from .data import (EncodedSplit, decode_responses, encode_response, encode_split, left_pad, load_examples,
                   right_pad)
from .arith import ArithSpec, arith_reward, check, make_problems
from .arith import vocabulary as arith_vocabulary
from .gold import gold_score
from .tokenizer import build_word_tokenizer, ensure_special_tokens, load_tokenizer

log = logging.getLogger("harness.lm")
CACHE_VERSION = 1


# --------------------------------------------------------------------------- devices
def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def uses_bf16(device: torch.device, dtype: str = "auto") -> bool:
    """Whether the model's matrix work runs in bf16 (autocast) for this device and ``lm.dtype``."""
    return dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda")


def autocast(device: torch.device, dtype: str = "auto"):
    """bf16 autocast on GPU (weights and optimizer state stay fp32); plain fp32 on CPU."""
    if uses_bf16(device, dtype):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' notices (e.g. the freshly initialised reward head) while loading."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------- cache
def _source_id(value: str | None) -> Any:
    """A model/tokenizer/dataset source as it enters a cache key: local paths with the newest
    mtime of their files (an edited file rebuilds), hub ids as written."""
    if value is None:
        return None
    p = Path(str(value)).expanduser()
    if p.exists():
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
        return {"path": str(p.resolve()), "mtime": max((f.stat().st_mtime for f in files), default=0.0)}
    return {"hub": str(value)}


def cache_path(lm: Any) -> Path:
    """``lm.cache_dir`` as a folder: a leading ``~`` is the home folder (``os.path.expanduser``),
    relative paths are relative to the working directory. ``validate_lm`` refuses an empty one."""
    text = "" if lm.cache_dir is None else str(lm.cache_dir)
    if not text.strip():
        raise ValueError(f"lm.cache_dir must be a non-empty path, got {lm.cache_dir!r}")
    return Path(os.path.expanduser(text))


def stage_key(material: dict) -> str:
    blob = json.dumps(material, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def cached_stage(cache_dir: Path, name: str, material: dict,
                 build: Callable[[Path], dict]) -> tuple[Path, dict, bool]:
    """``(folder, meta, reused)``: load ``<name>-<hash>`` if complete, else build it atomically."""
    material = {"stage": name, "version": CACHE_VERSION, **material}
    key = stage_key(material)
    final = cache_dir / f"{name}-{key}"
    if (final / "stage.json").is_file():
        log.info("lm: reusing cached %s stage %s", name, final)
        return final, json.loads((final / "stage.json").read_text()), True
    cache_dir.mkdir(parents=True, exist_ok=True)
    # one builder per stage: parallel workers of a sweep wait for the first one's build instead
    # of each building the same stage (flock: released by the kernel if the builder dies)
    with open(cache_dir / f".{name}-{key}.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("lm: waiting for another process building %s stage %s", name, final)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "stage.json").is_file():
            log.info("lm: reusing cached %s stage %s", name, final)
            return final, json.loads((final / "stage.json").read_text()), True
        remove_stale_temps(cache_dir, name, key)
        return _build_stage(cache_dir, name, key, final, material, build)


def remove_stale_temps(cache_dir: Path, name: str, key: str) -> list[Path]:
    """Remove the temporary folders builders killed mid-build left behind (``SIGKILL`` skips
    the cleanup in :func:`_build_stage`): called with ``<name>-<key>``'s lock held, so every
    ``.<name>-<key>.<pid>.tmp`` is stale; a temp folder of another key of this stage is removed
    only when its own lock can be taken at once (no builder holds it). No pid is trusted (a
    cache shared across machines sees other hosts' pids). Returns what was removed."""
    removed = []
    for tmp in sorted(cache_dir.glob(f".{name}-*.*.tmp")):
        other = tmp.name[len(name) + 2:].split(".", 1)[0]
        if not tmp.is_dir() or len(other) != len(key):
            continue
        if other == key:
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
            continue
        lock_file = cache_dir / f".{name}-{other}.lock"
        if not lock_file.is_file():
            continue
        with open(lock_file, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # another process is building that key right now
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    if removed:
        log.warning("lm: removed %d temporary folder(s) left by killed %s builders: %s", len(removed), name,
                    ", ".join(p.name for p in removed))
    return removed


def _build_stage(cache_dir: Path, name: str, key: str, final: Path, material: dict,
                 build: Callable[[Path], dict]) -> tuple[Path, dict, bool]:
    tmp = cache_dir / f".{name}-{key}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log.info("lm: building %s stage -> %s", name, final)
    t0 = time.perf_counter()
    try:
        meta = build(tmp)
        meta.update(build_seconds=time.perf_counter() - t0, key=key, material=material)
        (tmp / "stage.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished the same stage first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
            if not (final / "stage.json").is_file():
                raise
            meta = json.loads((final / "stage.json").read_text())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, meta, False


# --------------------------------------------------------------------------- reward model
@dataclass(frozen=True)
class ScoringSettings:
    """Where and how a reward model scores: on ``device`` under autocast ``dtype``, prompts cut to
    their last ``max_prompt_len`` tokens and responses to their first ``max_response_len``; the
    calibrated score is ``scale * r + shift``."""

    device: torch.device
    max_prompt_len: int
    max_response_len: int
    dtype: str = "auto"
    scale: float = 1.0
    shift: float = 0.0


class RewardModel:
    """Scores ``(prompt, response)`` texts, mapped by ``scale * r + shift`` (the calibration of a
    trained RM to gold units). Two kinds: a folder with ``reward_head.safetensors`` is a
    :class:`PooledRewardModel` (what the pipeline trains); any other folder or hub id is read
    with ``AutoModelForSequenceClassification`` (``num_labels=1``, its own tokenizer and pooling)."""

    def __init__(self, model, tokenizer, settings: ScoringSettings):
        self.model, self.tokenizer = model, tokenizer
        self.pooled = isinstance(model, PooledRewardModel)
        self.device, self.dtype = settings.device, settings.dtype
        self.max_prompt_len, self.max_response_len = settings.max_prompt_len, settings.max_response_len
        self.scale, self.shift = settings.scale, settings.shift

    @classmethod
    def load(cls, source: str | Path, settings: ScoringSettings, tokenizer=None,
             field_name: str = "lm.reward_model") -> "RewardModel":
        from transformers import AutoModelForSequenceClassification

        folder = Path(pretrained_source(source))
        with quiet_transformers():
            if (folder / PooledRewardModel.HEAD_FILE).is_file():
                model = PooledRewardModel.load(folder, field_name)
            else:
                model = load_pretrained(AutoModelForSequenceClassification, source, field_name)
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(str(source), field_name)
        ensure_special_tokens(tokenizer)
        if not isinstance(model, PooledRewardModel) and model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        disable_dropout(model)
        model.to(settings.device).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return cls(model, tokenizer, settings)

    def raw(self, prompts: list[str], responses: list[str], finished: list[bool] | None = None,
            share_prompts: bool = False) -> torch.Tensor:
        """Uncalibrated scores. ``finished[i]``: response ``i`` ended with EOS, which a pooled RM
        reads as its last token (whether stopping there is right is part of a summary's quality).
        ``share_prompts``: a pooled RM runs each distinct prompt once (a group's responses share it;
        :func:`harness.models.lm.trunk_states`)."""
        tok, pad = self.tokenizer, self.tokenizer.pad_token_id
        finished = finished if finished is not None else [False] * len(responses)
        p_ids = [tok(p, add_special_tokens=False)["input_ids"][-self.max_prompt_len:] for p in prompts]
        r_ids = [tok(r, add_special_tokens=False)["input_ids"][:self.max_response_len] if r else [] for r in responses]
        with autocast(self.device, self.dtype):
            if self.pooled:
                r_ids = [(r + [tok.eos_token_id])[:self.max_response_len] if f else r for r, f in zip(r_ids, finished)]
                pi, pm = left_pad(p_ids, pad, self.device)
                ri, rm = right_pad(r_ids, pad, self.device)
                return self.model(pi, pm, ri, rm, share_prompts=share_prompts).float()
            ids, mask = right_pad([a + b for a, b in zip(p_ids, r_ids)], pad, self.device)
            return self.model(input_ids=ids, attention_mask=mask).logits[:, 0].float()

    @torch.no_grad()
    def __call__(self, prompts: list[str], responses: list[str], finished: list[bool] | None = None,
                 batch_size: int = 256, share_prompts: bool = False) -> torch.Tensor:
        finished = finished if finished is not None else [False] * len(responses)
        out = [self.raw(prompts[i:i + batch_size], responses[i:i + batch_size], finished[i:i + batch_size],
                        share_prompts)
               for i in range(0, len(prompts), batch_size)]
        return torch.cat(out) * self.scale + self.shift


# --------------------------------------------------------------------------- the task object
@dataclass
class LMTask:
    """What the trainer needs: tokenizer, encoded splits, the starting policy's folder, the
    reward (RM or gold) and the gold score. Built once per process, shared by population members.

    ``gold_fn(response, example)`` is the gold score (summarization: :func:`gold_score`;
    arithmetic: the 0/1 checker), ``reward_fn`` what ``lm.reward=gold`` optimises (None: the gold
    score itself), and ``binary`` says the gold score is a 0/1 verdict (pass@k, length by
    correctness are then defined)."""

    tokenizer: Any
    train: EncodedSplit
    held_out: EncodedSplit
    policy_source: str
    reward_kind: str  # rm | gold
    reward_model: RewardModel | None
    max_prompt_len: int
    max_response_len: int
    device: torch.device
    dtype: str = "auto"
    meta: dict = field(default_factory=dict)
    gold_fn: Callable[[str, Any], float] = gold_score
    reward_fn: Callable[[str, Any], float] | None = None
    binary: bool = False

    def _load(self, auto_cls):
        with quiet_transformers():
            model = load_pretrained(auto_cls, self.policy_source, "lm.model")
        if len(self.tokenizer) > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(len(self.tokenizer))
        disable_dropout(model)
        return model.to(self.device).eval()

    def load_policy(self):
        from transformers import AutoModelForCausalLM

        return self._load(AutoModelForCausalLM)

    def load_backbone(self):
        from transformers import AutoModel

        return self._load(AutoModel)

    def gold(self, examples: list[Example], responses: list[str]) -> torch.Tensor:
        return torch.tensor([self.gold_fn(r, e) for r, e in zip(responses, examples)], dtype=torch.float32)

    @property
    def reward_is_gold(self) -> bool:
        """The reward is the gold score itself (``lm.reward=gold`` without a ``reward_fn``)."""
        return self.reward_kind == "gold" and self.reward_fn is None

    def reward(self, examples: list[Example], responses: list[str], finished: list[bool]) -> torch.Tensor:
        """The optimized score (before the no-EOS penalty and the KL term)."""
        if self.reward_kind == "gold":
            if self.reward_is_gold:
                return self.gold(examples, responses)
            return torch.tensor([self.reward_fn(r, e) for r, e in zip(responses, examples)], dtype=torch.float32)
        # a group's responses share their prompt: the reward model runs it once (the same scores to rounding)
        return self.reward_model([e.prompt for e in examples], responses, finished, share_prompts=True).cpu()


# --------------------------------------------------------------------------- helpers
@dataclass(frozen=True)
class Decoding:
    """How responses are decoded: up to ``max_response_len`` tokens at ``temperature`` (the argmax
    with ``greedy``), ``samples`` responses per prompt (one with ``greedy``), on ``device`` under
    autocast ``dtype``, ``batch_size`` rows per call to :func:`harness.models.lm.generate`."""

    max_response_len: int
    temperature: float
    greedy: bool
    device: Any
    dtype: str = "auto"
    samples: int = 1
    batch_size: int = 256

    @property
    def per_prompt(self) -> int:
        return 1 if self.greedy else self.samples


def _sample_texts(model, tokenizer, split: EncodedSplit, indices: list[int], decoding: Decoding,
                  gen: torch.Generator, bar: str | None = None) -> tuple[list[int], list[str], list[bool]]:
    """``n = decoding.per_prompt`` responses per prompt (grouped), as ``(example indices, texts,
    ended with EOS)``, decoded ``batch_size // n`` prompts at a time (each prompt run once, its cache
    shared by its ``n`` rows). ``bar``: the title of a progress bar over the prompts; None: none."""
    d, n = decoding, decoding.per_prompt
    rows = [i for i in indices for _ in range(n)]
    texts: list[str] = []
    finished: list[bool] = []
    per_chunk = max(1, d.batch_size // n)
    with stage_bar(len(indices), bar, "prompt") as shown:
        for s in range(0, len(indices), per_chunk):
            chunk = indices[s:s + per_chunk]
            ids, mask = left_pad([split.prompt_ids[i] for i in chunk], tokenizer.pad_token_id, d.device)
            with autocast(d.device, d.dtype):
                g = generate(model, ids, mask, DecodeSettings(d.max_response_len, tokenizer.eos_token_id,
                                                              tokenizer.pad_token_id, d.temperature),
                             greedy=d.greedy, generator=gen, samples=n)
            texts += decode_responses(tokenizer, g.tokens, g.mask)
            finished += g.has_eos.tolist()
            shown.update(len(chunk))
    return rows, texts, finished


def evaluate_scores(model, tokenizer, split: EncodedSplit, n: int, decoding: Decoding, seed: int,
                    score: Callable[[str, Any], float] = gold_score) -> list[list[float]]:
    """``score`` of each response to the first ``n`` prompts of ``split``: one list per prompt,
    ``decoding.samples`` sampled responses each (one greedy response with ``decoding.greedy``).

    Sampled responses come from a generator seeded with ``seed`` alone, so two policies evaluated
    with one seed share their random numbers (and evaluation never moves the training RNG).
    """
    gen = torch.Generator(device=decoding.device).manual_seed(seed)
    idx = list(range(min(n, len(split))))
    per = decoding.per_prompt
    rows, texts, _ = _sample_texts(model, tokenizer, split, idx, decoding, gen)
    flat = [score(t, split.examples[i]) for i, t in zip(rows, texts)]
    return [flat[j:j + per] for j in range(0, len(flat), per)]


def evaluate_gold(model, tokenizer, split: EncodedSplit, n: int, decoding: Decoding, seed: int,
                  score: Callable[[str, Any], float] = gold_score) -> float:
    """Mean ``score`` (the gold score) over the first ``n`` prompts of ``split``, ``decoding.samples``
    responses each (:func:`evaluate_scores`)."""
    per_prompt = evaluate_scores(model, tokenizer, split, n, decoding, seed, score)
    flat = [x for s in per_prompt for x in s]
    return sum(flat) / max(len(flat), 1)


def _lr_at(step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))


def stage_bar(total: int, desc: str | None, unit: str):
    """A progress bar with an ETA over one pipeline stage's ``total`` steps (tqdm, on stderr);
    ``desc=None``: disabled (no output)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=desc is None, dynamic_ncols=True)


def supervised_training(model, batches: Iterable[Any], loss_of: Callable[[Any], torch.Tensor], lr: float,
                        steps: int, warmup: int, bar: str | None = None) -> tuple[float, int]:
    """The one supervised-training loop of the pipeline's stages (SFT, reward model): one step per
    item of ``batches`` (drawn lazily, so a stage's RNG is read in its own order), minimising
    ``loss_of(batch)`` with AdamW (no weight decay) at ``lr`` times :func:`_lr_at` (linear warmup
    over ``warmup`` steps, then cosine decay over ``steps``) and the gradient norm clipped to 1
    (``torch.nn.utils.clip_grad_norm_``), the model in train mode and back in eval mode after.
    ``bar``: the title of a progress bar over the ``steps`` (:func:`stage_bar`), showing the loss; None: none.
    Returns ``(mean loss of the last 20 steps (nan without steps), steps taken)``."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_at(s, steps, warmup))
    model.train()
    losses = []
    with stage_bar(steps, bar, "step") as shown:
        for batch in batches:
            loss = loss_of(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            shown.set_postfix_str(f"loss={losses[-1]:.4g}", refresh=False)
            shown.update()
    model.eval()
    tail = losses[-20:] or [float("nan")]
    return sum(tail) / len(tail), len(losses)


@dataclass
class PipelineInputs:
    """What every stage of the pipeline reads: the ``lm`` settings, the tokenizer and encoded
    splits, the gold score, and where the stages run (``device``, autocast ``dtype``, seeded by
    ``seed = lm.pipeline_seed``), the folder of the cached stages, and whether the stages show
    progress bars (the run's ``progress``)."""

    lm: Any
    tokenizer: Any
    train: EncodedSplit
    held_out: EncodedSplit
    gold_fn: Callable[[str, Any], float]
    device: torch.device
    dtype: str
    seed: int
    cache_dir: Path
    progress: bool = False

    def bar(self, desc: str) -> str | None:
        """A stage's progress-bar title (:func:`stage_bar`): ``desc``, or None with ``progress`` off."""
        return f"lm: {desc}" if self.progress else None

    def decoding(self, greedy: bool, samples: int = 1) -> Decoding:
        """Decoding at ``lm.temperature`` up to ``lm.max_response_len`` tokens."""
        return Decoding(int(self.lm.max_response_len), float(self.lm.temperature), greedy, self.device, self.dtype,
                        samples=samples)

    def scoring(self, scale: float = 1.0, shift: float = 0.0) -> ScoringSettings:
        """A reward model's settings at the task's lengths."""
        return ScoringSettings(self.device, self.lm.max_prompt_len, self.lm.max_response_len, self.dtype, scale, shift)


def train_sft(model, p: PipelineInputs) -> dict:
    """Response-only token cross-entropy on ``lm.sft.steps`` batches of ``lm.sft.batch_size`` training
    examples drawn with replacement (:func:`supervised_training`)."""
    tokenizer, train, sft, device = p.tokenizer, p.train, p.lm.sft, p.device
    responses = [encode_response(tokenizer, e.reference, p.lm.max_response_len) for e in train.examples]
    rng = random.Random(p.seed)
    disable_dropout(model)

    def batches():
        for _step in range(sft.steps):
            yield [rng.randrange(len(train)) for _ in range(sft.batch_size)]

    def loss_of(idx: list[int]) -> torch.Tensor:
        p_ids, p_mask = left_pad([train.prompt_ids[i] for i in idx], tokenizer.pad_token_id, device)
        r_ids, r_mask = right_pad([responses[i] for i in idx], tokenizer.pad_token_id, device)
        with autocast(device, p.dtype):
            out = response_forward(model, Responses(p_ids, p_mask, r_ids, r_mask))
        return -(out.logp * r_mask).sum() / r_mask.sum().clamp(min=1)

    final, _ = supervised_training(model, batches(), loss_of, sft.lr, sft.steps, sft.warmup, p.bar("SFT"))
    return {"sft_final_loss": final}


@dataclass
class _Preferences:
    """Sampled responses to some prompts of a split (``rows``: each response's example), their gold
    scores and the pairs ``(a, b)`` of one prompt's responses with ``gold[a] > gold[b]``."""

    rows: list[int]
    texts: list[str]
    finished: list[bool]
    gold: list[float]
    pairs: list[tuple[int, int]]


def _preferences(p: PipelineInputs, policy, split: EncodedSplit, n_prompts: int, gen: torch.Generator,
                 rng: random.Random, which: str) -> _Preferences:
    """``lm.rm.samples_per_prompt`` policy samples for each of ``n_prompts`` prompts drawn by ``rng``
    (with ``lm.rm.include_reference``, the reference summary joins each prompt's candidates);
    ``which``: the split's name in the progress bar."""
    rm_cfg = p.lm.rm
    idx = rng.sample(range(len(split)), min(n_prompts, len(split)))
    rows, texts, finished = _sample_texts(policy, p.tokenizer, split, idx,
                                          p.decoding(False, rm_cfg.samples_per_prompt), gen,
                                          p.bar(f"reward-model samples, {which}"))
    golds = [gold_score(t, split.examples[i]) for i, t in zip(rows, texts)]
    k = rm_cfg.samples_per_prompt
    groups = [list(range(g, g + k)) for g in range(0, len(rows), k)]
    if rm_cfg.include_reference:
        for group, i in zip(groups, idx):
            group.append(len(rows))
            rows.append(i)
            texts.append(split.examples[i].reference)
            finished.append(True)
            golds.append(gold_score(split.examples[i].reference, split.examples[i]))
    pairs = [(a, b) for group in groups for a in group for b in group if golds[a] > golds[b]]
    return _Preferences(rows, texts, finished, golds, pairs)


def train_reward_model(rm_source: Path, policy, p: PipelineInputs, out_dir: Path) -> dict:
    """Bradley-Terry on SFT sample pairs ranked by gold; calibrate to gold units on held-out.

    With ``rm.include_reference`` the reference summary joins each prompt's candidates (the
    comparisons of Stiennon et al. 2020 included reference summaries too); the calibration
    always uses SFT samples only, the distribution RL starts from.
    """
    from transformers import AutoModel

    rm_cfg, tokenizer = p.lm.rm, p.tokenizer
    gen = torch.Generator(device=p.device).manual_seed(p.seed + 1)
    rng = random.Random(p.seed + 2)
    tr = _preferences(p, policy, p.train, rm_cfg.prompts, gen, rng, "train")
    ev = _preferences(p, policy, p.held_out, rm_cfg.eval_prompts, gen, rng, "held-out")
    if not tr.pairs:
        raise ValueError("lm.rm: the SFT samples never differ in gold score, so there are no preference "
                         "pairs; raise lm.rm.prompts or lm.rm.samples_per_prompt, or set lm.rm.include_reference=true")
    with quiet_transformers():
        model = PooledRewardModel(load_pretrained(AutoModel, rm_source, "lm.model"))
    disable_dropout(model)
    model.to(p.device)
    scorer = RewardModel(model, tokenizer, p.scoring())
    steps = max(1, rm_cfg.epochs * math.ceil(len(tr.pairs) / rm_cfg.batch_size))
    tr_prompts = [p.train.examples[i].prompt for i in tr.rows]

    def batches():  # every pair once an epoch, shuffled
        for _epoch in range(rm_cfg.epochs):
            order = list(range(len(tr.pairs)))
            rng.shuffle(order)
            for s in range(0, len(order), rm_cfg.batch_size):
                yield [tr.pairs[j] for j in order[s:s + rm_cfg.batch_size]]

    def loss_of(batch: list[tuple[int, int]]) -> torch.Tensor:  # Bradley-Terry: -log sigmoid(r_win - r_lose)
        w = [a for a, _ in batch]
        lo = [b for _, b in batch]
        r = scorer.raw([tr_prompts[i] for i in w + lo], [tr.texts[i] for i in w + lo], [tr.finished[i] for i in w + lo])
        return -torch.nn.functional.logsigmoid(r[:len(w)] - r[len(w):]).mean()

    final_loss, step = supervised_training(model, batches(), loss_of, rm_cfg.lr, steps, max(1, steps // 10),
                                           p.bar("reward model"))
    with torch.no_grad():
        ev_prompts = [p.held_out.examples[i].prompt for i in ev.rows]
        r = torch.cat([scorer.raw(ev_prompts[i:i + 256], ev.texts[i:i + 256], ev.finished[i:i + 256])
                       for i in range(0, len(ev.rows), 256)]).float().cpu()  # the calibration below runs on CPU
    acc = (sum(float(r[a] > r[b]) for a, b in ev.pairs) / len(ev.pairs)) if ev.pairs else float("nan")
    n_samples = len(ev.rows) - (len(set(ev.rows)) if rm_cfg.include_reference else 0)
    calibration = _calibrate(r[:n_samples], torch.tensor(ev.gold[:n_samples]))
    with quiet_transformers():  # its own shard-writing bar, after the stage's bars
        model.save(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"rm_train_pairs": len(tr.pairs), "rm_eval_pairs": len(ev.pairs), "rm_steps": step,
            "rm_final_loss": final_loss, "rm_eval_accuracy": acc, **calibration,
            "sft_sample_gold": sum(tr.gold) / len(tr.gold)}


def _calibrate(r: torch.Tensor, gold: torch.Tensor) -> dict:
    """Least squares ``gold ~ scale * r + shift`` on held-out SFT samples; when that fit is
    degenerate (gold constant, or anti-correlated), z-scores of ``r``."""
    rc, gc = r - r.mean(), gold - gold.mean()
    var_r, var_g = float((rc * rc).mean()), float((gc * gc).mean())
    cov = float((rc * gc).mean())
    corr = cov / math.sqrt(var_r * var_g) if var_r > 0 and var_g > 0 else float("nan")
    if var_r > 0 and var_g > 0 and cov > 0:
        calibration, scale = "least_squares", cov / var_r
        shift = float(gold.mean()) - scale * float(r.mean())
    else:
        calibration = "zscore"
        scale = 1.0 / math.sqrt(var_r) if var_r > 0 else 1.0
        shift = -scale * float(r.mean())
        log.warning("lm: reward model calibration fell back to z-scores (gold variance %.3g, covariance %.3g)",
                    var_g, cov)
    return {"rm_gold_corr": corr, "rm_scale": scale, "rm_shift": shift, "rm_calibration": calibration}


# --------------------------------------------------------------------------- build
def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def build_task(cfg: DictConfig) -> LMTask:
    """Tokenizer, data, SFT policy and reward model for ``cfg.lm`` (cached stages)."""
    lm = cfg.lm
    arith = lm.get("corpus", "summarize") == "arith"
    p, reward_fn, meta = _inputs(lm, resolve_device(cfg.device), arith, bool(cfg.get("progress", False)))
    data_material = _data_material(lm, p.seed, arith)
    # on a CPU the trained weights differ in their last bits with the intra-op thread count (the
    # ``threads`` that harness.train.lm.train sets before this): a stage built on another count is
    # another stage, so what a run loads is what it would build, whatever ran in this cache before
    compute = {"threads": torch.get_num_threads()} if p.device.type == "cpu" else {}
    policy_source, sft_material = _sft_stage(p, data_material, compute, meta)
    reward_model = None
    if lm.reward == "rm":
        reward_model = _rm_stage(p, policy_source, {"sft": sft_material, "rm": _plain(lm.rm),
                                                    "temperature": lm.temperature, **compute}, meta)
    return LMTask(tokenizer=p.tokenizer, train=p.train, held_out=p.held_out, policy_source=policy_source,
                  reward_kind=lm.reward, reward_model=reward_model, max_prompt_len=lm.max_prompt_len,
                  max_response_len=lm.max_response_len, device=p.device, dtype=p.dtype, meta=meta,
                  gold_fn=p.gold_fn, reward_fn=reward_fn, binary=arith)


def _inputs(lm: Any, device: torch.device, arith: bool, progress: bool) -> tuple[PipelineInputs, Callable | None, dict]:
    """The tokenizer and the encoded splits (cheap, deterministic: rebuilt every time, saved with
    the stages), the gold score and ``reward_fn``; and the ``data`` part of the pipeline's meta."""
    seed = int(lm.pipeline_seed)
    cache_dir = cache_path(lm)
    if lm.tokenizer is not None:
        tokenizer = load_tokenizer(str(lm.tokenizer))
    elif lm.model is not None:
        tokenizer = load_tokenizer(str(lm.model), "lm.model")
    else:
        tokenizer = build_word_tokenizer(arith_vocabulary() if arith else vocabulary())
    ensure_special_tokens(tokenizer)
    if arith:
        spec = ArithSpec.from_cfg(lm.arith)
        train_ex, held_ex = make_problems(seed, spec)
        gold_fn = check
        reward_fn = functools.partial(arith_reward, format_reward=spec.format_reward) if spec.format_reward else None
    else:
        train_ex, held_ex = load_examples(lm, seed)
        gold_fn, reward_fn = gold_score, None
    train = encode_split(tokenizer, train_ex, lm.max_prompt_len)
    held_out = encode_split(tokenizer, held_ex, lm.max_prompt_len)
    meta = {"data": {"train": len(train), "held_out": len(held_out),
                     "train_prompts_truncated": sum(train.truncated),
                     "held_out_prompts_truncated": sum(held_out.truncated)}}
    p = PipelineInputs(lm, tokenizer, train, held_out, gold_fn, device, lm.dtype, seed, cache_dir, progress)
    return p, reward_fn, meta


def _data_material(lm: Any, seed: int, arith: bool) -> dict:
    """What the data, tokenizer and model stages depend on (the key of the cached stages)."""
    if arith:  # the format reward and pass@k's k matter to RL only: the SFT stage does not depend on them
        data_material = {"corpus": "arith", "arith": {k: v for k, v in _plain(lm.arith).items()
                                                      if k not in ("format_reward", "pass_k")}}
    else:
        data_material = {"dataset": _source_id(lm.dataset), "columns": _plain(lm.columns),
                         "splits": _plain(lm.splits), "data": _plain(lm.data)}
    data_material.update({
        "tokenizer": _source_id(lm.tokenizer), "model": _source_id(lm.model),
        "arch": _plain(lm.arch) if lm.model is None else None, "seed": seed,
        "max_prompt_len": lm.max_prompt_len, "max_response_len": lm.max_response_len,
    })
    return data_material


def _sft_stage(p: PipelineInputs, data_material: dict, compute: dict, meta: dict) -> tuple[str, dict]:
    """Stage 1, SFT (cached; skipped for a given ``lm.model`` with ``lm.sft.steps=0``):
    ``(the policy's source, the stage's material)``; records ``meta["sft"]``."""
    lm = p.lm
    if lm.model is not None and lm.sft.steps == 0:
        meta["sft"] = {"skipped": True}
        return pretrained_source(lm.model), data_material
    sft_material = {**data_material, "sft": _plain(lm.sft), "dtype": p.dtype if p.device.type == "cuda" else "float32",
                    **compute}
    sft_dir, sft_meta, reused = cached_stage(p.cache_dir, "sft", sft_material, functools.partial(_build_sft, p))
    meta["sft"] = {**{k: v for k, v in sft_meta.items() if k != "material"}, "cached": reused}
    return str(sft_dir), sft_material


def _build_sft(p: PipelineInputs, out: Path) -> dict:
    """Train the SFT policy into ``out`` and score it (greedy and sampled) on held-out prompts."""
    from transformers import AutoModelForCausalLM

    lm, tokenizer = p.lm, p.tokenizer
    torch.manual_seed(p.seed)
    if lm.model is None:
        model = tiny_causal_lm(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id,
                               lm.max_prompt_len + lm.max_response_len,
                               TinyArch(lm.arch.n_layer, lm.arch.n_embd, lm.arch.n_head), p.seed)
    else:
        with quiet_transformers():
            model = load_pretrained(AutoModelForCausalLM, lm.model, "lm.model")
        if len(tokenizer) > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.to(p.device)
    stats = train_sft(model, p)
    n_eval = min(len(p.held_out), lm.sft.eval_prompts)
    stats["sft_gold_greedy"] = evaluate_gold(model, tokenizer, p.held_out, n_eval, p.decoding(True), p.seed, p.gold_fn)
    stats["sft_gold_sampled"] = evaluate_gold(model, tokenizer, p.held_out, n_eval, p.decoding(False), p.seed,
                                              p.gold_fn)
    stats["reference_gold"] = sum(p.gold_fn(e.reference, e) for e in p.held_out.examples[:n_eval]) / max(n_eval, 1)
    with quiet_transformers():  # its own shard-writing bar, between the stage's bars
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return stats


def _rm_stage(p: PipelineInputs, policy_source: str, rm_material: dict, meta: dict) -> RewardModel:
    """Stage 2, the reward model: ``lm.reward_model`` as given, else trained on the SFT policy's
    samples (cached); records ``meta["rm"]``."""
    lm = p.lm
    if lm.reward_model is not None:
        meta["rm"] = {"source": str(lm.reward_model)}
        return RewardModel.load(str(lm.reward_model), p.scoring())

    def build_rm(out: Path) -> dict:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(p.seed)
        with quiet_transformers():
            policy = load_pretrained(AutoModelForCausalLM, policy_source, "lm.model").to(p.device).eval()
        return train_reward_model(Path(policy_source), policy, p, out)

    rm_dir, rm_meta, reused = cached_stage(p.cache_dir, "rm", rm_material, build_rm)
    meta["rm"] = {**{k: v for k, v in rm_meta.items() if k != "material"}, "cached": reused}
    return RewardModel.load(rm_dir, p.scoring(rm_meta["rm_scale"], rm_meta["rm_shift"]), tokenizer=p.tokenizer,
                            field_name="lm.cache_dir")
