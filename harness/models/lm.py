"""Language-model policies, value functions and decoding, for any transformers causal LM.

Layout of a batch (docs/design.md, tensor conventions, ``[B, L]`` with a response mask):

* prompts are **left**-padded to ``[B, P]`` (``prompt_mask``), so every response starts at
  column ``P``;
* responses are **right**-padded to ``[B, L]`` (``response_mask``: 1 up to and including EOS).

Position ids are ``cumsum(mask) - 1``, so a left-padded prompt gets the same positions as the
unpadded one. The policy's distribution over response token ``t`` comes from the logits at
column ``P - 1 + t``; :func:`response_forward` returns, from **one teacher-forced forward
pass**, ``log pi(y_t | x, y_<t)`` and the entropy for every ``t`` at once (claim C12: equal to
the log-probabilities recorded during sequential decoding, tested). The value of the state
before token ``t``, ``V(s_t)``, is read from the hidden state at the same column.

Rows that share a prompt (a group: ``group_size`` samples of one prompt, group-major) have the
same prompt keys and values, so each distinct prompt is run through the model once and its KV
cache is gathered to every row that uses it (:func:`_shared_prompt_cache`): in decoding
(:func:`generate` with ``samples``, and ReMax's greedy response in the same batch) and in the
teacher-forced pass (:func:`response_forward` with ``share_prompts``), where the gathered cache
keeps its autograd graph, so the prompt's gradient is the sum over the rows, as in one pass over
every row. Both are tested equal to the per-row computation (tokens exactly, log-probabilities
and gradients to float rounding).
"""
from __future__ import annotations

import functools
import inspect
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


# --------------------------------------------------------------------------- construction
def pretrained_source(source) -> str:
    """What ``from_pretrained`` gets for a model/tokenizer setting: an existing local path with
    ``~`` expanded (transformers would read ``~/m`` as a hub id), anything else as written."""
    local = Path(os.path.expanduser(str(source)))
    return str(local) if local.exists() else str(source)


def load_pretrained(auto_cls, source, field_name: str = "lm.model", **kwargs):
    """``auto_cls.from_pretrained(source)`` that never runs code from the folder or hub repo
    (``trust_remote_code=False``) and fails with one line naming ``field_name``."""
    try:
        return auto_cls.from_pretrained(pretrained_source(source), trust_remote_code=False, **kwargs)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:400]
        raise ValueError(f"{field_name}: cannot load {auto_cls.__name__} from {str(source)!r}: "
                         f"{type(exc).__name__}: {reason}") from None


@dataclass(frozen=True)
class TinyArch:
    """A small GPT-2's shape (``lm.arch``): ``n_layer`` blocks of width ``n_embd`` with ``n_head``
    attention heads."""

    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4


def tiny_causal_lm(vocab_size: int, pad_token_id: int, eos_token_id: int, n_positions: int,
                   arch: TinyArch = TinyArch(), seed: int = 0):
    """A small GPT-2 of shape ``arch`` (no dropout: RL needs the sampling and the training forward
    to agree), its weights drawn from ``seed``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size, n_positions=n_positions, n_embd=arch.n_embd, n_layer=arch.n_layer, n_head=arch.n_head,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=eos_token_id,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config)


def context_length(config) -> int | None:
    for key in ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def disable_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


# GPT-2's tanh-approximate GELU (``gelu_new``; Hendrycks & Gimpel 2016, eq. in section 2):
# 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Since 0.5 (1 + tanh(u)) = sigmoid(2 u),
# it is x sigmoid(v) with v = x (K1 + K2 x^2), K1 = 2 sqrt(2/pi), K2 = 0.044715 K1.
_GELU_K1 = 2 * math.sqrt(2 / math.pi)
_GELU_K2 = 0.044715 * _GELU_K1


@functools.cache
def _gelu_k1(dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(_GELU_K1, dtype=dtype)


def _gelu_gate(x: torch.Tensor) -> torch.Tensor:
    """``sigmoid(v)``, ``v = x (K1 + K2 x^2)``: three kernels (``addcmul``, ``mul_``, ``sigmoid_``)."""
    return torch.addcmul(_gelu_k1(x.dtype), x, x, value=_GELU_K2).mul_(x).sigmoid_()


class _SigmoidGELUFunction(torch.autograd.Function):
    """``x sigmoid(v(x))`` with its derivative written out: ``s + x s (1 - s) v'(x)``, ``s = sigmoid(v)``,
    ``v'(x) = K1 + 3 K2 x^2`` (six elementwise kernels backward, against autograd's chain of the
    forward's)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        s = _gelu_gate(x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        x, s = ctx.saved_tensors
        slope = torch.addcmul(_gelu_k1(x.dtype), x, x, value=3 * _GELU_K2).mul_(x)  # x v'(x)
        return slope.mul_(torch.addcmul(s, s, s, value=-1)).add_(s).mul_(grad)  # (x v' s (1 - s) + s) grad


class SigmoidGELU(nn.Module):
    """GPT-2's tanh-approximate GELU, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, computed on
    a CPU in float32 or float64 as ``x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`` (the same function:
    ``0.5 (1 + tanh(u)) = sigmoid(2u)``), with its derivative written out (:class:`_SigmoidGELUFunction`);
    elsewhere (a GPU, half precision) as PyTorch's fused kernel ``F.gelu(approximate="tanh")``.

    Why: that fused kernel's ``tanh`` is slow on a CPU without AVX-512 (PyTorch 2.13's AVX2 build:
    ``torch.tanh`` 3.4x ``torch.sigmoid`` on the same tensor); here the forward of a tiny GPT-2's MLP
    activation ``[343, 512]`` takes 247 us against the fused kernel's 616, forward and backward 637
    against 1,339, a decoding step's ``[32, 512]`` 28 against 59 (one thread). Equal to
    the fused kernel to float rounding, values and gradients (tested)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
            return nn.functional.gelu(x, approximate="tanh")
        if torch.is_grad_enabled() and x.requires_grad:
            return _SigmoidGELUFunction.apply(x)
        return _gelu_gate(x).mul_(x)


def fast_gelu(model: nn.Module) -> nn.Module:
    """Swap transformers' Python tanh-approximate GELU (``NewGELUActivation``, GPT-2's ``gelu_new``:
    eight elementwise kernels forward and more backward, a third of a tiny GPT-2's forward time on
    a CPU) for :class:`SigmoidGELU` (three elementwise kernels forward on a CPU, PyTorch's fused
    kernel elsewhere): the same function, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), equal to
    float rounding (tested). Other activations are left as they are. Returns the model (changed
    in place)."""
    from transformers.activations import NewGELUActivation

    for module in model.modules():
        for name, child in list(module.named_children()):
            if type(child) is NewGELUActivation:
                setattr(module, name, SigmoidGELU())
    return model


# --------------------------------------------------------------------------- forward helpers
def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _forward_params(model: nn.Module) -> set[str]:
    fwd = getattr(model, "forward")
    return set(inspect.signature(fwd).parameters)


def _cache_kwarg(model: nn.Module) -> str:
    # transformers >= 5.2x names it ``cache``; earlier versions ``past_key_values``
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def _cache_out(out):
    cache = out.get("cache", None)
    return out.get("past_key_values", None) if cache is None else cache


@dataclass
class ResponseForward:
    logp: torch.Tensor  # [B, L] log pi(y_t | x, y_<t) at the sampling temperature (0 at padding where packed)
    entropy: torch.Tensor  # [B, L] entropy of pi(. | x, y_<t) (0 at padding where packed)
    hidden: torch.Tensor | None  # [B, L, H] last hidden state that predicts y_t (for a value head)


@dataclass(frozen=True)
class Responses:
    """A teacher-forced batch: left-padded prompts ``prompt_ids [B, P]`` (``prompt_mask``, 1 on
    their tokens) and the responses ``response_ids [B, L]`` that follow them (``response_mask``, 1
    on their tokens, right-padded)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(prompt_ids, prompt_mask, response_ids, response_mask)``."""
        return self.prompt_ids, self.prompt_mask, self.response_ids, self.response_mask


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, inverse)``: the row index of the first occurrence of each distinct (prompt, mask)
    row, in order of first occurrence, and for every row the position of its prompt in ``first``;
    None when every row is distinct (nothing to share)."""
    B = prompt_ids.shape[0]
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    n = int(inverse.max()) + 1 if B else 0
    if n == B:
        return None
    # torch.unique sorts; renumber by first occurrence so the prefill rows keep the batch's order
    first = torch.full((n,), B, dtype=torch.long, device=prompt_ids.device)
    first.scatter_reduce_(0, inverse, torch.arange(B, device=prompt_ids.device), reduce="amin")
    order = torch.empty_like(first)
    order[first.argsort()] = torch.arange(n, device=prompt_ids.device)
    return first.sort().values, order[inverse]


