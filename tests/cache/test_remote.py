"""The remote tier against a real redis-server started on loopback with a password.

Each test uses fresh local folders, so every lookup that is not in this process goes past the
disk tier to Redis. The server is Debian's ``redis-server`` (skipped with the install command
when absent, a failure under CI=true).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyopencl as cl
import pytest

from netcl.core.device import device_identity
from netcl.runtime.cache import ProgramCache, _remote
from netcl.runtime.cache._entry import FORMAT_VERSION, decode, encode

SECRET = "fleet-secret"
PREFIX = f"netcl:cache:v{FORMAT_VERSION}:"


# the server and the state reset come from conftest.py
RedisServer = Any


@pytest.fixture(autouse=True)
def _fresh(fresh_remote: None) -> None:
    """As in a new process: no tier or warning remembered, no remote in the environment."""


def _cache(tmp_path: Path, url: str, key: str | None = SECRET, **kw: Any) -> ProgramCache:
    """A fresh instance on a fresh local folder: nothing local to hit."""
    folder = tmp_path / f"local-{time.monotonic_ns()}"
    return ProgramCache(folder, remote=url, remote_key=key, **kw)


def _result(spans: Any) -> str:
    got = [s for s in spans.get_finished_spans() if s.name == "netcl.cache.get_program"]
    return str(got[-1].attributes["netcl.cache.result"])


def _point_sum(points: list[Any], **attrs: str) -> float:
    return sum(
        (p.sum if hasattr(p, "sum") else p.value)
        for p in points
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


# configuration ----------------------------------------------------------------------------------

NO_IMPORT = textwrap.dedent("""
    import sys
    from netcl.core import device
    from netcl.runtime.cache import ProgramCache
    ctx = device.default_context()
    c = ProgramCache(sys.argv[1])
    c.get_program(ctx, "__kernel void k(__global float *a) { a[0] = 1.0f; } // no-redis", None)
    assert c.stats.compiles == 1
    print("redis" in sys.modules, any(m.startswith("redis.") for m in sys.modules))
""")


@pytest.mark.parametrize(
    "env",
    [{}, {"NETCL_CACHE_REMOTE": "redis://127.0.0.1:1/0"}],  # a URL without a key: not used
    ids=["no-remote", "remote-without-key"],
)
def test_redis_not_imported_without_a_usable_remote(tmp_path: Path, env: dict[str, str]) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NETCL_CACHE_REMOTE")}
    out = subprocess.run(
        [sys.executable, "-c", NO_IMPORT, str(tmp_path / "c")],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_bad_configuration_warns_once_and_compiles(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for url in ("http://127.0.0.1:1/0", "redis://127.0.0.1:1/0?socket_timeout=bad"):
        for i in range(2):
            c = _cache(tmp_path, url)
            check_add(c.get_program(ctx, add_src(1.0, f"badcfg-{url}-{i}"), device), 1.0)
            assert c.stats.compiles == 1 and c.stats.remote_errors == 0
    events = log_events("cache_remote_unusable")
    assert len(events) == 2  # one per configuration, not one per lookup
    # a remote without a key is not trusted: one warning, no remote
    monkeypatch.setenv("NETCL_CACHE_REMOTE", "redis://:secret-pw@127.0.0.1:1/0")
    for i in range(2):
        c = ProgramCache(tmp_path / f"env-{i}")
        check_add(c.get_program(ctx, add_src(2.0, f"nokey-{i}"), device), 2.0)
        assert c.remote is None
    (unsigned,) = log_events("cache_remote_unsigned")
    assert unsigned.url == "redis://***@127.0.0.1:1/0"  # type: ignore[attr-defined]
    assert "NETCL_CACHE_REMOTE_KEY" in unsigned.reason  # type: ignore[attr-defined]
    assert unsigned.levelname == "WARNING"


def test_a_url_of_another_scheme_is_refused_with_the_scheme_in_the_reason(
    tmp_path: Path, log_events: Callable[[str], list[Any]]
) -> None:
    """A remote URL that is not redis:// or rediss://: no remote, and the warning's reason (the
    password redacted from its url) names the scheme that was given."""
    c = _cache(tmp_path, "http://:pw@127.0.0.1:1/0")
    assert c.remote is None
    (event,) = log_events("cache_remote_unusable")
    assert event.url == "http://***@127.0.0.1:1/0"  # type: ignore[attr-defined]
    want = "NETCL_CACHE_REMOTE: expected a redis:// or rediss:// URL, got scheme 'http'"
    assert event.reason == want  # type: ignore[attr-defined]


def test_bad_argument_types_name_the_argument(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="remote must be a redis://"):
        ProgramCache(tmp_path, remote=6379)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="remote_key must be a str or bytes secret or None, got"):
        ProgramCache(tmp_path, remote="redis://h:1/0", remote_key=32)  # type: ignore[arg-type]


# hits across processes ----------------------------------------------------------------------------

PUBLISH = textwrap.dedent("""
    import json, sys
    from netcl.core import device
    from netcl.runtime.cache import ProgramCache
    ctx = device.default_context()
    c = ProgramCache(sys.argv[1])  # remote and key from the environment
    c.get_program(ctx, sys.argv[2], ctx.devices[0])
    print(json.dumps(c.stats.as_dict()))
