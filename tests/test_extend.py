"""docs/extending.md, followed as written: each section's titled code blocks are written into a
fresh folder and its command lines are run from the command line, at the smallest size that works
(a few overrides appended). A new estimator and a new policy loss are their function and their
YAML in a package of their own; a new claim is its entry in claims.yaml and its experiment file in
a copy of the harness, registered and judged by the commands the page names."""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "extending.md"
FENCE = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```', re.S | re.M)
TINY = ["budget.iterations=2", "progress=false", "threads=1"]


def section(heading: str) -> str:
    """The text of the page's ``## heading`` section."""
    parts = re.split(r"^## ", PAGE.read_text(), flags=re.M)
    (text,) = [p for p in parts if p.startswith(heading + "\n")]
    return text


def titled_files(text: str) -> dict[str, str]:
    """Path -> content of the code blocks with a ``title``."""
    return {title: body for _, title, body in FENCE.findall(text) if title}


def command_lines(text: str) -> list[str]:
    """The lines of the section's ``bash`` blocks."""
    return [line for lang, _, body in FENCE.findall(text) if lang == "bash" for line in body.splitlines()
            if line.strip()]


def run(line: str, cwd: Path, extra: list[str] = (), path: list[Path] = (), timeout: int = 600):
    """``line`` as a shell would run it (its leading ``VAR=value`` words are its environment; a
    relative ``PYTHONPATH`` is relative to ``cwd``), with ``extra`` arguments appended; ``python``
    is this interpreter and ``path`` goes after the line's own ``PYTHONPATH``."""
    words = shlex.split(line)
    env = {**os.environ, "MPLBACKEND": "Agg"}
    env.pop("PYTHONPATH", None)
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = str((cwd / value).resolve()) if key == "PYTHONPATH" else value
    env["PYTHONPATH"] = os.pathsep.join(x for x in [env.get("PYTHONPATH", ""), *map(str, path)] if x)
    assert words[0] == "python", line
    return subprocess.run([sys.executable, *words[1:], *extra], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def write_package(root: Path, text: str) -> None:
    """The section's files, and the two empty ``__init__.py`` the page says make ``pkg://mypkg.conf``."""
    for rel, body in titled_files(text).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    for rel in ("mypkg/__init__.py", "mypkg/conf/__init__.py"):
        (root / rel).touch()


def only_run(results: Path) -> tuple[dict, Path]:
    (summary,) = results.rglob("summary.json")
    return json.loads(summary.read_text()), summary.parent


def test_a_new_estimator_is_its_function_and_its_yaml(tmp_path):
    text = section("A new estimator")
    write_package(tmp_path, text)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "mypkg/__init__.py", "mypkg/conf/__init__.py", "mypkg/conf/estimator/centred_rank.yaml", "mypkg/estimators.py"]
    (line,) = command_lines(text)
    r = run(line, tmp_path, TINY, [REPO])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary, folder = only_run(tmp_path / "results")
    assert summary["status"] == "completed" and summary["config"]["estimator"] == "centred_rank"
    assert pq.read_table(folder / "metrics.parquet").column("iteration").to_pylist() == [1, 2]
    # centred ranks of a group of 4 (its YAML's group_size) are -1/2, -1/6, 1/6, 1/2 on every token:
    # mean 0, standard deviation sqrt((1/4 + 1/36 + 1/36 + 1/4) / 4) = sqrt(5/36)
    assert summary["final"]["adv_mean"] == pytest.approx(0.0, abs=1e-6)
    assert summary["final"]["adv_std"] == pytest.approx(math.sqrt(5 / 36), abs=1e-6)


def test_a_new_policy_loss_is_its_function_and_its_yaml_and_its_knob_a_config_key(tmp_path):
    text = section("A new policy loss")
    write_package(tmp_path, text)
    assert "mypkg/losses.py" in titled_files(text) and "mypkg/conf/policy_loss/tanh_pg.yaml" in titled_files(text)
    line, _ = command_lines(text)
    r = run(line, tmp_path, TINY, [REPO])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary, folder = only_run(tmp_path / "results")
    assert summary["status"] == "completed"
    assert summary["config"]["update"] == "tanh_pg"
    assert yaml.safe_load((folder / "config.yaml").read_text())["adv_scale"] == 0.5
    # the knob with another loss: refused, as the page says, before any run
    r = run(line.replace("policy_loss=tanh_pg", "update=pg"), tmp_path, [*TINY, "results_dir=other"], [REPO])
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert "adv_scale must be 1.0 with update=pg (it applies to update=tanh_pg)" in r.stdout
    assert not (tmp_path / "other").exists() or not list((tmp_path / "other").rglob("summary.json"))


def test_the_plugins_key_in_an_experiment_file_imports_the_loss_before_its_knob_is_read(tmp_path):
    """The experiment file names the module and sets the loss's knob: the module is imported (the
    knob joins the schema) before Hydra composes the config with it."""
    text = section("A new policy loss")
    write_package(tmp_path, text)
    _, line = command_lines(text)
    assert "plugins=" not in line
    r = run(line, tmp_path, TINY, [REPO])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "results").rglob("summary.json")]
    got = sorted((s["status"], s["config"]["estimator"], s["config"]["update"], s["config"]["seed"]) for s in runs)
    assert got == [("completed", "rloo", "tanh_pg", 0), ("completed", "rloo", "tanh_pg", 1)]
    for summary in (tmp_path / "results").rglob("summary.json"):
        assert yaml.safe_load((summary.parent / "config.yaml").read_text())["adv_scale"] == 0.5


def test_the_harness_configs_name_no_plugins():
    """What lets the command line skip the search for a ``plugins`` key without a search path of
    the user's (harness.plugins.plugins_in_configs): no YAML of the harness's own names one."""
    named = [p.relative_to(REPO).as_posix() for p in sorted((REPO / "harness" / "conf").rglob("*.yaml"))
             if isinstance(data := yaml.safe_load(p.read_text()), dict) and "plugins" in data]
    assert named == []


def test_a_new_claim_is_its_entry_and_its_experiment_file(tmp_path):
    """In a copy of the harness: the page's experiment file and claims.yaml entry, then its two
    commands: ``--register`` registers the new claim, and the confirmatory ``--run`` (which refuses
    an unregistered claim) runs its experiment and judges it."""
    text = section("A new claim")
    for package in ("harness", "analysis"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / "docs" / "claims_list.md", tmp_path / "docs" / "claims_list.md")
    files = titled_files(text)
    assert sorted(files) == ["harness/conf/claims.yaml", "harness/conf/experiment/claim_c99.yaml"]
    (tmp_path / "harness/conf/experiment/claim_c99.yaml").write_text(files["harness/conf/experiment/claim_c99.yaml"])
    claims = tmp_path / "harness/conf/claims.yaml"
    # the entry goes at the end of the file's last mapping, claims:
    claims.write_text(claims.read_text().rstrip("\n") + "\n" + files["harness/conf/claims.yaml"])
    assert yaml.safe_load(claims.read_text())["claims"]["C99"]["experiments"] == ["claim_c99"]
    register, judge = command_lines(text)
    r = run(register, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "C99: new claim, not registered" in r.stdout
    assert "C99" in json.loads((tmp_path / "harness/conf/claims_registry.json").read_text())["claims"]
    assert "\n| C99 | " in (tmp_path / "docs" / "claims_list.md").read_text()  # its row in the claims list
    r = run(judge, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "results/claims/claims_only.json").read_text())
    (verdict,) = report["verdicts"]
    assert verdict["claim"] == "C99" and verdict["parts"][0]["experiment"] == "claim_c99"
    assert verdict["n"] == "40 batches"  # the experiment file's probe.batches
    assert verdict["label"] == "supported"