@functools.cache
def _preallocated_layer():
    """A full-attention KV cache layer (a transformers ``DynamicLayer``) whose keys and values
    live in buffers preallocated for the whole response: a decoding step writes its columns in
    place and attends to a view, instead of concatenating the whole cache again. Made from a
    filled layer by :func:`preallocate_cache`; only used without autograd (decoding)."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def fill(self, keys: torch.Tensor, values: torch.Tensor, capacity: int,
                 rows: torch.Tensor | None = None) -> "PreallocatedLayer":
            """Buffers for the keys and values and ``capacity`` more columns; with ``rows``, row ``r``
            holds row ``rows[r]`` of ``keys`` and ``values`` (gathered straight into the buffers)."""
            B, H, n, _ = keys.shape
            B = B if rows is None else rows.numel()
            self.key_buf = keys.new_empty(B, H, n + capacity, keys.shape[-1])
            self.value_buf = values.new_empty(B, H, n + capacity, values.shape[-1])
            if rows is None:
                self.key_buf[:, :, :n] = keys
                self.value_buf[:, :, :n] = values
            else:  # index_select into the buffers' views: a fifth of indexing then copying
                torch.index_select(keys, 0, rows, out=self.key_buf[:, :, :n])
                torch.index_select(values, 0, rows, out=self.value_buf[:, :, :n])
            self.length = n
            self.keys, self.values = self.key_buf[:, :, :n], self.value_buf[:, :, :n]
            self.device, self.is_initialized = keys.device, True
            return self

        def update(self, key_states, value_states, *args, **kwargs):
            n, q = self.length, key_states.shape[-2]
            self.key_buf[:, :, n:n + q] = key_states
            self.value_buf[:, :, n:n + q] = value_states
            self.length = n + q
            self.keys, self.values = self.key_buf[:, :, :n + q], self.value_buf[:, :, :n + q]
            return self.keys, self.values

        def keep_rows(self, rows: torch.Tensor) -> None:
            """Keep only the batch rows ``rows`` (indices into the current rows, in order)."""
            self.key_buf, self.value_buf = self.key_buf.index_select(0, rows), self.value_buf.index_select(0, rows)
            self.keys, self.values = self.key_buf[:, :, :self.length], self.value_buf[:, :, :self.length]

    return PreallocatedLayer


def preallocate_cache(cache, capacity: int):
    """Swap each plain full-attention layer of a transformers ``Cache`` for a
    preallocated one (:func:`_preallocated_layer`) with room for ``capacity`` more tokens (other layer kinds, e.g.
    sliding-window or recurrent ones, are kept as they are). Returns the cache."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if layers is None:
        return cache
    cache.layers = [_preallocated_layer()().fill(layer.keys, layer.values, capacity)
                    if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4 else layer
                    for layer in layers]
    return cache


def _gpt2_trunk(model: nn.Module):
    """The ``GPT2Model`` trunk of transformers' ``GPT2LMHeadModel`` (or the ``GPT2Model`` itself)
    where the harness's own GPT-2 passes (:func:`_gpt2_pass`, :func:`_gpt2_decode_step`) compute
    what the model's ``forward`` does: sdpa attention, no cross-attention, no gradient
    checkpointing, no hooks on the model, its trunk or any module whose ``forward`` or kernels the
    own passes call directly (embeddings, layer norms, projections, activations, LM head), nor
    global module hooks (transformers' own output-capturing hooks on the blocks and attention
    modules only act on outputs these passes do not return), transformers' ``Conv1D``
    projections, PyTorch's ``LayerNorm``, no dropout at work (training with p > 0). None for any
    other model (then the callers call the model)."""
    from torch.nn.modules import module as torch_module
    from transformers import GPT2LMHeadModel, GPT2Model
    from transformers.pytorch_utils import Conv1D

    trunk = model.transformer if type(model) is GPT2LMHeadModel else model
    if type(trunk) is not GPT2Model:
        return None
    projections = [m for b in trunk.h for m in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    norms = [trunk.ln_f, *(n for b in trunk.h for n in (b.ln_1, b.ln_2))]
    called = [model, trunk, trunk.wte, trunk.wpe, *norms, *projections, *(b.mlp.act for b in trunk.h),
              *([model.lm_head] if model is not trunk else [])]
    if (getattr(trunk.config, "_attn_implementation", None) != "sdpa"
            or getattr(trunk.config, "add_cross_attention", False) or trunk.gradient_checkpointing
            or any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                   for m in called)
            or torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
            or torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks
            or any(type(m) is not Conv1D for m in projections) or any(type(m) is not nn.LayerNorm for m in norms)
            or (trunk.training and any(m.p > 0 for m in trunk.modules() if isinstance(m, nn.Dropout)))):
        return None
    return trunk


def _layer_norm_args(ln: nn.LayerNorm) -> tuple:
    """What ``LayerNorm.forward`` passes ``F.layer_norm`` after the input."""
    return ln.normalized_shape, ln.weight, ln.bias, ln.eps


def _gpt2_weights(trunk: nn.Module) -> list[tuple]:
    """Per ``GPT2Block`` of a trunk (:func:`_gpt2_trunk`), what :func:`_gpt2_block` uses, read once
    per pass or decoding loop (the same parameter tensors, which an optimizer updates in place):
    ``(ln_1, c_attn weight, bias, c_proj weight, bias, ln_2, c_fc weight, bias, mlp c_proj weight,
    bias, the activation's forward, split size, head dim, scaling)``."""
    out = []
    for b in trunk.h:
        attn, mlp = b.attn, b.mlp
        out.append((_layer_norm_args(b.ln_1), attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
                    attn.c_proj.bias, _layer_norm_args(b.ln_2), mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight,
                    mlp.c_proj.bias, mlp.act.forward, attn.split_size, attn.head_dim, attn.scaling))
    return out