""")


def test_remote_hit_across_processes(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    spans: Any,
) -> None:
    src = add_src(3.0, f"across-{time.time_ns()}")
    env = {**os.environ, "NETCL_CACHE_REMOTE": server.url, "NETCL_CACHE_REMOTE_KEY": SECRET}
    out = subprocess.run(
        [sys.executable, "-c", PUBLISH, str(tmp_path / "machine-a"), src],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    a = json.loads(out.stdout)
    assert a["compiles"] == 1 and a["remote_writes"] == 1 and a["remote_hits"] == 0

    local_b = tmp_path / "machine-b"
    b = ProgramCache(local_b, remote=server.url, remote_key=SECRET)
    prg = b.get_program(ctx, src, device)
    check_add(prg, 3.0)
    assert _result(spans) == "remote"
    assert b.stats.remote_hits == 1 and b.stats.compiles == 0 and b.stats.misses == 0
    assert b.stats.hits == 1
    assert len(b.entries()) == 1  # the remote hit was written to the local tier
    # a new process on machine B now hits its own disk, without asking Redis
    b2 = ProgramCache(local_b, remote=server.url, remote_key=SECRET)
    check_add(b2.get_program(ctx, src, device), 3.0)
    assert _result(spans) == "disk" and b2.stats.remote_hits == 0


def test_a_damaged_local_entry_replaced_from_the_remote_is_a_remote_hit(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    spans: Any,
) -> None:
    """The local entry damaged, the remote's value good: the lookup's result is "remote" (what
    served it), not "recovered" (a compile after damage), and the damage is counted."""
    src = add_src(4.0, f"damaged-local-{time.time_ns()}")
    _cache(tmp_path, server.url).get_program(ctx, src, device)  # compiled and published
    local = tmp_path / "machine-b"
    ProgramCache(local, remote=server.url, remote_key=SECRET).get_program(ctx, src, device)
    ProgramCache(local).entries()[0].path.write_bytes(b"")  # damaged on machine B's disk
    b = ProgramCache(local, remote=server.url, remote_key=SECRET)
    check_add(b.get_program(ctx, src, device), 4.0)
    assert _result(spans) == "remote"
    assert (b.stats.remote_hits, b.stats.recoveries, b.stats.compiles) == (1, 1, 0)


def test_remote_without_a_disk_tier(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    spans: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NETCL_CACHE_DISABLE", "1")
    src = add_src(8.0, f"nodisk-{time.time_ns()}")
    first = _cache(tmp_path, server.url)
    first.get_program(ctx, src, device)
    assert _result(spans) == "compiled" and first.stats.remote_writes == 1
    second = _cache(tmp_path, server.url)
    check_add(second.get_program(ctx, src, device), 8.0)
    assert _result(spans) == "remote" and second.stats.remote_hits == 1
    assert not list(tmp_path.glob("local-*"))  # memory, remote, compile: no folder made


def test_a_build_another_machine_finished_while_this_one_waited_is_a_remote_hit(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    spans: Any,
    metric_points: Callable[[str], list[Any]],
) -> None:
    """A lookup that waits for another machine's remote lock and then loads that machine's
    binary reports the result "remote" (span and lookups metric), not a compile; the stats
    count each wait."""
    r = server.client()
    machine_a, b = _cache(tmp_path, server.url), _cache(tmp_path, server.url, lock_timeout=10.0)
    for n, add in enumerate((5.0, 6.0), 1):
        src = add_src(add, f"waited-{time.time_ns()}")
        before = set(r.keys(PREFIX + "*"))
        machine_a.get_program(ctx, src, device)  # machine A compiles and publishes
        assert machine_a.stats.remote_writes == n and machine_a.stats.remote_waits == 0
        (key,) = set(r.keys(PREFIX + "*")) - before
        value = r.get(key)
        # what A published names its device, options and source size
        meta, _ = decode(value, key.decode()[len(PREFIX) :], secret=SECRET.encode())
        assert (meta["device"], meta["identity"]) == (device.name, device_identity(device))
        assert (meta["options"], meta["source_bytes"]) == ("", len(src.encode()))
        # machine A's build again: the value taken away, A's lock held (a fresh stamp) until
        # A publishes the value and releases the lock, 0.3 s later
        r.delete(key)
        secs, micros = r.time()
        lock = PREFIX + "lock:" + key.decode()[len(PREFIX) :]
        r.set(lock, f"machine-a:{secs * 1000 + micros // 1000}", px=5000)

        def finish(key: bytes = key, value: bytes = value, lock: str = lock) -> None:
            time.sleep(0.3)
            r.set(key, value)
            r.delete(lock)

        remote_before = _point_sum(
            metric_points("netcl.cache.lookups"), **{"netcl.cache.result": "remote"}
        )
        a = threading.Thread(target=finish)
        a.start()
        try:
            check_add(b.get_program(ctx, src, device), add)
        finally:
            a.join()
        assert _result(spans) == "remote"
        assert (
            _point_sum(metric_points("netcl.cache.lookups"), **{"netcl.cache.result": "remote"})
            == remote_before + 1
        )
        assert b.stats.remote_waits == n and b.stats.remote_hits == n
        assert b.stats.compiles == 0 and b.stats.misses == 0
        assert b.stats.remote_lock_timeouts == 0
        assert not r.exists(lock)  # B's own lock, taken after A's, was released


def test_unsigned_opt_in(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NETCL_CACHE_REMOTE_UNSIGNED", "1")
    src = add_src(4.0, f"unsigned-{time.time_ns()}")
    first = _cache(tmp_path, server.url, key="")
    first.get_program(ctx, src, device)
    assert first.stats.remote_writes == 1 and first.remote is not None
    second = _cache(tmp_path, server.url, key="")
    check_add(second.get_program(ctx, src, device), 4.0)
    assert second.stats.remote_hits == 1
    # a fleet with a key does not accept what the unsigned one wrote
    signed = _cache(tmp_path, server.url)
    check_add(signed.get_program(ctx, src, device), 4.0)
    assert signed.stats.remote_rejected == 1 and signed.stats.compiles == 1


# integrity --------------------------------------------------------------------------------------


def _tamper(value: bytes, how: str, key: str) -> bytes:
    if how == "tampered":
        flipped = bytearray(value)
        flipped[len(value) // 2] ^= 0x40
        return bytes(flipped)
    if how == "foreign-key":
        meta, binary = decode(value, key, secret=SECRET.encode())
        return encode(key, bytes(binary), meta, b"another fleet's secret")
    if how == "truncated":
        return value[: len(value) // 2]
    if how == "other-device":  # correctly signed, but written for another device identity
        meta, binary = decode(value, key, secret=SECRET.encode())
        return encode(key, bytes(binary), {**meta, "identity": "x|y|z"}, SECRET.encode())
    if how == "pickle":
        return b"\x80\x05\x95" + value
    raise AssertionError(how)


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("tampered", "signature"),
        ("foreign-key", "signature"),
        ("truncated", "truncated"),
        ("other-device", "identity"),
        ("pickle", "foreign"),
    ],
)
def test_bad_values_are_refused_and_replaced(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    spans: Any,
    log_events: Callable[[str], list[Any]],
    metric_points: Callable[[str], list[Any]],
    how: str,
    reason: str,
) -> None:
    src = add_src(5.0, f"bad-{how}-{time.time_ns()}")
    writer = _cache(tmp_path, server.url)
    writer.get_program(ctx, src, device)
    (entry,) = writer.entries()
    key = entry.key
    name = PREFIX + key
    r = server.client()
    r.set(name, _tamper(r.get(name), how, key))
    before = _point_sum(
        metric_points("netcl.cache.remote.rejected"), **{"netcl.cache.reason": reason}
    )

    reader = _cache(tmp_path, server.url)
    check_add(reader.get_program(ctx, src, device), 5.0)  # compiled, not loaded
    assert _result(spans) == "compiled"
    assert reader.stats.remote_rejected == 1 and reader.stats.compiles == 1
    assert reader.stats.remote_hits == 0
    (event,) = log_events("cache_remote_rejected")
    assert event.levelname == "WARNING"
    after = _point_sum(
        metric_points("netcl.cache.remote.rejected"), **{"netcl.cache.reason": reason}
    )
    assert after == before + 1
    # the recompiled program replaced the bad value: the next machine gets a remote hit
    third = _cache(tmp_path, server.url)
    check_add(third.get_program(ctx, src, device), 5.0)
    assert third.stats.remote_hits == 1 and third.stats.remote_rejected == 0


def test_oversized_values_are_neither_read_nor_written(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    src = add_src(6.0, f"big-{time.time_ns()}")
    small = _cache(tmp_path, server.url)
    tier = small.remote
    assert tier is not None
    tier.max_bytes = 1000  # smaller than any PoCL binary
    small.get_program(ctx, src, device)
    assert small.stats.remote_writes == 0 and small.stats.compiles == 1
    tier.max_bytes = _remote.RemoteTier.max_bytes
    big = _cache(tmp_path, server.url)
    big.get_program(ctx, src, device)  # now published
    assert big.stats.remote_writes == 1
    tier.max_bytes = 1000
    capped = _cache(tmp_path, server.url)
    check_add(capped.get_program(ctx, src, device), 6.0)
    assert capped.stats.remote_rejected == 1 and capped.stats.compiles == 1


# availability -----------------------------------------------------------------------------------


def test_redis_killed_in_the_middle_of_a_run(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    own_server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
    metric_points: Callable[[str], list[Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", "netcl.runtime.cache")
    tag = time.time_ns()
    c = ProgramCache(tmp_path / "local", remote=own_server.url, remote_key=SECRET)
    for i in range(2):
        check_add(c.get_program(ctx, add_src(float(i), f"kill-{tag}-{i}"), device), float(i))
    assert c.stats.remote_writes == 2
    tier = c.remote
    assert tier is not None
    own_server.kill()
    before = metric_points("netcl.cache.remote.duration")
    n_before = sum(p.count for p in before)
    t_before = sum(p.sum for p in before)
    slowest = 0.0
    for i in range(2, 8):
        t0 = time.perf_counter()
        prg = c.get_program(ctx, add_src(float(i), f"kill-{tag}-{i}"), device)
        slowest = max(slowest, time.perf_counter() - t0)
        check_add(prg, float(i))
    # three failed calls opened the breaker; the other lookups did not even try
    assert c.stats.remote_errors == _remote.RemoteTier.breaker_failures == 3
    assert tier.breaker_open
    assert len(log_events("cache_remote_breaker_open")) == 1
    after = metric_points("netcl.cache.remote.duration")
    assert sum(p.count for p in after) - n_before == 3
    # bounded: the three failed calls together cost less than one read timeout
    assert sum(p.sum for p in after) - t_before < _remote.TIMEOUT_S
    errors = metric_points("netcl.cache.remote.errors")
    assert _point_sum(errors, **{"error.type": "redis.exceptions.ConnectionError"}) >= 3
    assert c.stats.compiles == 8 and c.stats.write_errors == 0

    # Redis comes back: after the breaker's pause one trial call closes it again
    own_server.start()
    tier.breaker_open_s = 0.0
    tier._open_until = time.monotonic()
    check_add(c.get_program(ctx, add_src(9.0, f"kill-{tag}-9"), device), 9.0)
    assert not tier.breaker_open and c.stats.remote_writes == 3
    assert log_events("cache_remote_breaker_closed")


def test_slow_redis_costs_one_timeout_per_lookup_until_the_breaker_opens(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    metric_points: Callable[[str], list[Any]],
) -> None:
    pytest.importorskip("redis", reason="redis-py missing: pip install 'netcl-cache[redis]'")

    def remote_seconds() -> float:
        return float(sum(p.sum for p in metric_points("netcl.cache.remote.duration")))

    # a server that accepts connections and never answers
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://:pw@127.0.0.1:{silent.getsockname()[1]}/0?socket_timeout=0.2"
        c = ProgramCache(tmp_path / "local", remote=url, remote_key=SECRET)
        tag = time.time_ns()
        overhead = []
        for i in range(5):
            t0 = remote_seconds()  # time spent in Redis calls, failed ones included
            check_add(c.get_program(ctx, add_src(float(i), f"slow-{tag}-{i}"), device), float(i))
            overhead.append(remote_seconds() - t0)
        assert c.stats.remote_errors == 3 and c.stats.compiles == 5
        tier = c.remote
        assert tier is not None and tier.breaker_open
    # each of the first three lookups paid about one read timeout, the last two nothing
    assert all(0.15 < o < 0.2 + 0.4 for o in overhead[:3]), overhead
    assert overhead[3:] == [0.0, 0.0], overhead


def test_full_redis_and_wrong_password_never_fail_get_program(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    own_server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    metric_points: Callable[[str], list[Any]],
) -> None:
    tag = time.time_ns()
    oom = metric_points("netcl.cache.remote.errors")
    oom_before = _point_sum(oom, **{"error.type": "redis.exceptions.OutOfMemoryError"})
    own_server.client().config_set("maxmemory", "1")  # every write: OOM command not allowed
    full = _cache(tmp_path, own_server.url)
    for i in range(4):
        check_add(full.get_program(ctx, add_src(float(i), f"full-{tag}-{i}"), device), float(i))
    assert full.stats.compiles == 4 and full.stats.remote_writes == 0
    assert full.stats.remote_errors == 4
    tier = full.remote
    assert tier is not None and not tier.breaker_open  # a full server still answers reads
    oom = metric_points("netcl.cache.remote.errors")
    assert _point_sum(oom, **{"error.type": "redis.exceptions.OutOfMemoryError"}) == oom_before + 4

    bad = own_server.url.replace(own_server.password, "wrong-password")
    denied = _cache(tmp_path, bad)
    for i in range(4):
        check_add(denied.get_program(ctx, add_src(float(i), f"auth-{tag}-{i}"), device), float(i))
    assert denied.stats.remote_errors == 3 and denied.stats.compiles == 4
    tier = denied.remote
    assert tier is not None and tier.breaker_open
    auth = metric_points("netcl.cache.remote.errors")
    assert _point_sum(auth, **{"error.type": "redis.exceptions.AuthenticationError"}) >= 3


def test_the_lock_is_released_after_the_server_refused_the_write(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    own_server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    """A server that lets this user take the lock but refuses the value's write (NOPERM): the
    lookup compiles, counts one remote error and still releases its lock, so that other
    machines need not wait for it to expire."""
    admin = own_server.client()
    admin.execute_command(
        "ACL", "SETUSER", "locker", "on", ">locker-pw", "+@all", "%R~*", f"~{PREFIX}lock:*"
    )
    c = _cache(tmp_path, f"redis://locker:locker-pw@127.0.0.1:{own_server.port}/0")
    check_add(c.get_program(ctx, add_src(2.0, f"noperm-{time.time_ns()}"), device), 2.0)
    assert (c.stats.compiles, c.stats.remote_writes, c.stats.remote_errors) == (1, 0, 1)
    assert admin.keys(PREFIX + "*") == []  # no value, and the lock was released


# one compile for the fleet ----------------------------------------------------------------------

RACER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, pyopencl as cl
    from netcl.core import device
    from netcl.runtime.cache import ProgramCache

    local, src, barrier, me, n = sys.argv[1:5] + [int(sys.argv[5])]
    ctx = device.default_context(); dev = ctx.devices[0]; q = cl.CommandQueue(ctx)
    c = ProgramCache(local)
    open(os.path.join(barrier, me), "w").close()
    while len(os.listdir(barrier)) < n:  # every racer is ready: start together
        time.sleep(0.01)
    prg = c.get_program(ctx, src, dev)
    a = np.arange(32, dtype=np.float32); mf = cl.mem_flags
    da = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    dc = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
    cl.Kernel(prg, "inc")(q, (32,), None, da, dc)
    out = np.empty_like(a); cl.enqueue_copy(q, out, dc)
    assert np.allclose(out, a + 7.0)
    print(json.dumps(c.stats.as_dict()))
""")


