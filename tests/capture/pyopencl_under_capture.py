"""A pytest plugin that runs every test inside a ``KernelCapture`` and replays the capture once
afterwards (waiting for the replay): a replay that cannot run fails the test.

Used by ``test_pyopencl_suite.py`` on pyopencl's own test suite:
``python -m pytest -p pyopencl_under_capture <pyopencl>/test/test_array.py`` with this folder on
``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from netcl.runtime.capture import KernelCapture


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, Any, Any]:
    cap = KernelCapture()
    cap.begin()
    try:
        result = yield
    except BaseException:
        cap.reset()  # the test failed on its own: nothing to replay
        raise
    try:
        cap.end()
        done = cap.replay()
        if done is not None:
            done.wait()
    finally:
        cap.reset()
    return result
