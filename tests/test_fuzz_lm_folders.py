"""Issue 36 item 6: LM model and tokenizer folders that passed validation and failed later.

A folder named by ``lm.model``, ``lm.tokenizer`` or ``lm.reward_model`` is checked fully before
any work starts (:mod:`harness.tasks.lm.validate`): its tokenizer is loaded as the run loads it
(with the EOS token generation needs), and its safetensors weights are read back to their headers
and compared with the tensors of the model its ``config.json`` describes (built on the meta
device). Each row of :data:`BAD` breaks one copy of a good tiny folder in one way; the run must
end with exit code 2 and one ``invalid config: <field>: ...`` line naming the folder's file, with
nothing created (no run folder, no cache). The rows are grouped by class: the tokenizer (of each
field that reads one), the weights against the config, the weights' files, the pooled reward
head. :data:`GOOD` are folders the run loads fine, which must pass (no false refusals).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import app
from harness.tasks.lm import vocabulary
from harness.validation import validate

from .test_lm_common import TINY, compose, one_thread  # noqa: F401  (autouse fixture)

REPO = Path(__file__).resolve().parents[1]
WIDTH, POSITIONS = 16, 128  # the tiny GPT-2s: n_embd 16, 2 heads, 1 layer; context >= TINY's 64 + 10 tokens
VOCAB = len({"<unk>", "</s>", *vocabulary()})  # the word-level tokenizer's vocabulary


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """Good tiny folders: ``gpt2`` (a causal LM with its tokenizer, tied embeddings), ``sharded``
    (the same in two safetensors shards), ``base`` (a GPT2Model's weights, no ``transformer.``
    prefix, as a causal LM: the tied head comes from the embeddings), ``tok`` (a tokenizer only),
    ``rm`` (a sequence classifier) and ``pooled`` (the pipeline's own pooled reward model)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel, GPT2Model,
                              PreTrainedTokenizerFast)

    from harness.models.lm import PooledRewardModel

    root = tmp_path_factory.mktemp("lm_folders")
    vocab = {"<unk>": 0, "</s>": 1}
    for w in vocabulary():
        vocab.setdefault(w, len(vocab))
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="</s>")
    config = dict(vocab_size=len(vocab), n_positions=POSITIONS, n_embd=WIDTH, n_layer=1, n_head=2,
                  bos_token_id=1, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**config)).save_pretrained(root / "gpt2")
    GPT2LMHeadModel(GPT2Config(**config)).save_pretrained(root / "sharded", max_shard_size="20KB")
    GPT2Model(GPT2Config(**config)).save_pretrained(root / "base")
    GPT2ForSequenceClassification(GPT2Config(**config, num_labels=1)).save_pretrained(root / "rm")
    PooledRewardModel(GPT2Model(GPT2Config(**config))).save(root / "pooled")
    for name in ("gpt2", "sharded", "base", "rm", "pooled", "tok"):
        tok.save_pretrained(root / name)
    assert len(list((root / "sharded").glob("model-*.safetensors"))) >= 2
    return root


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def _replace_head(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"w_e": torch.ones(WIDTH + 1), "w_h": torch.zeros(WIDTH), "bias": torch.zeros(())},
              str(folder / "reward_head.safetensors"))