def _gpt2_block(w: tuple, h: torch.Tensor, attend, keep: torch.Tensor | None = None) -> torch.Tensor:
    """One ``GPT2Block`` (its weights ``w`` of :func:`_gpt2_weights`) on the states ``h [M, H]`` (one
    row per column), ``attend`` mapping the ``c_attn`` output ``[M, 3H]`` to the attention's
    ``[M, H]``: ``GPT2Block.forward``'s kernels (each ``LayerNorm`` as the ``F.layer_norm`` it calls,
    each ``Conv1D`` as its own ``addmm`` on the matrix, without its views; the activation's
    ``forward``; the residual adds in transformers' order), without the dropouts
    (:func:`_gpt2_trunk`: none at work) and without the modules' calls around them (their hooks:
    none, :func:`_gpt2_trunk`). ``keep``: the rows of ``h`` that go on after the attention (``attend``
    then gives theirs only, ``[len(keep), H]``), the block's output theirs."""
    ln_1, attn_w, attn_b, proj_w, proj_b, ln_2, fc_w, fc_b, out_w, out_b, act = w[:11]
    layer_norm = torch.nn.functional.layer_norm
    x = attend(torch.addmm(attn_b, layer_norm(h, *ln_1), attn_w))
    h = torch.addmm(proj_b, x, proj_w) + (h if keep is None else h.index_select(0, keep))
    return h + torch.addmm(out_b, act(torch.addmm(fc_b, layer_norm(h, *ln_2), fc_w)), out_w)


@dataclass(frozen=True)
class _PassLayout:
    """Which columns of :func:`_gpt2_pass` run, and how its rows attend.

    ``columns`` (packed): only the columns at these indices of the flattened ``[R * q]`` grid go
    through the embeddings, projections, MLPs and layer norms, as one ``[N, H]`` batch, and the
    result is their ``[N, H]`` states; the others enter attention (and ``want_cache``'s keys and
    values) as zeros, so no kept column may attend to a left-out one under ``mask`` and its
    causal order (the callers leave out a prompt's left padding, which the mask hides from every
    query, and a response's padding and last token, which only padding attends to). A masked key
    has weight exactly 0 whatever its value, so the kept columns' attention is the unpacked
    pass's, and their values equal the unpacked pass's where each row of a matrix product is its
    own dot products (bit for bit on this CPU; tested to float rounding); gradients differ by the
    rounding of sums over fewer rows.

    ``groups`` (grouped attention, with ``past``): the rows come in ``R / groups`` runs of
    ``groups`` consecutive rows that share one past, given once per run (``past`` of
    ``[R / groups, heads, n, head_dim]``, the ``mask`` the same over each run's past columns).
    Each run's ``groups * q`` queries then attend in one block to its past and to all of the
    run's new columns, each row's own ones under the causal and padding mask and the other rows'
    masked, which the queries' ``[R * q]`` order already is (row-major); instead of the past
    gathered to every row and concatenated with its columns, and attention in ``R * heads``
    small blocks. Masked keys weigh exactly 0, so the values are the per-row attention's to float
    rounding (the sums run in another order; tested).

    ``last`` (no ``past``, ``groups`` 1): only each row's last column's state is wanted, ``last [R]``
    its index among the ``N`` kept columns (or the ``R * q`` grid's); the result is ``[R, 1, H]``. The
    last layer then runs ``ln_1`` and ``c_attn`` at every column (its keys and values, for
    ``want_cache``) but the attention, projection, MLP and ``ln_f`` at those ``R`` columns only,
    each row's last column attending to its row's unmasked columns: what the others' states would
    feed is nothing. A single query's attention rounds differently from the same query in the
    full block's (float rounding; tested), so the decoding's prefill, bit for bit the model's,
    does not use it; the teacher-forced passes do (:func:`_gpt2_packed_response`), where it
    saves time (``benchmarks/lm_vs_trl.py`` measures the update)."""

    columns: torch.Tensor | None = None
    groups: int = 1
    last: torch.Tensor | None = None


def _gpt2_attention_mask(padding: torch.Tensor, q: int, n: int, groups: int) -> tuple[torch.Tensor | None, bool]:
    """``(attn_mask, is_causal)`` of :func:`_gpt2_pass`'s attention for ``q`` new columns after ``n``
    past ones under the padding mask ``padding [R, n + q]`` (bool): with ``groups`` > 1
    ``[R / groups, 1, groups * q, n + groups * q]``, the past's padding then each row's own causal
    block; else the 4-D causal and padding mask of transformers' ``create_causal_mask``, or none
    and sdpa's ``is_causal`` where nothing is padded and ``q == 1`` or there is no past."""
    rows = padding.shape[0]
    attn_mask, causal = None, q > 1
    if groups > 1:  # [R / groups, 1, groups * q, n + groups * q]: the past's padding, then each row's own block
        runs, width = rows // groups, groups * q
        own = torch.ones(q, q, dtype=torch.bool, device=padding.device).tril()
        own = torch.block_diag(*[own] * groups) & padding[:, n:].reshape(runs, 1, 1, width)
        attn_mask = torch.cat([padding[::groups, None, None, :n].expand(runs, 1, width, n), own], dim=-1)
        causal = False
    elif not ((q == 1 or n == 0) and bool(padding.all())):
        q_at = torch.arange(n, n + q, device=padding.device)
        kv_at = torch.arange(n + q, device=padding.device)
        attn_mask = ((kv_at.view(1, 1, 1, -1) <= q_at.view(1, 1, -1, 1)) & padding[:, None, None, :]
                     ).expand(rows, -1, q, n + q)
        causal = False
    return attn_mask, causal


