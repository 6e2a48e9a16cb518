"""``validate_lm(cfg)``: every check on the ``lm`` node that can fail before any work starts.

Every refusal is a ``ValueError`` whose message is one line naming the field. Code from a model
or tokenizer folder is never run: every transformers load passes ``trust_remote_code=False``, and
a folder whose ``config.json`` / ``tokenizer_config.json`` names custom code (``auto_map``) or a
``model_type`` this transformers does not know is refused here, by reading those files as JSON.
A local ``.json``/``.jsonl`` dataset is read here too, so a bad row is refused before any run
directory exists (with the file and the line). So is every local model or tokenizer folder the run
would read: the tokenizer is loaded as the run loads it (:func:`check_tokenizer_loads`),
and the safetensors weights' headers are compared with the model ``config.json`` describes, built
on the meta device (:func:`check_weights`); nothing of the weights is read but their headers. The
embedded model's sizes are bounded by the machine's memory (:func:`check_embedded_memory`).
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from ...config import PARAM_BYTES, bad_field, check_choice, check_fits
from .data import LOCAL_SUFFIXES, load_examples

REWARDS = ("rm", "gold")
CORPORA = ("summarize", "arith")
ARITH_OPERATORS = "+-"
ARITH_DIGITS_MAX = 18  # operands stay exact in a 64-bit integer
ARITH_OPS_MAX = 32
CRITICS = ("head", "model")
DTYPES = ("auto", "float32", "bfloat16")
KL_TARGETS = ("ref", "old")
EXAMPLE_BYTES = 200  # at least, a generated example in memory (tests/test_fuzz_sizes.py measures the smallest)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


_bad = bad_field  # every refusal here is harness.config's one line


def one_line(text: Any, limit: int = 400) -> str:
    """``text`` with its whitespace (newlines included) collapsed, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def looks_like_hub_id(value: str) -> bool:
    return bool(_HUB_ID.match(value)) and ".." not in value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(field_name: str, value: Any, lowest: int, why: str = "") -> None:
    """``value`` must be an integer (not a bool, not a float) ``>= lowest``."""
    if not _is_int(value) or value < lowest:
        _bad(field_name, f"an integer >= {lowest}{why}", value)


def check_number(field_name: str, value: Any, lowest: float, strict: bool) -> None:
    """``value`` must be a finite number ``> lowest`` (``strict``) or ``>= lowest``."""
    if not _is_number(value) or value < lowest or (strict and value == lowest):
        _bad(field_name, f"a finite number {'>' if strict else '>='} {lowest:g}", value)


def _check_text(field_name: str, value: Any, allowed: str, nullable: bool) -> None:
    if value is None and nullable:
        return
    if value is None or isinstance(value, (bool, DictConfig, ListConfig, dict, list)) or not str(value).strip():
        _bad(field_name, allowed, value)


def read_json_object(field_name: str, path: Path) -> dict:
    """The JSON object in ``path``, or a one-line ``ValueError`` naming ``field_name`` and the file."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{field_name}: {str(path)!r} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{field_name}: {str(path)!r} line {exc.lineno}: not valid JSON ({exc.msg})") from None
    except OSError as exc:
        raise ValueError(f"{field_name}: cannot read {str(path)!r} ({one_line(exc)})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{field_name}: {str(path)!r} must hold a JSON object, not a {type(data).__name__}")
    return data


def _refuse_custom_code(field_name: str, where: str, auto_map: Any) -> None:
    if auto_map:
        names = sorted(auto_map) if isinstance(auto_map, dict) else auto_map
        raise ValueError(f"{field_name}: {where} names custom code (auto_map: {one_line(names, 120)}); code from "
                         "a model folder is never run (trust_remote_code=False): use a model whose model_type "
                         "transformers knows, without auto_map")


def _known_model_types():
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING


WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"


def check_model_folder(field_name: str, path: Path, kind: str = "model") -> None:
    """A local model folder, checked fully without loading its weights: ``config.json`` is a JSON
    object with a ``model_type`` transformers knows and no ``auto_map`` (custom code), read with
    ``json`` (nothing of the folder is run); transformers builds the model it describes (on the
    meta device: no memory); and the safetensors weights hold every tensor of that model with
    its shape (:func:`check_weights`)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{field_name}: {str(path)!r} has no config.json, so it is not a saved transformers model")
    config = read_json_object(field_name, config_file)
    _refuse_custom_code(field_name, repr(str(config_file)), config.get("auto_map"))
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in _known_model_types():
        import transformers

        raise ValueError(f"{field_name}: {str(config_file)!r} has model_type {model_type!r}, which transformers "
                         f"{transformers.__version__} does not know (code from a model folder is never run: "
                         "trust_remote_code=False)")
    check_tokenizer_folder(field_name, path)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:
        raise ValueError(f"{field_name}: cannot read the config of {str(path)!r}: {one_line(exc)}") from None
    check_weights(field_name, path, config, kind)


