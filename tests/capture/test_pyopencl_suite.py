"""pyopencl's own tests that once failed under capture (a capture spanning two contexts), run
with every test recorded and replayed (``pyopencl_under_capture.py``).

pyopencl's test suite is not installed with pyopencl: point ``NETCL_PYOPENCL_TESTS`` at the
``test`` folder of a pyopencl checkout of the installed version to run these; without it they
are skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = os.environ.get("NETCL_PYOPENCL_TESTS", "")
TESTS = [
    "test_array.py::test_custom_type_zeros",
    "test_array.py::test_custom_type_take_put",
    "test_algorithm.py::test_struct_reduce",
    "test_algorithm.py::test_sort",
    "test_wrapper.py::test_capture_call",
]


@pytest.mark.slow
@pytest.mark.skipif(not SUITE, reason="set NETCL_PYOPENCL_TESTS to pyopencl's test folder")
@pytest.mark.parametrize("test", TESTS)
def test_pyopencl_test_replays_under_capture(test: str) -> None:
    suite = Path(SUITE)
    assert (suite / test.split("::")[0]).is_file(), f"{suite} holds no {test}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    # one process per test: pyopencl's registry of struct types is process-wide, and two of
    # these tests register one name differently
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-p",
            "pyopencl_under_capture",
            "-o",
            "addopts=",
            test,
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout, res.stdout[-2000:]
