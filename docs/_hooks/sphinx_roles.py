"""Griffe extension: the packages' docstrings name objects with Sphinx roles
(``:class:`ProgramCache```, ``:func:`~netcl.core.telemetry.error_type```), which mkdocstrings
would print as they are. Each becomes the name in code, linked to its reference entry when the
name resolves (in the scope of the object whose docstring it is) to an object the reference
shows; otherwise (a private helper, another library) it stays code without a link."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([\w.]+)`")


def _path(obj: griffe.Object, name: str) -> str | None:
    head, _, rest = name.partition(".")
    try:
        base = obj.resolve(head) if not name.startswith("netcl.") else head
    except (griffe.NameResolutionError, ValueError):
        return None
    return f"{base}.{rest}" if rest else base


def _convert(obj: griffe.Object, text: str) -> str:
    def replace(m: re.Match[str]) -> str:
        short, name = m[1], m[2]
        shown = name.rsplit(".", 1)[-1] if short else name
        path = _path(obj, name)
        if path is None:
            return f"`{shown}`"
        # autorefs links it when the reference has the object, and leaves plain code when not
        return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'

    return _ROLE.sub(replace, text)


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None:
                obj.docstring.value = _convert(obj, obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)  # type: ignore[misc]
