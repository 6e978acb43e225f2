"""`netcl config` lists every NETCL_* setting the code reads, with value and source; the code
reads them only through those declarations. `netcl cache zero` resets the statistics only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from netcl.core import device
from netcl.runtime.cache import ProgramCache, _config

NETCL = str(Path(sys.executable).with_name("netcl"))
PACKAGES = Path(__file__).resolve().parents[2] / "packages"
SRC = "__kernel void f(__global int *a) { a[0] = 2; }"


def _netcl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NETCL_")}
    return subprocess.run(
        [NETCL, *args], capture_output=True, text=True, timeout=120, env={**clean, **(env or {})}
    )


def _settings(env: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    proc = _netcl("config", "--json", env=env)
    return {d["name"]: d for d in json.loads(proc.stdout)["settings"]}


def test_every_netcl_variable_in_the_code_is_listed() -> None:
    named = set()
    for path in PACKAGES.glob("*/src/**/*.py"):
        text = path.read_text()
        named |= set(re.findall(r"\bNETCL_[A-Z_]*[A-Z]\b", text))
        # read only through the declarations, so the code and `netcl config` agree
        assert not re.search(r"(environ\.get|getenv|environ\[)\(?\s*\"NETCL_", text), path
    listed = _settings()
    assert named - {"NETCL_CACHE"} <= set(listed), named - set(listed)
    assert {
        "NETCL_POOL_LIMIT",
        "NETCL_PROFILE",
        "NETCL_CACHE_MAX_BYTES",
        "NETCL_CACHE_DIR",
        "PYOPENCL_CTX",
    } <= set(listed)
    assert all(d["source"] == "default" for d in listed.values())


def test_values_sources_and_invalid_values(tmp_path: Path) -> None:
    env = {
        "NETCL_CACHE_DIR": str(tmp_path),
        "NETCL_POOL_LIMIT": "50%",
        "NETCL_CACHE_REMOTE": "redis://user:pw@example.invalid:6379/0",
        "NETCL_CACHE_REMOTE_KEY": "s3cret",
    }
    got = _settings(env)
    assert got["NETCL_CACHE_DIR"]["value"] == str(tmp_path)
    assert got["NETCL_CACHE_DIR"]["source"] == "environment"
    assert got["NETCL_POOL_LIMIT"]["value"] == "50%" and got["NETCL_POOL_LIMIT"]["error"] is None
    assert got["NETCL_PROFILE"]["source"] == "default"
    text = _netcl("config", env=env).stdout
    assert "s3cret" not in text and "pw@" not in text and "redis://***@" in text
    assert text.splitlines()[0].split() == ["SETTING", "VALUE", "SOURCE", "PACKAGE"]

    bad = _netcl("config", env={"NETCL_CACHE_MAX_BYTES": "10X", "NETCL_PROFILE": "maybe"})
    assert bad.returncode == 1
    # the same message the code itself gives for these values
    assert (
        "NETCL_CACHE_MAX_BYTES: expected a byte count such as 1073741824, 500M or 2G, "
        "got '10X'" in bad.stderr
    )
    assert "NETCL_PROFILE='maybe': expected 1 to turn profiling on" in bad.stderr
    assert re.search(r"^NETCL_CACHE_MAX_BYTES\s+10X\s+environment \(INVALID\)", bad.stdout, re.M)


def test_zero_resets_the_statistics_and_keeps_the_entries(tmp_path: Path) -> None:
    ctx = device.default_context()
    for _ in range(2):  # a compile, then a disk hit
        cache = ProgramCache(cache_dir=tmp_path)
        cache.get_program(ctx, SRC, ctx.devices[0])
        cache.flush_stats()
    before = json.loads(_netcl("cache", "stats", "--json", "--dir", str(tmp_path)).stdout)
    assert before["disk_hits"] >= 1 and before["entries"] == 1, before
    proc = _netcl("cache", "zero", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc
    assert proc.stdout == f"statistics zeroed in {tmp_path} (1 entry kept)\n"
    after = json.loads(_netcl("cache", "stats", "--json", "--dir", str(tmp_path)).stdout)
    assert after["entries"] == 1 and after["hits"] == 0 and after["misses"] == 0, after


def test_a_remote_url_without_a_scheme_names_an_empty_scheme() -> None:
    """`netcl config` rejects NETCL_CACHE_REMOTE without "://" and says it has no scheme."""
    proc = _netcl("config", env={"NETCL_CACHE_REMOTE": " 127.0.0.1:6379 "})
    assert proc.returncode == 1
    assert (
        "NETCL_CACHE_REMOTE: expected a redis:// or rediss:// URL, got scheme ''\n" in proc.stderr
    )
    assert re.search(
        r"^NETCL_CACHE_REMOTE\s+127\.0\.0\.1:6379\s+environment \(INVALID\)", proc.stdout, re.M
    )


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("REDIS://127.0.0.1:6379/0", None),  # the scheme is case-insensitive
        ("  rediss://127.0.0.1:6379/0 ", None),
        ("redis://127.0.0.1:6379/0?note=a://b", None),  # only the first "://" ends the scheme
        ("http://127.0.0.1:6379/0", "http"),
        ("HTTPS://redis://127.0.0.1", "https"),
    ],
)
def test_the_remote_url_scheme(
    monkeypatch: pytest.MonkeyPatch, url: str, scheme: str | None
) -> None:
    """NETCL_CACHE_REMOTE takes redis:// and rediss:// in any case; another scheme is named,
    lower-cased, in the error."""
    monkeypatch.setenv("NETCL_CACHE_REMOTE", url)
    if scheme is None:
        assert _config.REMOTE.value() == url.strip()
    else:
        with pytest.raises(ValueError) as exc:
            _config.REMOTE.value()
        assert str(exc.value) == (
            f"NETCL_CACHE_REMOTE: expected a redis:// or rediss:// URL, got scheme {scheme!r}"
        )
