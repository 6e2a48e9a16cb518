"""docs/design.md stays true to the code: every dotted name it writes imports, every repository
path it names exists, every config key it writes is a key of the run's schema, its layers are
``.importlinter``'s, and every package of ``harness/`` and ``analysis/`` is named on it (a new
package without a line on the map fails here)."""
from __future__ import annotations

import configparser
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
DOTTED = re.compile(r"(?<![\w./-])(?:harness|analysis)(?:\.\w+)+")
PATH = re.compile(r"(?<![\w./-])(?:harness|analysis|scripts|tests|benchmarks|docs|examples)/(?:[\w./*-]|<\w+>)*[\w*/]")
CONFIG_KEY = re.compile(r"`([a-z_]+(?:\.[a-z_]+)*)(?:=[^`]*|: [^`]*\|[^`]*)`")
PACKAGE_ROOTS = ("harness", "analysis")


def resolve(name: str) -> bool:
    """Whether the dotted ``name`` is a module or an attribute of one (``harness.losses.ClipSettings``)."""
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


def layout_paths(text: str) -> list[str]:
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


def named_paths(text: str) -> set[str]:
    """Every repository path the page names: in its prose and in its layout block."""
    return set(PATH.findall(text)) | set(layout_paths(text))


def packages(root: Path = ROOT) -> list[str]:
    """Every package of the code, as a folder path: each folder with an ``__init__.py`` under
    ``harness/`` and ``analysis/`` (the two roots included)."""
    return sorted(str(init.parent.relative_to(root)) for top in PACKAGE_ROOTS
                  for init in (root / top).rglob("__init__.py"))


def unnamed_packages(text: str, folders: list[str]) -> list[str]:
    """The package folders of ``folders`` that ``text`` names neither as a path (``harness/train/``,
    ``harness/train/loop.py`` does not count) nor by dotted name (``harness.train``)."""
    paths = {p.rstrip("/") for p in named_paths(text)}
    dotted = set(DOTTED.findall(text)) | {w for w in re.findall(r"`(\w+)`", text) if w in PACKAGE_ROOTS}
    return [f for f in folders if f not in paths and f.replace("/", ".") not in dotted]


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
    paths = sorted(named_paths(text))
    assert {"harness/train/loop.py", "harness/config.py", ".importlinter", "analysis/"} <= set(paths), paths
    missing += [p for p in paths if not list(ROOT.glob(re.sub(r"<\w+>", "*", p).rstrip("/")))]
    schema = OmegaConf.structured(run_schema())
    switches = re.search(r"^Orthogonal switches.*?\n\n", text, re.S | re.M).group(0)  # every `word` a key
    keys = sorted(set(CONFIG_KEY.findall(text)) | {w for w in re.findall(r"`([a-z_]+(?:\.[a-z_]+)*)`", switches)
                                                    if not DOTTED.fullmatch(w)})
    assert {"estimator", "clip_ratio_c", "normalize_advantages", "kl.estimator"} <= set(keys), keys
    missing += [f"config key {k}" for k in keys if not has_key(schema, k)]
    assert not missing, missing


def test_every_package_is_on_the_map():
    """Each folder with an ``__init__.py`` under harness/ and analysis/ is named on docs/design.md."""
    found = packages()
    assert {"harness", "harness/train", "harness/tasks/lm", "analysis/claims"} <= set(found), found
    assert unnamed_packages(DESIGN.read_text(), found) == []


def test_the_checks_fail_on_what_does_not_exist():
    """The scanners on made-up text: a missing name, a missing key, a package left off the page."""
    assert resolve("harness.train.loop.Loop") and resolve("harness.io.schema") and resolve("analysis")
    assert not resolve("harness.losses.no_such_loss") and not resolve("harness.config.schema")
    assert not resolve("harness.tasks.toy.ToyTask.no_such_method")
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"estimator": "???", "kl": {"beta": 0.0}})
    assert has_key(cfg, "estimator") and has_key(cfg, "kl.beta") and not has_key(cfg, "kl.nope")
    assert not has_key(cfg, "kl.beta.x") and not has_key(cfg, "update")
    assert PATH.findall("`harness/conf/estimator/<name>.yaml`, harness/train/loop.py.") == \
        ["harness/conf/estimator/<name>.yaml", "harness/train/loop.py"]
    page = "## Layout\n\n```\na.toml   docs/ (site x/)\n  config.py   text\n             more text\nanalysis/   reads\n```\n"
    assert layout_paths(page) == ["a.toml", "docs/", "harness/config.py", "analysis/"]
    folders = ["analysis", "harness", "harness/io", "harness/tasks/lm", "harness/train"]
    text = page + "\n`harness` runs; `harness.tasks.lm` is one; harness/train/loop.py is a file, not the package.\n"
    assert unnamed_packages(text, folders) == ["harness/io", "harness/train"]
    assert unnamed_packages(text + "harness/io/ and `harness.train`.\n", folders) == []


def importlinter_layers() -> list[list[str]]:
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
