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
_OWNER = ("self", "cls")  # the names a method reaches its own object (or class) by
# public despite the underscore, so reading them is no breach: named tuples' documented methods
# and fields (the underscore keeps them from clashing with field names), and sys._getframe
# (documented in the sys module)
_PUBLIC = {"_asdict", "_field_defaults", "_fields", "_make", "_replace"}
_PUBLIC_PATHS = {"sys._getframe"}
# The one declared exception to "writes only on self": a BufferPool hands out and takes back its
# Tensors' block (Tensor._buffer, ._bin, both of netcl-core) on its hot path, where a method call
# on the Tensor cost 15% of an allocate and release (0.316 -> 0.363 us; the gate holds the pool
# within 2x of pyopencl's MemoryPool, and an H200 reads 1.86-1.94 today)
_FRIEND_WRITES = {"netcl.core.memory": {"_buffer", "_bin"}}


def _package(module: str) -> str:
    """The distribution a module belongs to: ``netcl.core`` or ``netcl.runtime.<name>``."""
    parts = module.split(".")
    return ".".join(parts[:2] if parts[1] == "core" else parts[:3])


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _bound(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body binds: assignments, ``def``/``class``, ``__slots__``."""
    names: set[str] = set()
    for stmt in body:
        for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
            if isinstance(target, ast.Name):
                names.add(target.id)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets)
            and isinstance(stmt.value, (ast.Tuple, ast.List))
        ):
            names.update(
                e.value
                for e in stmt.value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return names


def _class_privates(cls: ast.ClassDef) -> set[str]:
    """What a class defines: its body's names and every ``self._x = ...``/``cls._x = ...``."""
    names = _bound(cls.body)
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in _OWNER
        ):
            names.add(node.attr)
    return names