def saved_shapes(field_name: str, path: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the folder's safetensors weights (``model.safetensors``,
    or the shards ``model.safetensors.index.json`` names), read from the files' headers;
    safetensors refuses a file its header does not exactly cover (a truncated one)."""
    if (path / WEIGHTS).is_file():
        files = [path / WEIGHTS]
    elif (path / WEIGHTS_INDEX).is_file():
        index = path / WEIGHTS_INDEX
        weight_map = read_json_object(field_name, index).get("weight_map")
        if (not isinstance(weight_map, dict) or not weight_map
                or not all(isinstance(v, str) and v and Path(v).name == v for v in weight_map.values())):
            raise ValueError(f"{field_name}: {str(index)!r} must hold a non-empty weight_map of tensor names to "
                             "shard file names in the same folder")
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        raise ValueError(f"{field_name}: {str(path)!r} has no {WEIGHTS} (nor {WEIGHTS_INDEX}); the weights are read "
                         "from safetensors only (a pickled pytorch_model.bin is never loaded)")
    return safetensors_shapes(field_name, files)


def safetensors_shapes(field_name: str, files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in ``files``, from their headers (no tensor is read)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        except Exception as exc:
            raise ValueError(f"{field_name}: {str(file)!r} is not a complete safetensors file "
                             f"({type(exc).__name__}: {one_line(exc, 200)})") from None
    return shapes


def _pooled_head(path: Path, kind: str) -> Path | None:
    """A reward model folder's :class:`~harness.models.lm.PooledRewardModel` head file, if it has one."""
    from ...models.lm import PooledRewardModel

    head = path / PooledRewardModel.HEAD_FILE
    return head if kind == "reward_model" and head.is_file() else None


def _model_class(path: Path, kind: str):
    """The transformers Auto class the run loads a ``kind`` folder with (:mod:`.pipeline`)."""
    import transformers

    if kind == "reward_model":
        pooled = _pooled_head(path, kind) is not None
        return transformers.AutoModel if pooled else transformers.AutoModelForSequenceClassification
    return transformers.AutoModelForCausalLM


