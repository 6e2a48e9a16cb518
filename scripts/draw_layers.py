"""Draw the layers of ``.importlinter`` for docs/design.md: ``python scripts/draw_layers.py``.

Reads the ``layers`` contract of ``.importlinter`` (the one list of layers, checked by
``lint-imports`` in tests/test_layers.py), writes ``docs/figures/layers.svg`` (one row of boxes per
layer, top to bottom, imports pointing down) and the same layers as a table between the
``layers`` markers of docs/design.md (:func:`harness.docs.write_block`). Run it after
changing the layers; tests/test_design_doc.py checks the page and the picture against ``.importlinter``.

The SVG keeps its text as text (``svg.fonttype: none``) and carries no date or random ids, so the
same layers give the same file.
"""
from __future__ import annotations

import configparser
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = "importlinter:contract:layers"
PAGE = "docs/design.md"
FIGURE = ROOT / "docs" / "figures" / "layers.svg"
STAMP = "Written by `python scripts/draw_layers.py` from `.importlinter`."  # no date: the same layers, the same page


def read_layers(path: Path = ROOT / ".importlinter") -> list[list[str]]:
    """The layers of ``path``'s layers contract, top to bottom, each a list of module names
    (import-linter's ``a : b`` puts independent modules in one layer)."""
    parser = configparser.ConfigParser()
    parser.read_string(path.read_text())
    lines = [line.strip() for line in parser[CONTRACT]["layers"].splitlines() if line.strip()]
    return [[m.strip() for m in line.split(":")] for line in lines]


def layers_table(layers: list[list[str]]) -> str:
    """The markdown table of docs/design.md's ``layers`` block."""
    rows = [f"| {i} | {', '.join(f'`{m}`' for m in layer)} |" for i, layer in enumerate(layers, 1)]
    return "\n".join(["| layer | modules |", "| --- | --- |", *rows])


def draw(layers: list[list[str]], out: Path = FIGURE) -> Path:
    """One row per layer (top: imports from every row below it), boxes of its modules, arrows down."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "layers"})
    per_row = 4  # modules per line of a row's box
    heights = [0.42 + 0.28 * ((len(layer) - 1) // per_row + 1) for layer in layers]
    gap = 0.45
    total = sum(heights) + gap * (len(layers) - 1)
    fig = Figure(figsize=(10, total + 0.3))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.15, total + 0.15)
    ax.axis("off")
    top = total
    for i, (layer, h) in enumerate(zip(layers, heights)):
        y = top - h
        ax.add_patch(FancyBboxPatch((0.3, y), 9.4, h, boxstyle="round,pad=0,rounding_size=0.08",
                                    facecolor=f"C{i}", alpha=0.18, edgecolor=f"C{i}", linewidth=1.5))
        ax.text(0.45, y + h - 0.08, f"layer {i + 1}", ha="left", va="top", fontsize=9, color="0.3")
        lines = [layer[k:k + per_row] for k in range(0, len(layer), per_row)]
        for j, chunk in enumerate(lines):
            ax.text(5.0, y + h - 0.34 - 0.28 * j, "    ".join(chunk), ha="center", va="center",
                    fontsize=11, family="monospace")
        if i < len(layers) - 1:
            ax.add_patch(FancyArrowPatch((5.0, y - 0.02), (5.0, y - gap + 0.02), arrowstyle="-|>",
                                         mutation_scale=14, color="0.35", linewidth=1.2))
            ax.text(5.15, y - gap / 2, "imports", ha="left", va="center", fontsize=8, color="0.35")
        top = y - gap
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="svg", metadata={"Date": None})
    return out


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from harness.docs import write_block

    layers = read_layers()
    print(draw(layers).relative_to(ROOT))
    print(write_block(PAGE, "layers", layers_table(layers), stamp=STAMP).relative_to(ROOT))


if __name__ == "__main__":
    main()
