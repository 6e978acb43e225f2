"""Which pyopencl errors the pool takes for "out of device memory" (found by the mutation run: no
test reached the codes other than MemoryError). The pool frees its held blocks and retries only
on those; any other error reaches the caller at once."""

from __future__ import annotations

import pyopencl as cl
import pytest

from netcl.core.memory import _is_oom as is_oom

_CODES = cl.status_code


def _error(kind: type[cl.Error], code: int) -> cl.Error:
    # built the way pyopencl's C++ layer builds the errors it raises
    return kind(cl._cl._ErrorRecord("clCreateBuffer failed", code, "clCreateBuffer"))


@pytest.mark.parametrize(
    "code",
    [_CODES.MEM_OBJECT_ALLOCATION_FAILURE, _CODES.OUT_OF_RESOURCES, _CODES.OUT_OF_HOST_MEMORY],
)
def test_out_of_memory_codes_count_whatever_class_carries_them(code: int) -> None:
    assert is_oom(_error(cl.MemoryError, code))
    assert is_oom(_error(cl.RuntimeError, code))


def test_a_real_driver_error_that_is_not_memory_is_not_oom(ctx: cl.Context) -> None:
    with pytest.raises(cl.Error) as info:  # zero bytes: CL_INVALID_BUFFER_SIZE from the driver
        cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 0)
    assert not is_oom(info.value)
    assert not is_oom(_error(cl.LogicError, _CODES.INVALID_VALUE))
