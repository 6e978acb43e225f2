"""Plain-text tables for the ``netcl`` command (every package's subcommands) and the demo:
labels never run into values, lists get a header, counts get the right plural, and a narrow
terminal is respected (a cell that does not fit is cut with ``…``). Output to a pipe or file is
never cut unless ``COLUMNS`` is set."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

__all__ = ["human", "pairs", "plural", "table", "width"]

_GAP = "  "
_MARK = "…"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, "entry", "entries")`` -> ``"1 entry"``; without ``many``, ``word + "s"``."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def human(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB`` ... ``3.2 GiB``."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def width() -> int | None:
    """Columns to fit in: ``COLUMNS`` when set, the terminal's width when stdout is one, else
    None (no limit: a pipe or log file gets whole lines)."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if sys.stdout.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def _cut(text: str, room: int) -> str:
    if len(text) <= room:
        return text
    return text[: max(room - 1, 0)] + _MARK if room > 0 else ""


def table(
    rows: Sequence[Sequence[object]],
    headers: Sequence[str] | None = None,
    *,
    right: Sequence[int] = (),
) -> list[str]:
    """Rows as aligned columns two spaces apart, ``headers`` first; column indexes in ``right``
    are right-aligned. Lines longer than :func:`width` are cut in their widest columns, the
    last first, with ``…``."""
    limit = width()
    cells = [[str(c) for c in r] for r in ([list(headers)] if headers else []) + list(rows)]
    if not cells:
        return []
    n = max(len(r) for r in cells)
    for r in cells:
        r.extend([""] * (n - len(r)))
    widths = [max(len(r[i]) for r in cells) for i in range(n)]
    if limit is not None:
        over = sum(widths) + len(_GAP) * (n - 1) - limit
        while over > 0:
            i = max(range(n), key=lambda k: (widths[k], k))
            if (take := min(over, widths[i] - min(widths[i], 4))) <= 0:
                break
            widths[i] -= take
            over -= take
    lines = []
    for r in cells:
        parts = [
            _cut(c, w).rjust(w) if i in right else _cut(c, w).ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        line = _GAP.join(parts).rstrip()  # rstrip: no padding after the last column
        lines.append(_cut(line, limit) if limit is not None else line)
    return lines


def pairs(rows: Sequence[tuple[str, object]]) -> list[str]:
    """``label  value`` lines with the values in one column; a value that does not fit next to
    its label goes on the next line, indented, cut with ``…`` if still too long."""
    limit = width()
    label_w = max((len(k) for k, _ in rows), default=0)
    lines = []
    for label, value in rows:
        text = str(value)
        line = f"{label:<{label_w}}{_GAP}{text}".rstrip()
        if limit is not None and len(line) > limit:
            lines += [_cut(label, limit), _cut("    " + text, limit)]
        else:
            lines.append(line)
    return lines
