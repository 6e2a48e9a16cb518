"""mkdocs hook (mkdocs.yml ``hooks:``): the docstrings use reST roles (``:func:`name```), which
mkdocstrings renders literally; show the name as code, without its role."""
from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|data|mod|meth|attr|obj|exc|const|math|ref|term):(?=<code>)")


def on_page_content(html: str, **kwargs) -> str:
    return ROLE.sub("", html)
