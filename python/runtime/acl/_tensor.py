"""Tensor descriptors and data buffers (top-level ``acl`` functions), as pyACL has them.

A descriptor records dtype, dims and format; a data buffer records an address and a size. Both
are handles (ints); creation returns the handle alone (0 when refused, as pyACL's NULL) and the
getters return bare values, as the pyACL wrappers of non-``aclError`` C functions do. Addresses
in data buffers are checked when an operator uses them (``acl.op.execute_v2``).
"""

from __future__ import annotations

from typing import Any

from . import _consts as C
from . import _state as S
from ._state import AclError, api, need_int


class TensorDesc:
    __slots__ = ("count", "dims", "dtype", "fmt", "size")

    def __init__(self, dtype: int, dims: tuple[int, ...], fmt: int):
        self.dtype = dtype
        self.dims = dims
        self.fmt = fmt
        n = 1
        for d in dims:
            n *= d
        self.count = n
        info = C.DTYPES.get(dtype)
        if info is not None:
            self.size = n * info[1]
        elif dtype == C.ACL_INT4:
            self.size = (n + 1) // 2
        elif dtype == C.ACL_UINT1:
            self.size = (n + 7) // 8
        else:
            self.size = 0

    def element_count(self) -> int:
        return self.count

    def nbytes(self) -> int:
        return self.size


class DataBuffer:
    """An address and a size; ``cache`` keeps the operand ``acl.op`` resolved for it last."""

    __slots__ = ("cache", "ptr", "size")

    def __init__(self, ptr: int, size: int):
        self.ptr = ptr
        self.size = size
        self.cache: Any = None


def _desc(h: Any, name: str) -> TensorDesc:
    return S.get(h, TensorDesc, "tensor desc", name)


def create_tensor_desc(dtype: int, dims: list, fmt: int) -> int:
    """A descriptor handle (0 when a dim is negative); ``dims`` must be a list, as pyACL."""
    need_int("acl.create_tensor_desc", dtype=dtype, fmt=fmt)
    if not isinstance(dims, list):
        raise S.ArgTypeError("acl.create_tensor_desc args parse failed: argument 2 is not list")
    need_int("acl.create_tensor_desc", **{f"dims[{i}]": d for i, d in enumerate(dims)})
    if any(d < 0 for d in dims):
        S.record_msg(f"acl.create_tensor_desc: dims {dims} (dynamic -1 dims are not supported)")
        return 0
    return S.new_handle(TensorDesc(int(dtype), tuple(int(d) for d in dims), int(fmt)))


def destroy_tensor_desc(desc: int) -> None:
    need_int("acl.destroy_tensor_desc", desc=desc)
    if type(S.handles.get(desc)) is TensorDesc:
        S.drop(desc)
        S.bump()
    else:
        S.record_msg(f"acl.destroy_tensor_desc: {desc:#x} is not a live tensor desc")


def _getter(name: str, f, bad: Any = 0):
    def get(desc: int) -> Any:
        need_int(name, desc=desc)
        try:
            return f(_desc(desc, name))
        except AclError as e:
            S.record_msg(str(e))
            return bad

    get.__name__ = name.rsplit(".", 1)[1]
    return get


get_tensor_desc_size = _getter("acl.get_tensor_desc_size", TensorDesc.nbytes)
get_tensor_desc_element_count = _getter(
    "acl.get_tensor_desc_element_count", TensorDesc.element_count
)
get_tensor_desc_num_dims = _getter("acl.get_tensor_desc_num_dims", lambda d: len(d.dims))
get_tensor_desc_type = _getter("acl.get_tensor_desc_type", lambda d: d.dtype, C.ACL_DT_UNDEFINED)
get_tensor_desc_format = _getter(
    "acl.get_tensor_desc_format", lambda d: d.fmt, C.ACL_FORMAT_UNDEFINED
)


def get_tensor_desc_dim(desc: int, index: int) -> int:
    """Dim ``index`` (-1 when the descriptor or the index is invalid)."""
    dim, ret = get_tensor_desc_dim_v2(desc, index)
    return dim if ret == 0 else -1


@api("acl.get_tensor_desc_dim_v2", 1, -1)
def get_tensor_desc_dim_v2(desc: int, index: int) -> tuple[int, int]:
    need_int("acl.get_tensor_desc_dim_v2", desc=desc, index=index)
    d = _desc(desc, "acl.get_tensor_desc_dim_v2")
    if not 0 <= index < len(d.dims):
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM,
            f"acl.get_tensor_desc_dim_v2: index {index} (the desc has {len(d.dims)} dims)",
        )
    return d.dims[index], C.ACL_SUCCESS


def data_type_size(dtype: int) -> int:
    need_int("acl.data_type_size", dtype=dtype)
    info = C.DTYPES.get(dtype)
    return 0 if info is None else info[1]


def create_data_buffer(data: int, size: int) -> int:
    """A data buffer handle for ``size`` bytes at ``data`` (0 and 0 for an empty one)."""
    need_int("acl.create_data_buffer", data=data, size=size)
    if size < 0 or (data == 0 and size != 0):
        S.record_msg(f"acl.create_data_buffer: data {data:#x}, size {size}")
        return 0
    return S.new_handle(DataBuffer(int(data), int(size)))


@api("acl.destroy_data_buffer")
def destroy_data_buffer(data_buffer: int) -> int:
    """Forget the buffer (the memory it names is not freed)."""
    need_int("acl.destroy_data_buffer", data_buffer=data_buffer)
    S.get(data_buffer, DataBuffer, "data buffer", "acl.destroy_data_buffer")
    S.drop(data_buffer)
    S.bump()
    return C.ACL_SUCCESS


def _buf_getter(name: str, f):
    def get(data_buffer: int) -> int:
        need_int(name, data_buffer=data_buffer)
        try:
            return f(S.get(data_buffer, DataBuffer, "data buffer", name))
        except AclError as e:
            S.record_msg(str(e))
            return 0

    get.__name__ = name.rsplit(".", 1)[1]
    return get


get_data_buffer_addr = _buf_getter("acl.get_data_buffer_addr", lambda b: b.ptr)
get_data_buffer_size = _buf_getter("acl.get_data_buffer_size", lambda b: b.size)
get_data_buffer_size_v2 = _buf_getter("acl.get_data_buffer_size_v2", lambda b: b.size)


@api("acl.update_data_buffer")
def update_data_buffer(data_buffer: int, data: int, size: int) -> int:
    need_int("acl.update_data_buffer", data_buffer=data_buffer, data=data, size=size)
    b = S.get(data_buffer, DataBuffer, "data buffer", "acl.update_data_buffer")
    if size < 0:
        raise AclError(C.ACL_ERROR_INVALID_PARAM, f"acl.update_data_buffer: size {size}")
    b.ptr, b.size = int(data), int(size)
    b.cache = None
    S.bump()
    return C.ACL_SUCCESS
