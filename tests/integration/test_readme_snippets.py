"""Every ```python block of every README in the repository and of every page of the
documentation site (docs/) runs verbatim, each in a fresh Python process with a fresh HOME (so a
fresh netcl program cache), on the default device.

A block that must not run (an excerpt, a fragment) is fenced ```python no-run: renderers still
highlight it as Python, this test leaves it out. Keep those rare: README code is for copying.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SKIP_DIRS = {".git", ".venv", "venv", "node_modules", ".benchmarks", "build", "dist"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]  # a README block may run 600 s


class Block(NamedTuple):
    readme: Path
    line: int  # 1-based line of the opening fence
    info: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.readme.relative_to(ROOT).as_posix()}:{self.line}"


def _readmes() -> list[Path]:
    """Every README.md of the repository and every Markdown page under docs/."""
    found = []
    for path in [*ROOT.rglob("README.md"), *(ROOT / "docs").rglob("*.md")]:
        rel = path.relative_to(ROOT)
        if not any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            found.append(path)
    return sorted(set(found))


def code_blocks(readme: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (CommonMark fences: ``` or ~~~, 3 or more)."""
    blocks: list[Block] = []
    lines = readme.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None or ("`" in m["info"] and m["fence"][0] == "`"):
            i += 1
            continue
        start, fence, indent = i, m["fence"], len(m["indent"])
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if (
                close
                and close["fence"][0] == fence[0]
                and len(close["fence"]) >= len(fence)
                and not close["info"].strip()
            ):
                break
            line = lines[i]
            # CommonMark: drop up to the fence's own indentation from every content line
            body.append(line[min(indent, len(line) - len(line.lstrip())) :])
            i += 1
        blocks.append(Block(readme, start + 1, m["info"].strip(), "\n".join(body)))
        i += 1
    return blocks


def _runnable(block: Block) -> bool:
    return block.info.split() == ["python"]


ALL_BLOCKS = [b for r in _readmes() for b in code_blocks(r)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if _runnable(b)]


def test_blocks_are_found() -> None:
    # The root README and every package README with code to show (netcl-runtime has none)
    # show runnable code: a parser or discovery bug that finds nothing must not pass silently.
    readmes = {b.readme.relative_to(ROOT).as_posix() for b in PYTHON_BLOCKS}
    expected = {"README.md"} | {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "packages").glob("*/README.md")
        if (p.parent / "src").is_dir()
    }
    assert expected <= readmes, f"README(s) without a runnable python block: {expected - readmes}"


def test_code_blocks_parser(tmp_path: Path) -> None:
    md = tmp_path / "README.md"
    md.write_text(
        "text\n```python\ndef f():\n    return 1\n```\n"
        "\n- item\n\n  ```python no-run\n  y = 2\n  ```\n"
        "````python\n```\nnot a fence end\n````\n~~~\nplain\n~~~\n"
    )
    blocks = code_blocks(md)
    assert [(b.line, b.info, b.code) for b in blocks] == [
        (2, "python", "def f():\n    return 1"),
        (9, "python no-run", "y = 2"),
        (12, "python", "```\nnot a fence end"),
        (16, "", "plain"),
    ]
    assert [_runnable(b) for b in blocks] == [True, False, True, False]


def _netcl_imports(code: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "netcl" or n.startswith("netcl.")}


def test_package_blocks_need_only_their_install() -> None:
    # A package README's install line installs that package and netcl-core only: its examples
    # must not import a sibling package.
    for block in PYTHON_BLOCKS:
        rel = block.readme.relative_to(ROOT)
        if rel.parts[0] != "packages":
            continue
        pkg = rel.parts[1].removeprefix("netcl-")
        own = "netcl.core" if pkg == "core" else f"netcl.runtime.{pkg}"
        allowed = ("netcl.core", own)
        foreign = {
            n
            for n in _netcl_imports(block.code)
            if not any(n == a or n.startswith(a + ".") for a in allowed)
        }
        assert not foreign, f"{block.id}: imports {sorted(foreign)}, not installed with {pkg}"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_readme_python_block_runs(block: Block, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NETCL_", "XDG_", "OTEL_"))}
    env["HOME"] = str(home)
    script = tmp_path / "snippet.py"
    script.write_text(block.code + "\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"{block.id}: the python block failed (exit {proc.returncode})\n--- code\n{block.code}\n"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )
