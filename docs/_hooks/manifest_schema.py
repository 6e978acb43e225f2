"""MkDocs hook: the saved format's manifest schema, generated from the records the code uses
(``netcl.runtime.capture._format``), so the docs never restate it by hand. A page that holds the
line ``<!-- manifest-schema -->`` gets, in its place, a table per record: each field, its type
with its bounds (a number's range, a text's or list's length, or the table an index points
into), and whether it may be missing. The module is read as source (``ast``): the docs
environment has none of the packages' dependencies, and nothing of it runs."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

MARKER = "<!-- manifest-schema -->"
SOURCE = Path("packages/netcl-capture/src/netcl/runtime/capture/_format.py")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    root = Path(config["docs_dir"]).resolve().parent
    return markdown.replace(MARKER, schema((root / SOURCE).read_text(encoding="utf-8")))


def schema(source: str) -> str:
    """The markdown of the schema the module ``source`` declares: its type aliases, then its
    records (classes) in the order it declares them."""
    tree = ast.parse(source)
    names: dict[str, ast.expr] = {}  # module-level names bound to one expression
    aliases: list[tuple[str, ast.expr]] = []
    records: list[ast.ClassDef] = []
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            if ast.unparse(node.annotation) == "TypeAlias":
                aliases.append((node.target.id, node.value))
            names[node.target.id] = node.value
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = zip(target.elts, node.value.elts, strict=False)
                    names.update((t.id, v) for t, v in pairs if isinstance(t, ast.Name))
                elif isinstance(target, ast.Name):
                    names[target.id] = node.value
        elif isinstance(node, ast.ClassDef) and any(
            ast.unparse(b) == "NamedTuple" for b in node.bases
        ):
            records.append(node)
    render = _Render(names, {name for name, _ in aliases})
    out = ["| Type | Is |", "| --- | --- |"]
    out += [f"| `{name}` | {render(value)} |" for name, value in aliases]
    for record in records:
        doc = " ".join((ast.get_docstring(record) or "").split()).replace("``", "`")
        out += ["", f"**`{record.name}`**: {doc}", "", "| Field | Type | Missing |"]
        out.append("| --- | --- | --- |")
        for item in record.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                kind, optional = render.optional(item.annotation)
                missing = "may be" if optional else "no"
                out.append(f"| `{item.target.id}` | {render(kind)} | {missing} |")
    return "\n".join(out) + "\n"


class _Render:
    """Annotations in words: ``Annotated[int, "sections"] | None`` is an index of
    ``sections`` that may be missing."""

    def __init__(self, names: dict[str, ast.expr], aliases: set[str]) -> None:
        self.names, self.aliases = names, aliases

    def optional(self, node: ast.expr) -> tuple[ast.expr, bool]:
        """The annotation without its ``| None``, and whether it had one."""
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.BitOr)
            and ast.unparse(node.right) == "None"
        ):
            return node.left, True
        return node, False

    def __call__(self, node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return f"`{node.id}`"
            return f"`{node.id}`" if node.id[0].isupper() else node.id
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return f"{self(node.left)} or {self(node.right)}"
        if isinstance(node, ast.Constant):
            return "missing" if node.value is None else f"`{node.value}`"
        if not isinstance(node, ast.Subscript):
            return f"`{ast.unparse(node)}`"
        outer, inner = ast.unparse(node.value), node.slice
        args = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        if outer == "Literal":
            return "one of " + ", ".join(
                f'`"{a.value}"`' for a in args if isinstance(a, ast.Constant)
            )
        if outer == "list":
            return f"list of {self(args[0])}"
        if outer == "tuple":
            return "[" + ", ".join(self(a) for a in args) + "]"
        if outer == "Annotated":
            return self._bounded(args[0], args[1])
        return f"`{ast.unparse(node)}`"

    def _bounded(self, kind: ast.expr, bounds: ast.expr) -> str:
        bounds = self.names.get(bounds.id, bounds) if isinstance(bounds, ast.Name) else bounds
        if isinstance(bounds, ast.Constant):
            return f"index of `{bounds.value}`"
        least, most = (
            (ast.unparse(b) for b in bounds.elts) if isinstance(bounds, ast.Tuple) else ("?", "?")
        )
        is_list = isinstance(kind, ast.Subscript) and ast.unparse(kind.value) == "list"
        what = "length " if is_list or ast.unparse(kind) == "str" else ""
        return f"{self(kind)}, {what}`{least}` to `{most}`"