@pytest.mark.slow
@pytest.mark.timeout(420)  # six processes, each allowed 300 s
def test_six_processes_compile_a_new_kernel_once(tmp_path: Path, server: RedisServer) -> None:
    n = 6
    # a big enough program that the compile takes a while on any device
    body = "".join(
        f"__kernel void k{j}(__global float *x) {{ x[get_global_id(0)] *= {j}.5f; }}\n"
        for j in range(40)
    )
    src = (
        f"// race {time.time_ns()}\n" + body + "__kernel void inc(__global const float *a, "
        "__global float *c) { int i = get_global_id(0); c[i] = a[i] + 7.0f; }\n"
    )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "NETCL_CACHE_REMOTE": server.url, "NETCL_CACHE_REMOTE_KEY": SECRET}
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER,
                str(tmp_path / f"machine-{i}"),
                src,
                str(barrier),
                str(i),
                str(n),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    stats = []
    for p in racers:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        stats.append(json.loads(out))
    total = {k: sum(s[k] for s in stats) for k in stats[0]}
    assert total["compiles"] == 1, stats  # one machine compiled, five loaded its binary
    assert total["remote_hits"] == n - 1 and total["remote_writes"] == 1
    assert total["remote_lock_timeouts"] == 0 and total["remote_errors"] == 0
    assert not server.client().keys(PREFIX + "lock:*")  # the lock was released


