"""``validate_lm(cfg)``: every check on the ``lm`` node that can fail before any work starts."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .data import LOCAL_SUFFIXES

REWARDS = ("rm", "gold")
CRITICS = ("head", "model")
DTYPES = ("auto", "float32", "bfloat16")
KL_TARGETS = ("ref", "old")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


def _bad(field_name: str, allowed: str, value: Any) -> None:
    raise ValueError(f"{field_name} must be {allowed}, got {value!r}")


def looks_like_hub_id(value: str) -> bool:
    return bool(_HUB_ID.match(value)) and ".." not in value


def check_source(field_name: str, value: Any, kind: str) -> None:
    """A local path must exist and hold what ``kind`` needs; anything else must be a hub id
    that transformers can resolve (this may contact the hub, which only happens when a user
    names a hub model)."""
    if value is None:
        return
    text = str(value)
    p = Path(text).expanduser()
    if p.exists():
        if kind in ("model", "reward_model") and not (p / "config.json").is_file():
            raise ValueError(f"{field_name}: {text!r} has no config.json, so it is not a saved transformers model")
        if kind == "tokenizer" and p.is_dir() and not any(
                (p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")):
            raise ValueError(f"{field_name}: {text!r} holds no tokenizer files (tokenizer.json, tokenizer_config.json)")
        if kind == "dataset" and p.is_file() and p.suffix not in LOCAL_SUFFIXES:
            raise ValueError(f"{field_name}: local file {text!r} must end in one of {list(LOCAL_SUFFIXES)}")
        return
    if text.startswith((".", "/", "~")) or os.sep + os.sep in text or not looks_like_hub_id(text):
        raise ValueError(f"{field_name}: no such file or folder {text!r} (and it is not a hub id)")
    if kind == "dataset":
        try:
            import datasets  # noqa: F401
        except ImportError:
            raise ValueError(f"{field_name}: {text!r} is not a local .json/.jsonl file and loading a hub dataset "
                             "needs the optional package `datasets` (pip install datasets)") from None
        return
    if kind in ("model", "reward_model"):
        try:
            from transformers import AutoConfig

            AutoConfig.from_pretrained(text, trust_remote_code=False)
        except Exception as exc:
            raise ValueError(f"{field_name}: {text!r} is neither a local folder nor a model on the hub "
                             f"that could be reached ({type(exc).__name__}: {exc})") from None


def validate_lm(cfg: Any) -> None:
    """Raise ``ValueError`` naming the first invalid ``lm.*`` (or LM-relevant) field."""
    lm = cfg.get("lm")
    if lm is None:
        _bad("lm", "the LM task's settings (use task=lm_summarize)", None)
    if lm.reward not in REWARDS:
        _bad("lm.reward", f"one of {list(REWARDS)}", lm.reward)
    if lm.critic not in CRITICS:
        _bad("lm.critic", f"one of {list(CRITICS)}", lm.critic)
    if lm.dtype not in DTYPES:
        _bad("lm.dtype", f"one of {list(DTYPES)}", lm.dtype)
    for key in ("max_prompt_len", "max_response_len", "prompts_per_iter", "eval_prompts", "eval_samples"):
        if int(lm[key]) < 1:
            _bad(f"lm.{key}", "an integer >= 1", lm[key])
    if not lm.temperature > 0:
        _bad("lm.temperature", "> 0", lm.temperature)
    if lm.no_eos_penalty < 0:
        _bad("lm.no_eos_penalty", ">= 0", lm.no_eos_penalty)
    d = lm.data
    if d.train_size < 1:
        _bad("lm.data.train_size", "an integer >= 1", d.train_size)
    if d.eval_size < 1:
        _bad("lm.data.eval_size", "an integer >= 1", d.eval_size)
    if not 1 <= d.min_facts <= d.max_facts:
        _bad("lm.data.min_facts/max_facts", "1 <= min_facts <= max_facts", (d.min_facts, d.max_facts))
    if not 0 <= d.min_distractors <= d.max_distractors:
        _bad("lm.data.min_distractors/max_distractors", "0 <= min <= max", (d.min_distractors, d.max_distractors))
    if d.max_facts > 12:
        _bad("lm.data.max_facts", "<= 12 (one fact per name)", d.max_facts)
    a = lm.arch
    if a.n_layer < 1 or a.n_head < 1 or a.n_embd < 1 or a.n_embd % a.n_head:
        _bad("lm.arch", "positive n_layer, n_head, n_embd with n_embd divisible by n_head", dict(a))
    if lm.sft.steps < 0:
        _bad("lm.sft.steps", ">= 0", lm.sft.steps)
    if lm.model is None and lm.sft.steps < 1:
        _bad("lm.sft.steps", ">= 1 for the embedded model (it starts untrained)", lm.sft.steps)
    for key in ("batch_size", "eval_prompts"):
        if lm.sft[key] < 1:
            _bad(f"lm.sft.{key}", "an integer >= 1", lm.sft[key])
    if lm.sft.warmup < 0:
        _bad("lm.sft.warmup", ">= 0", lm.sft.warmup)
    if lm.reward == "rm" and lm.reward_model is None:
        for key in ("prompts", "eval_prompts", "epochs", "batch_size"):
            if lm.rm[key] < 1:
                _bad(f"lm.rm.{key}", "an integer >= 1", lm.rm[key])
        if lm.rm.samples_per_prompt < 2:
            _bad("lm.rm.samples_per_prompt", ">= 2 (pairs are formed within a prompt)", lm.rm.samples_per_prompt)
    if cfg.kl.target not in KL_TARGETS:
        _bad("kl.target", f"one of {list(KL_TARGETS)} for the LM task", cfg.kl.target)
    if cfg.kl.in_reward and cfg.kl.target != "ref":
        _bad("kl.target", "'ref' with kl.in_reward=true (the penalty is to the frozen SFT policy)", cfg.kl.target)
    b = cfg.budget
    if b.tokens is None and b.iterations is None:
        _bad("budget.tokens", "set (or budget.iterations)", None)
    if b.tokens is not None and b.tokens < 1:
        _bad("budget.tokens", ">= 1 or null", b.tokens)
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            _bad("device", "'cpu' or 'auto' here: CUDA is not available", cfg.device)
    check_source("lm.model", lm.model, "model")
    check_source("lm.tokenizer", lm.tokenizer, "tokenizer")
    check_source("lm.reward_model", lm.reward_model, "reward_model")
    check_source("lm.dataset", lm.dataset, "dataset")
    if lm.model is not None and Path(str(lm.model)).expanduser().is_dir():
        _check_context(lm, Path(str(lm.model)).expanduser())


def _check_context(lm: Any, path: Path) -> None:
    from transformers import AutoConfig

    from ...models.lm import context_length

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:
        raise ValueError(f"lm.model: cannot read the config of {str(path)!r}: {exc}") from None
    n = context_length(config)
    if n is not None and lm.max_prompt_len + lm.max_response_len > n:
        _bad("lm.max_prompt_len + lm.max_response_len", f"<= the model's context length {n}",
             lm.max_prompt_len + lm.max_response_len)
