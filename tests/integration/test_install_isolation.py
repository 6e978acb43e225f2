"""Each distribution installs and imports alone: netcl-core by itself, and every runtime package
with netcl-core only, never pulling or seeing its siblings. Builds real wheels and installs them
into a fresh virtual environment (dependencies come from the package index)."""

from __future__ import annotations

import json
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

# building five wheels and a virtual environment (module fixtures) counts against the first test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _run(*cmd: str | Path) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    for pkg in ["core", *RUNTIME]:
        src = ROOT / f"packages/netcl-{pkg}"
        _run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, src)
    return dist


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Path:
    where = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    py = where / "bin" / "python"
    _run(py, "-m", "pip", "install", "-q", "--find-links", wheels, "netcl-core[pocl]")
    return py


def _importable(py: Path, modules: list[str], setup: str = "") -> list[str]:
    """The modules of ``modules`` that import in the venv of ``py`` (after running ``setup``)."""
    code = (
        f"{setup}\nimport importlib, json\nok = []\n"
        f"for m in {modules!r}:\n"
        "    try:\n        importlib.import_module(m)\n    except ModuleNotFoundError:\n"
        "        continue\n    ok.append(m)\nprint(json.dumps(ok))"
    )
    return list(json.loads(_run(py, "-c", code)))


def test_core_alone(env: Path) -> None:
    setup = "import netcl.core.memory, netcl.core.tensor, netcl.core.telemetry, netcl.core.log"
    assert _importable(env, [f"netcl.runtime.{s}" for s in RUNTIME], setup) == []
    out = _run(env.parent / "netcl", "info")
    assert "netcl-core 0.1.0" in out and "netcl-cache" not in out


@pytest.mark.parametrize("pkg", RUNTIME)
def test_runtime_package_alone_with_core(env: Path, wheels: Path, pkg: str) -> None:
    py = env
    _run(py, "-m", "pip", "install", "-q", "--find-links", wheels, f"netcl-{pkg}")
    try:
        listed = _run(py, "-m", "pip", "list", "--format=freeze")
        installed = {ln.split("==")[0] for ln in listed.splitlines() if ln.startswith("netcl")}
        assert installed == {"netcl-core", f"netcl-{pkg}"}
        names = ", ".join(PUBLIC[pkg])
        siblings = [s for s in RUNTIME if s != pkg]
        setup = f"from netcl.runtime.{pkg} import {names}"
        assert _importable(py, [f"netcl.runtime.{s}" for s in siblings], setup) == []
    finally:
        _run(py, "-m", "pip", "uninstall", "-q", "-y", f"netcl-{pkg}")
