"""The BufferPool's limit: the ``limit`` argument or ``NETCL_POOL_LIMIT``, checked once."""

from __future__ import annotations

import math

#: Environment variable with the default pool limit: bytes (``1000000000``) or a percentage of
#: the device's global memory (``50%``). ``0`` or unset: no limit.
LIMIT_ENV = "NETCL_POOL_LIMIT"


def resolve_limit(limit: int | None, global_mem: int) -> int:
    """The pool limit in bytes (0: none) from the argument, else from :data:`LIMIT_ENV`.

    Every value that is not a whole number of bytes >= 0 or a percentage from 0% to 100% is a
    ``ValueError`` naming the value (``inf%``, ``nan``, ``-1``, ``1e400``, ``lots``).
    """
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"BufferPool: limit={limit!r} must be an int >= 0 (bytes; 0 means no limit)"
            )
        return limit
    from netcl.core._settings import POOL_LIMIT  # the declaration netcl config lists

    raw = POOL_LIMIT.raw()
    text = raw.strip()
    if not text:
        return 0
    value = _parse(text, global_mem)
    if value is None:
        raise _invalid(raw)
    return value


def check_text(raw: str) -> str:
    """``raw`` when it is a valid ``NETCL_POOL_LIMIT`` (for ``netcl config``), else the same
    ValueError the pool raises."""
    if raw.strip() and _parse(raw.strip(), 0) is None:
        raise _invalid(raw)
    return raw


def _invalid(raw: str) -> ValueError:
    return ValueError(
        f"{LIMIT_ENV}={raw!r}: expected a number of bytes (a whole number >= 0, 0 for no "
        "limit) or a percentage of the device's global memory from 0% to 100%, such as '50%'"
    )


def _parse(text: str, global_mem: int) -> int | None:
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            # NaN fails both comparisons, and inf fails the second: both are refused here
            if not (math.isfinite(pct) and 0 <= pct <= 100):
                return None
            return int(global_mem * pct / 100)
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None
