"""The documentation (issue 17): README.md stays short and points into the docs; every link into
the repository resolves; the mkdocs site builds with ``--strict`` (a warning, a broken link or
anchor, a page left out of the nav, or a docstring griffe cannot parse fails it); every result
table a benchmark script writes has its markers on its page."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 170
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (their brackets are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (what mkdocs uses for anchors)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "").replace("*", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", _prose_keep_headings(page.read_text()), re.M)}


def _prose_keep_headings(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def test_readme_is_under_the_limit_and_keeps_its_generated_blocks():
    text = (ROOT / "README.md").read_text()
    n = len(text.splitlines())
    assert n < README_LIMIT, f"README.md has {n} lines; the limit is {README_LIMIT} (move detail into docs/)"
    for name in ("lm-compare", "claims-summary"):
        assert text.count(f"<!-- {name}:start -->") == 1 and text.count(f"<!-- {name}:end -->") == 1, name
    assert "<!-- claims-table:start -->" not in text  # the table lives in docs/claims.md
    claims = (ROOT / "docs" / "claims.md").read_text()
    assert claims.count("<!-- claims-table:start -->") == 1 and claims.count("<!-- claims-table:end -->") == 1


def test_every_link_into_the_repository_resolves():
    broken = []
    for page in markdown_files():
        for target in LINK.findall(_prose(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http(s), mailto: outside the repository
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or not dest.is_relative_to(ROOT):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def test_the_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A title\n\n[ok](p.md#a-title) [bad](missing.md) `[not a link](x.md)`\n"
                    "```\n[also not](y.md)\n```\n")
    found = LINK.findall(_prose(page.read_text()))
    assert found == ["p.md#a-title", "missing.md"] and _anchors(page) == {"a-title"}
    assert _slug("The arithmetic task (`task=lm_arith`)") == "the-arithmetic-task-tasklm_arith"


def test_every_benchmark_block_has_its_markers_on_its_page():
    """A script run with --docs writes its table between markers its page must have."""
    calls = []
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        calls += re.findall(r"write_block\('([^']+)', '([^']+)'", script.read_text())
    assert len(calls) >= 7, calls
    for page, name in calls:
        text = (ROOT / page).read_text()
        assert text.count(f"<!-- {name}:start -->") == 1 and text.count(f"<!-- {name}:end -->") == 1, (page, name)


def test_write_block_replaces_only_between_its_markers(tmp_path):
    from harness.docs import this_command, write_block

    page = tmp_path / "page.md"
    page.write_text("# Page\n\nbefore\n<!-- t:start -->\nold | table\n<!-- t:end -->\nafter\n")
    write_block(page, "t", "| a |\n| --- |\n| 1 |\n", command="python benchmarks/x.py --docs", date="2026-12-01")
    assert page.read_text() == ("# Page\n\nbefore\n<!-- t:start -->\nWritten by `python benchmarks/x.py --docs` on "
                                "2026-12-01.\n\n| a |\n| --- |\n| 1 |\n<!-- t:end -->\nafter\n")
    write_block(page, "t", "| b |", command="c", date="d")  # again: still one block
    assert page.read_text().count("<!-- t:start -->") == 1 and "| a |" not in page.read_text()
    with pytest.raises(ValueError, match="no <!-- other:start -->"):
        write_block(page, "other", "x")
    assert this_command([str(ROOT / "benchmarks" / "lm_gain.py"), "res dir", "--docs"]) == \
        "python benchmarks/lm_gain.py 'res dir' --docs"


def test_mujoco_table_takes_the_zoo_evaluation_at_the_largest_logged_step_not_above_the_budget():
    sys.path.insert(0, str(ROOT))
    import pandas as pd

    from benchmarks.mujoco_learning import REFERENCE, published_at

    ref = pd.DataFrame({"env": ["A", "A", "A", "B"], "timesteps": [25_000, 50_000, 75_000, 50_000],
                        "mean": [1.0, 2.0, 3.0, 9.0], "min": [0.0] * 4, "max": [5.0] * 4})
    assert published_at(ref, "A", 60_000)["mean"] == 2.0  # 50k: the last logged step before 60k, not 75k
    assert published_at(ref, "A", 75_000)["mean"] == 3.0 and published_at(ref, "B", 100_000)["mean"] == 9.0
    assert published_at(ref, "A", 20_000) is None
    # the committed file: the zoo's HalfCheetah-v3 run at 100k, as read from its evaluations.npz by hand
    zoo = published_at(pd.read_csv(REFERENCE, comment="#"), "HalfCheetah-v3", 100_000)
    assert (zoo["timesteps"], zoo["episodes"], zoo["mean"], zoo["min"], zoo["max"]) == \
        (100_000, 20, 2779.4, 2690.4, 2838.5)


def test_mkdocs_builds_strictly(tmp_path):
    """``mkdocs build --strict`` into a temporary folder: any warning fails (CI installs mkdocs with
    the test extra; elsewhere the test is skipped unless PG_HARNESS_REQUIRE_DOCS is set)."""
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("PG_HARNESS_REQUIRE_DOCS"):
            pytest.fail("mkdocs is not installed (pip install -c constraints.txt -e '.[docs]')")
        pytest.skip("mkdocs not installed (the docs and test extras install it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True)
    log = out.stdout + out.stderr
    print(f"mkdocs build --strict: {time.time() - t0:.1f} s")
    assert out.returncode == 0, log
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "site" / "api" / "losses" / "index.html").read_text().count("clipped_surrogate_loss") > 1


# ------------------------------------------------------------------ docs/design.md stays true (issue 38)

DESIGN = ROOT / "docs" / "design.md"
DOTTED = re.compile(r"(?<![\w./-])(?:harness|analysis)(?:\.\w+)+")
PATH = re.compile(r"(?<![\w./-])(?:harness|analysis|scripts|tests|benchmarks|docs|examples)/(?:[\w./*-]|<\w+>)*[\w*/]")
CONFIG_KEY = re.compile(r"`([a-z_]+(?:\.[a-z_]+)*)(?:=[^`]*|: [^`]*\|[^`]*)`")


def resolve(name: str) -> bool:
    """Whether the dotted ``name`` is a module or an attribute of one (``harness.losses.ClipSettings``)."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as exc:
            if exc.name != ".".join(parts[:i]) and not ".".join(parts[:i]).startswith(f"{exc.name}."):
                raise  # the module exists but imports something missing: not this test's finding
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def has_key(cfg, dotted: str) -> bool:
    """Whether ``cfg`` has the (dotted) key, its value set or not (``estimator`` is ``???``)."""
    for part in dotted.split("."):
        if not hasattr(cfg, "keys") or part not in cfg.keys():
            return False
        cfg = cfg._get_node(part)
    return True


