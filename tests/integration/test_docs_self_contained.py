"""The project's files name no document outside the repository: whatever a user needs (the
telemetry contract, measured baselines, the GPU recipe) is in the project's own READMEs and its
documentation site (docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_TEXT = {".md", ".py", ".toml", ".ini", ".txt", ".yml", ".yaml", ".cfg", ".json", ""}
_SKIP_DIRS = {"build", "dist", "node_modules", "venv"}
# Documents and tools that only ever existed outside the repository.
_OUTSIDE = re.compile(
    r"DESIGN\.md|BASELINES\.md|GPU\.md|device-env\.sh|\.whl/|\bthe spec\b|\bspec's\b"
    r"|`(?:device|run)` tool",
    re.IGNORECASE,
)


def _project_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any((p.startswith(".") and p != ".ci") or p in _SKIP_DIRS for p in rel.parts[:-1]):
            continue
        if path.is_file() and (path.suffix in _TEXT or rel.parts[0] == ".ci"):
            files.append(path)
    return files


def test_no_reference_to_documents_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    files = [f for f in _project_files() if f.resolve() != this]
    assert any(f.name == "README.md" for f in files) and any(f.suffix == ".py" for f in files)
    hits = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if m := _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {m.group(0)!r}")
    assert not hits, "references to documents outside the repository:\n" + "\n".join(hits)