def check_weights(field_name: str, path: Path, config: Any, kind: str) -> None:
    """The folder's safetensors hold every tensor of the model its config describes, with the
    config's shape (a tensor absent would be silently re-initialised at random; a shape off, a
    failed load mid-run). The model is built on the meta device (shapes, no memory); tied tensors
    count once; a base model's weights under a head model (or the reverse) match by
    ``base_model_prefix``, as transformers loads them. Tensors the model does not have are
    ignored, as transformers ignores them."""
    import torch

    auto_cls = _model_class(path, kind)
    try:
        with torch.device("meta"):
            model = auto_cls.from_config(config, trust_remote_code=False)
    except Exception as exc:
        raise ValueError(f"{field_name}: transformers cannot build a {auto_cls.__name__} from the config.json of "
                         f"{str(path)!r} ({type(exc).__name__}: {one_line(exc, 200)})") from None
    saved = saved_shapes(field_name, path)
    state = model.state_dict(keep_vars=True)
    prefix = getattr(model, "base_model_prefix", "") or ""
    dot = prefix + "."
    expects_prefix = bool(prefix) and any(k.startswith(dot) for k in state)
    has_prefix = bool(prefix) and any(k.startswith(dot) for k in saved)
    if has_prefix and not expects_prefix:  # a head model's weights, loaded as its base model
        saved = {k[len(dot):]: v for k, v in saved.items() if k.startswith(dot)}
    strip = expects_prefix and not has_prefix  # a base model's weights, loaded under a head

    def saved_name(name: str) -> str:
        return name[len(dot):] if strip and name.startswith(dot) else name

    groups: dict[int, list[str]] = {}  # tied tensors: one group, present if any of its names is
    for name, tensor in state.items():
        groups.setdefault(id(tensor), []).append(name)
    missing = []
    for names in groups.values():
        expected = tuple(state[names[0]].shape)
        found = [n for n in names if saved_name(n) in saved]
        if not found:
            missing.append(names[0])
        for n in found:
            if saved[saved_name(n)] != expected:
                raise ValueError(f"{field_name}: the weights in {str(path)!r} do not match its config.json: tensor "
                                 f"{saved_name(n)!r} has shape {list(saved[saved_name(n)])} in the weights, "
                                 f"{list(expected)} by the config")
    if missing:
        raise ValueError(f"{field_name}: the weights in {str(path)!r} do not match its config.json: {len(missing)} "
                         f"of the {len(groups)} tensors of the {type(model).__name__} it describes are not in them "
                         f"(first: {saved_name(missing[0])!r})")
    head_file = _pooled_head(path, kind)
    if head_file is not None:
        head = safetensors_shapes(field_name, [head_file])
        hidden = int(config.hidden_size)
        want = {"w_e": (hidden,), "w_h": (hidden,), "bias": ()}
        if {k: head.get(k) for k in want} != want:
            raise ValueError(f"{field_name}: {str(head_file)!r} must hold w_e and w_h of shape [{hidden}] and a "
                             f"scalar bias, got {one_line({k: list(v) for k, v in sorted(head.items())}, 200)}")


def check_tokenizer_folder(field_name: str, path: Path) -> None:
    """A local tokenizer folder's ``tokenizer_config.json`` (when there is one) names no custom code."""
    config_file = path / "tokenizer_config.json"
    if config_file.is_file():
        config = read_json_object(field_name, config_file)
        _refuse_custom_code(field_name, repr(str(config_file)), config.get("auto_map"))


def check_tokenizer_loads(field_name: str, path: Path) -> None:
    """The tokenizer the run will use, loaded now from the local ``path`` as the run loads it
    (:func:`.tokenizer.load_tokenizer`: ``AutoTokenizer``, ``trust_remote_code=False``, after
    :func:`check_tokenizer_folder` refused custom code), with the EOS token generation needs: a
    truncated ``tokenizer.json`` or a folder with only ``tokenizer_config.json`` is refused here,
    in one line naming ``field_name``, not when the run reaches it."""
    from .tokenizer import ensure_special_tokens, load_tokenizer

    if path.is_dir():
        check_tokenizer_folder(field_name, path)
    ensure_special_tokens(load_tokenizer(str(path), field_name), f"{field_name}: {str(path)!r}")