def design_layout_paths(text: str) -> list[str]:
    """The files and folders of design.md's layout block: the first word of each line (entries two
    spaces in are under ``harness/``), and every word of its first line outside parentheses."""
    block = re.search(r"^## Layout\n.*?^```\n(.*?)^```", text, re.S | re.M).group(1)
    lines = block.splitlines()
    out = [w for w in re.sub(r"\([^)]*\)", "", lines[0]).split()]
    for line in lines[1:]:
        if m := re.match(r"^  (\S+)", line):
            out.append(f"harness/{m.group(1)}")
        elif m := re.match(r"^(\S+)", line):
            out.append(m.group(1))
    return out


def test_every_name_and_path_in_design_md_exists():
    """Every ``harness.x.y`` / ``analysis.x`` name written in docs/design.md imports (a module, or an
    attribute of one), every repository path in it exists (a glob matches something), every entry of
    its layout block exists, and every config key it writes as ``key=value`` or ``key: a | b`` is a key
    of the run's schema (``harness.config.run_schema``, with the losses' knobs)."""
    from omegaconf import OmegaConf

    import harness.losses  # noqa: F401  (registers the losses: their knobs are in the schema)
    from harness.config import run_schema

    text = DESIGN.read_text()
    names = sorted(set(DOTTED.findall(text)))
    assert len(names) > 40, names  # the scan sees the page's names
    missing = [n for n in names if not resolve(n)]
    paths = sorted(set(PATH.findall(text)) | set(design_layout_paths(text)))
    assert {"harness/train/control.py", "harness/config.py", ".importlinter"} <= set(paths), paths
    missing += [p for p in paths if not list(ROOT.glob(re.sub(r"<\w+>", "*", p).rstrip("/")))]
    schema = OmegaConf.structured(run_schema())
    switches = re.search(r"^Orthogonal switches.*?\n\n", text, re.S | re.M).group(0)  # every `word` a key
    keys = sorted(set(CONFIG_KEY.findall(text)) | {w for w in re.findall(r"`([a-z_]+(?:\.[a-z_]+)*)`", switches)
                                                    if not DOTTED.fullmatch(w)})
    assert {"estimator", "clip_ratio_c", "normalize_advantages", "kl.estimator"} <= set(keys), keys
    missing += [f"config key {k}" for k in keys if not has_key(schema, k)]
    assert not missing, missing