def _gpt2_pass(trunk: nn.Module, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
               past: list[tuple[torch.Tensor, torch.Tensor]] | None = None, want_cache: bool = False,
               layout: _PassLayout = _PassLayout()) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A GPT-2 trunk's (:func:`_gpt2_trunk`) last hidden states (after ``ln_f``) ``[R, q, H]`` for
    the ``q`` columns ``ids [R, q]`` at positions ``pos [R, q]``, attending to the ``past`` keys and
    values of each layer (``[R, heads, n, head_dim]``, or none) and to themselves, under the
    padding mask ``mask [R, n + q]``; with ``want_cache`` also each layer's keys and values of all
    ``n + q`` columns (with their autograd graph). ``layout``: which columns run (packed, only the
    last) and whether rows share their past (grouped attention): :class:`_PassLayout`.

    The same modules, kernels and arguments as ``GPT2Model.forward`` with a ``DynamicCache``
    (transformers 5.x: the 4-D boolean mask of ``create_causal_mask``, causal and padding, or no
    mask and sdpa's ``is_causal`` where nothing is padded and ``q == 1`` or there is no past; the
    cache's ``cat`` of past and new keys and values), without the per-call work around them:
    output classes and their decorators, the attention and mask interfaces, keyword plumbing,
    and, per block (:func:`_gpt2_block`), the projections' views and the dropout calls (none is at
    work: :func:`_gpt2_trunk`). The states run as ``[R * q, H]`` (or packed ``[N, H]``) matrices. Equal to the model's
    own pass bit for bit, values and gradients (tested); about 1 ms less a teacher-forced pass of
    the tiny GPT-2 on a CPU."""
    columns, groups, last = layout.columns, layout.groups, layout.last
    rows, q = ids.shape
    n = 0 if past is None else past[0][0].shape[-2]
    attn_mask, causal = _gpt2_attention_mask(mask.bool(), q, n, groups)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    flat_ids, flat_pos = ids.reshape(-1), pos.reshape(-1)
    if columns is not None:
        flat_ids, flat_pos = flat_ids[columns], flat_pos[columns]
    h = trunk.wte.forward(flat_ids) + trunk.wpe.forward(flat_pos)
    cache = []
    weights = _gpt2_weights(trunk)
    for i, w in enumerate(weights):
        split, head_dim, scaling = w[11:]
        final = last is not None and i == len(weights) - 1

        def attend(x: torch.Tensor) -> torch.Tensor:
            if columns is not None:  # back to the [R, q] grid for attention, zeros where left out
                x = x.new_zeros(rows * q, x.shape[-1]).index_copy(0, columns, x)
            qs, ks, vs = x.view(rows // groups, groups * q, -1).split(split, dim=2)
            qs, ks, vs = (t.view(rows // groups, groups * q, -1, head_dim).transpose(1, 2) for t in (qs, ks, vs))
            if past is not None:
                ks, vs = torch.cat([past[i][0], ks], dim=-2), torch.cat([past[i][1], vs], dim=-2)
            if want_cache:
                cache.append((ks, vs))
            if final:  # each row's last column attends to all of its row's unmasked columns
                out = sdpa(qs[:, :, -1:], ks, vs, attn_mask=None if attn_mask is None else attn_mask[:, :, -1:],
                           scale=scaling)
                return out.transpose(1, 2).reshape(rows, -1)
            out = sdpa(qs, ks, vs, attn_mask=attn_mask, scale=scaling, is_causal=causal)
            out = out.transpose(1, 2).contiguous().view(rows * q, -1)
            return out if columns is None else out.index_select(0, columns)
        h = _gpt2_block(w, h, attend, keep=last if final else None)
    h = torch.nn.functional.layer_norm(h, *_layer_norm_args(trunk.ln_f))
    if last is not None:
        return h.view(rows, 1, -1), cache
    return (h.view(rows, q, -1) if columns is None else h), cache


def _gpt2_response_pass(trunk, batch: Responses, shared, lm_head=None, want_hidden=False):
    """``(logits [B, L, V] or None, hidden [B, L, H] or None)`` at the ``L`` columns that predict the
    response tokens, through :func:`_gpt2_pass`: one pass over ``[prompt | response]``, or with
    ``shared`` (:func:`distinct_prompts`) the distinct prompts run once and their keys and values
    gathered to the rows. The LM head ``lm_head`` (None: no logits) is applied to the same slices
    of the same states as in the model's calls of :func:`_full_response_logits` (``logits_to_keep
    = L + 1``) and :func:`_shared_response_pass` (the prompts' last column, then the responses)."""
    prompt_ids, prompt_mask, response_ids, response_mask = batch.parts()
    P, L = prompt_ids.shape[1], response_ids.shape[1]
    mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    if shared is None:
        h, _ = _gpt2_pass(trunk, torch.cat([prompt_ids, response_ids], dim=1), mask, positions(mask))
        return (None if lm_head is None else lm_head(h[:, -(L + 1):])[:, :-1],
                h[:, P - 1:P + L - 1] if want_hidden else None)
    first, rows = shared  # fewer distinct prompts than rows: the cache is always gathered
    last, cache = _gpt2_prompt_states(trunk, prompt_ids[first], prompt_mask[first], pack=False)
    cache = [(k[rows], v[rows]) for k, v in cache]
    logits = [] if lm_head is None else [lm_head(last)[rows]]
    hidden = [last[rows]] if want_hidden else []
    if L > 1:
        mask = mask[:, :P + L - 1]
        h, _ = _gpt2_pass(trunk, response_ids[:, :-1], mask, positions(mask)[:, P:], past=cache)
        logits += [] if lm_head is None else [lm_head(h)]
        hidden += [h] if want_hidden else []
    return (torch.cat(logits, dim=1) if logits else None, torch.cat(hidden, dim=1) if hidden else None)


def _gpt2_prompt_states(trunk, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, pack: bool = True,
                        last_only: bool = False):
    """``(last [n, 1, H], cache)``: left-padded prompts ``[n, P]`` through :func:`_gpt2_pass` with
    their keys and values, with ``pack`` the left padding packed out (``columns``) where there is
    any: the padding's keys and values are then zeros, which every query's padding mask leaves
    out (so the attention of every prompt column, and later of every response column, is the
    padded pass's). ``last``: each prompt's last column, which predicts the first response token.
    A mask that is not left padding (each row's ones a non-empty suffix) runs unpacked, and so
    does ``pack=False`` (the pass bit-identical to the model's, :func:`_gpt2_response_pass`).
    ``last_only`` (with ``pack``): the last layer past its keys and values runs at the last
    columns only (``last`` of :class:`_PassLayout`; float rounding)."""
    pos = positions(prompt_mask)
    m = prompt_mask.bool()
    n, P = prompt_ids.shape
    columns = ends = None
    if not pack or not bool((m[:, 1:] >= m[:, :-1]).all() and m[:, -1].all()):
        last_only = False
    elif not bool(m.all()):
        columns = prompt_mask.reshape(-1).nonzero().squeeze(1)
        ends = prompt_mask.sum(-1).cumsum(0) - 1  # each prompt's last column among the packed ones
    if last_only:
        last = ends if columns is not None else torch.arange(n, device=pos.device) * P + P - 1
        return _gpt2_pass(trunk, prompt_ids, prompt_mask, pos, want_cache=True,
                          layout=_PassLayout(columns=columns, last=last))
    h, cache = _gpt2_pass(trunk, prompt_ids, prompt_mask, pos, want_cache=True, layout=_PassLayout(columns=columns))
    return (h[:, -1:] if columns is None else h.index_select(0, ends).unsqueeze(1)), cache


def _gpt2_packed_response(trunk, lm_head, batch: Responses, shared, temperature) -> "ResponseForward | None":
    """:func:`response_forward` of a GPT-2 with shared prompts (``shared`` of :func:`distinct_prompts`),
    the responses packed: the distinct prompts run once (:func:`_gpt2_pass`) and their keys and
    values gathered to the rows (or, where each prompt's rows come together and as many each, as
    a group's samples do, attended once per prompt: ``groups`` of :class:`_PassLayout`, values to
    float rounding), then only the response columns that predict a response token
    (``response_mask[:, 1:]``) run (``columns`` of :class:`_PassLayout`), not the padding after each
    row's EOS, which the one-pass and shared forwards multiply to the longest response of the
    batch. Log-probabilities and entropies are 0 at the padding. None for responses of one token,
    or a response mask that is not each row's ones then zeros (the caller runs the padded pass).

    Against the padded pass: the same values at every response token (bit for bit on this CPU,
    tested to float rounding), gradients to float rounding (sums over fewer rows; tested); the
    shorter the responses against the longest, the less work it saves over the padded pass."""
    prompt_ids, prompt_mask, response_ids, response_mask = batch.parts()
    B, L = response_ids.shape
    if L < 2 or not bool((response_mask[:, 1:] <= response_mask[:, :-1]).all()):
        return None
    P = prompt_ids.shape[1]
    first, rows = shared
    last, cache = _gpt2_prompt_states(trunk, prompt_ids[first], prompt_mask[first], last_only=True)
    groups = B // first.numel()  # each prompt's rows together, as many each (group-major): grouped attention
    together = torch.arange(first.numel(), device=rows.device).repeat_interleave(groups)
    if groups < 2 or B % first.numel() or not torch.equal(rows, together):
        groups, cache = 1, [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cache]
    mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)[:, :P + L - 1]
    columns = response_mask[:, 1:].reshape(-1).nonzero().squeeze(1)  # column j predicts token j + 1
    h, _ = _gpt2_pass(trunk, response_ids[:, :-1], mask, positions(mask)[:, P:], past=cache,
                      layout=_PassLayout(columns=columns, groups=groups))
    logits = torch.cat([lm_head(last[:, 0]).index_select(0, rows), lm_head(h)])  # token 0 of each row, then the rest
    targets = torch.cat([response_ids[:, 0], response_ids[:, 1:].reshape(-1)[columns]])
    logp, entropy = _token_logp_entropy(logits, targets, temperature)
    where = torch.cat([torch.arange(B, device=columns.device) * L, columns // (L - 1) * L + columns % (L - 1) + 1])
    grid = lambda x: x.new_zeros(B * L).index_copy(0, where, x).view(B, L)  # noqa: E731
    return ResponseForward(logp=grid(logp), entropy=grid(entropy), hidden=None)


def _gpt2_decode_step(model: nn.Module, cache):
    """A decoding step for transformers' ``GPT2LMHeadModel`` (sdpa attention) on a preallocated
    cache (:func:`preallocate_cache`), or None for any other model or cache (then the caller calls
    the model). ``step(ids [R, 1], mask [R, n], pos [R, 1]) -> logits [R, V]`` of the new column.

    The same modules and kernels as ``GPT2LMHeadModel.forward`` with ``logits_to_keep=1`` (token
    plus position embedding, per block ``ln_1``, ``c_attn``, the new keys and values written into
    the cache, ``scaled_dot_product_attention`` under the padding mask, ``c_proj``, ``ln_2``, the
    MLP, residuals, per block through :func:`_gpt2_block` on ``[R, H]`` states; ``ln_f``,
    ``lm_head``), without what that call spends on one query token per row: building a 4-D mask,
    dispatching through the attention and cache interfaces and the output classes, the
    projections' views, the dropout calls (none at work); about half of a tiny model's step on a
    CPU. Equal to the model's own step bit
    for bit (tested, padded and unpadded, float32 and bfloat16; where nothing is masked
    transformers gives the attention no mask, which here gives the same bits)."""
    layers = getattr(cache, "layers", None)
    trunk = _gpt2_trunk(model)
    if (trunk is None or trunk is model or layers is None or len(layers) != len(trunk.h)
            or not all(type(layer) is _preallocated_layer() for layer in layers)):
        return None
    sdpa = torch.nn.functional.scaled_dot_product_attention

    weights, wte, wpe, ln_f, lm_head = (_gpt2_weights(trunk), trunk.wte.forward, trunk.wpe.forward,
                                        _layer_norm_args(trunk.ln_f), model.lm_head.forward)
    layer_norm = torch.nn.functional.layer_norm

    def step(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        rows = ids.shape[0]
        h = wte(ids.view(-1)) + wpe(pos.view(-1))
        attn_mask = mask.bool()[:, None, None, :]
        for w, layer in zip(weights, layers):
            split, head_dim, scaling = w[11:]

            def attend(x: torch.Tensor) -> torch.Tensor:
                q, k, v = (t.view(rows, -1, 1, head_dim) for t in x.split(split, dim=1))
                keys, values = layer.update(k, v)
                out = sdpa(q, keys, values, attn_mask=attn_mask, scale=scaling)
                return out.transpose(1, 2).reshape(rows, -1)
            h = _gpt2_block(w, h, attend)
        return lm_head(layer_norm(h, *ln_f))

    return step


def _shared_prompt_cache(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         rows: torch.Tensor, **forward_kwargs):
    """Run the distinct prompts ``prompt_ids [n, P]`` once (``use_cache``) and gather their KV
    cache to ``rows [R]`` (row ``r`` uses prompt ``rows[r]``). Returns ``(cache, out)``: ``out`` is
    the prompts' own output (``[n, ...]``; a causal LM's logits of the last column only); None
    when the model's cache cannot be gathered (then the caller runs every row)."""
    keep = {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                use_cache=True, **forward_kwargs, **keep)
    cache = _cache_out(out)
    if not hasattr(cache, "batch_select_indices"):  # a legacy tuple cache (older transformers)
        return None, None
    if rows.numel() != prompt_ids.shape[0] or not torch.equal(rows, torch.arange(len(rows), device=rows.device)):
        cache.batch_select_indices(rows)
    return cache, out


def _shared_response_pass(model, batch: Responses, shared, read, **forward_kwargs):
    """Per-column outputs ``read(out)`` (a tuple of ``[rows, T, ...]`` tensors) at the ``L`` columns
    ``P - 1 .. P + L - 2`` that predict the response tokens, the distinct prompts (``shared =
    (first, rows)`` of :func:`distinct_prompts`) run once and their cache gathered to the rows
    (with its autograd graph): the prompts' last column, then the responses but their last token
    run on the cache. None when the model's cache cannot be gathered."""
    prompt_ids, prompt_mask, response_ids, response_mask = batch.parts()
    first, rows = shared
    P, L = prompt_ids.shape[1], response_ids.shape[1]
    cache, pre = _shared_prompt_cache(model, prompt_ids[first], prompt_mask[first], rows, **forward_kwargs)
    if cache is None:
        return None
    parts = [tuple(x[:, -1:][rows] for x in read(pre))]  # the prompt's last column predicts response token 0
    if L > 1:
        mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)[:, :P + L - 1]
        out = model(input_ids=response_ids[:, :-1], attention_mask=mask, position_ids=positions(mask)[:, P:],
                    use_cache=True, **forward_kwargs, **{_cache_kwarg(model): cache})
        parts.append(tuple(read(out)))
    return tuple(torch.cat(xs, dim=1) for xs in zip(*parts))


def trunk_states(backbone: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 response_ids: torch.Tensor, response_mask: torch.Tensor, share_prompts: bool = False) -> torch.Tensor:
    """``[B, L, H]``: a transformer trunk's (``AutoModel``) last hidden states at the columns that
    predict the response tokens (column ``P - 1 + t`` for token ``t``), from one pass over
    ``[prompt | response]``, or with ``share_prompts`` each distinct prompt run once (as in
    :func:`response_forward`; equal to float rounding, tested)."""
    shared = distinct_prompts(prompt_ids, prompt_mask) if share_prompts else None
    trunk = _gpt2_trunk(backbone)
    batch = Responses(prompt_ids, prompt_mask, response_ids, response_mask)
    if trunk is backbone and trunk is not None:
        return _gpt2_response_pass(trunk, batch, shared, want_hidden=True)[1]
    if shared is not None:
        out = _shared_response_pass(backbone, batch, shared, lambda o: (o.last_hidden_state,))
        if out is not None:
            return out[0]
    P, L = prompt_ids.shape[1], response_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    out = backbone(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
    return out.last_hidden_state[:, P - 1:P + L - 1]


def response_forward(model: nn.Module, batch: Responses, temperature: float = 1.0, want_hidden: bool = False,
                     share_prompts: bool = False) -> ResponseForward:
    """Teacher-forced log-probabilities, entropies (and hidden states) of every response token of
    ``batch``.

    One forward over ``[prompt | response]``; only the ``L + 1`` last columns go through the LM
    head (``logits_to_keep``) where the model supports it, so a long prompt costs no vocabulary
    projection.

    ``share_prompts``: rows with the same prompt (a group's samples) share one pass over it: the
    distinct prompts are run once with ``use_cache``, their cache is gathered to the rows (with
    its autograd graph), and the responses are run on it; the logits of the prompts' last column
    predict the first response token. Equal to the one-pass result to float rounding (tested),
    and falls back to it when every prompt is distinct. A GPT-2 runs through the harness's own
    passes (:func:`_gpt2_pass`); with shared prompts and no hidden states wanted, packed
    (:func:`_gpt2_packed_response`: the padding after each EOS is not run, its values are 0).
    """
    shared = distinct_prompts(batch.prompt_ids, batch.prompt_mask) if share_prompts else None
    trunk, out = _gpt2_trunk(model), None
    own = trunk is not None and trunk is not model  # a GPT-2 LM head model: the harness's own passes
    if own and shared is not None and not want_hidden:
        packed = _gpt2_packed_response(trunk, model.lm_head, batch, shared, temperature)
        if packed is not None:
            return packed
    if own:
        out = _gpt2_response_pass(trunk, batch, shared, model.lm_head, want_hidden)
    elif shared is not None:
        out = _shared_response_logits(model, batch, shared, want_hidden)
    if out is None:
        out = _full_response_logits(model, batch, want_hidden)
    logits, hidden = out
    logp, entropy = _token_logp_entropy(logits, batch.response_ids, temperature)
    return ResponseForward(logp=logp, entropy=entropy, hidden=hidden)


def _token_logp_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """``(log pi(target), entropy of pi)`` per row of ``logits [..., V]`` at the sampling
    temperature, ``pi = softmax(logits / temperature)`` in float32."""
    logits = logits.float() / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    probs = torch.softmax(logits, dim=-1)
    return logp, logz - (probs * logits).sum(-1)


def _full_response_logits(model, batch: Responses, want_hidden):
    """``(logits [B, L, V], hidden [B, L, H] or None)`` of one pass over ``[prompt | response]``."""
    prompt_ids, prompt_mask, response_ids, response_mask = batch.parts()
    P, L = prompt_ids.shape[1], response_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                  output_hidden_states=want_hidden, use_cache=False)
    if "logits_to_keep" in _forward_params(model):
        kwargs["logits_to_keep"] = L + 1
    out = model(**kwargs)
    logits = out.logits[:, -(L + 1):-1]  # column P-1+t predicts response token t
    hidden = out.hidden_states[-1][:, P - 1:P + L - 1] if want_hidden else None
    return logits, hidden


def _shared_response_logits(model, batch: Responses, shared, want_hidden):
    """As :func:`_full_response_logits`, the distinct prompts run once (see :func:`response_forward`);
    None when the model's cache cannot be gathered."""
    read = (lambda o: (o.logits, o.hidden_states[-1])) if want_hidden else (lambda o: (o.logits,))  # noqa: E731
    out = _shared_response_pass(model, batch, shared, read, output_hidden_states=want_hidden)
    if out is None:
        return None
    return out[0], (out[1] if want_hidden else None)


# --------------------------------------------------------------------------- policy and critics
class PolicyWithValue(nn.Module):
    """The policy LM, with an optional scalar value head on its last hidden states
    (``lm.critic=head``: actor and critic share the trunk, 000's "separate output heads")."""

    def __init__(self, lm: nn.Module, value_head: bool):
        super().__init__()
        self.lm = lm
        self.value_head = None
        if value_head:
            hidden = lm.config.get_text_config().hidden_size if hasattr(lm.config, "get_text_config") \
                else lm.config.hidden_size
            self.value_head = nn.Linear(hidden, 1)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def forward(self, prompt_ids, prompt_mask, response_ids, response_mask, temperature=1.0, share_prompts=False):
        out = response_forward(self.lm, Responses(prompt_ids, prompt_mask, response_ids, response_mask), temperature,
                               want_hidden=self.value_head is not None, share_prompts=share_prompts)
        values = None
        if self.value_head is not None:
            values = self.value_head(out.hidden.float()).squeeze(-1)
        return out, values


class ValueModel(nn.Module):
    """A separate critic (``lm.critic=model``): a transformer trunk (initialised from the policy's
    starting weights, InstructGPT-style separate value network) plus a scalar head."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, prompt_ids, prompt_mask, response_ids, response_mask, share_prompts=False) -> torch.Tensor:
        hidden = trunk_states(self.backbone, prompt_ids, prompt_mask, response_ids, response_mask, share_prompts)
        return self.head(hidden.float()).squeeze(-1)


# --------------------------------------------------------------------------- decoding
class NonFiniteError(FloatingPointError):
    """The policy produced NaN/inf logits (its weights have diverged)."""


@dataclass
class Generation:
    tokens: torch.Tensor  # [B, L] response ids, pad after EOS
    mask: torch.Tensor  # [B, L] 1 up to and including EOS
    logp: torch.Tensor  # [B, L] log-prob of each token when it was chosen (0 on padding)
    has_eos: torch.Tensor  # [B] bool

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)


@dataclass(frozen=True)
class DecodeSettings:
    """How responses are decoded token by token: until ``eos_token_id`` or ``max_new_tokens``, padded
    with ``pad_token_id`` after, from ``softmax(logits / temperature)``; ``use_cache=False``
    recomputes the whole prefix every step (the slow reference decoder)."""

    max_new_tokens: int
    eos_token_id: int
    pad_token_id: int
    temperature: float = 1.0
    use_cache: bool = True


def generate(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: DecodeSettings, *,
             greedy: bool = False, generator: torch.Generator | None = None, samples: int = 1) -> Generation:
    """Sample token by token until EOS or ``settings.max_new_tokens``: ``samples`` responses to each
    prompt row of ``prompt_ids [n, P]``, as ``n * samples`` rows, group-major (row ``i * samples + j``
    is sample ``j`` of prompt ``i``); with ``greedy`` one argmax response per prompt (``samples`` is
    then ignored). The decoder is :func:`generate_groups`."""
    if greedy:
        return generate_groups(model, prompt_ids, prompt_mask, settings, samples=0, with_greedy=True)[1]
    return generate_groups(model, prompt_ids, prompt_mask, settings, samples=samples, generator=generator)[0]


def generate_groups(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: DecodeSettings,
                    *, samples: int = 1, with_greedy: bool = False,
                    generator: torch.Generator | None = None) -> tuple[Generation | None, Generation | None]:
    """``samples`` sampled responses to each of the ``n`` prompts ``prompt_ids [n, P]`` (group-major,
    ``n * samples`` rows) and, with ``with_greedy``, one greedy (argmax) response to each, decoded
    together with a KV cache until EOS or ``settings.max_new_tokens``. Returns ``(sampled, greedy)``, each a
    :class:`Generation` (None where not asked for).

    Token ``t`` is drawn from ``softmax(logits / settings.temperature)``; its log-probability under that
    distribution is recorded (the quantity the C12 test compares with :func:`response_forward`).
    Each prompt is run through the model once and its KV cache gathered to its rows (the group's
    samples and its greedy row), into a cache preallocated for the whole response
    (:func:`preallocate_cache`); attention mask and positions are preallocated too. Random numbers:
    one ``multinomial`` over the sampled rows per step, for as long as one of them is unfinished:
    the draws of plain per-row decoding, so the samples equal those of sampling each row alone
    (tested), the greedy rows draw nothing. A GPT-2's own step stops running the rows that have
    finished once enough have (``_DROP_*`` below: the same draws bit for bit, tested). Each
    returned part is cut at its longest response.
    ``settings.use_cache=False`` recomputes the whole prefix every step (the slow reference decoder).

    The loop runs under ``torch.inference_mode`` (less bookkeeping per operation than ``no_grad``);
    what it returns is copied out of it, since inference tensors may not be saved for a backward
    pass (the tokens are the update's input ids).
    """
    tokens, logps, alive_at, finished, t = _decode(model, prompt_ids, prompt_mask, settings,
                                                   _DecodeRows(prompt_ids.shape[0], samples, with_greedy), generator)
    with torch.no_grad():
        tokens, logps, alive_at, finished = (x.clone() for x in (tokens, logps, alive_at, finished))
    n_s = prompt_ids.shape[0] * samples

    def part(lo: int, hi: int) -> Generation | None:
        if hi == lo:
            return None
        mask = alive_at[lo:hi, :t + 1].long()
        width = int(mask.sum(-1).max())  # plain decoding stops when its last row has finished
        return Generation(tokens=tokens[lo:hi, :width], mask=mask[:, :width], logp=logps[lo:hi, :width],
                          has_eos=finished[lo:hi])
    return part(0, n_s), part(n_s, tokens.shape[0])


@dataclass(frozen=True)
class _DecodeRows:
    """The decoded rows of ``n`` prompts: ``samples`` sampled rows each (group-major), then one
    greedy row each with ``with_greedy``."""

    n: int
    samples: int
    with_greedy: bool

    @property
    def n_s(self) -> int:
        return self.n * self.samples

    @property
    def n_g(self) -> int:
        return self.n if self.with_greedy else 0


@torch.inference_mode()
def _decode(model, prompt_ids, prompt_mask, settings: DecodeSettings, layout: _DecodeRows, generator):
    """The decode loop of :func:`generate_groups`: ``(tokens, log-probs, alive, finished, last step)``
    over all rows (sampled, then greedy), uncut."""
    n, P = prompt_ids.shape
    device = prompt_ids.device
    n_s, n_g = layout.n_s, layout.n_g
    R, L = n_s + n_g, settings.max_new_tokens
    pad_token_id, use_cache, temperature = settings.pad_token_id, settings.use_cache, settings.temperature
    rows = torch.cat([torch.arange(n, device=device).repeat_interleave(layout.samples),
                      torch.arange(n_g, device=device)])  # the prompt of each decoded row
    row_ids, row_mask = prompt_ids[rows], prompt_mask[rows]
    tokens = torch.full((R, L), pad_token_id, dtype=torch.long, device=device)
    logps = torch.zeros(R, L, device=device)
    alive_at = torch.zeros(R, L, dtype=torch.bool, device=device)
    finished = torch.zeros(R, dtype=torch.bool, device=device)
    pad = torch.full((R,), pad_token_id, dtype=torch.long, device=device)
    attn = torch.cat([row_mask, torch.zeros(R, L, dtype=row_mask.dtype, device=device)], dim=1)
    pos = positions(row_mask)[:, -1:] + torch.arange(1, L + 1, device=device).view(1, -1)
    ckw = _cache_kwarg(model)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}
    cache, logits = _prefill(model, prompt_ids, prompt_mask, rows, L, use_cache, keep) if use_cache else (None, None)
    fast_step = _gpt2_decode_step(model, cache) if use_cache else None
    live = every = None  # the rows the own step still runs (None: all) and every row's last log-probs
    t = 0
    for t in range(L):
        if not use_cache:
            ids = torch.cat([row_ids, tokens[:, :t]], dim=1)
            out = model(input_ids=ids, attention_mask=attn[:, :P + t], position_ids=positions(attn[:, :P + t]),
                        use_cache=False, **keep)
            logits = out.logits[:, -1]
        elif t > 0 and fast_step is not None and live is None:
            logits = fast_step(tokens[:, t - 1:t], attn[:, :P + t], pos[:, t - 1:t])
        elif t > 0 and fast_step is not None:
            logits = fast_step(tokens[:, t - 1:t].index_select(0, live), attn[:, :P + t].index_select(0, live),
                               pos[:, t - 1:t].index_select(0, live))
        elif t > 0:
            out = model(input_ids=tokens[:, t - 1:t], attention_mask=attn[:, :P + t], position_ids=pos[:, t - 1:t],
                        use_cache=True, **{ckw: cache}, **keep)
            cache, logits = _cache_out(out), out.logits[:, -1]
        logprobs = _step_logprobs(logits, temperature, t)
        if live is not None:  # the finished rows keep log-probs of an earlier step: drawn from, never kept
            logprobs = every.index_copy_(0, live, logprobs)
        nxt = torch.where(~finished, _next_tokens(logprobs, layout, finished, generator, pad_token_id), pad)
        alive = ~finished
        tokens[:, t] = nxt
        logps[:, t] = logprobs.gather(-1, nxt.unsqueeze(-1)).squeeze(-1).masked_fill_(finished, 0.0)
        alive_at[:, t] = alive
        finished |= alive & (nxt == settings.eos_token_id)
        done = int(finished.sum())
        if done == R:
            break
        attn[:, P + t].copy_(alive)
        if fast_step is not None and t + _DROP_STEPS_LEFT < L and R - done >= _DROP_MIN_ROWS:
            live, every = _drop_finished(cache, finished, R - done, (live, every), logprobs)

    return tokens, logps, alive_at, finished, t


def _prefill(model, prompt_ids, prompt_mask, rows, L: int, use_cache: bool, keep: dict):
    """``(cache, logits of each row's next token)``: the prompts run once and their keys and
    values gathered to the decoded ``rows`` (a GPT-2: through the harness's own pass, into a
    preallocated cache of ``L`` more columns), or every row prefilled where no cache can be gathered."""
    trunk = _gpt2_trunk(model) if use_cache else None
    if trunk is not None and trunk is not model:  # a GPT-2: the prompts through the harness's own pass
        from transformers import DynamicCache

        last, kv = _gpt2_prompt_states(trunk, prompt_ids, prompt_mask)
        logits = model.lm_head(last)[:, -1][rows]
        cache = DynamicCache()
        cache.layers = [_preallocated_layer()().fill(k, v, L, rows) for k, v in kv]
        return cache, logits
    cache, out = _shared_prompt_cache(model, prompt_ids, prompt_mask, rows)
    if cache is None:  # no gatherable cache: prefill every row
        row_ids, row_mask = prompt_ids[rows], prompt_mask[rows]
        out = model(input_ids=row_ids, attention_mask=row_mask, position_ids=positions(row_mask), use_cache=True,
                    **keep)
        return _cache_out(out), out.logits[:, -1]
    return preallocate_cache(cache, L), out.logits[:, -1][rows]


def _step_logprobs(logits: torch.Tensor, temperature: float, t: int) -> torch.Tensor:
    """``log softmax(logits / temperature)`` in float32; refuses non-finite logits."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if not torch.isfinite(logits).all():
        raise NonFiniteError(f"non-finite logits while decoding token {t}")
    return torch.log_softmax(logits, dim=-1)


def _next_tokens(logprobs: torch.Tensor, layout: _DecodeRows, finished: torch.Tensor,
                 generator: torch.Generator | None, pad_token_id: int) -> torch.Tensor:
    """Every row's next token: one draw over the sampled rows while one of them is unfinished (the
    draws of plain per-row decoding), the argmax for the greedy rows."""
    n_s = layout.n_s
    if not layout.n_g:  # sampled rows only: one of them is unfinished, or the loop would have ended
        return _categorical(logprobs.exp(), generator)
    nxt = torch.empty(logprobs.shape[0], dtype=torch.long, device=logprobs.device)
    if n_s and not bool(finished[:n_s].all()):
        nxt[:n_s] = _categorical(logprobs[:n_s].exp(), generator)
    else:
        nxt[:n_s] = pad_token_id
    nxt[n_s:] = logprobs[n_s:].argmax(-1)
    return nxt


def _drop_finished(cache, finished: torch.Tensor, running: int,
                   kept_rows: tuple[torch.Tensor | None, torch.Tensor | None],
                   logprobs: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The rows a GPT-2's own step runs from now on ``(live, every)`` (``kept_rows``: until now;
    ``live`` None: all rows): once enough of the rows it computes have finished (``_DROP_*``; of
    them ``running`` have not), the finished ones leave its cache; ``every`` keeps each row's last
    log-probs."""
    live, every = kept_rows
    computed = finished.shape[0] if live is None else live.numel()
    if computed - running < max(_DROP_MIN_ROWS, computed // _DROP_FRACTION):
        return live, every
    running_now = ~finished
    rows = running_now.nonzero().squeeze(1)  # of all R rows
    kept = rows if live is None else running_now.index_select(0, live).nonzero().squeeze(1)  # of live
    for layer in cache.layers:
        layer.keep_rows(kept)
    return rows, (logprobs.clone() if every is None else every)


def _categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``torch.multinomial(probs, 1, generator=generator).squeeze(-1)`` (one draw per row of
    ``probs [R, V]``, nonnegative and finite): on a CPU as PyTorch computes it for one sample
    (``aten::multinomial``: ``argmax(probs / q)``, ``q ~ Exp(1)`` drawn by ``exponential_`` from the
    generator, the Gumbel-max trick), without its input checks and wrapping, the same draws and
    generator state (tested against ``torch.multinomial``), with less overhead per decoding step.
    Elsewhere ``torch.multinomial`` itself."""
    if probs.device.type != "cpu":
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return torch.div(probs, q, out=q).argmax(-1)


# The own decoding step (a GPT-2 on a preallocated cache) stops running rows that have finished:
# once a quarter of the rows it runs, and at least _DROP_MIN_ROWS, have ended and at least
# _DROP_STEPS_LEFT steps may follow, the cache keeps only the rows still decoding. A step costs
# about 520 us plus 20 us a row for the tiny GPT-2 on one CPU thread, dropping the rows about
# 0.1 ms a layer. Never below _DROP_MIN_ROWS rows: MKL multiplies fewer than 4 rows by another
# path, whose rounding differs from the full batch's, and a row's tokens and log-probs are the
# same bits whichever rows run beside it from 4 rows up (tested).
_DROP_MIN_ROWS = 4
_DROP_STEPS_LEFT = 4
_DROP_FRACTION = 4


# --------------------------------------------------------------------------- reward model
class PooledRewardModel(nn.Module):
    r"""Reward model: a transformer trunk with a per-token scalar head, averaged over the response,

    .. math:: r(x, y) = b + \frac{1}{|y|} \sum_{t<|y|} \big[ w_e^\top (h_t \odot e_{y_t}) + w_h^\top h_t \big]

    where :math:`h_t = h(x, y_{<t})` is the last hidden state that predicts token ``t`` and
    :math:`e_{y_t}` the embedding of the token written there. With ``w_e = 1`` (the
    initialisation) the per-token term is the trunk's own logit of the written token (GPT-2 ties
    its LM head to the embeddings), so an RM initialised from the SFT trunk starts from "how
    plausible is this summary to the SFT model" and Bradley-Terry training moves it from there.
    The summary is judged where its claims are written, which a few thousand preference pairs
    can teach; a judgement packed into the last token's state (``AutoModelForSequenceClassification``)
    learned far less from the same pairs here. Saved as the trunk's ``save_pretrained`` folder
    plus ``reward_head.safetensors``.
    """

    HEAD_FILE = "reward_head.safetensors"

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        self.w_e = nn.Parameter(torch.ones(hidden))
        self.w_h = nn.Parameter(torch.zeros(hidden))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, prompt_ids, prompt_mask, response_ids, response_mask, share_prompts=False) -> torch.Tensor:
        # column P-1+t predicts token t
        states = trunk_states(self.backbone, prompt_ids, prompt_mask, response_ids, response_mask, share_prompts).float()
        emb = self.backbone.get_input_embeddings()(response_ids).float()
        per_token = (states * emb) @ self.w_e + states @ self.w_h
        keep = response_mask.float()
        return self.bias + (per_token * keep).sum(-1) / keep.sum(-1).clamp(min=1.0)

    def save(self, folder) -> None:
        from safetensors.torch import save_file

        self.backbone.save_pretrained(folder, safe_serialization=True)
        head = {"w_e": self.w_e, "w_h": self.w_h, "bias": self.bias}
        save_file({k: v.detach().cpu().contiguous() for k, v in head.items()}, str(folder) + "/" + self.HEAD_FILE)

    @classmethod
    def load(cls, folder, field_name: str = "lm.reward_model") -> "PooledRewardModel":
        from safetensors.torch import load_file
        from transformers import AutoModel

        model = cls(load_pretrained(AutoModel, folder, field_name))
        head = load_file(str(folder) + "/" + cls.HEAD_FILE)
        with torch.no_grad():
            model.w_e.copy_(head["w_e"])
            model.w_h.copy_(head["w_h"])
            model.bias.copy_(head["bias"])
        return model
