"""What the capture package sets up when it is imported, checked here because the mutation run
only runs, for each function, the tests that call it inside a test: the hook table (every entry
point that records gets its stand-in, the invoker's memo included) and the lazily imported names
(the same object on every lookup)."""

from __future__ import annotations

import pytest

import netcl.runtime.capture as capture
from netcl.runtime.capture import _intercept


def test_the_hook_table_made_again_covers_the_same_entry_points() -> None:
    again = _intercept._hooks()
    assert again and set(again) == set(_intercept.HOOKS)
    assert _intercept._memo_invoker in again.values()


@pytest.mark.parametrize("name", ["capture_step", "load_step", "CaptureFileError"])
def test_a_lazy_name_is_the_same_object_on_every_lookup(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(vars(capture), name, raising=False)  # as before its first lookup
    first = getattr(capture, name)
    assert first is not None and getattr(capture, name) is first
