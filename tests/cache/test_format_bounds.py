"""Exact bounds of the entry format (as the remote tier reads it: signed, with a bound) and of
``pid_alive`` (found by the mutation run: the edges and the error details were untested)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from netcl.runtime.cache._entry import FORMAT_VERSION as VERSION
from netcl.runtime.cache._entry import HEADER, MAGIC, EntryError, _tag, decode, encode, tag_size
from netcl.runtime.cache._store import pid_alive

SECRET = b"fleet secret"
KEY = hashlib.sha256(b"program").hexdigest()
TAG_BYTES = tag_size(SECRET)


def encode_value(secret: bytes, key: str, binary: bytes, meta: dict[str, object]) -> bytes:
    return encode(key, binary, meta, secret)


def decode_value(
    secret: bytes, key: str, data: bytes, bound: int
) -> tuple[dict[str, object], memoryview]:
    return decode(data, key, secret=secret, max_bytes=bound)


def _error(data: bytes, bound: int = 1 << 20) -> EntryError:
    with pytest.raises(EntryError) as info:
        decode_value(SECRET, KEY, data, bound)
    return info.value


def test_a_value_of_exactly_the_bound_is_read_one_byte_more_is_not() -> None:
    value = encode_value(SECRET, KEY, b"\x01" * 100, {"identity": "x"})
    meta, binary = decode_value(SECRET, KEY, value, len(value))
    assert meta == {"identity": "x"} and bytes(binary) == b"\x01" * 100
    err = _error(value, len(value) - 1)
    assert str(err) == f"oversized: {len(value)} bytes, bound {len(value) - 1}"


def test_shorter_than_header_and_tag_is_truncated_naming_the_length() -> None:
    for n in (1, HEADER.size - 1, HEADER.size + TAG_BYTES - 1):
        data = (HEADER.pack(MAGIC, VERSION, 0, 0, 0) + b"\0" * TAG_BYTES)[:n]
        err = _error(data)
        assert err.reason == "truncated" and str(err) == f"truncated: {n} bytes"


def test_header_and_tag_alone_are_long_enough_and_fail_on_the_metadata() -> None:
    # 56 bytes, authentic, declaring no metadata and no binary: past every length check, the
    # empty metadata is what is refused
    head = HEADER.pack(MAGIC, VERSION, 0, 0, 0)
    data = head + _tag(KEY, head, SECRET)
    assert len(data) == HEADER.size + TAG_BYTES
    assert _error(data).reason == "metadata"


def test_pid_alive_edges() -> None:
    assert pid_alive(os.getpid()) and pid_alive(1)  # 1: init, always there
    assert not pid_alive(0) and not pid_alive(-1)  # never a single process
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert not pid_alive(int(done.stdout))  # exited and reaped


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a check as another user")
def test_a_process_of_another_user_is_alive() -> None:
    # a forked child turned into nobody: signalling init is refused (EPERM), which still means
    # "exists"; the child only calls os.kill and exits
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, b"1" if pid_alive(1) else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_foreign_version_and_length_errors_name_what_they_found() -> None:
    value = encode_value(SECRET, KEY, b"\x02" * 10, {"identity": "x"})
    foreign = b"NOTNETCL" + value[8:]
    assert str(_error(foreign)) == f"foreign: magic b'NOTNETCL', expected {MAGIC!r}"
    newer = value[:8] + (VERSION + 1).to_bytes(2, "little") + value[10:]
    err = _error(newer)
    assert err.reason == "version"
    assert str(err) == f"version: format {VERSION + 1}, expected {VERSION}"
    want = len(value)
    assert str(_error(value + b"\0")) == f"truncated: {want + 1} bytes, header says {want}"


def test_metadata_of_exactly_the_largest_size_is_read() -> None:
    from netcl.runtime.cache._entry import MAX_META_BYTES

    filler = "a" * (MAX_META_BYTES - len('{"identity":"x","pad":""}'))
    meta = {"identity": "x", "pad": filler}
    value = encode_value(SECRET, KEY, b"\x03", meta)
    assert HEADER.unpack_from(value)[3] == MAX_META_BYTES
    assert decode_value(SECRET, KEY, value, 1 << 20)[0] == meta


def test_a_wrong_tag_says_so() -> None:
    value = encode_value(SECRET, KEY, b"\x04" * 10, {"identity": "x"})
    tampered = value[:-1] + bytes([value[-1] ^ 1])
    assert str(_error(tampered)) == (
        "signature: HMAC tag does not match (tampered, or another key)"
    )


def test_metadata_one_byte_too_large_is_refused_naming_both_sizes() -> None:
    from netcl.runtime.cache._entry import MAX_META_BYTES, parse_meta

    with pytest.raises(EntryError) as info:
        parse_meta(b" " * (MAX_META_BYTES + 1))
    assert info.value.reason == "metadata"
    assert str(info.value) == f"metadata: {MAX_META_BYTES + 1} bytes, at most {MAX_META_BYTES}"


def test_nesting_is_counted_from_where_it_closes() -> None:
    from netcl.runtime.cache._entry import parse_meta

    # one level closed, then nine open: 9 deep, though never more than 8 brackets stay open
    # before the first closing
    raw = b'{"a":[],"b":[[[[[[[[]]]]]]]]}'
    with pytest.raises(EntryError) as info:
        parse_meta(raw)
    assert str(info.value) == "metadata: nested 9 deep, at most 8"
    assert parse_meta(b'{"a":[],"b":[[[[[[[]]]]]]]}')["a"] == []  # 8 deep: read


def test_metadata_that_is_not_json_says_what_the_parser_said() -> None:
    import json

    from netcl.runtime.cache._entry import parse_meta

    with pytest.raises(json.JSONDecodeError) as parser:
        json.loads(b'{"a":')
    with pytest.raises(EntryError) as info:
        parse_meta(b'{"a":')
    assert str(info.value) == f"metadata: {parser.value}"


def test_the_encoding_is_canonical() -> None:
    # sorted keys, no spaces, reserved field 0: equal metadata gives byte-equal values, whatever
    # the dict's insertion order (the layout documented in the module)
    one = encode_value(SECRET, KEY, b"\x05", {"b": 1, "a": [1, 2]})
    two = encode_value(SECRET, KEY, b"\x05", {"a": [1, 2], "b": 1})
    assert one == two
    magic, version, reserved, meta_len, bin_len = HEADER.unpack_from(one)
    assert (magic, version, reserved, bin_len) == (MAGIC, VERSION, 0, 1)
    assert one[HEADER.size : HEADER.size + meta_len] == b'{"a":[1,2],"b":1}'


def test_metadata_that_is_not_an_object_is_named() -> None:
    from netcl.runtime.cache._entry import parse_meta

    with pytest.raises(EntryError) as info:
        parse_meta(b"[1]")
    assert str(info.value) == "metadata: not a JSON object"


def test_an_error_without_detail_is_just_its_reason() -> None:
    assert str(_error(b"")) == "empty"
    assert str(EntryError("special")) == "special"
