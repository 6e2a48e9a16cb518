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

import pytest

from harness.tasks.lm.data import load_examples
from harness.tasks.lm.pipeline import build_task, cache_path, cached_stage, remove_stale_temps
from harness.validation import validate

from .test_lm_common import TINY, compose, one_thread  # noqa: F401  (autouse fixture)

REPO = Path(__file__).resolve().parents[1]
YES = b"y\n" * 100  # what an unattended "run the custom code? [y/N]" prompt would read
GOOD = '{"prompt": "a b c", "completion": "a"}'  # a good JSONL row

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


def one_line_error(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message, message
    return message


def _env(marker: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "MPLBACKEND": "Agg", "EVIL_MARKER": str(marker)}


def _cli(overrides: list[str], cwd: Path, marker: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *overrides], cwd=cwd, env=_env(marker), input=YES,
                          capture_output=True, timeout=300, check=False)


# --------------------------------------------------------------------------- 1. no code from a model folder
def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


CLI_CASES = ["evil_model", "evil_tokenizer", "temperature_inf", "bad_jsonl", "empty_cache_dir"]


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_refuses_bad_lm_input_with_one_line_and_exit_code_2(case, tmp_path):
    """The real command line, stdin answering "y" to any prompt: exit code 2, one
    ``invalid config: <field> ...`` line, no traceback, no code from the folder run, no run
    directory, nothing written outside results_dir (Hydra's own job log under results_dir/.hydra
    is all there may be)."""
    marker, res, inputs = tmp_path / "MARKER", tmp_path / "res", tmp_path / "inputs"
    inputs.mkdir()
    override, field = {
        "evil_model": lambda: (f"lm.model={evil_model(inputs)}", "lm.model"),
        "evil_tokenizer": lambda: (f"lm.tokenizer={evil_tokenizer(inputs)}", "lm.tokenizer"),
        "temperature_inf": lambda: ("lm.temperature=inf", "lm.temperature"),
        "bad_jsonl": lambda: (f"lm.dataset={_jsonl(inputs / 'x.jsonl', [GOOD, '[1, 2]'])}", "lm.dataset"),
        "empty_cache_dir": lambda: ("lm.cache_dir=", "lm.cache_dir"),
    }[case]()
    overrides = [*TINY, "estimator=rloo", f"results_dir={res}", f"lm.cache_dir={tmp_path / 'res' / 'cache'}", override]
    before = sorted(p.name for p in tmp_path.iterdir())
    out = _cli(overrides, tmp_path, marker)
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    assert not marker.exists(), "code from the model folder ran"
    assert out.returncode == 2, stdout + stderr
    lines = [ln for ln in stdout.splitlines() if ln.startswith("invalid config:")]
    assert len(lines) == 1 and lines[0].startswith(f"invalid config: {field}"), stdout
    assert "Traceback" not in stdout + stderr, stdout + stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({*before, "res"}), "written outside results_dir"
    assert sorted(p.name for p in res.iterdir()) == [".hydra"], "a run directory or cache was created"
    if case == "bad_jsonl":
        assert f"{inputs / 'x.jsonl'}' line 2: not a JSON object" in lines[0], lines[0]


@pytest.mark.parametrize("variant", ["auto_map_unknown_type", "unknown_type", "known_type_with_auto_map",
                                     "no_model_type", "config_not_json", "config_a_list"])
def test_crafted_model_folder_is_refused_in_validate_naming_lm_model(variant, tmp_path, monkeypatch):
    monkeypatch.setenv("EVIL_MARKER", str(tmp_path / "MARKER"))
    folder = {
        "auto_map_unknown_type": lambda: evil_model(tmp_path),
        "unknown_type": lambda: evil_model(tmp_path, auto_map=False),
        "known_type_with_auto_map": lambda: evil_model(tmp_path, model_type="gpt2"),
        "no_model_type": lambda: evil_model(tmp_path, model_type=None, auto_map=False),
        "config_not_json": lambda: evil_model(tmp_path),
        "config_a_list": lambda: evil_model(tmp_path),
    }[variant]()
    if variant == "config_not_json":
        (folder / "config.json").write_text('{"model_type": "gpt2",\n "n_layer": }')
    if variant == "config_a_list":
        (folder / "config.json").write_text("[1, 2]")
    for field in ("lm.model", "lm.reward_model"):
        with pytest.raises(ValueError) as info:
            validate(compose("estimator=rloo", f"{field}={folder}", results_dir=tmp_path))
        message = one_line_error(info)
        assert message.startswith(f"{field}: ") and str(folder) in message, message
    expected = {"auto_map_unknown_type": "custom code", "known_type_with_auto_map": "custom code",
                "unknown_type": "model_type 'evil_lm'", "no_model_type": "model_type None",
                "config_not_json": "line 2: not valid JSON", "config_a_list": "must hold a JSON object"}[variant]
    assert expected in message, message
    assert not (tmp_path / "MARKER").exists()


