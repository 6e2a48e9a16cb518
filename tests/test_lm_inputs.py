"""Bad LM inputs (issue 12): no code from a model folder, no crash from a crafted file, one
clear line naming the field for every bad value, no stale temp folders, no cache in the cwd."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from harness.tasks.lm.pipeline import build_task, cached_stage, remove_stale_temps

from .test_lm_common import compose, one_thread  # noqa: F401  (autouse fixture)

REPO = Path(__file__).resolve().parents[1]
YES = b"y\n" * 100  # what an unattended "run the custom code? [y/N]" prompt would read

EVIL_CODE = textwrap.dedent("""
    import os
    open(os.environ["EVIL_MARKER"], "w").write("code from the model folder ran")
    from transformers import PretrainedConfig, PreTrainedTokenizerFast
    class EvilConfig(PretrainedConfig):
        model_type = "evil_lm"
    class EvilTokenizer(PreTrainedTokenizerFast):
        pass
""")


def evil_model(root: Path, model_type: str | None = "evil_lm", auto_map: bool = True) -> Path:
    """A model folder whose config.json points at code that writes ``$EVIL_MARKER`` when imported."""
    folder = root / "evil"
    folder.mkdir(parents=True)
    config: dict = {"architectures": ["EvilModel"]}
    if model_type is not None:
        config["model_type"] = model_type
    if auto_map:
        config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig",
                              "AutoModelForCausalLM": "modeling_evil.EvilModel",
                              "AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py"):
        (folder / name).write_text(EVIL_CODE)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "[EOS]"}))
    return folder


def evil_tokenizer(root: Path) -> Path:
    folder = root / "evil_tok"
    folder.mkdir(parents=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}))
    (folder / "tokenization_evil.py").write_text(EVIL_CODE)
    return folder


def _env(marker: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "MPLBACKEND": "Agg", "EVIL_MARKER": str(marker)}


# --------------------------------------------------------------------------- 1. no code from a model folder
LOADS = """
import sys
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification
from harness.models.lm import load_pretrained
from harness.tasks.lm.tokenizer import load_tokenizer
model, tok = sys.argv[1], sys.argv[2]
for call in (lambda: load_pretrained(AutoConfig, model), lambda: load_pretrained(AutoModelForCausalLM, model),
             lambda: load_pretrained(AutoModel, model, "lm.reward_model"),
             lambda: load_pretrained(AutoModelForSequenceClassification, model, "lm.reward_model"),
             lambda: load_tokenizer(tok), lambda: load_tokenizer(model, "lm.model")):
    try:
        call()
        print("LOADED")
    except ValueError as exc:
        print("REFUSED", exc)
"""


def test_every_load_passes_trust_remote_code_false_even_past_validate(tmp_path):
    """The loaders themselves (what the pipeline calls once validate has passed) never run a
    folder's code, even with stdin answering "y" to transformers' prompt: each refuses in one
    line naming the field."""
    marker = tmp_path / "MARKER"
    model, tok = evil_model(tmp_path), evil_tokenizer(tmp_path)
    out = subprocess.run([sys.executable, "-c", LOADS, str(model), str(tok)], cwd=tmp_path, env=_env(marker),
                         input=YES, capture_output=True, timeout=300, check=False)
    stdout = out.stdout.decode()
    assert out.returncode == 0, stdout + out.stderr.decode()
    assert not marker.exists(), "code from the model folder ran"
    lines = stdout.splitlines()
    assert len(lines) == 6 and all(ln.startswith("REFUSED lm.") for ln in lines), stdout
    assert [ln.split()[1] for ln in lines] == ["lm.model:", "lm.model:", "lm.reward_model:", "lm.reward_model:",
                                               "lm.tokenizer:", "lm.model:"]


def test_no_from_pretrained_without_trust_remote_code_false():
    """Every transformers load in the LM code goes through the two guarded loaders (or passes
    ``trust_remote_code=False`` itself)."""
    import re

    files = [REPO / "harness" / "models" / "lm.py", *sorted((REPO / "harness" / "tasks" / "lm").glob("*.py"))]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"\.from_pretrained\(", line) and "``" not in line:
                assert "trust_remote_code=False" in line, f"{path.name}:{number}: {line.strip()}"


# --------------------------------------------------------------------------- 4. stale temp folders
def _fast_build(out: Path) -> dict:
    (out / "weights.safetensors").write_text("w")
    return {"value": 1}


def _hang_build(out: Path) -> dict:
    (out / "half.safetensors").write_text("half")
    time.sleep(600)
    return {"value": 0}


def _build_and_hang(cache_dir):
    cached_stage(cache_dir, "sft", {"x": 1}, _hang_build)


def test_builder_killed_with_sigkill_leaves_no_temp_folder_for_good(tmp_path):
    """A builder killed mid-build (SIGKILL: no cleanup runs) leaves its temp folder; the next
    build of that stage, holding the stage lock, removes it and builds."""
    import multiprocessing as mp

    cache = tmp_path / "cache"
    child = mp.get_context("fork").Process(target=_build_and_hang, args=(cache,))
    child.start()
    deadline = time.time() + 60
    while not list(cache.glob(".sft-*.tmp/half.safetensors")) and time.time() < deadline:
        time.sleep(0.05)
    [stale] = list(cache.glob(".sft-*.tmp"))
    assert stale.name.endswith(f".{child.pid}.tmp")
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert stale.is_dir()  # what the killed builder left
    folder, meta, reused = cached_stage(cache, "sft", {"x": 1}, _fast_build)
    assert not reused and meta["value"] == 1 and (folder / "stage.json").is_file()
    assert not list(cache.glob(".*.tmp")), "the killed builder's temp folder is still there"


def test_temp_folders_of_other_keys_go_only_when_no_builder_holds_their_lock(tmp_path):
    import fcntl

    cache = tmp_path / "cache"
    cache.mkdir()
    free, busy, other_stage = cache / ".sft-aaaaaaaaaaaa.123.tmp", cache / ".sft-bbbbbbbbbbbb.456.tmp", \
        cache / ".rm-cccccccccccc.789.tmp"
    for tmp in (free, busy, other_stage):
        tmp.mkdir()
        (tmp / "junk").write_text("x")
        (cache / f"{tmp.name.rsplit('.', 2)[0]}.lock").touch()
    with open(cache / ".sft-bbbbbbbbbbbb.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live builder of that key
        removed = remove_stale_temps(cache, "sft", "dddddddddddd")
    assert removed == [free] and not free.exists() and busy.is_dir() and other_stage.is_dir()


def test_real_sft_build_removes_its_stale_temp_folder(tmp_path):
    cheap = ("estimator=rloo", "lm.reward=gold", "lm.sft.steps=2")
    key = build_task(compose(*cheap, results_dir=tmp_path)).meta["sft"]["key"]  # the shared test cache
    cache = tmp_path / "cache"
    stale = cache / f".sft-{key}.999999.tmp"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_text("half a model")
    task = build_task(compose(*cheap, results_dir=tmp_path, cache_dir=cache))
    assert task.meta["sft"]["key"] == key and task.meta["sft"]["cached"] is False
    assert (cache / f"sft-{key}" / "stage.json").is_file()
    assert not stale.exists() and not list(cache.glob(".*.tmp"))
