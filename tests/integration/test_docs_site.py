"""The documentation site builds in strict mode (a broken link, a missing reference or a
docstring warning fails it) and its API reference covers every public name: each name in the
``__all__`` of every public module of the five packages is in the built site's inventory
(mkdocstrings' ``objects.inv``), and every public module has a reference page. The built site
has a guide per package with code (``docs/guides/<name>.md``), and the repository files its pages
show (the dashboards' screenshots) are published with it."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def public_modules() -> dict[str, list[str] | None]:
    """Every public module of the packages (no part starting with ``_``; ``version`` aside) by
    dotted name, with its ``__all__`` (None when it declares none), read from source."""
    found: dict[str, list[str] | None] = {}
    for src in sorted(ROOT.glob("packages/*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if any(p.startswith("_") for p in parts) or parts[-1] == "version":
                continue
            names = None
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "__all__"
                ):
                    names = list(ast.literal_eval(node.value))
            found[".".join(parts)] = names
    return found


def inventory_names(objects_inv: Path) -> set[str]:
    """The object names of a Sphinx inventory (version 2: four header lines, then zlib)."""
    header, _, body = objects_inv.read_bytes().partition(b"zlib.\n")
    assert header.startswith(b"# Sphinx inventory version 2"), header[:60]
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


def test_public_modules_are_found_and_declare_all() -> None:
    modules = public_modules()
    assert {"netcl.core.device", "netcl.runtime.cache", "netcl.runtime.scheduler"} <= set(modules)
    # netcl.core itself re-exports nothing: its submodules are the API
    missing = sorted(m for m, names in modules.items() if names is None and m != "netcl.core")
    assert not missing, f"public modules without __all__ (what does the reference show?): {missing}"


def test_every_public_module_has_a_reference_page() -> None:
    directives = {
        line.removeprefix(":::").strip()
        for page in REFERENCE.glob("*.md")
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith(":::")
    }
    needed = {m for m, names in public_modules().items() if names}
    assert needed <= directives, (
        f"no `::: module` page under docs/reference/ (and mkdocs.yml's nav) for "
        f"{sorted(needed - directives)}"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_site_builds_strict_and_documents_every_public_name(tmp_path: Path) -> None:
    if not all(importlib.util.find_spec(name) for name in ("mkdocs", "mkdocstrings")):
        reason = "mkdocs and mkdocstrings are not installed (hatch run docs:build has them)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true requires the docs build: {reason}", pytrace=False)
        pytest.skip(reason)
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-5000:]}"
    documented = inventory_names(site / "objects.inv")
    missing = sorted(
        f"{module}.{name}"
        for module, names in public_modules().items()
        for name in names or ()
        if f"{module}.{name}" not in documented
    )
    assert not missing, f"public names missing from the API reference: {missing}"
    packages = [p.parent.name.removeprefix("netcl-") for p in ROOT.glob("packages/*/src")]
    assert len(packages) == 5, packages
    no_guide = sorted(p for p in packages if not (site / "guides" / f"{p}.html").is_file())
    assert not no_guide, f"no guide page (docs/guides/<name>.md, in the nav) for {no_guide}"
    for shot in ("observability/console.png", "observability/timeline.png"):
        assert (site / "repo" / shot).is_file(), f"{shot}, linked from a page, is not published"