def test_tokenizer_folder_with_custom_code_is_refused_in_validate(tmp_path, monkeypatch):
    monkeypatch.setenv("EVIL_MARKER", str(tmp_path / "MARKER"))
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", f"lm.tokenizer={evil_tokenizer(tmp_path)}", results_dir=tmp_path))
    assert one_line_error(info).startswith("lm.tokenizer: ") and "custom code" in str(info.value)
    assert not (tmp_path / "MARKER").exists()


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


# --------------------------------------------------------------------------- 2. numeric lm.* fields
NUMERIC_CASES = [
    ("lm.temperature=inf", "lm.temperature must be a finite number > 0, got inf"),
    ("lm.temperature=nan", "lm.temperature must be a finite number > 0, got nan"),
    ("lm.temperature=-0.5", "lm.temperature must be a finite number > 0"),
    ("lm.temperature=hot", "lm.temperature must be a finite number > 0, got 'hot'"),
    ("lm.no_eos_penalty=nan", "lm.no_eos_penalty must be a finite number >= 0, got nan"),
    ("lm.no_eos_penalty=inf", "lm.no_eos_penalty must be a finite number >= 0"),
    ("lm.no_eos_penalty=-1", "lm.no_eos_penalty must be a finite number >= 0"),
    ("lm.sft.lr=nan", "lm.sft.lr must be a finite number > 0, got nan"),
    ("lm.sft.lr=0", "lm.sft.lr must be a finite number > 0"),
    ("lm.sft.lr=inf", "lm.sft.lr must be a finite number > 0"),
    ("lm.rm.lr=-1", "lm.rm.lr must be a finite number > 0, got -1"),
    ("lm.rm.lr=nan", "lm.rm.lr must be a finite number > 0"),
    ("lm.max_prompt_len=inf", "lm.max_prompt_len must be an integer >= 1, got inf"),
    ("lm.max_prompt_len=1.5", "lm.max_prompt_len must be an integer >= 1, got 1.5"),
    ("lm.max_prompt_len=0", "lm.max_prompt_len must be an integer >= 1"),
    ("lm.max_response_len=nan", "lm.max_response_len must be an integer >= 1"),
    ("lm.prompts_per_iter=0", "lm.prompts_per_iter must be an integer >= 1"),
    ("lm.eval_prompts=0", "lm.eval_prompts must be an integer >= 1"),
    ("lm.eval_samples=-2", "lm.eval_samples must be an integer >= 1"),
    ("lm.eval_samples=true", "lm.eval_samples must be an integer >= 1, got True"),
    ("lm.pipeline_seed=-1", "lm.pipeline_seed must be an integer >= 0"),
    ("lm.pipeline_seed=inf", "lm.pipeline_seed must be an integer >= 0"),
    ("lm.kl_ref_every=-1", "lm.kl_ref_every must be an integer >= 0"),
    ("lm.kl_ref_every=2.5", "lm.kl_ref_every must be an integer >= 0, got 2.5"),
    ("lm.data.train_size=0", "lm.data.train_size must be an integer >= 1"),
    ("lm.data.train_size=inf", "lm.data.train_size must be an integer >= 1"),
    ("lm.data.eval_size=0", "lm.data.eval_size must be an integer >= 1"),
    ("lm.data.min_facts=nan", "lm.data.min_facts must be an integer >= 0"),
    ("lm.data.min_facts=0", "lm.data.min_facts/max_facts must be 1 <= min_facts <= max_facts"),
    ("lm.data.max_facts=1.5", "lm.data.max_facts must be an integer >= 0"),
    ("lm.data.min_distractors=-1", "lm.data.min_distractors must be an integer >= 0"),
    ("lm.data.max_distractors=inf", "lm.data.max_distractors must be an integer >= 0"),
    ("lm.arch.n_layer=0", "lm.arch.n_layer must be an integer >= 1"),
    ("lm.arch.n_head=nan", "lm.arch.n_head must be an integer >= 1"),
    ("lm.arch.n_embd=inf", "lm.arch.n_embd must be an integer >= 1"),
    ("lm.sft.steps=-1", "lm.sft.steps must be an integer >= 0"),
    ("lm.sft.steps=nan", "lm.sft.steps must be an integer >= 0"),
    ("lm.sft.batch_size=0", "lm.sft.batch_size must be an integer >= 1"),
    ("lm.sft.warmup=-1", "lm.sft.warmup must be an integer >= 0"),
    ("lm.sft.warmup=inf", "lm.sft.warmup must be an integer >= 0"),
    ("lm.sft.eval_prompts=0", "lm.sft.eval_prompts must be an integer >= 1"),
    ("lm.rm.prompts=0", "lm.rm.prompts must be an integer >= 1"),
    ("lm.rm.samples_per_prompt=1", "lm.rm.samples_per_prompt must be an integer >= 2"),
    ("lm.rm.samples_per_prompt=inf", "lm.rm.samples_per_prompt must be an integer >= 2"),
    ("lm.rm.eval_prompts=0", "lm.rm.eval_prompts must be an integer >= 1"),
    ("lm.rm.epochs=0", "lm.rm.epochs must be an integer >= 1"),
    ("lm.rm.batch_size=nan", "lm.rm.batch_size must be an integer >= 1"),
    ("lm.rm.include_reference=maybe", "lm.rm.include_reference must be true or false"),
    ("lm.cache_dir=", "lm.cache_dir must be a non-empty path"),
    ("lm.cache_dir=null", "lm.cache_dir must be a non-empty path"),
    ("lm.columns.prompt=", "lm.columns.prompt must be a non-empty column name"),
    ("lm.splits.train=null", "lm.splits.train must be a non-empty split name"),
    ("lm.model=", "lm.model must be a local path or a hub id"),
    ("lm.dataset=", "lm.dataset must be a local path or a hub id"),
]