# netcl cache stats ------------------------------------------------------------------------------


def test_cli_stats_shows_the_remote(
    tmp_path: Path,
    own_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from netcl.core.cli import main

    def stats(json_out: bool) -> int:  # the `netcl cache stats` command, in this process
        return main(
            ["cache", "stats", "--dir", str(tmp_path / "local"), *(["--json"] if json_out else [])]
        )

    (tmp_path / "local").mkdir(mode=0o700)
    monkeypatch.setenv("NETCL_CACHE_REMOTE", own_server.url)
    monkeypatch.setenv("NETCL_CACHE_REMOTE_KEY", SECRET)
    assert stats(True) == 0
    info = json.loads(capsys.readouterr().out)["remote"]
    assert info == {
        "configured": True,
        "url": f"redis://***@127.0.0.1:{own_server.port}/0",
        "usable": True,
        "signed": True,
        "reachable": True,
    }
    assert stats(False) == 0
    text = capsys.readouterr().out
    assert f"redis://***@127.0.0.1:{own_server.port}/0  reachable\n" in text
    assert own_server.password not in text
    monkeypatch.delenv("NETCL_CACHE_REMOTE_KEY")  # a trusted network's store, unsigned on purpose
    monkeypatch.setenv("NETCL_CACHE_REMOTE_UNSIGNED", "1")
    assert stats(False) == 0
    assert "/0  reachable, UNSIGNED\n" in capsys.readouterr().out
    monkeypatch.setenv("NETCL_CACHE_REMOTE_KEY", SECRET)
    monkeypatch.delenv("NETCL_CACHE_REMOTE_UNSIGNED")
    own_server.kill()
    assert stats(True) == 0
    info = json.loads(capsys.readouterr().out)["remote"]
    assert info["reachable"] is False and "ConnectionError" in info["error"]
    monkeypatch.delenv("NETCL_CACHE_REMOTE")
    assert stats(True) == 0
    assert json.loads(capsys.readouterr().out)["remote"] == {"configured": False}


# what each call is called, and a server that answers "no" ---------------------------------------


def test_each_remote_call_is_timed_under_its_operation_name(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    metric_points: Callable[[str], list[Any]],
) -> None:
    """A miss that publishes its program makes one call of each kind, and the duration metric
    tells them apart by ``netcl.cache.remote.op``: get, lock, set, unlock."""

    def counts() -> dict[str, int]:
        out: dict[str, int] = {}
        for p in metric_points("netcl.cache.remote.duration"):
            op = str(p.attributes["netcl.cache.remote.op"])
            out[op] = out.get(op, 0) + p.count
        return out

    before = counts()
    c = _cache(tmp_path, server.url)
    c.get_program(ctx, add_src(0.0, f"ops-{time.time_ns()}"), device)
    assert c.stats.remote_writes == 1
    after = counts()
    assert {op: after[op] - before.get(op, 0) for op in after} == {
        "get": 1,
        "lock": 1,
        "set": 1,
        "unlock": 1,
    }


def test_a_server_that_refuses_every_command_is_not_down(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    own_server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
) -> None:
    """A user without permissions (NOPERM): every lookup's first call fails and is logged with
    the server's own words, but a server that answers is not down, so the breaker never opens
    and each lookup tries again."""
    own_server.client().acl_setuser("nobody", enabled=True, passwords=["+nopw"], commands=["+ping"])
    url = f"redis://nobody:nopw@127.0.0.1:{own_server.port}/0"
    c = _cache(tmp_path, url)
    tag = time.time_ns()
    for i in range(5):
        check_add(c.get_program(ctx, add_src(float(i), f"noperm-{tag}-{i}"), device), float(i))
    assert c.stats.remote_errors == 5 and c.stats.compiles == 5
    tier = c.remote
    assert tier is not None and not tier.breaker_open
    events = log_events("cache_remote_error")
    assert len(events) == 5
    for event in events:
        assert (event.op, event.error_type) == ("get", "redis.exceptions.NoPermissionError")
        assert event.url == f"redis://***@127.0.0.1:{own_server.port}/0"
        assert "has no permissions to run the 'getrange' command" in event.error


def _lock_px(admin: Any, key: str) -> int:
    """The expiry (ms) a lock was taken with: its absolute expiry less the server time its value
    carries ("<token>:<ms>"), give or take 1 ms (two clocks of the server)."""
    stamp = int(admin.get(f"{PREFIX}lock:{key}").split(b":")[-1])
    return int(admin.execute_command("PEXPIRETIME", f"{PREFIX}lock:{key}")) - stamp


def test_a_lock_expires_after_the_wait_but_at_least_after_one_second(
    tmp_path: Path, server: RedisServer
) -> None:
    """``lock`` takes a free lock at once (not waited) holding this lease's token, expiring
    after ``wait_s`` but never sooner than 1 s; ``unlock`` frees it."""
    tier = _cache(tmp_path, server.url).remote
    assert tier is not None
    admin = server.client()
    for wait_s, px in [(0.5, 1000), (0.999, 1000), (2.5, 2500)]:
        taken = []
        for n in range(7):  # the median of a few: the exact expiry
            key = f"{n}{time.time_ns():x}".ljust(64, "a")
            lease = tier.lock(key, wait_s)
            assert (lease.key, lease.waited) == (key, False) and lease.token is not None
            value = admin.get(f"{PREFIX}lock:{key}")
            assert value.decode().split(":")[0] == lease.token
            taken.append(_lock_px(admin, key))
            tier.unlock(lease)
            assert admin.exists(f"{PREFIX}lock:{key}") == 0
        assert sorted(taken)[3] == px and max(abs(t - px) for t in taken) <= 1, (wait_s, taken)


def test_a_held_lock_is_polled_at_doubling_intervals_and_taken_once_freed(
    tmp_path: Path, server: RedisServer
) -> None:
    """Another machine's lock: ``lock`` polls 20, 40, 80, 160 then 250 ms apart and gives up
    after ``wait_s`` (no token, waited); once that lock expires the poll takes it, and the
    lease names the key, so that ``unlock`` frees it."""
    tier = _cache(tmp_path, server.url).remote
    assert tier is not None
    admin = server.client()
    key = f"h{time.time_ns():x}".ljust(64, "b")
    name = f"{PREFIX}lock:{key}"
    sec, usec = admin.time()
    admin.set(name, f"other:{sec * 1000 + usec // 1000}", px=1000)  # as long as ours: not stale

    def evals() -> int:
        return int(admin.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))

    before, start = evals(), time.monotonic()
    lease = tier.lock(key, 0.5)
    took, polls = time.monotonic() - start, evals() - before
    assert (lease.key, lease.token, lease.waited) == (key, None, True)
    assert took >= 0.5
    # one try at once, then after 20, 60, 140, 300 and 500 ms (the last sleep is cut to the
    # deadline: only a host stalled for 200 ms in all could make it fewer)
    assert polls == 6, polls
    assert admin.get(name).startswith(b"other:")  # still the other machine's

    admin.pexpire(name, 100)  # the other machine is done soon
    lease = tier.lock(key, 5.0)
    assert (lease.key, lease.waited) == (key, True) and lease.token is not None
    assert admin.get(name).decode().split(":")[0] == lease.token
    tier.unlock(lease)
    assert admin.exists(name) == 0


def test_a_value_of_exactly_max_bytes_is_published(tmp_path: Path, server: RedisServer) -> None:
    """``put`` sends a value as large as ``max_bytes`` (True) and refuses one byte more (False,
    nothing sent)."""
    tier = _cache(tmp_path, server.url).remote
    assert tier is not None
    admin = server.client()
    key = f"{time.time_ns():x}".ljust(64, "c")
    meta = {"device": "d", "options": ""}
    size = len(encode(key, b"binary", meta, tier._secret))
    tier.max_bytes = size - 1
    assert tier.put(key, b"binary", meta) is False
    assert admin.exists(PREFIX + key) == 0
    tier.max_bytes = size
    assert tier.put(key, b"binary", meta) is True
    assert admin.get(PREFIX + key) == encode(key, b"binary", meta, tier._secret)
