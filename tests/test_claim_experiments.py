"""A claim experiment is its file: the ``# claim experiment:`` block of
``harness/conf/experiment/<name>.yaml`` says how it runs (harness.experiments.load_experiments).

The table read from the files equals the hand table it replaced (written out below once, from
harness/experiments/__init__.py at 16a7db0: the looks are the claims' pre-registered plan); a
malformed block is one line naming the file and the field, exit 2, from both commands that read
it; and a claim added as its claims.yaml entry and its experiment file, in a copy of the
packages, is picked up (claims, plan, --quick configs) with no other edit."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness import experiments as X

REPO = Path(__file__).resolve().parents[1]

# The hand table of harness/experiments/__init__.py at 16a7db0, as it was:
# name -> (family, quick, quick_skip, isolate, opt_in, looks).
_TOY_QUICK = {"++probe.batches": "1000", "++probe.reps": "500"}
_NEW_QUICK = {"++probe.batches": "200", "++probe.reps": "200"}
_REPORTED_ONLY = "--quick skips experiments whose parts are only reported, not judged"
_CONTROL_QUICK = {"population": "2", "budget.env_steps": "4000", "eval_every_steps": "2000", "eval_episodes": "3"}
_LM = "--quick skips the LM task"
_MUJOCO_OPT_IN = ("the MuJoCo claims' experiment takes about 65 minutes in one process (10 seeds x 7 arms "
                  "x 50k Hopper steps on 2 cores)")
_TRL_QUICK = {"population": "2", "budget.tokens": "3000", "eval_every": "5", "lm.eval_prompts": "16", "lm.data.train_size": "256", "lm.sft.steps": "60", "lm.arch.n_layer": "1", "lm.arch.n_embd": "32", "lm.arch.n_head": "2"}
OLD_TABLE = {
    "claim_c3": ("toy", _TOY_QUICK, None, False, None, ()),
    "claim_c3_control": ("control", {"++probe.batches": "20"}, None, False, None, ()),
    "claim_c4": ("toy", _TOY_QUICK, None, False, None, ()),
    "claim_c5": ("toy", {**_TOY_QUICK, "gae_lambda": "0.0,1.0", "++probe.critic_noise": "0.3"}, None, False, None, ()),
    "claim_c13": ("toy", _TOY_QUICK, None, False, None, ()),
    "claim_c14": ("toy", {"++probe.batches": "200"}, None, False, None, ()),
    "claim_c17": ("toy", _TOY_QUICK, None, False, None, ()),
    "claim_c18": ("toy", {"population": "4", "loss_agg": "seq_mean_token_mean,seq_mean_token_sum_norm"}, None, False,
                  None, (20, 40)),
    "claim_c20": ("toy", {"++probe.batches": "500", "group_size": "2,8"}, None, False, None, ()),
    "claim_c20_train": ("toy", {"population": "3", "group_size": "2,8"}, None, False, None, (20, 40)),
    "claim_c22": ("toy", _TOY_QUICK, None, False, None, ()),
    "claim_c23": ("toy", _NEW_QUICK, None, False, None, ()),
    "claim_c24": ("toy", {**_NEW_QUICK, "task.episodes_per_iter": "16,256"}, None, False, None, ()),
    "claim_c25": ("toy", {**_NEW_QUICK, "group_size": "4,64"}, None, False, None, ()),
    "claim_c27": ("toy", _NEW_QUICK, None, False, None, ()),
    "claim_c26": ("toy", {"population": "3", "budget.env_steps": "1280"}, None, False, None, (120, 240)),
    "claim_c26_noclip": ("toy", {}, _REPORTED_ONLY, False, None, ()),
    "claim_c28": ("toy", {"population": "3", "budget.env_steps": "1920"}, None, False, None, (20, 40)),
    "claim_c29": ("toy", {"population": "3", "budget.env_steps": "1920"}, None, False, None, (40, 80)),
    "claim_c30": ("toy", {"population": "3", "budget.env_steps": "1920"}, None, False, None, (20, 40)),
    "claim_c31": ("toy", _TOY_QUICK, None, False, None, ()),
    "claim_c8": ("control", _CONTROL_QUICK, None, False, None, (40, 80)),
    "claim_c8_grid": ("control", {}, _REPORTED_ONLY, False, None, ()),
    "claim_c9": ("control", _CONTROL_QUICK, None, False, None, (10, 20)),
    "claim_c11": ("control", {**_CONTROL_QUICK, "ent_coef": "0.0,0.05"}, None, False, None, (10, 20)),
    "claim_c34": ("control", {}, "--quick skips the MuJoCo claims (minutes even at their smallest)", False,
                  _MUJOCO_OPT_IN, ()),
    "claim_c53": ("control", _CONTROL_QUICK, None, False, None, ()),
    "claim_c54": ("control", _CONTROL_QUICK, None, False, None, ()),
    "claim_c55": ("control", {}, "--quick skips the MuJoCo claims (minutes even at their smallest)", False,
                  "20 runs of 100k HalfCheetah steps (PPO, 20 epochs of 8 minibatches per 512 steps): about 30 "
                  "minutes on 2 cores", ()),
    "claim_c56": ("control", _CONTROL_QUICK, None, False, None, ()),
    "claim_c57": ("lm", _TRL_QUICK, None, False, None, ()),
    "claim_c58": ("lm", _TRL_QUICK, None, False, None, ()),
    "claim_c10": ("lm", {}, "--quick skips the LM task (its SFT/reward-model pipeline alone takes minutes on CPU)",
                  False, None, ()),
    "claim_c10_loss": ("lm", {}, _LM, False, None, ()),
    "claim_c15": ("lm", {}, _LM, True, None, ()),
    "claim_c19": ("lm", {}, _LM, False, None, (10, 20)),
    "claim_c18_arith": ("lm", {}, _LM, False, None, ()),
}


def test_the_experiment_files_say_what_the_hand_table_said():
    """Every field of every experiment, the quick overrides in their order (the sweep's order)."""
    read = {n: (e.family, e.quick, e.quick_skip, e.isolate, e.opt_in, e.looks) for n, e in X.EXPERIMENTS.items()}
    assert sorted(read) == sorted(OLD_TABLE)
    for name, old in OLD_TABLE.items():
        assert read[name] == old, name
        assert list(read[name][1]) == list(old[1]), name


def test_a_plain_experiment_file_is_no_claim_experiment():
    assert X.read_experiment(REPO / "harness" / "conf" / "experiment" / "quickstart.yaml") is None
    assert "quickstart" not in X.EXPERIMENTS


# ----------------------------------------------------------------------------- malformed blocks

_BODY = "defaults:\n  - override /task: toy\nseed: 0\n"


def _block(tmp_path, *lines, name="claim_x"):
    f = tmp_path / f"{name}.yaml"
    f.write_text("# @package _global_\n# a test experiment\n#\n# claim experiment:\n"
                 + "".join(f"#   {line}\n" for line in lines) + _BODY)
    return f


def test_a_block_reads_every_field(tmp_path):
    f = _block(tmp_path, "family: control", 'quick: {population: "2", ++probe.batches: "20"}',
               'quick_skip: "why not quick"', "isolate: true", 'opt_in: "a long', '  reason"', "looks: [10, 20]")
    assert X.read_experiment(f) == X.Experiment("claim_x", "control", {"population": "2", "++probe.batches": "20"},
                                                "why not quick", True, "a long reason", (10, 20))
    assert X.read_experiment(_block(tmp_path, "family: lm")) == X.Experiment("claim_x", "lm")


@pytest.mark.parametrize("lines,message", [
    (["family: vision"], "family must be one of ['toy', 'control', 'lm'], got 'vision'"),
    (["looks: [1, 2]"], "family must be one of ['toy', 'control', 'lm'], got None"),
    ([], "the claim experiment block must be a mapping of ['family', 'quick',"),
    (["family: toy", "quick: {population: 2}"], "quick.population must be a string"),
    (["family: toy", "quick: [population]"], "quick must be a mapping"),
    (["family: toy", "looks: [40, 20]"], "looks must be a list of increasing seed counts per arm, e.g. [20, 40] "
                                         "(or absent), got [40, 20]"),
    (["family: toy", "looks: [20, 20]"], "looks must be a list of increasing"),
    (["family: toy", "looks: [0, 20]"], "looks must be a list of increasing"),
    (["family: toy", "looks: 20"], "looks must be a list of increasing"),
    (["family: toy", "isolate: yes please"], "isolate must be true or false"),
    (["family: toy", "quick_skip: 3"], "quick_skip must be a sentence"),
    (["family: toy", "colour: red"], "colour must be a field among ['family', 'quick', 'quick_skip', 'isolate', "
                                     "'opt_in', 'looks'], got 'red'"),
    (["family: [toy"], "the claim experiment block must be YAML"),
])
def test_a_malformed_block_is_one_line_naming_the_file_and_the_field(tmp_path, lines, message):
    f = _block(tmp_path, *lines)
    with pytest.raises(X.BadExperimentFile) as err:
        X.read_experiment(f)
    text = str(err.value)
    assert text.startswith(f"{f}: ") and message in text and "\n" not in text


def test_two_blocks_in_one_file_are_refused(tmp_path):
    f = _block(tmp_path, "family: toy")
    f.write_text("# claim experiment:\n#   family: lm\n" + f.read_text())
    with pytest.raises(X.BadExperimentFile, match="claim experiment must be one block per file"):
        X.read_experiment(f)


# ----------------------------------------------------------------------------- in a copy of the packages

def _copy_packages(tmp_path: Path) -> Path:
    """harness/ and analysis/ (with harness/conf) copied to tmp_path/repo: what these tests add
    there, and nothing else, is what a contributor would add."""
    repo = tmp_path / "repo"
    for pkg in ("harness", "analysis"):
        shutil.copytree(REPO / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def _python(repo: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(repo)
    return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=timeout)


_BAD_LOOKS = ("harness/conf/experiment/claim_c29.yaml: looks must be a list of increasing seed counts per arm, "
              "e.g. [20, 40] (or absent), got [80, 40]")


def _break_c29(repo: Path) -> None:
    f = repo / "harness" / "conf" / "experiment" / "claim_c29.yaml"
    f.write_text(f.read_text().replace("#   looks: [40, 80]\n", "#   looks: [80, 40]\n"))


def test_the_experiments_command_refuses_a_malformed_block_with_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from harness.experiments import run as XR

    conf = tmp_path / "harness" / "conf"
    shutil.copytree(REPO / "harness" / "conf" / "experiment", conf / "experiment")
    _break_c29(tmp_path)
    monkeypatch.setattr(X, "REPO", tmp_path)
    monkeypatch.setattr(X, "CONF_DIR", conf)
    monkeypatch.setattr(X, "_EXPERIMENTS", None)  # read again, from tmp_path
    out = tmp_path / "out"
    assert XR.main(["claims", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {_BAD_LOOKS}\n"
    assert not out.exists() or not list(out.iterdir())  # nothing ran


def test_the_claims_report_refuses_a_malformed_block_with_one_line_and_exit_2(tmp_path):
    """In a subprocess (analysis.claims reads the experiments when it is imported), with --only,
    whose check imports the claims inside argparse (which turns a ValueError into its own line)."""
    repo = _copy_packages(tmp_path)
    _break_c29(repo)
    (tmp_path / "out").mkdir()
    res = _python(repo, "-m", "analysis", "claims", str(tmp_path / "out"), "--only", "C29")
    assert res.returncode == 2 and res.stderr == f"python -m analysis: error: {_BAD_LOOKS}\n", res.stderr[-2000:]
    assert not list((tmp_path / "out").iterdir())


_NEW_EXPERIMENT = """\
# @package _global_
# C99: a claim added by tests/test_claim_experiments.py (entry + this file, nothing else).
#
# claim experiment:
#   family: toy
#   quick: {population: "2", budget.env_steps: "128"}
#   looks: [3, 6]
defaults:
  - override /task: toy
  - override /estimator: grpo

hydra:
  sweeper:
    params:
      loss_agg: seq_mean_token_mean,seq_mean_token_sum_norm

std_normalize: false
update: pg
epochs: 1
minibatches: 1
lr: 0.05
seed: 0
population: 3
normalize_advantages: none
group_size: 4
task:
  env_id: varlen
  episodes_per_iter: 32
budget:
  env_steps: 320
progress: false
"""

_CHECK = """\
import json, sys
from harness import experiments as X
from analysis.claims import CLAIMS_BY_ID
from analysis.claims import registry
from analysis.claims.plan import looks_of
c = CLAIMS_BY_ID["C99"]
points = X.compose_points("claim_c99", sys.argv[1], quick=True)
print(json.dumps({"ids": X.CLAIM_IDS[-1:], "for": X.experiments_for(["C99", "C18"]),
                  "claims_of": X.claims_of("claim_c99"),
                  "family": X.EXPERIMENTS["claim_c99"].family, "looks": list(looks_of("claim_c99")),
                  "quick": X.sweep_params("claim_c99", True), "full": X.sweep_params("claim_c99", False),
                  "experiments": list(c.experiments), "changed": registry.check(),
                  "points": [[p.error, int(p.cfg.population), p.cfg.loss_agg, len(p.run_dirs)] for p in points]}))
"""


def test_a_claim_added_as_its_entry_and_its_experiment_file_is_picked_up(tmp_path):
    """In a copy of the packages: C99's claims.yaml entry (C18's test on a new experiment) and
    harness/conf/experiment/claim_c99.yaml, nothing else. The claims and the plan know it, and --quick
    composes its 2 configs with its quick overrides (2 seeds each)."""
    repo = _copy_packages(tmp_path)
    conf = repo / "harness" / "conf"
    (conf / "experiment" / "claim_c99.yaml").write_text(_NEW_EXPERIMENT)
    table = yaml.safe_load((conf / "claims.yaml").read_text())
    entry = {k: v for k, v in table["claims"]["C18"].items() if k not in ("reported", "checks")}
    entry = {**entry, "text": "a test claim", "short": "test claim", "experiments": ["claim_c99"],
             "primary": {k: v for k, v in entry["primary"].items() if k != "experiment"}}
    entry_text = yaml.safe_dump({"C99": entry}, sort_keys=False)
    text = (conf / "claims.yaml").read_text()
    assert list(yaml.safe_load(text))[-1] == "claims", "the claims are claims.yaml's last block"
    (conf / "claims.yaml").write_text(text.rstrip("\n") + "\n\n" + textwrap.indent(entry_text, "  "))

    res = _python(repo, "-c", _CHECK, str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["ids"] == ["C99"] and got["claims_of"] == ["C99"] and got["experiments"] == ["claim_c99"]
    assert got["for"] == ["claim_c99", "claim_c18", "claim_c18_arith"]  # by family: toy, then LM
    assert got["family"] == "toy" and got["looks"] == [3, 6]
    assert got["full"] == {"loss_agg": "seq_mean_token_mean,seq_mean_token_sum_norm"}
    assert got["quick"] == {"loss_agg": "seq_mean_token_mean,seq_mean_token_sum_norm", "population": "2",
                            "budget.env_steps": "128"}
    # not registered yet: a confirmatory run waits for python -m analysis claims --register
    assert "C99: new claim, not registered" in got["changed"]
    assert any(line.startswith("protocol: family changed: C99 added") for line in got["changed"]), got["changed"]
    # what `python -m harness.experiments claims DIR --quick --only C99` runs: 2 configs x 2 seeds
    assert got["points"] == [[None, 2, "seq_mean_token_mean", 2], [None, 2, "seq_mean_token_sum_norm", 2]]
