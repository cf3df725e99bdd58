"""Griffe extension used by the docs build (not part of the package).

The package's docstrings use reST conventions: ``:class:`Name``` roles and ``#:``
comments above module attributes. This extension turns the roles into code spans and
reads ``#:`` comments as attribute docstrings, so mkdocstrings renders them cleanly.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):`~?([^`]+)`")


def _plain(text: str) -> str:
    return _ROLE.sub(lambda match: f"``{match.group(1)}``", text)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in docstrings; read ``#:`` attribute comments."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _plain(obj.docstring.value)

    def on_attribute_instance(
        self, *, node: Any, attr: griffe.Attribute, agent: Any, **kwargs: Any
    ) -> None:
        if attr.docstring is not None or not isinstance(node, ast.AST) or attr.lineno is None:
            return
        try:
            lines = attr.lines_collection[attr.filepath]
        except (KeyError, TypeError):
            return
        comment: list[str] = []
        index = attr.lineno - 2
        while index >= 0 and lines[index].lstrip().startswith("#:"):
            comment.insert(0, lines[index].lstrip()[2:].strip())
            index -= 1
        if comment:
            attr.docstring = griffe.Docstring(
                _plain(" ".join(comment)), lineno=attr.lineno, parent=attr
            )