def check_source(field_name: str, value: Any, kind: str) -> None:
    """A local path must exist and hold what ``kind`` needs; anything else must be a hub id
    that transformers can resolve (this may contact the hub, which only happens when a user
    names a hub model)."""
    if value is None:
        return
    _check_text(field_name, value, "a local path or a hub id (null: the embedded one)", nullable=True)
    text = str(value)
    p = Path(text).expanduser()
    if p.exists():
        if kind in ("model", "reward_model"):
            if not p.is_dir():
                raise ValueError(f"{field_name}: {text!r} is a file; a saved transformers model is a folder")
            check_model_folder(field_name, p, kind)
        if kind == "tokenizer":
            if not p.is_dir():
                raise ValueError(f"{field_name}: {text!r} is a file; a saved tokenizer is a folder (tokenizer.json, "
                                 "tokenizer_config.json)")
            if not any((p / f).is_file() for f in TOKENIZER_FILES):
                raise ValueError(f"{field_name}: {text!r} holds no tokenizer files (tokenizer.json, "
                                 "tokenizer_config.json)")
            check_tokenizer_loads(field_name, p)
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

            config = AutoConfig.from_pretrained(text, trust_remote_code=False)
        except Exception as exc:
            raise ValueError(f"{field_name}: {text!r} is neither a local folder nor a model on the hub "
                             f"that could be reached ({type(exc).__name__}: {one_line(exc)})") from None
        _refuse_custom_code(field_name, f"the config of {text!r}", getattr(config, "auto_map", None))


def validate_lm(cfg: Any) -> None:
    """Raise ``ValueError`` naming the first invalid ``lm.*`` (or LM-relevant) field."""
    lm = cfg.get("lm")
    if lm is None:
        _bad("lm", "the LM task's settings (use task=lm_summarize or task=lm_arith)", None)
    corpus = lm.get("corpus", "summarize")
    check_choice("lm.corpus", corpus, CORPORA)
    for key, choices in (("reward", REWARDS), ("critic", CRITICS), ("dtype", DTYPES)):
        check_choice(f"lm.{key}", lm[key], choices)
    for key in ("max_prompt_len", "max_response_len", "prompts_per_iter", "eval_prompts", "eval_samples"):
        check_int(f"lm.{key}", lm[key], 1)
    check_number("lm.temperature", lm.temperature, 0, strict=True)
    check_number("lm.no_eos_penalty", lm.no_eos_penalty, 0, strict=False)
    check_int("lm.pipeline_seed", lm.pipeline_seed, 0)
    check_int("lm.kl_ref_every", lm.get("kl_ref_every", 1), 0)
    _check_text("lm.cache_dir", lm.cache_dir, "a non-empty path (a leading ~ is the home folder)", nullable=False)
    cache = Path(os.path.expanduser(str(lm.cache_dir)))
    if cache.exists() and not cache.is_dir():
        raise ValueError(f"lm.cache_dir: {str(lm.cache_dir)!r} is a file; it must be a folder (or not exist yet)")
    if corpus == "arith":
        _validate_arith(cfg, lm)
    else:
        _validate_summarize(lm)
    if corpus == "arith" or lm.dataset is None:  # a generated corpus: every example held at once
        node = "arith" if corpus == "arith" else "data"
        sizes = {f"lm.{node}.train_size": (int(lm[node].train_size), 1),
                 f"lm.{node}.eval_size": (int(lm[node].eval_size), 1)}
        check_fits(sizes, lambda v: EXAMPLE_BYTES * sum(v.values()),
                   f"the generated corpus (at least {EXAMPLE_BYTES} bytes an example: the object, its prompt and "
                   "its reference)")
    a = lm.arch
    for key in ("n_layer", "n_head", "n_embd"):
        check_int(f"lm.arch.{key}", a[key], 1)
    if a.n_embd % a.n_head:
        _bad("lm.arch", "positive n_layer, n_head, n_embd with n_embd divisible by n_head", dict(a))
    if lm.model is None:
        check_embedded_memory(cfg, lm)
    check_int("lm.sft.steps", lm.sft.steps, 0)
    if lm.model is None and lm.sft.steps < 1:
        _bad("lm.sft.steps", ">= 1 for the embedded model (it starts untrained)", lm.sft.steps)
    for key in ("batch_size", "eval_prompts"):
        check_int(f"lm.sft.{key}", lm.sft[key], 1)
    check_int("lm.sft.warmup", lm.sft.warmup, 0)
    check_number("lm.sft.lr", lm.sft.lr, 0, strict=True)
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
    model_dir = Path(str(lm.model)).expanduser() if lm.model is not None else None
    if model_dir is not None and model_dir.is_dir():
        if lm.tokenizer is None and not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
            raise ValueError(f"lm.model: {str(lm.model)!r} holds no tokenizer files (tokenizer.json, "
                             "tokenizer_config.json); save one there or set lm.tokenizer")
        if lm.tokenizer is None:  # the policy reads texts with the model folder's own tokenizer
            check_tokenizer_loads("lm.model", model_dir)
        _check_context(lm, model_dir)
    rm_dir = Path(str(lm.reward_model)).expanduser() if lm.reward_model is not None else None
    if rm_dir is not None and rm_dir.is_dir():  # a given reward model reads texts with its own tokenizer
        check_tokenizer_loads("lm.reward_model", rm_dir)
    if corpus == "arith":
        from .arith import ArithSpec, make_problems

        make_problems(int(lm.pipeline_seed), ArithSpec.from_cfg(lm.arith))  # a space too small for the sizes
    elif lm.dataset is not None and Path(str(lm.dataset)).expanduser().is_file():
        load_examples(lm, int(lm.pipeline_seed))  # every row checked now, naming the file and the line


