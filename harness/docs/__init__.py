"""Generated blocks of the docs pages: written by the code that knows their content, never typed.

A page marks the place of each block with a pair of HTML comments::

    <!-- control-learning:start -->
    ...
    <!-- control-learning:end -->

and its writer calls :func:`write_block`, which replaces what lies between them with a line naming
the command (and the date, unless the block gives its own ``stamp``), then the markdown. Everything
outside the markers is left as it is. The writers: ``python -m harness.docs --write`` (the tables of
the registries, :mod:`harness.docs.tables`), the benchmark scripts run with ``--docs`` (their
measurements) and ``python scripts/draw_layers.py`` (the layers of docs/design.md).

The pages are the repository's (:data:`ROOT`, the checkout this package sits in): these writers run
in a checkout, not from an installed wheel. Importing this module imports nothing of the harness.
"""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: harness/docs/ is two folders in


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def this_command(argv: list[str] | None = None) -> str:
    """The command line that ran this script, its path relative to the repository when inside it."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    if script.is_relative_to(ROOT):
        argv[0] = str(script.relative_to(ROOT))
    return "python " + " ".join(shlex.quote(a) for a in argv)


def page_path(page: str | Path) -> Path:
    """``page``, a relative path taken from the repository root."""
    page = Path(page)
    return page if page.is_absolute() else ROOT / page


def with_block(text: str, name: str, markdown: str, stamp: str, where: object = "the page") -> str:
    """``text`` with what lies between the ``name`` markers replaced by ``stamp``, a blank line and
    ``markdown``. Raises ``ValueError`` naming ``where`` when the markers are missing."""
    start, end = markers(name)
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{where}: no {start} ... {end} markers")
    return f"{text[:i]}{start}\n{stamp}\n\n{markdown.strip()}\n{end}{text[j + len(end):]}"


def write_block(page: str | Path, name: str, markdown: str, command: str | None = None,
                date: str | None = None, stamp: str | None = None) -> Path:
    """Replace the ``name`` block of the markdown file ``page`` (relative paths: from the repository
    root) by ``markdown``, stamped ``Written by `command` on date.``; ``command`` defaults to this
    process's command line, ``date`` to today (``stamp``: that line instead, for a block that must
    not change from one day to the next). Raises ``ValueError`` when the page lacks the markers."""
    page = page_path(page)
    if stamp is None:
        stamp = f"Written by `{command or this_command()}` on {date or time.strftime('%Y-%m-%d')}."
    new = with_block(page.read_text(), name, markdown, stamp, where=page)
    fd, tmp = tempfile.mkstemp(dir=page.parent, prefix=f".{page.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, page)
    return page
