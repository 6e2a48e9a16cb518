"""``python -m analysis probes``: the probe runs' bias and variance, readable without code."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.cli import main
from harness.app import run
from tests.control_helpers import make_cfg

PROBE = ["task=toy", "mode=probe", "++probe.batches=200", "++probe.reps=100", "progress=false", "threads=1"]


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Three toy probe runs: reinforce and rloo at batch size 64, reinforce at 16."""
    root = tmp_path_factory.mktemp("probes")
    for est, size in (("reinforce", 64), ("rloo", 64), ("reinforce", 16)):
        run(make_cfg([*PROBE, f"estimator={est}", f"task.episodes_per_iter={size}", f"results_dir={root}"]))
    return root


def table_rows(page: str, heading: str) -> list[dict[str, str]]:
    """The first table under ``## heading``: one ``{column: cell}`` per row."""
    section = page.split(f"## {heading}\n", 1)[1].lstrip("\n")
    lines = section.split("\n\n", 1)[0].splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in x.strip("|").split("|")))) for x in lines[2:]]


def test_the_tables_hold_each_runs_statistics_grouped_by_batch_size(probes, capsys):
    assert main(["probes", str(probes)]) == 0
    assert capsys.readouterr().out.strip() == f"probes: {probes / 'probes' / 'probes.md'}"
    page = (probes / "probes" / "probes.md").read_text()
    raw = pd.concat([pd.read_parquet(p) for p in probes.rglob("probe.parquet")])
    raw = raw[raw["scope"] == "all"]
    sizes = sorted(raw["batch_size"].unique())
    assert len(sizes) == 2  # the batch size is a setting of the probe: one section each
    for size in sizes:
        rows = table_rows(page, f"task=toy · target=policy_gradient · batch_size={size} · samples_per_batch={size}")
        want = raw[raw["batch_size"] == size].sort_values("rel_total_var")
        assert [r["estimator"] for r in rows] == list(want["estimator"])  # ordered by relative variance
        for cells, (_, r) in zip(rows, want.iterrows()):
            assert cells["rel. variance"] == f"{r.rel_total_var:.4g} [{r.rel_total_var_low:.4g}, {r.rel_total_var_high:.4g}]"
            assert cells["rel. bias²"] == f"{r.rel_bias_sq:.4g} [{r.rel_bias_sq_low:.4g}, {r.rel_bias_sq_high:.4g}]"
    assert (probes / "probes" / "probes.png").stat().st_size > 10_000


def test_an_unfinished_probe_run_is_left_out_with_its_reason(probes, tmp_path):
    import shutil

    shutil.copytree(probes, tmp_path / "r")
    victim = next((tmp_path / "r").rglob("probe.parquet")).parent
    summary = json.loads((victim / "summary.json").read_text())
    (victim / "summary.json").write_text(json.dumps({**summary, "status": "running"}))
    assert main(["probes", str(tmp_path / "r")]) == 0
    left = (tmp_path / "r" / "probes" / "probes.md").read_text().split("## Left out\n", 1)[1]
    assert str(victim) in left


def test_a_folder_without_probe_runs_is_refused_in_one_line(tmp_path, capsys):
    assert main(["probes", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: no finished probe run (a run folder with probe.parquet, from mode=probe) under {tmp_path}"]
    assert not (tmp_path / "probes").exists()