def test_the_names_check_fails_on_a_name_that_does_not_exist():
    assert resolve("harness.train.loop.Loop") and resolve("harness.io.schema") and resolve("analysis")
    assert not resolve("harness.losses.no_such_loss") and not resolve("harness.config.schema")
    assert not resolve("harness.tasks.toy.ToyTask.no_such_method")
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"estimator": "???", "kl": {"beta": 0.0}})
    assert has_key(cfg, "estimator") and has_key(cfg, "kl.beta") and not has_key(cfg, "kl.nope")
    assert not has_key(cfg, "kl.beta.x") and not has_key(cfg, "update")
    assert PATH.findall("`harness/conf/estimator/<name>.yaml`, harness/train/loop.py.") == \
        ["harness/conf/estimator/<name>.yaml", "harness/train/loop.py"]
    assert design_layout_paths("## Layout\n\n```\na.toml   docs/ (site x/)\n  config.py   text\n"
                               "             more text\nanalysis/   reads\n```\n") == \
        ["a.toml", "docs/", "harness/config.py", "analysis/"]


def importlinter_layers() -> list[list[str]]:
    import configparser

    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    lines = [line for line in parser["importlinter:contract:layers"]["layers"].splitlines() if line.strip()]
    return [[m.strip() for m in line.split(":")] for line in lines]


def test_design_md_layers_are_importlinter_layers():
    """The layers table of docs/design.md (top to bottom) is the layers contract of .importlinter."""
    text = DESIGN.read_text()
    block = text[text.index("<!-- layers:start -->"):text.index("<!-- layers:end -->")]
    rows = re.findall(r"^\| (\d+) \| (.*) \|$", block, re.M)
    assert [int(i) for i, _ in rows] == list(range(1, len(rows) + 1))
    assert [re.findall(r"`([^`]+)`", mods) for _, mods in rows] == importlinter_layers()


def test_the_layers_figure_shows_importlinter_layers():
    """docs/figures/layers.svg (drawn by scripts/draw_layers.py, which the page names) shows each layer's
    modules under its 'layer N' label, top to bottom, as .importlinter lists them."""
    text = DESIGN.read_text()
    assert "](figures/layers.svg)" in text and "`python scripts/draw_layers.py`" in text
    svg = (ROOT / "docs" / "figures" / "layers.svg").read_text()
    texts = sorted((float(y), s) for y, s in re.findall(r'<text [^>]*\by="([-\d.]+)"[^>]*>([^<]*)</text>', svg))
    shown: list[list[str]] = []
    for _, s in texts:
        if re.fullmatch(r"layer \d+", s):
            assert int(s.split()[1]) == len(shown) + 1, s
            shown.append([])
        elif s != "imports":
            shown[-1] += s.split()
    assert shown == importlinter_layers()