@pytest.mark.parametrize("override,expected", NUMERIC_CASES, ids=[c[0] for c in NUMERIC_CASES])
def test_bad_lm_values_are_refused_naming_the_field(override, expected, tmp_path):
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", override, results_dir=tmp_path))
    assert one_line_error(info).startswith(expected), str(info.value)


def test_every_numeric_lm_field_of_the_task_file_is_covered():
    """A numeric field added to harness/conf/task/lm_summarize.yaml needs a case above."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(REPO / "harness" / "conf" / "task" / "lm_summarize.yaml").lm, resolve=False)

    def numeric(prefix, n):
        for k, v in n.items():
            if isinstance(v, dict):
                yield from numeric(f"{prefix}{k}.", v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                yield f"{prefix}{k}"

    covered = {c[0].split("=")[0] for c in NUMERIC_CASES}
    assert sorted(set(numeric("lm.", node)) - covered) == []


def test_good_lm_values_pass(tmp_path):
    validate(compose("estimator=rloo", "lm.temperature=2", "lm.no_eos_penalty=0.5", "lm.sft.lr=1",
                     "lm.reward=gold", results_dir=tmp_path))


# --------------------------------------------------------------------------- 3. JSONL datasets
JSONL_CASES = [
    ([], "is empty (no rows)"),
    (["", "   "], "is empty (no rows)"),
    ([GOOD, "[1, 2]"], "line 2: not a JSON object (a list)"),
    ([GOOD, '"text"'], "line 2: not a JSON object (a string)"),
    ([GOOD, GOOD, '{"prompt": "a", "completion": '], "line 3: not valid JSON"),
    ([GOOD, "", '{"prompt": "a" "completion": "b"}'], "line 3: not valid JSON"),  # blank lines count
    ([GOOD, '{"prompt": null, "completion": "x"}'], "line 2: column 'prompt' (lm.columns.prompt) must be a string, got a null"),
    ([GOOD, GOOD, GOOD, '{"prompt": "a", "completion": null}'],
     "line 4: column 'completion' (lm.columns.summary) must be a string, got a null"),
    (['{"prompt": NaN, "completion": "x"}', GOOD], "line 1: column 'prompt' (lm.columns.prompt) must be a string, got a number"),
    (['{"prompt": ["a"], "completion": "x"}', GOOD], "line 1: column 'prompt' (lm.columns.prompt) must be a string, got a list"),
    ([GOOD, '{"prompt": "  ", "completion": "x"}'], "line 2: the prompt (column 'prompt') is blank"),
]


@pytest.mark.parametrize("lines,expected", JSONL_CASES, ids=[c[1][:30] for c in JSONL_CASES])
def test_bad_jsonl_is_refused_in_validate_naming_file_and_line(lines, expected, tmp_path):
    path = _jsonl(tmp_path / "data.jsonl", lines) if lines else tmp_path / "data.jsonl"
    if not lines:
        path.write_text("")
    cfg = compose("estimator=rloo", f"lm.dataset={path}", results_dir=tmp_path)
    with pytest.raises(ValueError) as info:
        validate(cfg)
    message = one_line_error(info)
    assert message.startswith(f"lm.dataset: {str(path)!r}"), message
    assert expected in message, message
    with pytest.raises(ValueError, match="lm.dataset"):  # the loader itself refuses it too
        load_examples(cfg.lm, 0)


def test_missing_column_and_non_utf8_name_the_line(tmp_path):
    path = _jsonl(tmp_path / "data.jsonl", [GOOD, '{"prompt": "a"}'])
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", f"lm.dataset={path}", results_dir=tmp_path))
    assert one_line_error(info).startswith(f"lm.columns: {str(path)!r} line 2 has columns ['prompt']")
    path.write_bytes(GOOD.encode() + b"\n" + b'{"prompt": "\xff\xfe"}\n')
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", f"lm.dataset={path}", results_dir=tmp_path))
    assert one_line_error(info) == f"lm.dataset: {str(path)!r} line 2: not UTF-8 text"


def test_bad_json_file_names_the_split_and_row(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"train": [json.loads(GOOD)] * 3,
                                "validation": [json.loads(GOOD), {"prompt": "x", "completion": None}]}))
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", f"lm.dataset={path}", "lm.splits.eval=validation", results_dir=tmp_path))
    assert one_line_error(info).startswith(f"lm.dataset: {str(path)!r} split 'validation' row 2: column 'completion'")
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", f"lm.dataset={path}", "lm.splits.eval=test", results_dir=tmp_path))
    assert one_line_error(info).startswith("lm.splits.eval: 'test' is not a split of")
    path.write_text('[{"prompt": "a", "completion": "b"},\n 3]')
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", f"lm.dataset={path}", results_dir=tmp_path))
    assert one_line_error(info) == f"lm.dataset: {str(path)!r} row 2: not a JSON object (a number)"
    path.write_text('[{"prompt": "a", "completion": "b"},\n {]')
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", f"lm.dataset={path}", results_dir=tmp_path))
    assert one_line_error(info).startswith(f"lm.dataset: {str(path)!r} line 2: not valid JSON")


def test_good_jsonl_keeps_its_text(tmp_path):
    path = _jsonl(tmp_path / "data.jsonl", [json.dumps({"prompt": f"doc {i}", "completion": f"s {i}"}) for i in range(6)])
    cfg = compose("estimator=rloo", f"lm.dataset={path}", results_dir=tmp_path)
    validate(cfg)
    train, held = load_examples(cfg.lm, 0)
    assert [e.prompt for e in train + held] == [f"doc {i}" for i in range(6)]
    assert [e.reference for e in train + held] == [f"s {i}" for i in range(6)]


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


# --------------------------------------------------------------------------- 5. lm.cache_dir
def test_cache_dir_expands_the_home_folder_and_never_lands_in_the_cwd(tmp_path, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    cfg = compose("estimator=rloo", "lm.reward=gold", "lm.sft.steps=2", "lm.cache_dir='~/lmcache'",  # Hydra needs ~ quoted
                  results_dir=tmp_path / "res")
    validate(cfg)
    assert cache_path(cfg.lm) == home / "lmcache"
    task = build_task(cfg)
    assert Path(task.policy_source).parent == home / "lmcache"
    assert list((home / "lmcache").glob("sft-*/stage.json"))
    assert list(work.iterdir()) == []  # no literal "~" folder, nothing in the cwd


def test_cache_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError) as info:
        validate(compose("estimator=rloo", f"lm.cache_dir={tmp_path / 'file'}", results_dir=tmp_path))
    assert one_line_error(info).startswith("lm.cache_dir: ")
