"""The packages' structure: no import cycle between their modules (type-only and function-level
imports count: each is a dependency a reader has to follow), no code generated at run time, seams
between packages, and the size budget counted on the formatted source.

``python tests/integration/test_structure.py`` prints each package's code lines and the total."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from netcl.core import contract

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> dict[str, Path]:
    """Every module of the packages' sources by dotted name (a package by its own name)."""
    found = {}
    for src in sorted(ROOT.glob("packages/*/src")):
        for path in src.rglob("*.py"):
            parts = path.relative_to(src).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import statement of one module, wherever it sits."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule; `from mod import name` the module
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target in modules and target != name:
                yield target, node.lineno


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    modules = _modules()
    assert "netcl.core.telemetry" in modules and "netcl.runtime.capture" in modules
    graph = {name: {t for t, _ in _imports(name, path, modules)} for name, path in modules.items()}
    assert sum(map(len, graph.values())) > 50  # the walk sees the imports at all
    cycles = _cycles(graph)
    details: list[str] = []
    for component in cycles:
        members = set(component)
        for name in component:
            for target, line in _imports(name, modules[name], modules):
                line_text = f"{modules[name].relative_to(ROOT)}:{line} imports {target}"
                if target in members and line_text not in details:
                    details.append(line_text)
    assert not cycles, "import cycles:\n" + "\n".join(details)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("call", ["exec", "eval", "compile"])
def test_no_code_generated_at_run_time(call: str) -> None:
    hits = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == call
            ):
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not hits, f"{call}() in the packages: {hits}"


# -- seams: packages meet at public API, and pyopencl's internals sit in one contract ----------
_CONTRACT = "netcl.core.contract"
_PYOPENCL = ("pyopencl",)  # module names whose private attributes only the contract may use
# pyopencl's private names the contract pins: no other module names them, not even as a string
_NAMES = {e.name for e in contract.ENTRY_POINTS if e.name.startswith("_")}


def _package(module: str) -> str:
    """The distribution a module belongs to: ``netcl.core`` or ``netcl.runtime.<name>``."""
    parts = module.split(".")
    return ".".join(parts[:2] if parts[1] == "core" else parts[:3])


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_privates(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Per package, the private names its own modules and classes define (module globals,
    ``self._x = ...``, ``__slots__``, class attributes): what its modules may write on objects
    (and modules) of its own."""
    own: dict[str, set[str]] = {}
    for name, path in modules.items():
        names = own.setdefault(_package(name), set())
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for stmt in tree.body:
            for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                if isinstance(target, ast.Name):
                    names.add(target.id)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                        if isinstance(target, ast.Name):
                            names.add(target.id)
                    if (
                        isinstance(stmt, ast.Assign)
                        and any(
                            isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
                        )
                        and isinstance(stmt.value, (ast.Tuple, ast.List))
                    ):
                        names.update(
                            e.value
                            for e in stmt.value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        )
                    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(stmt.name)
    return own


def _aliases(tree: ast.AST, roots: tuple[str, ...]) -> set[str]:
    """The local names a module binds to modules under ``roots`` (``import pyopencl as cl``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.split(".")[0] in roots
            )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in roots:
            found.update(a.asname or a.name for a in node.names)
    return found


def seam_breaches(name: str, source: str, own: set[str]) -> list[str]:
    """What module ``name`` (of a package whose own private names are ``own``) does across a
    seam: a ``sys.modules`` lookup of a netcl module, a write of (or ``getattr`` on) a private
    attribute that its package does not define, pyopencl's private names outside the contract,
    a function over 80 lines. One line per finding, with its line number."""
    tree = ast.parse(source)
    found: list[str] = []
    pyopencl = _aliases(tree, _PYOPENCL) if name != _CONTRACT else set()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        # sys.modules["netcl..."] / sys.modules.get("netcl...")
        if isinstance(node, (ast.Subscript, ast.Call)):
            target = node.value if isinstance(node, ast.Subscript) else node.func
            if (
                isinstance(node, ast.Call)
                and isinstance(target, ast.Attribute)
                and (target.attr in ("get", "__getitem__"))
            ):
                target, keys = target.value, node.args[:1]
            elif isinstance(node, ast.Subscript):
                keys = [node.slice]
            else:
                keys = []
            if (
                isinstance(target, ast.Attribute)
                and target.attr == "modules"
                and isinstance(target.value, ast.Name)
                and target.value.id == "sys"
            ):
                texts = [k.value if isinstance(k, ast.Constant) else ast.unparse(k) for k in keys]
                if any(str(t).lstrip("f'\"").startswith("netcl") for t in texts):
                    found.append(f"{line}: sys.modules lookup of a netcl module ({texts[0]})")
        # obj._private = ... on an object that is not the class's own
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in pyopencl:
                found.append(
                    f"{line}: pyopencl private {base.id}.{node.attr} outside the "
                    "contract (netcl/core/contract.py)"
                )
            elif (
                isinstance(node.ctx, ast.Store)
                and node.attr not in own
                and not (isinstance(base, ast.Name) and base.id in ("self", "cls"))
            ):
                found.append(
                    f"{line}: writes {ast.unparse(node)}, another package's private attribute"
                )
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in own
        ):
            found.append(
                f"{line}: {node.func.id}(..., {node.args[1].value!r}) probes another "
                "package's private attribute"
            )
        if name != _CONTRACT and isinstance(node, ast.Constant) and node.value in _NAMES:
            found.append(
                f"{line}: names pyopencl's private {node.value!r} outside the contract "
                "(a word of the contract's instead)"
            )
        if isinstance(node, (ast.Import, ast.ImportFrom)) and name != _CONTRACT:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" for a in node.names]
            )
            if any(
                n.startswith("pyopencl.") and any(map(_private, n.split(".")[1:])) for n in names
            ):
                found.append(f"{line}: imports a pyopencl private module outside the contract")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or line) - line + 1
            if length > 80:
                found.append(f"{line}: function {node.name} is {length} lines (at most 80)")
    return found


