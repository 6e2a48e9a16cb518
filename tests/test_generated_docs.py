"""The docs' estimator and policy-loss tables, the recipe table and docs/running.md's option lists are
written from the registries by ``python -m harness.docs --write`` (:mod:`harness.docs.tables`): the
committed text is the generated one, and a newly registered estimator or loss shows up with no hand edit."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import config
from harness.config import first_sentence
from harness.docs import tables
from harness.estimators import ESTIMATORS, register_estimator
from harness.losses import POLICY_LOSSES, NoSettings, pg_loss, register_policy_loss

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_tables_are_the_generated_ones():
    """README.md, docs/estimators.md and docs/running.md hold exactly what the generator writes (its
    blocks between their markers); else the message names the page and the command that fixes it."""
    assert set(tables.BLOCKS) == {"README.md", "docs/estimators.md", "docs/running.md", "docs/frameworks.md"}
    for page in tables.BLOCKS:
        text = (ROOT / page).read_text()
        for name in tables.BLOCKS[page]:
            assert text.count(f"<!-- {name}:start -->") == 1 and text.count(f"<!-- {name}:end -->") == 1, (page, name)
        assert tables.generated(page, text) == text, \
            f"{page}: its tables differ from the registries; run `python -m harness.docs --write`"
    assert tables.stale_pages() == []


def test_the_command_checks_the_pages():
    """``python -m harness.docs --check`` is the command CI and the message name: it runs and passes."""
    done = subprocess.run([sys.executable, "-m", "harness.docs", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_tables_show_what_the_registries_and_yamls_say():
    """Rows worked out by hand from the registrations and harness/conf/estimator/*.yaml."""
    est = tables.estimator_table(link=True).splitlines()
    assert est[0] == "| `estimator=` | needs | `update` | `normalize_advantages` | `loss_agg` | what it is |"
    assert len(est) == 2 + len(ESTIMATORS)
    row = {line.split(" | ")[0]: line for line in est[2:]}
    assert row["| [`dr_grpo`](harness/conf/estimator/dr_grpo.yaml)"] == (
        "| [`dr_grpo`](harness/conf/estimator/dr_grpo.yaml) | groups, whole episodes | `clip` | `none` | "
        "`seq_mean_token_sum_norm` | Dr. GRPO: R_i - group mean, no std (Liu et al. 2025); its YAML adds the "
        "token-sum aggregation |")
    assert " | critic | `pg` | `none` | `token_mean` | " in row["| [`a2c`](harness/conf/estimator/a2c.yaml)"]
    assert " | groups, greedy rollout, whole episodes | `pg` | `none` | " in \
        row["| [`remax`](harness/conf/estimator/remax.yaml)"]
    assert " | critic, whole episodes | `pg` | `batch` | " in row["| [`baseline`](harness/conf/estimator/baseline.yaml)"]
    assert tables.estimator_table(link=False).splitlines()[2].startswith("| `reinforce` | whole episodes | ")
    loss = tables.loss_table().splitlines()
    assert loss[2:4] == ["| `pg` | - | Vanilla policy gradient, log pi_t A_t (Williams 1992) |",
                         "| `clip` | `clip_eps=0.2`, `clip_eps_high=null`, `delta=null`, `log_ratio_clamp=null` | PPO's clipped surrogate, "
                         "min(r_t A_t, clip(r_t, 1-eps, 1+eps_high) A_t), optional `delta` cap on r_t (Schulman et al. "
                         "2017; DAPO clip-higher; INTELLECT-2) |"]
    options = tables.options_table()
    assert ("| `loss_agg=` | `token_mean`, `seq_mean_token_mean`, `seq_mean_token_sum_norm`, `token_sum`, "
            "`seq_mean_token_sum` |") in options
    assert "| `grad_clip=` | `joint`, `per_network` |" in options.splitlines()
    assert "| `logger=` | `none`, `tensorboard`, `wandb`, `mlflow` |" in options.splitlines()
    assert "lm: `lm_arith`, `lm_summarize`; toy: `toy` (`harness/conf/task/`) |" in options


@dataclasses.dataclass(frozen=True)
class _KnobSettings:
    knob_test_a: float = 0.5
    knob_test_b: int | None = None


def _median_test(scores: torch.Tensor) -> torch.Tensor:
    """Median baseline: A_i = R_i - median_j R_j (e.g. Doe et al. 2020). Not in the table."""
    return scores - scores.median(dim=1, keepdim=True).values


def _scaled_test(x, s):
    """Scaled PG on log pi(a|s) (Doe et al. 2020, eq. 3), negated: .. math:: L = -A. Not in the table."""
    return pg_loss(x, NoSettings())


def test_a_registered_estimator_and_loss_appear_with_no_hand_edit(capsys):
    """A throwaway estimator (no YAML: the schema's defaults) and a loss with two knobs of its own get
    their rows and their names in the option lists; ``--check`` then fails naming each page and the
    command. The registries are restored in place (other modules hold them by name)."""
    saved = [(reg, dict(reg)) for reg in (ESTIMATORS, POLICY_LOSSES, config.LOSS_KNOBS)]
    last_estimator, last_loss = list(ESTIMATORS)[-1], list(POLICY_LOSSES)[-1]  # the new names come after these
    try:
        register_estimator("median_test", _median_test)
        register_policy_loss("scaled_test", _scaled_test, _KnobSettings)
        readme = tables.generated("README.md", (ROOT / "README.md").read_text())
        assert ("| `median_test` | groups, whole episodes | `clip` | `minibatch` | `token_mean` | Median baseline: "
                "A_i = R_i - median_j R_j (e.g. Doe et al. 2020) |") in readme.splitlines()
        assert ("| `scaled_test` | `knob_test_a=0.5`, `knob_test_b=null` | Scaled PG on log pi(a\\|s) (Doe et al. "
                "2020, eq. 3), negated |") in readme.splitlines()
        running = tables.generated("docs/running.md", (ROOT / "docs" / "running.md").read_text())
        assert f"`{last_estimator}`, `median_test` ([table]" in running
        assert f"`{last_loss}`, `scaled_test` (the policy loss) |" in running
        assert tables.main(["--check"]) == 1
        err = capsys.readouterr().err.splitlines()
        assert err == [f"{page}: its generated tables differ from the registries; run "
                       "`python -m harness.docs --write`" for page in tables.BLOCKS
                       if page != "docs/frameworks.md"]  # the recipe page reads the recipe files, not the registries
    finally:
        for reg, before in saved:
            reg.clear()
            reg.update(before)
    assert "median_test" not in ESTIMATORS and "scaled_test" not in POLICY_LOSSES
    assert "knob_test_a" not in config.LOSS_KNOBS
    assert tables.main(["--check"]) == 0


@pytest.mark.parametrize("doc, sentence", [
    ("PPO's clipped surrogate (Schulman et al. 2017, eq. 7), negated. .. math:: L = x", "PPO's clipped surrogate "
     "(Schulman et al. 2017, eq. 7), negated"),
    ("Pass@k: best member only, e.g. Chen et al. 2025. The rest get 0.", "Pass@k: best member only, e.g. Chen et al. 2025"),
    ("Uses i.e. Adam here. ``x`` is the input.", "Uses i.e. Adam here"),
    ("A one-liner.", "A one-liner"),
    ("", ""),
])
def test_first_sentence_stops_at_the_sentence_not_at_an_abbreviation(doc, sentence):
    def f():
        pass

    f.__doc__ = doc
    assert first_sentence(f) == sentence


def test_the_recipe_table_has_one_row_per_recipe_file_from_its_block_and_keys():
    """docs/frameworks.md's recipe rows: one per file of harness/conf/recipe/, the framework, source and
    difference of its '# recipe:' block, and the values the file sets (worked out by hand for one)."""
    files = sorted(p.stem for p in (ROOT / "harness" / "conf" / "recipe").glob("*.yaml"))
    rows = tables.recipe_table().splitlines()[2:]
    assert sorted(r.split(" | ")[0][len("| `recipe="):-1] for r in rows) == files
    row = next(r for r in rows if r.startswith("| `recipe=verl_remax` |"))
    cells = row.split(" | ")
    assert cells[1] == "verl" and "b178a3cd56f58b2d502255daba591e92833930a7" in cells[3] and cells[4] == "`remax`"
    assert ("`update=dual_clip` `clip_eps=0.2` `clip_eps_high=null` `clip_ratio_c=3.0` `loss_agg=token_mean` "
            "`epochs=1` `ent_coef=0.0` `normalize_advantages=none` `kl.target=ref` `kl.beta=0.001` `kl.estimator=k1` "
            "`kl.in_reward=true` `kl.log_ratio_clamp=null` `kl.value_clamp=null` `kl.greedy_penalty=false`") == cells[5]
    assert "reward_baselines" in cells[6]


def test_a_recipe_without_its_block_is_refused(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("# @package _global_\n# recipe:\n#   framework: verl\nupdate: clip\n")
    with pytest.raises(ValueError, match="x.yaml: its recipe block lacks 'algorithm'"):
        tables.read_recipe(bad)
