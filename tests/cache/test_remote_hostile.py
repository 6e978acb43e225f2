"""The remote tier at its hostile edges, against a real redis-server (conftest.py), some of it
behind a TCP proxy that this file starts and that paces what the server sends: options redis-py
refuses, slow and trickling transfers, deeply nested metadata, stale locks, signed but cut
binaries."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyopencl as cl
import pytest

from netcl.core.device import device_identity
from netcl.runtime.cache import ProgramCache, _config, _remote
from netcl.runtime.cache._entry import FORMAT_VERSION, HEADER, MAGIC, _tag, compute_key

SECRET = "fleet-secret"
PREFIX = f"netcl:cache:v{FORMAT_VERSION}:"
NETCL = str(Path(sys.executable).with_name("netcl"))
DEADLINE_S = 1.0  # the default NETCL_CACHE_REMOTE_TIMEOUT
RedisServer = Any  # conftest.py's


@pytest.fixture(autouse=True)
def _fresh(fresh_remote: None) -> None:
    """As in a new process: no tier or warning remembered, no remote in the environment."""


class PacedProxy:
    """A TCP proxy on loopback in front of ``port``. What the server sends comes through in
    steps of at most ``chunk`` bytes, each full step followed by a pause of ``every`` seconds
    (short replies pass at once): 16 KiB every 1/16 s is a 256 KiB/s link, 1 KiB every 0.4 s a
    trickle."""

    def __init__(self, port: int, chunk: int, every: float) -> None:
        self.target, self.chunk, self.every = port, chunk, every
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, paced: bool) -> None:
        try:
            while data := src.recv(self.chunk if paced else 1 << 16):
                dst.sendall(data)
                if paced and len(data) == self.chunk:
                    time.sleep(self.every)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def url(self, server: RedisServer) -> str:
        return server.url.replace(f":{server.port}/", f":{self.port}/")

    def close(self) -> None:
        self._listener.close()
        for s in self._open:
            s.close()


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[Callable[[int, float], PacedProxy]]:
    made: list[PacedProxy] = []

    def make(chunk: int, every: float) -> PacedProxy:
        made.append(PacedProxy(server.port, chunk, every))
        return made[-1]

    yield make
    for p in made:
        p.close()


def _key(src: str, device: cl.Device) -> str:
    return compute_key(src.encode(), "", device_identity(device))


def _remote_seconds(metric_points: Callable[[str], list[Any]]) -> float:
    return float(sum(p.sum for p in metric_points("netcl.cache.remote.duration")))


def _signed(key: str, binary: bytes, meta: bytes) -> bytes:
    """A value signed with the fleet's key whose metadata bytes are given as they are."""
    body = HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta), len(binary)) + meta + binary
    return body + _tag(key, body, SECRET.encode())


# 1. options redis-py refuses -------------------------------------------------------------------

BAD_OPTIONS = {
    "socket_timeout=-1": "socket_timeout",
    "bogus_option=1": "bogus_option",
    "socket_connect_timeout=0": "socket_connect_timeout",
    "max_connections=0": "max_connections",
    "timeout=2": "timeout",
    "protocol=9": "protocol",
}


@pytest.mark.parametrize("query", sorted(BAD_OPTIONS))
def test_an_option_redis_py_refuses_turns_the_remote_off_with_one_warning(
    query: str,
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
) -> None:
    pytest.importorskip("redis", reason="redis-py missing: pip install 'netcl-cache[redis]'")
    url = f"redis://:pw@127.0.0.1:1/0?{query}"
    for i in range(3):  # every lookup works (before: each raised ValueError or TypeError)
        c = ProgramCache(tmp_path / f"local-{i}", remote=url, remote_key=SECRET)
        check_add(c.get_program(ctx, add_src(1.0, f"opt-{query}-{i}"), device), 1.0)
        assert c.stats.compiles == 1 and c.stats.remote_errors == 0
        assert c.remote is None
    (event,) = log_events("cache_remote_unusable")  # one warning for the configuration
    assert BAD_OPTIONS[query] in event.reason  # type: ignore[attr-defined]
    assert "pw" not in event.url  # type: ignore[attr-defined]