def check_embedded_memory(cfg: Any, lm: Any) -> None:
    """The embedded GPT-2 (``lm.model=null``) and one iteration's activations fit in this machine
    (:func:`harness.config.memory_bytes`), or the size at fault is refused by name with the
    largest value that fits (:func:`harness.config.check_fits`). A lower estimate: the trained
    weights (:data:`PARAM_BYTES` each: ``12 n_embd^2`` a layer, and the position table of
    ``lm.max_prompt_len + lm.max_response_len`` rows of ``n_embd``) and the float32 hidden states
    every layer keeps for the backward pass, for the ``lm.prompts_per_iter x group_size``
    sequences of an iteration."""
    a = lm.arch
    sizes = {"lm.max_prompt_len": (int(lm.max_prompt_len), 1), "lm.max_response_len": (int(lm.max_response_len), 1),
             "lm.arch.n_embd": (int(a.n_embd), int(a.n_head)), "lm.arch.n_layer": (int(a.n_layer), 1),
             "lm.prompts_per_iter": (int(lm.prompts_per_iter), 1), "group_size": (int(cfg.group_size), 1)}

    def need(v: dict) -> int:
        d, layers = v["lm.arch.n_embd"], v["lm.arch.n_layer"]
        tokens = v["lm.max_prompt_len"] + v["lm.max_response_len"]
        weights = PARAM_BYTES * (layers * 12 * d * d + tokens * d)
        return weights + 4 * v["lm.prompts_per_iter"] * v["group_size"] * tokens * d * layers

    check_fits(sizes, need, "the embedded model's weights and an iteration's hidden states")