def _pickled_weights_only(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle: must never be loaded


def _drop_a_shard(folder: Path) -> None:
    sorted(folder.glob("model-*.safetensors"))[-1].unlink()


# (id, field, good folder to copy, how to break the copy (returning another path to name, or None), what the one
# line must say)
BAD = [
    # ---- the tokenizer, of each field that reads one: loaded now, as the run loads it
    ("tokenizer_json_truncated", "lm.tokenizer", "tok", lambda f: _truncate(f / "tokenizer.json"),
     "cannot load a tokenizer"),
    ("tokenizer_config_only", "lm.tokenizer", "tok", lambda f: (f / "tokenizer.json").unlink(),
     "cannot load a tokenizer"),
    ("tokenizer_without_eos", "lm.tokenizer", "tok", lambda f: _edit_json(f / "tokenizer_config.json", eos_token=None),
     "no EOS token"),
    ("tokenizer_a_file", "lm.tokenizer", "tok", lambda f: f / "tokenizer.json",
     "is a file; a saved tokenizer is a folder"),
    ("model_own_tokenizer_truncated", "lm.model", "gpt2", lambda f: _truncate(f / "tokenizer.json"),
     "cannot load a tokenizer"),
    ("reward_model_tokenizer_config_only", "lm.reward_model", "rm", lambda f: (f / "tokenizer.json").unlink(),
     "cannot load a tokenizer"),
    # ---- the weights against config.json: every tensor of the model it describes, with its shape
    ("config_wider_than_weights", "lm.model", "gpt2", lambda f: _edit_json(f / "config.json", n_embd=2 * WIDTH),
     # the first tensor in the model's own order: the token embeddings
     f"tensor 'transformer.wte.weight' has shape [{VOCAB}, {WIDTH}] in the weights, [{VOCAB}, {2 * WIDTH}] "
     "by the config"),
    ("config_deeper_than_weights", "lm.model", "gpt2", lambda f: _edit_json(f / "config.json", n_layer=2),
     "12 of the 28 tensors of the GPT2LMHeadModel it describes are not in them (first: 'transformer.h.1."),
    ("config_not_buildable", "lm.model", "gpt2", lambda f: _edit_json(f / "config.json", n_head=3),
     "transformers cannot build a AutoModelForCausalLM"),
    ("reward_model_labels_off", "lm.reward_model", "rm", lambda f: _edit_json(f / "config.json", num_labels=2,
                                                                             id2label=None, label2id=None),
     f"tensor 'score.weight' has shape [1, {WIDTH}] in the weights, [2, {WIDTH}] by the config"),
    ("causal_lm_as_reward_model", "lm.reward_model", "gpt2", lambda f: None,
     "1 of the 17 tensors of the GPT2ForSequenceClassification it describes are not in them (first: 'score.weight')"),
    # ---- the weights' files
    ("safetensors_truncated", "lm.model", "gpt2", lambda f: _truncate(f / "model.safetensors", 0.9),
     "model.safetensors' is not a complete safetensors file"),
    ("safetensors_header_cut", "lm.model", "gpt2", lambda f: _truncate(f / "model.safetensors", 0.001),
     "model.safetensors' is not a complete safetensors file"),
    ("safetensors_missing", "lm.model", "gpt2", lambda f: (f / "model.safetensors").unlink(),
     "has no model.safetensors (nor model.safetensors.index.json)"),
    ("pickled_weights_only", "lm.model", "gpt2", _pickled_weights_only,
     "has no model.safetensors (nor model.safetensors.index.json)"),
    ("shard_missing", "lm.model", "sharded", _drop_a_shard, "is not a complete safetensors file"),
    ("shard_index_not_a_map", "lm.model", "sharded",
     lambda f: _edit_json(f / "model.safetensors.index.json", weight_map=["../x"]), "must hold a non-empty weight_map"),
    ("reward_model_weights_truncated", "lm.reward_model", "rm", lambda f: _truncate(f / "model.safetensors", 0.9),
     "is not a complete safetensors file"),
    # ---- the pipeline's pooled reward model: its head file too
    ("pooled_head_truncated", "lm.reward_model", "pooled", lambda f: _truncate(f / "reward_head.safetensors"),
     "reward_head.safetensors' is not a complete safetensors file"),
    ("pooled_head_wrong_shape", "lm.reward_model", "pooled", _replace_head,
     f"must hold w_e and w_h of shape [{WIDTH}] and a scalar bias, got {{'bias': [], 'w_e': [{WIDTH + 1}]"),
]


def _overrides(field: str, folder: Path, good_root: Path) -> list[str]:
    """``field`` set to ``folder``; the other fields at good values (the policy is the good
    ``gpt2`` folder whenever a folder is named, as a hub model would be needed otherwise)."""
    model = folder if field == "lm.model" else good_root / "gpt2"
    more = [f"lm.tokenizer={folder}"] if field == "lm.tokenizer" else []
    more += [f"lm.reward_model={folder}"] if field == "lm.reward_model" else []
    return ["estimator=rloo", f"lm.model={model}", *more]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_folder_is_refused_before_anything_is_created(case, good, tmp_path, capsys):
    _, field, source, breakage, expected = case
    folder = tmp_path / "inputs" / source
    shutil.copytree(good / source, folder)
    folder = breakage(folder) or folder  # a breakage may name another path (a file in the folder)
    res, cache = tmp_path / "res", tmp_path / "cache"
    cfg = compose(*_overrides(field, folder, good), results_dir=res, cache_dir=cache)
    with pytest.raises(SystemExit) as info:
        app.main_entry(cfg)
    out = capsys.readouterr().out
    assert info.value.code == 2, out
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"invalid config: {field}: "), out
    assert str(folder) in lines[0] and expected in lines[0], lines[0]
    assert not res.exists() and not cache.exists(), "something was created before the refusal"


GOOD = [("lm.model", "gpt2"), ("lm.model", "sharded"), ("lm.model", "base"), ("lm.tokenizer", "tok"),
        ("lm.reward_model", "rm"), ("lm.reward_model", "pooled")]


@pytest.mark.parametrize("field, source", GOOD, ids=[f"{f}={s}" for f, s in GOOD])
def test_good_folders_pass(field, source, good, tmp_path):
    validate(compose(*_overrides(field, good / source, good), results_dir=tmp_path / "res", cache_dir=tmp_path))


def test_base_model_folder_loads_as_the_policy_with_its_tied_head(good):
    """The ``base`` row of :data:`GOOD` is what transformers loads too: every tensor found."""
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(str(good / "base"), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info


@pytest.mark.parametrize("case", ["safetensors_truncated", "tokenizer_config_only"])
def test_cli_refuses_a_bad_folder_with_exit_2_and_one_line(case, good, tmp_path):
    """The real command line for one row of each kind: exit 2, one line, no traceback, no run folder
    (Hydra's own job log under results_dir/.hydra is all there may be)."""
    _, field, source, breakage, expected = next(c for c in BAD if c[0] == case)
    folder = tmp_path / "inputs" / source
    shutil.copytree(good / source, folder)
    breakage(folder)
    res = tmp_path / "res"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-m", "harness", *TINY, *_overrides(field, folder, good),
                          f"results_dir={res}", f"lm.cache_dir={tmp_path / 'cache'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("invalid config:")]
    assert len(lines) == 1 and lines[0].startswith(f"invalid config: {field}: ") and expected in lines[0], out.stdout
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert sorted(p.name for p in res.iterdir()) == [".hydra"] and not (tmp_path / "cache").exists()
