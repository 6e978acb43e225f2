"""Every distribution: one version source (``version.py`` is what the build reads, what
``__version__`` exports and what the telemetry scopes report) and the MIT LICENSE shipped;
netcl-runtime, with no code, at netcl-core's version, an extra per component."""

from __future__ import annotations

import contextlib
import importlib
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import netcl.core
from netcl.core import telemetry

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "netcl-core": "netcl.core",
    "netcl-cache": "netcl.runtime.cache",
    "netcl-graph": "netcl.runtime.graph",
    "netcl-capture": "netcl.runtime.capture",
    "netcl-scheduler": "netcl.runtime.scheduler",
}
META = "netcl-runtime"  # no code: netcl-core, and the components chosen by extra


@pytest.mark.parametrize(("dist", "module"), PACKAGES.items())
def test_version_is_the_installed_distributions(dist: str, module: str) -> None:
    mod = importlib.import_module(module)
    try:
        installed = version(dist)
    except PackageNotFoundError:  # sources on PYTHONPATH, nothing installed: no metadata to match
        pytest.skip(f"{dist} is not installed")
    assert mod.__version__ == installed
    assert mod.__version__ == importlib.import_module(f"{module}.version").__version__
    assert mod.__version__.count(".") == 2 and mod.__version__ != "0.0.0"


def test_telemetry_scope_carries_the_package_version(spans: InMemorySpanExporter) -> None:
    with telemetry.Scope("netcl.test", netcl.core.__version__).span("netcl.test.scope"):
        pass
    (span,) = spans.get_finished_spans()
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.version == netcl.core.__version__


def test_scheduler_span_scope_version(spans: InMemorySpanExporter) -> None:
    from netcl.runtime.scheduler import Scheduler, __version__

    sched = Scheduler()
    sched.submit(lambda: None)
    sched.run()
    scopes = {
        s.instrumentation_scope.version
        for s in spans.get_finished_spans()
        if s.instrumentation_scope is not None
    }
    assert scopes == {__version__}


@pytest.mark.parametrize(("dist", "module"), PACKAGES.items())
def test_pyproject_reads_the_one_version_source(dist: str, module: str) -> None:
    text = (ROOT / "packages" / dist / "pyproject.toml").read_text()
    assert not re.search(r"^version\s*=", text, re.MULTILINE), "a second version source"
    assert 'dynamic = ["version"]' in text
    path = "src/" + module.replace(".", "/") + "/version.py"
    assert f'[tool.hatch.version]\npath = "{path}"' in text
    assert (ROOT / "packages" / dist / path).is_file()


def test_runtime_has_cores_version_and_an_extra_per_component() -> None:
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "packages" / META / "pyproject.toml").read_text())["project"]
    assert project["version"] == netcl.core.__version__
    with contextlib.suppress(PackageNotFoundError):  # installed: the metadata says the same
        assert version(META) == project["version"]
    versions = {d: importlib.import_module(f"{m}.version").__version__ for d, m in PACKAGES.items()}
    (core,) = map(Requirement, project["dependencies"])
    extras = {
        e: [Requirement(r) for r in reqs] for e, reqs in project["optional-dependencies"].items()
    }
    components = {d.removeprefix("netcl-") for d in PACKAGES} - {"core"}
    assert set(extras) == components | {"all"}
    for req in [core, *(r for c in components for r in extras[c])]:
        assert req.specifier.contains(versions[req.name]), f"{req} refuses {versions[req.name]}"
    assert {c: [r.name for r in extras[c]] for c in components} == {
        c: [f"netcl-{c}"] for c in components
    }
    (everything,) = extras["all"]
    assert everything.name == META and everything.extras == components


@pytest.mark.parametrize("dist", [*PACKAGES, META])
def test_distribution_ships_the_license(dist: str) -> None:
    root_license = (ROOT / "LICENSE").read_text()
    assert root_license.startswith("MIT License\n\nCopyright (c) 2026 the netcl authors\n")
    # hatchling puts the project folder's LICENSE into the sdist and the wheel's dist-info
    assert (ROOT / "packages" / dist / "LICENSE").read_text() == root_license
    text = (ROOT / "packages" / dist / "pyproject.toml").read_text()
    assert 'license = "MIT"' in text and 'license-files = ["LICENSE"]' in text