def _validate_arith(cfg: Any, lm: Any) -> None:
    """``lm.corpus=arith`` (task=lm_arith): the generator's knobs, and the settings it has no use for."""
    if lm.reward != "gold":
        _bad("lm.reward", "'gold' for lm.corpus=arith (the reward is the exact checker; there is no reward model)",
             lm.reward)
    for key in ("dataset", "reward_model"):
        if lm.get(key) is not None:
            _bad(f"lm.{key}", "null for lm.corpus=arith (the problems are generated, the checker scores them)",
                 lm.get(key))
    ar = lm.get("arith")
    if not isinstance(ar, DictConfig):
        _bad("lm.arith", "the arithmetic generator's settings (use task=lm_arith)", ar)
    check_int("lm.arith.train_size", ar.train_size, 1)
    check_int("lm.arith.eval_size", ar.eval_size, 1)
    check_int("lm.arith.min_digits", ar.min_digits, 1)
    if not _is_int(ar.max_digits) or not ar.min_digits <= ar.max_digits <= ARITH_DIGITS_MAX:
        _bad("lm.arith.max_digits", f"an integer in [lm.arith.min_digits={ar.min_digits}, {ARITH_DIGITS_MAX}]",
             ar.max_digits)
    check_int("lm.arith.min_ops", ar.min_ops, 1)
    if not _is_int(ar.max_ops) or not ar.min_ops <= ar.max_ops <= ARITH_OPS_MAX:
        _bad("lm.arith.max_ops", f"an integer in [lm.arith.min_ops={ar.min_ops}, {ARITH_OPS_MAX}]", ar.max_ops)
    ops = ar.operators
    if not isinstance(ops, str) or not ops or any(c not in ARITH_OPERATORS for c in ops) or len(set(ops)) != len(ops):
        _bad("lm.arith.operators", f"a non-empty string of distinct characters from {ARITH_OPERATORS!r} "
             "('+', '-' or '+-')", ops)
    if not _is_number(ar.worked_frac) or not 0 <= ar.worked_frac <= 1:
        _bad("lm.arith.worked_frac", "a number in [0, 1] (the share of SFT solutions that show their working)",
             ar.worked_frac)
    check_number("lm.arith.format_reward", ar.format_reward, 0, strict=False)
    if not _is_int(ar.pass_k) or not 1 <= ar.pass_k <= lm.eval_samples:
        _bad("lm.arith.pass_k", f"an integer in [1, lm.eval_samples={lm.eval_samples}] (pass@k from "
             "lm.eval_samples sampled answers per held-out prompt)", ar.pass_k)
    if lm.model is None and lm.tokenizer is None:  # the embedded tokenizer: one word per character
        longest = (ar.max_ops + 1) * ar.max_digits + ar.max_ops + 1
        if lm.max_prompt_len < longest:
            _bad("lm.max_prompt_len", f">= {longest}, the longest prompt lm.arith allows (a cut prompt loses "
                 "its first operand)", lm.max_prompt_len)


def _validate_summarize(lm: Any) -> None:
    """``lm.corpus=summarize`` (task=lm_summarize): dataset columns, corpus sizes, reward model."""
    for key in ("prompt", "summary"):
        _check_text(f"lm.columns.{key}", lm.columns[key], "a non-empty column name", nullable=False)
    _check_text("lm.splits.train", lm.splits.train, "a non-empty split name", nullable=False)
    _check_text("lm.splits.eval", lm.splits.eval, "a split name, or null (hold out the tail of train)", nullable=True)
    d = lm.data
    check_int("lm.data.train_size", d.train_size, 1)
    check_int("lm.data.eval_size", d.eval_size, 1)
    for key in ("min_facts", "max_facts", "min_distractors", "max_distractors"):
        check_int(f"lm.data.{key}", d[key], 0)
    if not 1 <= d.min_facts <= d.max_facts:
        _bad("lm.data.min_facts/max_facts", "1 <= min_facts <= max_facts", (d.min_facts, d.max_facts))
    if not 0 <= d.min_distractors <= d.max_distractors:
        _bad("lm.data.min_distractors/max_distractors", "0 <= min <= max", (d.min_distractors, d.max_distractors))
    if d.max_facts > 12:
        _bad("lm.data.max_facts", "<= 12 (one fact per name)", d.max_facts)
    # lm.rm.* only matter when a reward model is trained, but a value no run could use is refused anyway
    for key in ("prompts", "eval_prompts", "epochs", "batch_size"):
        check_int(f"lm.rm.{key}", lm.rm[key], 1)
    check_int("lm.rm.samples_per_prompt", lm.rm.samples_per_prompt, 2, " (pairs are formed within a prompt)")
    check_number("lm.rm.lr", lm.rm.lr, 0, strict=True)
    if not isinstance(lm.rm.include_reference, bool):
        _bad("lm.rm.include_reference", "true or false", lm.rm.include_reference)


def _check_context(lm: Any, path: Path) -> None:
    from transformers import AutoConfig

    from ...models.lm import context_length

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:
        raise ValueError(f"lm.model: cannot read the config of {str(path)!r}: {one_line(exc)}") from None
    n = context_length(config)
    if n is not None and lm.max_prompt_len + lm.max_response_len > n:
        _bad("lm.max_prompt_len + lm.max_response_len", f"<= the model's context length {n}",
             lm.max_prompt_len + lm.max_response_len)
