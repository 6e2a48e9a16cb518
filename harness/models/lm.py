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
"""
from __future__ import annotations

import inspect
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


def tiny_causal_lm(vocab_size: int, pad_token_id: int, eos_token_id: int, n_positions: int,
                   n_layer: int = 2, n_embd: int = 128, n_head: int = 4, seed: int = 0):
    """A small GPT-2 (no dropout: RL needs the sampling and the training forward to agree)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
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
    logp: torch.Tensor  # [B, L] log pi(y_t | x, y_<t) at the sampling temperature
    entropy: torch.Tensor  # [B, L] entropy of pi(. | x, y_<t)
    hidden: torch.Tensor | None  # [B, L, H] last hidden state that predicts y_t (for a value head)


def response_forward(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     response_ids: torch.Tensor, response_mask: torch.Tensor,
                     temperature: float = 1.0, want_hidden: bool = False) -> ResponseForward:
    """Teacher-forced log-probabilities, entropies (and hidden states) of every response token.

    One forward over ``[prompt | response]``; only the ``L + 1`` last columns go through the LM
    head (``logits_to_keep``) where the model supports it, so a long prompt costs no vocabulary
    projection.
    """
    P, L = prompt_ids.shape[1], response_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                  output_hidden_states=want_hidden, use_cache=False)
    params = _forward_params(model)
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = L + 1
    out = model(**kwargs)
    logits = out.logits[:, -(L + 1):-1].float()  # column P-1+t predicts response token t
    logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1) - logz
    probs = torch.softmax(logits, dim=-1)
    entropy = logz - (probs * logits).sum(-1)
    hidden = out.hidden_states[-1][:, P - 1:P + L - 1] if want_hidden else None
    return ResponseForward(logp=logp, entropy=entropy, hidden=hidden)


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

    def forward(self, prompt_ids, prompt_mask, response_ids, response_mask, temperature=1.0):
        out = response_forward(self.lm, prompt_ids, prompt_mask, response_ids, response_mask, temperature,
                               want_hidden=self.value_head is not None)
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

    def forward(self, prompt_ids, prompt_mask, response_ids, response_mask) -> torch.Tensor:
        P, L = prompt_ids.shape[1], response_ids.shape[1]
        ids = torch.cat([prompt_ids, response_ids], dim=1)
        mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        out = self.backbone(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
        hidden = out.last_hidden_state[:, P - 1:P + L - 1]
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


@torch.no_grad()
def generate(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
             eos_token_id: int, pad_token_id: int, temperature: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None, use_cache: bool = True) -> Generation:
    """Sample (or take the argmax) token by token with a KV cache until EOS or ``max_new_tokens``.

    Token ``t`` is drawn from ``softmax(logits / temperature)``; its log-probability under that
    distribution is recorded (the quantity the C12 test compares with :func:`response_forward`).
    ``use_cache=False`` recomputes the whole prefix every step (the slow reference decoder).
    """
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    mask = prompt_mask.clone()
    pos = positions(mask)[:, -1]
    tokens = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    logps = torch.zeros(B, max_new_tokens, device=device)
    resp_mask = torch.zeros(B, max_new_tokens, dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    ckw = _cache_kwarg(model)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}
    ids = prompt_ids
    cache = None
    for t in range(max_new_tokens):
        if use_cache:
            if cache is None:
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True, **keep)
            else:
                out = model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=pos.unsqueeze(1),
                            use_cache=True, **{ckw: cache}, **keep)
            cache = _cache_out(out)
        else:
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False, **keep)
        logits = out.logits[:, -1].float() / temperature
        if not torch.isfinite(logits).all():
            raise NonFiniteError(f"non-finite logits while decoding token {t}")
        logprobs = torch.log_softmax(logits, dim=-1)
        if greedy:
            nxt = logprobs.argmax(-1)
        else:
            nxt = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
        alive = ~finished
        nxt = torch.where(alive, nxt, torch.full_like(nxt, pad_token_id))
        tokens[:, t] = nxt
        logps[:, t] = torch.where(alive, logprobs.gather(-1, nxt.unsqueeze(-1)).squeeze(-1), torch.zeros_like(logps[:, t]))
        resp_mask[:, t] = alive.long()
        finished = finished | (alive & (nxt == eos_token_id))
        if finished.all():
            tokens, logps, resp_mask = tokens[:, :t + 1], logps[:, :t + 1], resp_mask[:, :t + 1]
            break
        ids = torch.cat([ids, nxt.unsqueeze(1)], dim=1)
        mask = torch.cat([mask, alive.long().unsqueeze(1).to(mask.dtype)], dim=1)
        pos = pos + 1
    return Generation(tokens=tokens, mask=resp_mask, logp=logps, has_eos=finished)


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

    def forward(self, prompt_ids, prompt_mask, response_ids, response_mask) -> torch.Tensor:
        P, L = prompt_ids.shape[1], response_ids.shape[1]
        ids = torch.cat([prompt_ids, response_ids], dim=1)
        mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        out = self.backbone(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
        states = out.last_hidden_state[:, P - 1:P + L - 1].float()  # column P-1+t predicts token t
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
