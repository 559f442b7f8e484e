"""A griffe extension for the API pages: the docstrings' Sphinx roles (``:class:`X```,
``:meth:`~a.b```) become inline code, since mkdocstrings renders them literally and the
same docstrings serve ``help()`` and the IDEs, where the roles read as intended."""

from __future__ import annotations

import re
from typing import Any

import griffe

__all__ = ["SphinxRoles", "plain_roles"]

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|const|ref):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    """``:class:`~pkg.Name``` → ```Name```; ``:meth:`pkg.Name.m``` → ```pkg.Name.m```."""
    return _ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