def test_packages_meet_at_seams() -> None:
    modules = _modules()
    own = _own_privates(modules)
    assert {"_buffer", "_bin"} <= own["netcl.core"] and "_buffer" not in own["netcl.runtime.graph"]
    breaches = [
        f"{path.relative_to(ROOT)}:{finding}"
        for name, path in modules.items()
        for finding in seam_breaches(name, path.read_text(encoding="utf-8"), own[_package(name)])
    ]
    assert not breaches, "across a seam:\n" + "\n".join(breaches)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('import sys\nm = sys.modules["netcl.core.memory"]\n', "sys.modules lookup"),
        ('import sys\nm = sys.modules.get("netcl.core.memory")\n', "sys.modules lookup"),
        ("def f(t):\n    t._buffer = None\n", "writes t._buffer"),
        ('def f(pool):\n    return getattr(pool, "_guards", {})\n', "probes another package"),
        ("import pyopencl as cl\nf = cl._cl._enqueue_read_buffer\n", "pyopencl private cl._cl"),
        ("import pyopencl._cl as _cl\n", "pyopencl private module"),
        ('def f(entry):\n    return entry.name == "_enqueue_copy_buffer"\n', "names pyopencl's"),
        ("def f():\n" + "    x = 1\n" * 80, "function f is 81 lines"),
    ],
)
def test_the_seam_check_names_each_breach(source: str, expected: str) -> None:
    found = seam_breaches("netcl.runtime.graph._executor", source, {"_own"})
    assert len(found) == 1 and expected in found[0], found
    assert found[0].startswith(("2:", "1:")), found


def test_the_seam_check_passes_a_package_s_own_privates() -> None:
    source = "import sys\nclass A:\n    def f(self, o):\n        o._own = 1\n        self._x = 2\n"
    source += '        return sys.modules.get("opentelemetry.sdk")\n'
    assert seam_breaches("netcl.runtime.graph._executor", source, {"_own"}) == []


# -- size: code lines as `ruff format` lays them out (CI checks the layout) ----------------------
BUDGET = 9_600  # package source, end of the sixth round
_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def code_lines(source: str) -> int:
    """The lines of ``source`` that hold code: blank lines, comments and docstrings (a string
    that opens a module, class or function body) are not counted, so neither layout nor an
    explanation moves the figure."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(value.lineno, (value.end_lineno or 0) + 1))
    found: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _LAYOUT and token.type != tokenize.ENDMARKER:
            found.update(range(token.start[0], token.end[0] + 1))
    return len(found - docstrings)


def _sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, path in _modules().items():
        package = _package(name)
        sizes[package] = sizes.get(package, 0) + code_lines(path.read_text(encoding="utf-8"))
    return sizes


def test_package_source_is_within_its_budget() -> None:
    total = sum(_sizes().values())
    assert total > 5_000  # the count sees the packages at all
    assert total <= BUDGET, f"package source is {total} code lines, over the budget of {BUDGET}"


def test_code_lines_leave_out_layout_comments_and_docstrings() -> None:
    source = '"""Module."""\n\n# a comment\ndef f(\n    x,\n):\n    """Doc\n    string."""\n'
    source += "    return (  # why\n        x\n    )\n"
    assert code_lines(source) == 6


if __name__ == "__main__":
    for package, lines in sorted(_sizes().items()):
        print(f"{lines:6d}  {package}")
    print(f"{sum(_sizes().values()):6d}  in all (budget {BUDGET})")
    sys.exit(0)
