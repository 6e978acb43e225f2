"""Each distribution installs alone from the folder of wheels `hatch run dist` builds: pip finds
netcl-core there by itself, a runtime package brings netcl-core only (never a sibling, which
does not import), netcl-runtime's extras bring the components chosen and no other, and `netcl
--version` lists exactly what is installed. One fresh virtual environment: the third-party
dependencies come from the package index once, then every install takes the netcl wheels from
the folder alone (``--no-index``) and is undone after its test."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import venv
from collections.abc import Callable, Iterator
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

# building the wheels and a virtual environment (module fixtures) counts against the first test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

Install = Callable[..., dict[str, str]]


def _run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=900, cwd=cwd, env=env
    )
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _netcl(py: Path) -> dict[str, str]:
    """The netcl distributions installed in the venv of ``py``: name -> version."""
    listed = json.loads(_run(py, "-m", "pip", "list", "--format=json"))
    return {d["name"]: d["version"] for d in listed if d["name"].startswith("netcl-")}


@pytest.fixture(scope="module")
def py(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    return where / "bin" / "python"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory, py: Path) -> Path:
    """The folder ``hatch run dist DIR`` fills: hatch.toml's script, through the shell as hatch
    runs it, with the venv's Python; then the wheels' third-party dependencies, from the index
    with that folder as pip's find-links, the netcl ones uninstalled again."""
    tomllib = pytest.importorskip("tomllib")
    dist = tmp_path_factory.mktemp("dist")
    script = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]["default"]["scripts"]
    command = script["dist"].replace("{args:dist}", shlex.quote(str(dist)))
    path = f"{py.parent}{os.pathsep}{os.environ['PATH']}"
    _run("sh", "-c", command, cwd=ROOT, env={**os.environ, "PATH": path})
    built = sorted(p.name.split("-")[0] for p in dist.glob("*.whl"))
    assert built == sorted(f"netcl_{p}" for p in ["core", "runtime", *RUNTIME])
    pip = [py, "-m", "pip", "-q"]
    _run(*pip, "install", "--find-links", dist, "netcl-runtime[all]", "netcl-core[pocl]")
    _run(*pip, "uninstall", "-y", *_netcl(py))
    return dist


@pytest.fixture
def install(py: Path, wheels: Path) -> Iterator[Install]:
    """Install requirements from the wheels alone; the netcl distributions then installed.
    Everything netcl is uninstalled after the test."""

    def install(*requirements: str) -> dict[str, str]:
        _run(py, "-m", "pip", "-q", "install", "--no-index", "--find-links", wheels, *requirements)
        return _netcl(py)

    yield install
    if installed := _netcl(py):
        _run(py, "-m", "pip", "-q", "uninstall", "-y", *installed)


def _importable(py: Path, modules: list[str], setup: str = "") -> list[str]:
    """The modules of ``modules`` that import in the venv of ``py`` (after running ``setup``)."""
    code = (
        f"{setup}\nimport importlib, json\nok = []\n"
        f"for m in {modules!r}:\n"
        "    try:\n        importlib.import_module(m)\n    except ModuleNotFoundError:\n"
        "        continue\n    ok.append(m)\nprint(json.dumps(ok))"
    )
    return list(json.loads(_run(py, "-c", code)))


def _listed(py: Path) -> dict[str, str]:
    """What ``netcl --version`` lists: name -> version."""
    lines = _run(py.parent / "netcl", "--version").splitlines()
    return dict(line.split(" ", 1) for line in lines)


def _components_alone(py: Path, chosen: list[str]) -> None:
    """The chosen components' public names import; the other components do not."""
    setup = "\n".join(f"from netcl.runtime.{p} import {', '.join(PUBLIC[p])}" for p in chosen)
    others = [f"netcl.runtime.{p}" for p in RUNTIME if p not in chosen]
    assert _importable(py, others, setup) == []


def test_core_alone(py: Path, install: Install) -> None:
    assert set(install("netcl-core[pocl]")) == {"netcl-core"}
    setup = "import netcl.core.memory, netcl.core.tensor, netcl.core.telemetry, netcl.core.log"
    assert _importable(py, [f"netcl.runtime.{s}" for s in RUNTIME], setup) == []
    out = _run(py.parent / "netcl", "info")
    assert "netcl-core 0.1.0" in out and "netcl-cache" not in out


@pytest.mark.parametrize("pkg", RUNTIME)
def test_runtime_package_brings_core_alone(py: Path, install: Install, pkg: str) -> None:
    installed = install(f"netcl-{pkg}")  # netcl-core: found in the folder, not named
    assert set(installed) == {"netcl-core", f"netcl-{pkg}"}
    assert _listed(py) == installed
    _components_alone(py, [pkg])


@pytest.mark.parametrize(
    ("extras", "chosen"),
    [
        ("", []),
        ("[cache]", ["cache"]),
        ("[cache,capture]", ["cache", "capture"]),
        ("[all]", RUNTIME),
    ],
)
def test_runtime_extras_install_the_chosen_components(
    py: Path, install: Install, extras: str, chosen: list[str]
) -> None:
    installed = install(f"netcl-runtime{extras}")
    assert set(installed) == {"netcl-runtime", "netcl-core", *(f"netcl-{p}" for p in chosen)}
    assert _listed(py) == installed
    _components_alone(py, chosen)
