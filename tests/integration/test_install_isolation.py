"""Each distribution installs and imports alone: netcl-core by itself, and every runtime package
with netcl-core only, never pulling or seeing its siblings. Builds real wheels and installs them
into a fresh virtual environment (dependencies come from the package index)."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ["cache", "graph", "capture", "scheduler"]
PUBLIC = {
    "cache": ["ProgramCache", "cacher"],
    "graph": ["Graph", "GraphExecutor", "TensorRef"],
    "capture": ["KernelCapture", "capture_disabled", "get_capture"],
    "scheduler": ["Scheduler", "ExecutionPlan"],
}

pytestmark = pytest.mark.slow


def _run(*cmd: str | Path) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    for pkg in ["core", *RUNTIME]:
        _run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, ROOT / f"packages/netcl-{pkg}")
    return dist


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Path:
    where = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    py = where / "bin" / "python"
    _run(py, "-m", "pip", "install", "-q", "--find-links", wheels, "netcl-core[pocl]")
    return py


def _probe(py: Path, code: str) -> str:
    return _run(py, "-c", code).strip()


def test_core_alone(env: Path) -> None:
    names = _probe(
        env,
        "import importlib.util as u; import netcl.core.memory, netcl.core.tensor;"
        "print([n for n in ['cache','graph','capture','scheduler']"
        " if u.find_spec('netcl.runtime.' + n) is not None])",
    )
    assert names == "[]"
    out = _run(env.parent / "netcl", "info")
    assert "netcl-core 0.1.0" in out and "netcl-cache" not in out


@pytest.mark.parametrize("pkg", RUNTIME)
def test_runtime_package_alone_with_core(env: Path, wheels: Path, pkg: str) -> None:
    py = env
    _run(py, "-m", "pip", "install", "-q", "--find-links", wheels, f"netcl-{pkg}")
    try:
        listed = _run(py, "-m", "pip", "list", "--format=freeze")
        installed = {line.split("==")[0] for line in listed.splitlines() if line.startswith("netcl")}
        assert installed == {"netcl-core", f"netcl-{pkg}"}
        names = ", ".join(PUBLIC[pkg])
        siblings = [s for s in RUNTIME if s != pkg]
        out = _probe(
            py,
            f"from netcl.runtime.{pkg} import {names}; import importlib.util as u;"
            f"print([s for s in {siblings!r} if u.find_spec('netcl.runtime.' + s)])",
        )
        assert out == "[]"
    finally:
        _run(py, "-m", "pip", "uninstall", "-q", "-y", f"netcl-{pkg}")
