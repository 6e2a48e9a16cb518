"""Issue 36 item 7: sizes that passed validation and failed on allocation.

Every size a run allocates with is bounded by what the machine holds
(:func:`harness.config.memory_bytes`), through one lower estimate per task family of the memory a
run holds at once (:func:`harness.config.check_fits`): the control networks and an iteration's
samples (:func:`harness.validation.check_control_memory`), the toy task's sampled sequences
(:func:`harness.tasks.toy.validate_toy`), the embedded LM's weights and hidden states
(:func:`harness.tasks.lm.validate.check_embedded_memory`) and the generated LM corpora
(:func:`harness.tasks.lm.validate.validate_lm`). A config past it is refused before any
work starts, exit 2, one line naming the field at fault and the largest value that fits.

The table runs against a machine of exactly 1 GiB (``memory_bytes`` stood in for), so the largest
value that fits is worked out by hand in each row's comment; each boundary row checks that the
value one below passes. The issue's own example runs through the real command line on this machine.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import app, config
from harness.validation import validate

from .control_helpers import make_cfg

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
TINY_CONTROL = ["task=cartpole", "estimator=a2c", "budget.iterations=1", "budget.env_steps=null", "task.num_envs=2",
                "task.rollout_steps=8", "task.hidden=[8]", "eval_every=0", "threads=1", "progress=false"]
TOY = ["task=toy", "estimator=rloo", "group_size=2", "threads=1", "progress=false"]
LM = ["task=lm_summarize", "estimator=rloo", "lm.arch.n_embd=128", "lm.arch.n_head=4", "lm.arch.n_layer=2",
      "lm.max_prompt_len=64", "lm.max_response_len=16", "lm.prompts_per_iter=8", "group_size=8", "threads=1",
      "progress=false"]

# CartPole: 4 observation numbers, 2 actions; a2c has a critic, so 2 networks a member.
# One MLP 4 -> H -> 2 has 5H + 2(H + 1) parameters; 16 bytes each (weight, gradient, Adam's two moments).
# A step of an iteration's samples: 4 bytes x (4 obs + 1 action + 4 scalars) = 36 bytes.
# (id, overrides, field named, largest value that fits, value that must pass (or None))
CASES = [
    # networks: H = 2**23 makes 5H + 2(H+1) = 58720258 parameters; 1 GiB / (2 x 16) = 33554432 a network
    ("control_hidden", [*TINY_CONTROL, f"task.hidden=[{2**23}]"], "task.hidden",
     "at most 33554432 parameters a network (an actor and a critic per member, 16 bytes a parameter); these widths "
     "make 58720258", None),
    # population: H = 2048: 14338 parameters, 2 x 14338 x 16 + 2 x 8 x 36 = 459392 bytes a member; 2**30 // 459392
    ("control_population", [*TINY_CONTROL, "task.hidden=[2048]", "population=4096"], "population",
     "at most 2337 here", "population=2337"),
    # samples: H = 8: 58 parameters, 2 x 58 x 16 = 1856 bytes; (2**30 - 1856) // (64 envs x 36) = 466032 steps
    ("control_rollout_steps", [*TINY_CONTROL, "task.num_envs=64", "task.rollout_steps=2147483647"],
     "task.rollout_steps", "at most 466032 here", "task.rollout_steps=466032"),
    # toy preset mixed: 3 tokens a sequence, 12 bytes a token: 2**30 // 36 = 29826161 sequences
    ("toy_episodes_per_iter", [*TOY, "task.episodes_per_iter=2147483646"], "task.episodes_per_iter",
     "at most 29826161 here", "task.episodes_per_iter=29826160"),
    # embedded LM, 80 tokens, 64 sequences an iteration: 16 (12 d^2 L + 80 d) + 4 x 64 x 80 x d x L bytes.
    # d = 128: 16 x 12 x 128^2 L + 16 x 80 x 128 + 4 x 64 x 80 x 128 L = 5767168 L + 163840 <= 2**30 gives L <= 186
    ("lm_n_layer", [*LM, "lm.arch.n_layer=2147483647"], "lm.arch.n_layer", "at most 186 here", "lm.arch.n_layer=186"),
    # L = 2: 16 (24 d^2 + 80 d) + 4 x 64 x 80 x d x 2 = 384 d^2 + 42240 d <= 2**30 gives d <= 1618
    ("lm_n_embd", [*LM, "lm.arch.n_embd=1048576"], "lm.arch.n_embd", "at most 1618 here", None),
    # L = 2, d = 128: 16 (24 x 128^2 + 80 x 128) = 6455296 bytes of weights, 4 x 8 x 80 x 128 x 2 = 655360 a prompt:
    # (2**30 - 6455296) // 655360 = 1628
    ("lm_prompts_per_iter", [*LM, "lm.prompts_per_iter=2147483647"], "lm.prompts_per_iter", "at most 1628 here",
     "lm.prompts_per_iter=1628"),
    # generated corpora: 200 bytes an example at least; 2**30 // 200 = 5368709 examples, eval_size 256 / 64 included
    ("lm_arith_train_size", ["task=lm_arith", "estimator=rloo", "lm.arith.train_size=2147483647",
                             "lm.arith.eval_size=256", "threads=1", "progress=false"], "lm.arith.train_size",
     "at most 5368453 here", "lm.arith.train_size=20000"),
    ("lm_data_train_size", [*LM, "lm.data.train_size=2147483647", "lm.data.eval_size=64"], "lm.data.train_size",
     "at most 5368645 here", "lm.data.train_size=5368645"),
]


def test_the_smallest_generated_example_holds_at_least_example_bytes():
    """The bound on generated corpora counts :data:`EXAMPLE_BYTES` an example: never more than the
    smallest one holds (a one-character prompt and reference), measured with ``sys.getsizeof``."""
    from harness.tasks.lm.arith import Problem
    from harness.tasks.lm.corpus import Example
    from harness.tasks.lm.validate import EXAMPLE_BYTES

    for example in (Example("a", "b"), Problem("a", "b", answer=0, canonical=(0,))):
        held = (sys.getsizeof(example) + sys.getsizeof(vars(example)) + sys.getsizeof(example.prompt)
                + sys.getsizeof(example.reference))
        assert held >= EXAMPLE_BYTES, (type(example).__name__, held)


@pytest.fixture
def one_gib(monkeypatch):
    monkeypatch.setattr(config, "memory_bytes", lambda: GIB)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_size_past_the_machine_is_refused_by_name_before_any_work(case, one_gib, tmp_path, capsys):
    _, overrides, field, allowed, _ = case
    res = tmp_path / "res"
    cfg = make_cfg([*overrides, f"results_dir={res}", f"lm.cache_dir={tmp_path / 'cache'}"] if "lm" in case[0]
                   else [*overrides, f"results_dir={res}"])
    with pytest.raises(ValueError):  # first, so that a size let through fails here rather than training at it
        validate(cfg)
    with pytest.raises(SystemExit) as info:
        app.main_entry(cfg)
    out = capsys.readouterr().out
    assert info.value.code == 2, out
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"invalid config: {field} must be "), out
    assert allowed in lines[0], lines[0]
    assert "this machine holds 1 GiB" in lines[0] or "this machine's 1 GiB" in lines[0], lines[0]
    assert not res.exists() and not (tmp_path / "cache").exists()


BOUNDARY = [c for c in CASES if c[4] is not None]


@pytest.mark.parametrize("case", BOUNDARY, ids=[c[0] for c in BOUNDARY])
def test_the_largest_value_that_fits_passes(case, one_gib, tmp_path):
    _, overrides, _, _, fits = case
    extra = [f"lm.cache_dir={tmp_path / 'cache'}"] if "lm" in case[0] else []
    validate(make_cfg([*overrides, fits, f"results_dir={tmp_path / 'res'}", *extra]))


def test_the_issue_example_through_the_command_line(tmp_path):
    """``task.hidden=[2147483647]`` (the schema's bound, 2**31 - 1) on this machine: 2 networks of
    5 x (2**31 - 1) + 2 x 2**31 = 15032385531 parameters, 16 bytes each (481 GB): one line, exit 2,
    no traceback, no run folder (Hydra's job log under results_dir/.hydra is all there may be)."""
    res = tmp_path / "res"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-m", "harness", *TINY_CONTROL, "task.hidden=[2147483647]",
                          f"results_dir={res}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("invalid config:")]
    assert len(lines) == 1 and lines[0].startswith("invalid config: task.hidden must be layer widths"), out.stdout
    assert "these widths make 15032385531, got [2147483647]" in lines[0], lines[0]
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert sorted(p.name for p in res.iterdir()) == [".hydra"]