def _own_privates(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Per package, the names its own modules and classes define (module globals and functions,
    ``self._x = ...``, ``__slots__``, class attributes and methods): the private attributes its
    modules may read."""
    own: dict[str, set[str]] = {}
    for name, path in modules.items():
        names = own.setdefault(_package(name), set())
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names |= _bound(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names |= _class_privates(node)
    return own


def _class_scopes(tree: ast.AST) -> dict[int, set[str]]:
    """For each node (by ``id``) inside a class, the names the classes around it define: the
    private attributes it may write on another instance (``new._x = ...`` in a copy)."""
    scopes: dict[int, set[str]] = {}
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef):
            names = _class_privates(cls)
            for node in ast.walk(cls):
                scopes[id(node)] = scopes.get(id(node), set()) | names
    return scopes


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


def _sys_modules_lookup(node: ast.AST) -> str | None:
    """``sys.modules["netcl..."]`` / ``sys.modules.get("netcl...")``."""
    if isinstance(node, ast.Subscript):
        target, keys = node.value, [node.slice]
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("get", "__getitem__")
    ):
        target, keys = node.func.value, node.args[:1]
    else:
        return None
    if not (
        isinstance(target, ast.Attribute)
        and target.attr == "modules"
        and isinstance(target.value, ast.Name)
        and target.value.id == "sys"
    ):
        return None
    texts = [k.value if isinstance(k, ast.Constant) else ast.unparse(k) for k in keys]
    if any(str(t).lstrip("f'\"").startswith("netcl") for t in texts):
        return f"sys.modules lookup of a netcl module ({texts[0]})"
    return None


def _import(name: str, node: ast.AST) -> str | None:
    """An import of another package's private module or name, or of a pyopencl private module
    outside the contract (relative imports stay in the package)."""
    if isinstance(node, ast.Import):
        paths = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level:
        paths = [f"{node.module}.{a.name}" for a in node.names]
    else:
        return None
    for path in paths:
        root, *rest = path.split(".")
        if not any(map(_private, rest)):
            continue
        if root in _PYOPENCL and name != _CONTRACT:
            return f"imports a pyopencl private module outside the contract ({path})"
        if root == "netcl" and _package(path) != _package(name):
            return f"imports {path}, another package's private module or name (use its public API)"
    return None


def _attribute(
    name: str, node: ast.AST, own: set[str], scope: set[str], pyopencl: set[str]
) -> str | None:
    """A private attribute used across a seam. pyopencl's: anywhere in a chain from a pyopencl
    name (said once, at the chain's first private), or a name the contract pins, on any object.
    Another package's: a read of a name the package does not define (through ``self`` too: a
    private inherited from another package's class), a write (or ``del``) on any object but
    ``self``/``cls`` outside a class that defines the name (a copy's ``new._x = ...``)."""
    if not (isinstance(node, ast.Attribute) and _private(node.attr)):
        return None
    root, inner = node.value, []
    while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
        if isinstance(root, ast.Attribute):
            inner.append(root.attr)
        root = root.func if isinstance(root, ast.Call) else root.value
    contract_own = name == _CONTRACT
    if isinstance(root, ast.Name) and root.id in pyopencl:
        if contract_own or any(map(_private, inner)):
            return None
        return f"pyopencl private {ast.unparse(node)} outside the contract (netcl/core/contract.py)"
    if node.attr in _NAMES and not contract_own:
        return f"reaches pyopencl's private {node.attr!r} outside the contract"
    if isinstance(node.ctx, ast.Load):
        # the contract reads pyopencl's privates on pyopencl's objects: what it is there for
        if node.attr in own or node.attr in _PUBLIC or contract_own:
            return None
        if ast.unparse(node) in _PUBLIC_PATHS:
            return None
        return f"reads {ast.unparse(node)}, a private attribute its package does not define"
    if (isinstance(node.value, ast.Name) and node.value.id in _OWNER) or node.attr in scope:
        return None
    if node.attr in _FRIEND_WRITES.get(name, ()):
        return None
    return (
        f"writes {ast.unparse(node)}, another object's private attribute (only self and cls, "
        f"or another instance inside a class that defines {node.attr})"
    )


def _item_write(node: ast.AST, scope: set[str]) -> str | None:
    """``other._x[key] = ...`` (or ``del``): a write into another object's private container,
    outside a class that defines ``_x``."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del))):
        return None
    held = node.value
    if not (isinstance(held, ast.Attribute) and _private(held.attr)) or held.attr in scope:
        return None
    if isinstance(held.value, ast.Name) and held.value.id in _OWNER:
        return None
    return f"writes into {ast.unparse(held)}, another object's private attribute"


def _probe(node: ast.AST, own: set[str], scope: set[str]) -> str | None:
    """``getattr``/``hasattr`` of a private name the package does not define; ``setattr``/
    ``delattr`` of one on any object but ``self``/``cls`` outside a class that defines it."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and _private(node.args[1].value)
    ):
        return None
    attr, target = node.args[1].value, node.args[0]
    if isinstance(target, ast.Name) and target.id in _OWNER:
        return None
    if attr in (own if node.func.id in ("getattr", "hasattr") else scope):
        return None
    return f"{node.func.id}(..., {attr!r}) reaches another object's private attribute"


def seam_breaches(name: str, source: str, own: set[str]) -> list[str]:
    """What module ``name`` (of a package whose own private names are ``own``) does across a
    seam: an import of another package's private module, a ``sys.modules`` lookup of a netcl
    module, a private attribute of another package read or probed, a private attribute of
    another object written, pyopencl's private names outside the contract, a function over 80
    lines. One line per finding, with its line number."""
    tree = ast.parse(source)
    pyopencl = _aliases(tree, _PYOPENCL)
    scopes = _class_scopes(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        scope = scopes.get(id(node), set())
        for finding in (
            _sys_modules_lookup(node),
            _import(name, node),
            _attribute(name, node, own, scope, pyopencl),
            _probe(node, own, scope),
            _item_write(node, scope),
        ):
            if finding:
                found.append(f"{line}: {finding}")
        if name != _CONTRACT and isinstance(node, ast.Constant) and node.value in _NAMES:
            found.append(
                f"{line}: names pyopencl's private {node.value!r} outside the contract "
                "(a word of the contract's instead)"
            )
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
        ("from netcl.core._settings import Setting\n", "imports netcl.core._settings.Setting"),
        ("from netcl.core import _table\n", "imports netcl.core._table, another package's"),
        ("import netcl.runtime.cache._store as store\n", "imports netcl.runtime.cache._store"),
        ("from netcl.runtime.capture import _hidden\n", "another package's private module"),
        ("def f(t):\n    t._buffer = None\n", "writes t._buffer"),
        ("def f(t):\n    t._own = None\n", "writes t._own"),  # the package's name, not t's
        ("class A:\n    def f(self, t):\n        t._own = 1\n", "writes t._own"),
        ("def f(t):\n    del t._own\n", "writes t._own"),
        ("def f(t, k):\n    t._own[k] = 1\n", "writes into t._own"),
        ("def f(pool):\n    return pool._guards\n", "reads pool._guards"),
        ("class P(Pool):\n    def f(self):\n        return self._guards\n", "reads self._g"),
        ("def f(pool):\n    return pool.guards()._blocks[0]\n", "reads pool.guards()._blocks"),
        ('def f(pool):\n    return getattr(pool, "_guards", {})\n', "reaches another object's"),
        ('def f(o):\n    setattr(o, "_own", 1)\n', "setattr(..., '_own')"),
        ("import pyopencl as cl\nf = cl._cl._enqueue_read_buffer\n", "pyopencl private cl._cl"),
        ("import pyopencl as cl\nf = cl.Kernel._set_arg_buf\n", "private cl.Kernel._set_arg_buf"),
        ("import pyopencl as cl\nn = cl.Kernel(p, 'k')._wg\n", "pyopencl private cl.Kernel("),
        ("from pyopencl import Kernel\nf = Kernel._set_arg_null\n", "private Kernel._set_arg"),
        ("def f(k):\n    return k._set_arg_buf\n", "pyopencl's private '_set_arg_buf'"),
        ("import pyopencl._cl as _cl\n", "pyopencl private module"),
        ('def f(entry):\n    return entry.name == "_enqueue_copy_buffer"\n', "names pyopencl's"),
        ("def f():\n" + "    x = 1\n" * 80, "function f is 81 lines"),
    ],
)
def test_the_seam_check_names_each_breach(source: str, expected: str) -> None:
    found = seam_breaches("netcl.runtime.graph._executor", source, {"_own"})
    assert len(found) == 1 and expected in found[0], found
    assert found[0].startswith(("2:", "1:", "3:")), found


_OWN_SOURCE = """
import sys
from netcl.runtime.graph import _plan
from . import _layouts

class A:
    __slots__ = ("_x",)

    def f(self, o):
        self._x = o._own
        cls = type(self)
        new = cls.__new__(cls)
        new._x = {}
        new._x[1] = self._x[0] = o._own
        return sys.modules.get("opentelemetry.sdk")

    @classmethod
    def make(cls):
        cls._count = 0

def g(point):
    return point._replace(x=sys._getframe(1).f_lineno)._fields
"""


def test_the_seam_check_passes_a_package_s_own_privates() -> None:
    """Its own private modules imported, its own private names read on any object, its own
    objects written (``self``, ``cls``, and another instance inside the class that defines the
    name), names public despite the underscore, and the contract's use of pyopencl's privates."""
    cls = ast.parse(_OWN_SOURCE).body[3]
    assert isinstance(cls, ast.ClassDef) and _class_privates(cls) >= {"_x", "_count", "f"}
    own = {"_own", *_class_privates(cls)}  # what _own_privates finds: A's, and _own elsewhere
    assert seam_breaches("netcl.runtime.graph._executor", _OWN_SOURCE, own) == []
    contract_source = "import pyopencl as cl\nf = cl.Kernel._set_arg_buf\nn = '_set_arg_buf'\n"
    contract_source += "def raw(program):\n    return program._prg\n"
    assert seam_breaches(_CONTRACT, contract_source, set()) == []


# -- size: code lines as `ruff format` lays them out (CI checks the layout) ----------------------
# package source at the end of the sixth round (blank, comment and docstring lines are free:
# explain as much as needed)
BUDGET = 9_600
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
