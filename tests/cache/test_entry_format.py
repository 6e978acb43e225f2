"""The one entry format of both tiers (signed in Redis, checksummed on disk) and the URL
redaction (no Redis needed)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netcl.runtime.cache._config import redact
from netcl.runtime.cache._entry import (
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    EntryError,
    _tag,
    decode,
    encode,
    tag_size,
)

SECRET = b"fleet secret"
KEY = hashlib.sha256(b"program").hexdigest()
OTHER_KEY = hashlib.sha256(b"another program").hexdigest()
BINARY = bytes(range(256)) * 40
META = {"identity": "PoCL|cpu|3.0", "device": "cpu", "options": "-DN=4"}
BOUND = 1 << 20
TAG_BYTES = tag_size(SECRET)


def _reason(data: bytes, secret: bytes | None = SECRET, key: str = KEY, bound: int = BOUND) -> str:
    with pytest.raises(EntryError) as err:
        decode(data, key, secret=secret, max_bytes=bound)
    return err.value.reason


@pytest.mark.parametrize("secret", [SECRET, None], ids=["remote", "disk"])
def test_round_trip(secret: bytes | None) -> None:
    value = encode(KEY, BINARY, META, secret)
    meta, binary = decode(value, KEY, secret=secret, max_bytes=BOUND)
    assert meta == META and bytes(binary) == BINARY
    assert value[:8] == b"NETCLPRG" and BINARY in value  # the binary as is, no encoding
    assert HEADER.unpack_from(value)[1:3] == (FORMAT_VERSION, 0)  # one layout for both tiers
    assert len(value) - value.index(BINARY) - len(BINARY) == tag_size(secret)


def test_foreign_key_tampered_truncated_moved() -> None:
    value = encode(KEY, BINARY, META, SECRET)
    assert _reason(value, secret=b"another fleet") == "signature"  # signed with another key
    assert _reason(value, key=OTHER_KEY) == "signature"  # moved to another cache key
    flipped = bytearray(value)
    flipped[-TAG_BYTES - 10] ^= 1  # one bit of the binary
    assert _reason(bytes(flipped)) == "signature"
    assert _reason(value[:-1]) == "truncated"
    assert _reason(value[: HEADER.size + 3]) == "truncated"
    assert _reason(value + b"x") == "truncated"  # lengths must match exactly
    assert _reason(b"") == "empty"
    assert _reason(b"\x80\x04pickle" + value[10:]) == "foreign"  # not our magic: never parsed
    assert _reason(value, bound=len(value) - 1) == "oversized"


def test_metadata_is_parsed_only_after_the_tag() -> None:
    # a forged value with hostile metadata and a wrong tag is refused before any JSON parsing
    head = HEADER.pack(MAGIC, FORMAT_VERSION, 0, 3, 0)
    assert _reason(head + b"{{{" + bytes(TAG_BYTES)) == "signature"


def test_disk_entries_are_checksummed_not_signed() -> None:
    value = encode(KEY, BINARY, META)  # no secret: a crc32 over the key and the bytes before it
    assert _reason(value, secret=SECRET) in ("truncated", "signature")  # not a signed value
    assert _reason(encode(KEY, BINARY, META, SECRET), secret=None) == "truncated"
    assert _reason(value, secret=None, key=OTHER_KEY) == "checksum"  # moved to another key
    flipped = bytearray(value)
    flipped[HEADER.size + 5] ^= 1  # one bit of the metadata
    with pytest.raises(EntryError) as err:
        decode(bytes(flipped), KEY)
    assert str(err.value) == "checksum: crc32 of key, header, metadata and binary differs"


def _signed(meta: bytes, binary: bytes = b"") -> bytes:
    body = HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta), len(binary)) + meta + binary
    return body + _tag(KEY, body, SECRET)


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        (b"[" * 30_000 + b"]" * 30_000, "nested 30000 deep"),  # the parser would recurse
        (b'{"a":' * 9 + b"1" + b"}" * 9, "nested 9 deep"),
        (b'{"identity": "x", "pad": "' + b"x" * (64 << 10) + b'"}', "metadata of 655"),
        (b"\xff\xfe", "metadata"),  # not UTF-8
        (b"[1, 2]", "not a JSON object"),
        (b"{", "metadata"),
        (b'{"a":1} {}', "extra data"),  # the parser stops after the first value
    ],
    ids=[
        "30000-deep",
        "9-deep",
        "over-64KiB",
        "not-utf8",
        "not-an-object",
        "not-json",
        "extra-data",
    ],
)
def test_any_metadata_parse_failure_is_a_refused_value(meta: bytes, why: str) -> None:
    """Signed by a key holder (or forged in unsigned mode), yet refused: a value, never an
    exception out of the lookup."""
    with pytest.raises(EntryError, match=why) as err:
        decode(_signed(meta), KEY, secret=SECRET, max_bytes=BOUND)
    assert err.value.reason in ("metadata", "oversized")


def test_metadata_nesting_up_to_the_bound_is_read() -> None:
    # brackets inside strings do not count; eight levels are allowed
    meta = b'{"o": "-DA=[[[[[[[[[[x]]]]]]]]]]", "n":' + b"[" * 7 + b"]" * 7 + b"}"
    assert decode(_signed(meta), KEY, secret=SECRET)[0]["o"].startswith("-DA=")


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0), st.integers(min_value=1, max_value=255), st.booleans())
def test_any_changed_byte_is_refused(pos: int, xor: int, signed: bool) -> None:
    secret = SECRET if signed else None
    value = bytearray(encode(KEY, BINARY[:300], META, secret))
    value[pos % len(value)] ^= xor
    with pytest.raises(EntryError):
        decode(bytes(value), KEY, secret=secret, max_bytes=BOUND)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@cache.internal:6379/0", "redis://***@cache.internal:6379/0"),
        ("rediss://user:hunter2@10.0.0.1:6380/2", "rediss://***@10.0.0.1:6380/2"),
        ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
        ("redis://:p%40ss@[::1]:7000", "redis://***@[::1]:7000"),
        ("redis://cache:6379", "redis://cache:6379"),
        ("redis://alice@cache:6379/0", "redis://***@cache:6379/0"),  # a user name alone
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert "hunter2" not in redact(url)


def test_the_device_identity_check_below_the_redis_client() -> None:
    """A correctly signed value written for another device (driver, version) is refused, by
    the check the remote tier applies to what Redis returns; no server needed."""
    value = encode(KEY, BINARY, META, SECRET)
    assert bytes(decode(value, KEY, secret=SECRET, ident=META["identity"])[1]) == BINARY
    for other in ("PoCL|cpu|3.1", "", "PoCL|cpu|3.0 "):
        with pytest.raises(EntryError, match=r"identity: written for 'PoCL\|cpu\|3\.0'"):
            decode(value, KEY, secret=SECRET, ident=other)
    no_identity = encode(KEY, BINARY, {"device": "cpu"}, SECRET)
    with pytest.raises(EntryError, match="identity"):
        decode(no_identity, KEY, secret=SECRET, ident=META["identity"])
    # the tier itself (its client is made, nothing is sent: no server at that address)
    pytest.importorskip("redis", reason="redis-py missing: pip install 'netcl-cache[redis]'")
    from netcl.runtime.cache._config import RemoteSettings
    from netcl.runtime.cache._remote import RemoteTier

    tier = RemoteTier(RemoteSettings("redis://127.0.0.1:1/0", SECRET, True, 1.0))
    assert bytes(tier.decode(KEY, META["identity"], value)) == BINARY
    with pytest.raises(EntryError) as err:
        tier.decode(KEY, "another driver", value)
    assert err.value.reason == "identity"
