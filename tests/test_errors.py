"""The exception hierarchy."""

from __future__ import annotations

import pytest

import runtime


@pytest.mark.parametrize(
    "cls, extra",
    [
        (runtime.NotInitializedError, ()),
        (runtime.InvalidDeviceError, (ValueError,)),
        (runtime.OutOfMemoryError, (MemoryError,)),
        (runtime.InvalidHandleError, ()),
        (runtime.KernelError, ()),
        (runtime.NotReadyError, ()),
        (runtime.InvalidOperationError, ()),
        (runtime.WaitTimeoutError, (TimeoutError,)),
    ],
)
def test_hierarchy(cls, extra):
    assert issubclass(cls, runtime.Error)
    assert issubclass(cls, RuntimeError)
    for e in extra:
        assert issubclass(cls, e)
    assert cls.__module__ == "runtime"
    assert cls.__doc__


def test_base_is_runtime_error_subclass_not_shadowing_builtin():
    assert runtime.Error is not RuntimeError
    assert issubclass(runtime.Error, RuntimeError)


def test_out_of_memory_message_names_the_numbers():
    runtime.shutdown()
    runtime.init(device_count=1, memory="64MiB")
    try:
        keep = runtime.device_malloc(0, 40 << 20)
        with pytest.raises(runtime.OutOfMemoryError) as ei:
            runtime.device_malloc(0, 48 << 20)
        msg = str(ei.value)
        for word in ("50331648", "free", "67108864", "largest free block", "fragmentation"):
            assert word in msg
        assert isinstance(ei.value, MemoryError)
        runtime.device_free(keep)
        runtime.device_free(runtime.device_malloc(0, 48 << 20))
    finally:
        runtime.shutdown()