@pytest.mark.parametrize("query", ["socket_timeout=-1", "bogus_option=1"])
def test_cache_stats_json_with_a_refused_option(query: str, tmp_path: Path) -> None:
    pytest.importorskip("redis", reason="redis-py missing: pip install 'netcl-cache[redis]'")
    env = {
        **os.environ,
        "NETCL_CACHE_REMOTE": f"redis://127.0.0.1:1/0?{query}",
        "NETCL_CACHE_REMOTE_KEY": SECRET,
    }
    out = subprocess.run(
        [NETCL, "cache", "stats", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    remote = json.loads(out.stdout)["remote"]
    assert remote["usable"] is False and BAD_OPTIONS[query] in remote["error"]


REASONS = {
    "socket_timeout=-1": "option 'socket_timeout': expected a number of seconds > 0, got -1.0",
    "socket_timeout=inf": "option 'socket_timeout': expected a number of seconds > 0, got inf",
    "socket_connect_timeout=0": (
        "option 'socket_connect_timeout': expected a number of seconds > 0, got 0.0"
    ),
    "max_connections=0": "option 'max_connections': expected an integer >= 1, got 0",
    "db=-1": "option 'db': expected an integer >= 0, got -1",
    "bogus_option=1": "option 'bogus_option' is not one redis-py knows",
    "timeout=2": "option 'timeout' is not one redis-py knows",
}


@pytest.mark.parametrize("query", sorted(REASONS))
def test_the_warning_about_a_refused_option_names_it_in_full(
    query: str,
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
) -> None:
    """The ``cache_remote_unusable`` warning's reason, as an operator reads it in the log: the
    option by its name alone, what it must be and what the URL gave."""
    pytest.importorskip("redis", reason="redis-py missing: pip install 'netcl-cache[redis]'")
    c = ProgramCache(
        tmp_path / "local", remote=f"redis://:pw@127.0.0.1:1/0?{query}", remote_key=SECRET
    )
    check_add(c.get_program(ctx, add_src(1.0, f"reason-{query}"), device), 1.0)
    (event,) = log_events("cache_remote_unusable")
    assert event.reason == REASONS[query]  # type: ignore[attr-defined]


def test_options_at_their_limits_are_used(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
) -> None:
    """Every checked option at the edge of what it allows (a timeout under a second, integers at
    their least) is a usable remote: the program compiled here is published to Redis."""
    query = (
        "socket_timeout=0.5&socket_connect_timeout=0.25&max_connections=1&db=0"
        "&health_check_interval=0&socket_read_size=1"
    )
    src = add_src(1.0, f"limits-{time.time_ns()}")
    c = ProgramCache(tmp_path / "local", remote=f"{server.url}?{query}", remote_key=SECRET)
    check_add(c.get_program(ctx, src, device), 1.0)
    assert c.remote is not None and log_events("cache_remote_unusable") == []
    assert c.stats.remote_writes == 1 and c.stats.remote_errors == 0
    assert server.client().exists(PREFIX + _key(src, device)) == 1


# 2. one deadline for the whole call ------------------------------------------------------------


@pytest.mark.parametrize(
    ("link", "chunk", "every", "size"),
    [("256KiB/s", 16 << 10, 1 / 16, 8 << 20), ("trickle-1KiB/0.4s", 1 << 10, 0.4, 32 << 10)],
)
def test_a_slow_transfer_ends_at_the_deadline(
    link: str,
    chunk: int,
    every: float,
    size: int,
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    proxy: Callable[[int, float], PacedProxy],
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    metric_points: Callable[[str], list[Any]],
) -> None:
    src = add_src(2.0, f"slow-{link}-{time.time_ns()}")
    key = _key(src, device)
    server.client().set(PREFIX + key, os.urandom(size))  # what the lookup has to fetch
    url = proxy(chunk, every).url(server)

    settings = _config.remote_settings(url, SECRET)
    assert settings is not None
    tier = _remote.RemoteTier(settings)
    t0 = time.monotonic()
    with pytest.raises(_remote.RemoteError, match="TimeoutError"):
        tier.get(key)
    alone = time.monotonic() - t0

    c = ProgramCache(tmp_path / "local", remote=url, remote_key=SECRET)
    before = _remote_seconds(metric_points)
    check_add(c.get_program(ctx, src, device), 2.0)  # a miss, compiled here
    in_redis = _remote_seconds(metric_points) - before
    print(
        f"\n{link}: tier.get {alone:.3f} s, get_program's remote calls {in_redis:.3f} s "
        f"(deadline {DEADLINE_S} s)"
    )
    assert alone < DEADLINE_S + 0.2 and in_redis < DEADLINE_S + 0.2
    assert c.stats.remote_errors == 1 and c.stats.compiles == 1 and c.stats.misses == 1


def test_the_deadline_is_a_setting(
    server: RedisServer,
    proxy: Callable[[int, float], PacedProxy],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server.client().set(PREFIX + "ab" * 32, os.urandom(1 << 20))
    url = proxy(16 << 10, 1 / 16).url(server)
    monkeypatch.setenv("NETCL_CACHE_REMOTE_TIMEOUT", "0.3")
    tier = _remote.tier_for(url, SECRET)
    assert isinstance(tier, _remote.RemoteTier) and tier.timeout_s == 0.3
    t0 = time.monotonic()
    with pytest.raises(_remote.RemoteError):
        tier.get("ab" * 32)
    assert time.monotonic() - t0 < 0.3 + 0.2


def test_a_call_waiting_on_redis_runs_on_a_daemon_thread_named_for_the_cache(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    proxy: Callable[[int, float], PacedProxy],
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    """While a lookup waits on a slow Redis, a thread dump shows the call on a thread named
    ``netcl-cache-remote``, a daemon thread: a call that never ends keeps no process alive."""
    src = add_src(2.0, f"thread-{time.time_ns()}")
    server.client().set(PREFIX + _key(src, device), os.urandom(32 << 10))
    url = proxy(1 << 10, 0.4).url(server)  # a trickle: the fetch lasts the whole deadline
    seen: set[tuple[str, bool]] = set()
    stop = threading.Event()

    def watch() -> None:  # what a thread dump taken during the lookup would show
        while not stop.wait(0.01):
            seen.update((t.name, t.daemon) for t in threading.enumerate())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        c = ProgramCache(tmp_path / "local", remote=url, remote_key=SECRET)
        check_add(c.get_program(ctx, src, device), 2.0)
    finally:
        stop.set()
        watcher.join()
    assert c.stats.remote_errors == 1  # the fetch ran into the deadline
    assert {daemon for name, daemon in seen if name == "netcl-cache-remote"} == {True}


# 3. metadata nested too deep -------------------------------------------------------------------


def test_deeply_nested_metadata_is_a_rejected_value(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
) -> None:
    src = add_src(3.0, f"nested-{time.time_ns()}")
    key = _key(src, device)
    deep = b"[" * 30_000 + b"]" * 30_000  # 60 kB, under the 64 KiB bound on metadata
    server.client().set(PREFIX + key, _signed(key, b"\x7fELF", deep))
    c = ProgramCache(tmp_path / "local", remote=server.url, remote_key=SECRET)
    check_add(c.get_program(ctx, src, device), 3.0)  # before: RecursionError
    assert c.stats.remote_rejected == 1 and c.stats.compiles == 1
    (event,) = log_events("cache_remote_rejected")
    assert "nested" in event.reason  # type: ignore[attr-defined]


# 4. stale locks --------------------------------------------------------------------------------


def _old_stamp(r: Any, lock: str) -> None:
    t = r.time()
    r.set(lock, f"someone:{t[0] * 1000 - 3_600_000}", px=4000)  # taken an hour ago


STALE = {
    "no-expiry": lambda r, lock: r.set(lock, "left-by-someone"),
    "expiry-beyond-the-lock-timeout": lambda r, lock: r.set(lock, "x", px=3_600_000),
    "older-than-the-lock-timeout": _old_stamp,
}


@pytest.mark.parametrize("how", sorted(STALE))
def test_a_stale_lock_is_taken_over_at_once(
    how: str,
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    proxy: Callable[[int, float], PacedProxy],
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    metric_points: Callable[[str], list[Any]],
    log_events: Callable[[str], list[Any]],
) -> None:
    src = add_src(4.0, f"stale-{how}-{time.time_ns()}")
    key = _key(src, device)
    r = server.client()
    STALE[how](r, PREFIX + "lock:" + key)
    url = proxy(16 << 10, 1 / 16).url(server)  # a 256 KiB/s link
    c = ProgramCache(tmp_path / "local", remote=url, remote_key=SECRET, lock_timeout=5.0)
    before = _remote_seconds(metric_points)
    t0 = time.monotonic()
    check_add(c.get_program(ctx, src, device), 4.0)
    took = time.monotonic() - t0
    in_redis = _remote_seconds(metric_points) - before
    print(f"\n{how}: get_program {took:.3f} s, of it remote calls {in_redis:.3f} s")
    assert in_redis < DEADLINE_S + 0.2 and took < 5.0  # before: the whole lock_timeout
    assert c.stats.remote_waits == 0 and c.stats.remote_writes == 1
    assert log_events("cache_remote_lock_stale")
    assert r.get(PREFIX + "lock:" + key) is None  # taken over, then released


def test_a_live_lock_is_waited_for_until_the_lock_timeout_then_the_program_compiled(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
) -> None:
    src = add_src(4.0, f"live-lock-{time.time_ns()}")
    key = _key(src, device)
    r = server.client()
    t = r.time()
    # held by another machine a moment ago, for as long as a lock of a 0.5 s wait lasts (1 s)
    r.set(PREFIX + "lock:" + key, f"someone:{t[0] * 1000 + t[1] // 1000}", px=1000)
    c = ProgramCache(tmp_path / "local", remote=server.url, remote_key=SECRET, lock_timeout=0.5)
    t0 = time.monotonic()
    check_add(c.get_program(ctx, src, device), 4.0)
    assert 0.5 <= time.monotonic() - t0 < 5.0
    assert (c.stats.remote_waits, c.stats.remote_lock_timeouts) == (1, 1)
    (event,) = log_events("cache_remote_lock_timeout")
    assert (event.key, event.timeout_s) == (key, 0.5)


def test_a_lock_released_while_waiting_is_taken_and_the_entry_expires_in_thirty_days(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
) -> None:
    src = add_src(4.0, f"released-lock-{time.time_ns()}")
    key = _key(src, device)
    r = server.client()
    r.set(PREFIX + "lock:" + key, "someone", px=5000)  # as long as the wait below: not stale
    threading.Timer(0.3, r.delete, (PREFIX + "lock:" + key,)).start()  # the holder is done
    c = ProgramCache(tmp_path / "local", remote=server.url, remote_key=SECRET, lock_timeout=5.0)
    check_add(c.get_program(ctx, src, device), 4.0)
    assert (c.stats.remote_waits, c.stats.remote_lock_timeouts, c.stats.remote_writes) == (1, 0, 1)
    assert 0 < r.ttl(PREFIX + key) <= _remote.TTL_S  # written with its expiry


# 5. a signed (or checksummed) binary that was cut ---------------------------------------------

LOAD_CUT = textwrap.dedent("""
    import json, sys
    import numpy as np, pyopencl as cl
    from netcl.core import device
    from netcl.runtime.cache import ProgramCache
    folder, src, remote = sys.argv[1], sys.argv[2], sys.argv[3] or None
    ctx = device.default_context(); dev = ctx.devices[0]; q = cl.CommandQueue(ctx)
    c = ProgramCache(folder, remote=remote, remote_key="fleet-secret")
    prg = c.get_program(ctx, src, dev)
    a = np.arange(64, dtype=np.float32); mf = cl.mem_flags
    da = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    dc = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
    prg.add(q, (64,), None, da, da, dc)
    out = np.empty_like(a); cl.enqueue_copy(q, out, dc)
    assert np.allclose(out, 2 * a + 5.0)
    print(json.dumps(c.stats.as_dict()))
""")


@pytest.mark.parametrize("tier", ["disk", "remote"])
@pytest.mark.parametrize("keep", [0.3, 0.5])
def test_a_cut_binary_never_reaches_the_driver(
    tier: str,
    keep: float,
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
) -> None:
    """A PoCL binary cut short but stored with matching lengths and a valid checksum (disk) or
    signature (remote): PoCL would read past its end and crash the process."""
    from netcl.runtime.cache._entry import decode, encode

    src = add_src(5.0, f"cut-{tier}-{keep}-{time.time_ns()}")
    writer = ProgramCache(tmp_path / "writer")
    writer.get_program(ctx, src, device)
    (entry,) = writer.entries()
    binary = bytes(decode(entry.path.read_bytes(), entry.key)[1])
    cut = binary[: int(len(binary) * keep)]
    meta = {"identity": device_identity(device), "device": device.name}
    folder = tmp_path / "reader"
    if tier == "disk":
        ProgramCache(folder).entries()  # makes the folders
        (folder / "programs" / entry.path.name).write_bytes(encode(entry.key, cut, meta))
        remote = ""
    else:
        server.client().set(PREFIX + entry.key, encode(entry.key, cut, meta, SECRET.encode()))
        remote = server.url
    out = subprocess.run(
        [sys.executable, "-c", LOAD_CUT, str(folder), src, remote],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"  # -11: SIGSEGV
    stats = json.loads(out.stdout)
    assert stats["compiles"] == 1
    if tier == "disk":
        assert stats["corrupt"] == 1 and stats["recoveries"] == 1 and stats["disk_hits"] == 0
    else:
        assert stats["remote_rejected"] == 1 and stats["remote_hits"] == 0


def test_the_cut_is_named(ctx: cl.Context) -> None:
    from netcl.runtime.cache._build import check_binary
    from netcl.runtime.cache._entry import EntryError

    prg = cl.Program(ctx, "__kernel void k(__global float *x) { x[0] = 1.0f; }").build()
    binary = bytes(prg.get_info(cl.program_info.BINARIES)[0])
    check_binary(binary)  # whole: fine
    if binary[:8] != b"poclbin\0":
        pytest.skip("the default device is not PoCL")
    huge_name = binary[:80] + struct.pack("<I", 1 << 30)  # a length pointing far past the end
    for bad in (binary[:-1], binary[:100], binary + b"\0", huge_name):
        with pytest.raises(EntryError, match="binary"):
            check_binary(bad)


def test_a_bad_value_seen_again_after_waiting_for_the_lock_is_reported_once(
    ctx: cl.Context,
    device: cl.Device,
    tmp_path: Path,
    server: RedisServer,
    add_src: Callable[..., str],
    check_add: Callable[..., None],
    log_events: Callable[[str], list[Any]],
) -> None:
    """A value that is not ours, and another machine compiling the program: the lookup refuses
    the value, waits for the lock, reads the same value again when the holder gives up, and
    counts and logs it once; then it compiles and replaces the value."""
    src = add_src(4.0, f"bad-twice-{time.time_ns()}")
    key = _key(src, device)
    r = server.client()
    r.set(PREFIX + key, b"\x80\x05\x95 not a netcl value")
    r.set(PREFIX + "lock:" + key, "someone", px=5000)  # as long as the wait below: not stale
    threading.Timer(0.3, r.delete, (PREFIX + "lock:" + key,)).start()  # gives up, value as is
    c = ProgramCache(tmp_path / "local", remote=server.url, remote_key=SECRET, lock_timeout=5.0)
    check_add(c.get_program(ctx, src, device), 4.0)
    assert (c.stats.remote_waits, c.stats.remote_rejected, c.stats.compiles) == (1, 1, 1)
    assert len(log_events("cache_remote_rejected")) == 1
    assert c.stats.remote_writes == 1 and r.get(PREFIX + key) != b"\x80\x05\x95 not a netcl value"
