"""``acl.op``: single-operator calls (``execute_v2``) on the runtime's native kernels.

Operators and how they run (``stream`` order in both cases; ``execute_v2`` returns at once):

==========  ==================================================  ===========================
op_type     native kernel (same shapes, a native dtype)          otherwise (numpy fallback)
==========  ==================================================  ===========================
Add         ``add(out, a, b)``                                   ``a + b`` (broadcasting)
Sub         ``axpy(out=a, b, -1)`` / ``scale(out, b, -1)`` then  ``a - b``
            ``add(out, a, out)``
Mul         ``mul(out, a, b)``                                   ``a * b``
Div         none                                                 floats ``a / b``; integers
RealDiv                                                          ``a // b`` (floor, as
                                                                 Ascend's Div), x/0 -> 0
Cast        ``copy`` when the dtypes are equal                   ``x.astype(out dtype)``
MatMul      ``matmul(c, a, b)`` (2-D, no transpose, no bias)     ``op(a) @ op(b) (+ bias)``
==========  ==================================================  ===========================

The native kernels take the dtypes ``runtime.kernels`` lists (float32, float64, int32, int64
today); whether a kernel takes a dtype is learnt from its launch (the runtime refuses an
unsupported dtype before queueing anything) and remembered, so dtypes added to the native
kernels are used without a change here. Every other dtype a descriptor can name and numpy has
(float16, int8, int16, uint8..uint64, bool, complex64, complex128) runs as the *numpy fallback*:
a Python kernel launched on the same stream (``Stream.launch_kernel(fn, buffers)``), which
receives the device buffers as numpy views, computes with numpy and writes the output, in
stream order. bfloat16, complex32, int4, uint1 and strings have no numpy type and return
``ACL_ERROR_UNSUPPORTED_DATA_TYPE``. No ``.om`` model files are used: ``set_model_dir`` only
checks its argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import runtime
from runtime import _runtime as N

from . import _consts as C
from . import _state as S
from ._state import AclError, api, need_int
from ._tensor import DataBuffer, TensorDesc

__all__ = [
    "cast",
    "create_attr",
    "create_handle",
    "destroy_attr",
    "destroy_handle",
    "execute",
    "execute_v2",
    "execute_with_handle",
    "set_attr_bool",
    "set_attr_float",
    "set_attr_int",
    "set_attr_list_bool",
    "set_attr_list_float",
    "set_attr_list_int",
    "set_attr_list_string",
    "set_attr_string",
    "set_model_dir",
    "update_params",
]

OPS = ("Add", "Sub", "Mul", "Div", "RealDiv", "Cast", "MatMul")


class OpAttr:
    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}


def create_attr() -> int:
    """An attribute-set handle (no ``ret``, as pyACL)."""
    return S.new_handle(OpAttr())


def destroy_attr(attr: int) -> None:
    need_int("acl.op.destroy_attr", attr=attr)
    if type(S.handles.get(attr)) is OpAttr:
        S.drop(attr)
        S.bump()
    else:
        S.record_msg(f"acl.op.destroy_attr: {attr:#x} is not a live op attr")


def _setter(name: str, check):
    @api(name)
    def set_attr(attr: int, attr_name: str, value: Any) -> int:
        need_int(name, attr=attr)
        if not isinstance(attr_name, str):
            raise S.ArgTypeError(f"{name} args parse failed: attr_name must be a str")
        a = S.get(attr, OpAttr, "attr", name)
        if not check(value):
            raise S.ArgTypeError(f"{name} args parse failed: value {value!r}")
        a.values[attr_name] = value
        S.bump()
        return C.ACL_SUCCESS

    set_attr.__name__ = name.rsplit(".", 1)[1]
    return set_attr


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


set_attr_int = _setter(
    "acl.op.set_attr_int", lambda v: isinstance(v, int) and not isinstance(v, bool)
)
set_attr_float = _setter("acl.op.set_attr_float", _is_num)
set_attr_bool = _setter("acl.op.set_attr_bool", lambda v: isinstance(v, (bool, int)))
set_attr_string = _setter("acl.op.set_attr_string", lambda v: isinstance(v, str))
set_attr_list_int = _setter(
    "acl.op.set_attr_list_int", lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v)
)
set_attr_list_float = _setter(
    "acl.op.set_attr_list_float", lambda v: isinstance(v, list) and all(_is_num(x) for x in v)
)
set_attr_list_bool = _setter(
    "acl.op.set_attr_list_bool",
    lambda v: isinstance(v, list) and all(isinstance(x, (bool, int)) for x in v),
)
set_attr_list_string = _setter(
    "acl.op.set_attr_list_string",
    lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
)


@api("acl.op.set_model_dir")
def set_model_dir(model_dir: str) -> int:
    """Accepted: operators run on native kernels, so no ``.om`` files are read."""
    if not isinstance(model_dir, str):
        raise S.ArgTypeError("acl.op.set_model_dir args parse failed: model_dir must be a str")
    S.check_init("acl.op.set_model_dir")
    return C.ACL_SUCCESS


@api("acl.op.update_params")
def update_params(op_type: str, in_descs: list, out_descs: list, attr: int) -> int:
    """Accepted (no compilation is needed)."""
    _lists("acl.op.update_params", in_descs=in_descs, out_descs=out_descs)
    S.check_init("acl.op.update_params")
    return C.ACL_SUCCESS


# --------------------------------------------------------------------------- execution


def _lists(name: str, **kw: Any) -> None:
    for k, v in kw.items():
        if not isinstance(v, list):
            raise S.ArgTypeError(
                f"{name} args parse failed: {k} must be a list, got {type(v).__name__}"
            )


class _T:
    """One operand: its descriptor and where its bytes are (``buf`` None: no bytes)."""

    __slots__ = ("_native", "buf", "desc", "np_dtype", "off", "shape")

    def __init__(self, desc: TensorDesc, buf: runtime.DeviceBuffer | None, off: int):
        self.desc = desc
        self.buf = buf
        self.off = off
        self.shape = desc.dims
        self.np_dtype = C.DTYPES[desc.dtype][0]
        self._native: runtime.DeviceBuffer | None = None

    def native(self) -> runtime.DeviceBuffer:
        """A typed view (``ValueError``/``TypeError`` when the runtime lacks the dtype)."""
        v = self._native
        if v is None:
            assert self.buf is not None
            v = self._native = self.buf.view(self.np_dtype, self.shape, self.off)
        return v

    def raw(self) -> runtime.DeviceBuffer:
        assert self.buf is not None
        return self.buf.view("uint8", (self.desc.size,), self.off)


def _operand(name: str, what: str, dh: Any, bh: Any) -> _T:
    desc = S.handles.get(dh)
    buf = S.handles.get(bh)
    if type(desc) is not TensorDesc:
        S.get(dh, TensorDesc, f"{what} desc", name)
    if type(buf) is not DataBuffer:
        S.get(bh, DataBuffer, f"{what} buffer", name)
    cache = buf.cache
    if (
        cache is not None
        and cache[0] is desc
        and (cache[1] is None or cache[1] == N.acl_memory_generation())
    ):
        return cache[2]
    info = C.DTYPES.get(desc.dtype)
    if info is None or info[0] is None:
        raise AclError(
            C.ACL_ERROR_UNSUPPORTED_DATA_TYPE,
            f"{name}: {what} dtype {desc.dtype} is not supported (no numpy type)",
        )
    need = desc.size
    if buf.size < need:
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM,
            f"{name}: {what} buffer holds {buf.size} bytes, its desc {list(desc.dims)} needs {need}",
        )
    if not need:
        t = _T(desc, None, 0)
        buf.cache = (desc, None, t)
        return t
    gen = N.acl_memory_generation()
    dev, off = S.resolve_device(buf.ptr, need, f"{what} buffer", name)
    t = _T(desc, dev, off)
    buf.cache = (desc, gen, t)
    return t


class _Recorder:
    """A stream that remembers what was launched on it (the plan a repeated call replays)."""

    __slots__ = ("launches", "stream")

    def __init__(self, stream: runtime.Stream):
        self.stream = stream
        self.launches: list[tuple[Any, tuple]] = []

    def launch_kernel(self, kernel: Any, args: tuple) -> None:
        self.stream.launch_kernel(kernel, args)
        self.launches.append((kernel, args))


#: (op_type, attr, descs and buffers) -> (S.state_key() when recorded, launches)
_plans: dict[tuple, tuple[int, list]] = {}
_MAX_PLANS = 4096

#: ACL stream handle -> its runtime stream, for the replay fast path (handles never repeat, so
#: an entry never names another stream; a destroyed one fails its launch)
_streams: dict[int, runtime.Stream] = {}


def _forget() -> None:
    """Drop the recorded plans and streams (``acl.finalize``)."""
    _plans.clear()
    _streams.clear()


#: (kernel name, numpy dtype) -> whether the native kernel takes it (learnt on first launch)
_native: dict[tuple[str, str], bool] = {}


def _try_native(stream: runtime.Stream, kernel: str, dtype: str, launches: list) -> bool:
    key = (kernel, dtype)
    if _native.get(key) is False:
        return False
    try:
        for k, args in launches:
            stream.launch_kernel(getattr(runtime.kernels, k), args)
    except (ValueError, TypeError) as e:
        if "dtype" in str(e):
            _native[key] = False
        return False
    _native[key] = True
    return True


def _fallback(stream: runtime.Stream, fn, out: _T, ins: list[_T]) -> None:
    o_dt, o_shape = np.dtype(out.np_dtype), out.shape
    specs = [(np.dtype(t.np_dtype), t.shape) for t in ins]

    def kernel(o: np.ndarray, *xs: np.ndarray) -> None:
        args = [x.view(dt).reshape(sh) for x, (dt, sh) in zip(xs, specs)]
        with np.errstate(all="ignore"):
            res = fn(*args)
        o.view(o_dt).reshape(o_shape)[...] = res

    stream.launch_kernel(kernel, (out.raw(), *(t.raw() for t in ins)))


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return np.floor_divide(a, b)
    return np.true_divide(a, b)


_UFUNCS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _div, "RealDiv": _div}


def _binary(name: str, op: str, stream: runtime.Stream, ins: list[_T], outs: list[_T]) -> None:
    if len(ins) != 2:
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH, f"{name}: {op} takes 2 inputs, got {len(ins)}"
        )
    if len(outs) != 1:
        raise AclError(
            C.ACL_ERROR_OP_OUTPUT_NOT_MATCH, f"{name}: {op} has 1 output, got {len(outs)}"
        )
    a, b = ins
    (out,) = outs
    if not a.desc.dtype == b.desc.dtype == out.desc.dtype:
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH,
            f"{name}: {op} needs one dtype for inputs and output, got {a.np_dtype}, {b.np_dtype} -> {out.np_dtype}",
        )
    try:
        shape = a.shape if a.shape == b.shape else np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH,
            f"{name}: {op} shapes {list(a.shape)} and {list(b.shape)} do not broadcast",
        ) from None
    if tuple(shape) != out.shape:
        raise AclError(
            C.ACL_ERROR_OP_OUTPUT_NOT_MATCH,
            f"{name}: {op} output shape {list(out.shape)}, expected {list(shape)}",
        )
    if out.np_dtype == "bool" and op not in ("Add", "Mul"):
        raise AclError(
            C.ACL_ERROR_UNSUPPORTED_DATA_TYPE, f"{name}: {op} does not take bool tensors"
        )
    if out.buf is None:
        return
    dt = out.np_dtype
    if a.shape == b.shape == out.shape and op in ("Add", "Mul", "Sub"):
        try:
            o, x, y = out.native(), a.native(), b.native()
        except (ValueError, TypeError):  # the runtime has no such dtype
            o = x = y = None
        if o is not None:
            if op == "Add":
                launches = [("add", (o, x, y))]
            elif op == "Mul":
                launches = [("mul", (o, x, y))]
            elif out.buf.id == a.buf.id and out.off == a.off:
                launches = [("axpy", (o, y, -1))]  # out is a: a += -1 * b
            else:
                launches = [("scale", (o, y, -1)), ("add", (o, x, o))]  # out = -b; out = a + out
            if _try_native(stream, launches[-1][0], dt, launches):
                return
    _fallback(stream, _UFUNCS[op], out, [a, b])


def _cast(name: str, stream: runtime.Stream, ins: list[_T], outs: list[_T], attrs: dict) -> None:
    if len(ins) != 1 or len(outs) != 1:
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH,
            f"{name}: Cast takes 1 input and 1 output, got {len(ins)} and {len(outs)}",
        )
    (x,), (out,) = ins, outs
    want = attrs.get("dst_type")
    if want is not None and want != out.desc.dtype:
        raise AclError(
            C.ACL_ERROR_OP_ATTR_NOT_MATCH,
            f"{name}: Cast dst_type {want} but the output desc has dtype {out.desc.dtype}",
        )
    if x.shape != out.shape:
        raise AclError(
            C.ACL_ERROR_OP_OUTPUT_NOT_MATCH,
            f"{name}: Cast shapes {list(x.shape)} -> {list(out.shape)}",
        )
    if out.buf is None:
        return
    if x.np_dtype == out.np_dtype:
        try:
            if _try_native(stream, "copy", out.np_dtype, [("copy", (out.native(), x.native()))]):
                return
        except (ValueError, TypeError):
            pass
    odt = np.dtype(out.np_dtype)
    _fallback(stream, lambda v: v.astype(odt), out, [x])


def _matmul(name: str, stream: runtime.Stream, ins: list[_T], outs: list[_T], attrs: dict) -> None:
    if len(ins) not in (2, 3) or len(outs) != 1:
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH,
            f"{name}: MatMul takes 2 or 3 inputs (x1, x2, bias) and 1 output",
        )
    a, b = ins[0], ins[1]
    bias = ins[2] if len(ins) == 3 else None
    (out,) = outs
    ta, tb = bool(attrs.get("transpose_x1", False)), bool(attrs.get("transpose_x2", False))
    if len(a.shape) != 2 or len(b.shape) != 2 or len(out.shape) != 2:
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH,
            f"{name}: MatMul needs 2-D tensors, got {list(a.shape)}, {list(b.shape)} -> {list(out.shape)}",
        )
    m, k = a.shape[::-1] if ta else a.shape
    k2, n = b.shape[::-1] if tb else b.shape
    if k != k2 or out.shape != (m, n):
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH,
            f"{name}: MatMul shapes {list(a.shape)} x {list(b.shape)} -> {list(out.shape)} do not match",
        )
    if not a.desc.dtype == b.desc.dtype == out.desc.dtype:
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH,
            f"{name}: MatMul needs one dtype, got {a.np_dtype}, {b.np_dtype} -> {out.np_dtype}",
        )
    if out.buf is None:
        return
    if not (ta or tb or bias is not None) and a.buf is not None and b.buf is not None:
        try:
            if _try_native(
                stream, "matmul", out.np_dtype, [("matmul", (out.native(), a.native(), b.native()))]
            ):
                return
        except (ValueError, TypeError):
            pass

    def mm(x: np.ndarray, y: np.ndarray, *rest: np.ndarray) -> np.ndarray:
        r = np.matmul(x.T if ta else x, y.T if tb else y)
        return r + rest[0] if rest else r

    if a.buf is None or b.buf is None:  # k == 0: the product is zeros (plus bias)
        zeros = np.zeros((m, n), np.dtype(out.np_dtype))
        _fallback(
            stream,
            (lambda *r: zeros + r[0]) if bias is not None else (lambda: zeros),
            out,
            [bias] if bias is not None else [],
        )
        return
    _fallback(stream, mm, out, [a, b] + ([bias] if bias is not None else []))


def _run(
    name: str,
    op_type: Any,
    in_descs: Any,
    in_bufs: Any,
    out_descs: Any,
    out_bufs: Any,
    attr: Any,
    stream: Any,
) -> int:
    if not isinstance(op_type, str):
        raise S.ArgTypeError(f"{name} args parse failed: op_type must be a str")
    if (
        type(in_descs) is not list
        or type(in_bufs) is not list
        or type(out_descs) is not list
        or type(out_bufs) is not list
    ):
        _lists(name, in_descs=in_descs, in_bufs=in_bufs, out_descs=out_descs, out_bufs=out_bufs)
    if type(attr) is not int or type(stream) is not int:
        need_int(name, attr=attr, stream=stream)
    # A call whose handles and buffers were all seen before, with nothing destroyed, freed or
    # changed since (S.state_key()), replays the launches recorded then.
    gen = S.state_key()
    try:
        key: Any = (op_type, attr, *in_descs, -1, *in_bufs, -1, *out_descs, -1, *out_bufs)
        plan = _plans.get(key)
    except TypeError:  # an unhashable element: the checks below report it
        key = plan = None
    if plan is not None and plan[0] == gen and S.is_initialized():
        st = S.stream_of(stream, name)
        for kernel, args in plan[1]:
            st.launch_kernel(kernel, args)
        return C.ACL_SUCCESS
    S.check_init(name)
    if op_type not in OPS:
        raise AclError(
            C.ACL_ERROR_OP_NOT_FOUND,
            f"{name}: operator {op_type!r} is not available (runtime.acl has {', '.join(OPS)})",
        )
    if len(in_descs) != len(in_bufs):
        raise AclError(
            C.ACL_ERROR_OP_INPUT_NOT_MATCH,
            f"{name}: {len(in_descs)} input descs but {len(in_bufs)} input buffers",
        )
    if len(out_descs) != len(out_bufs):
        raise AclError(
            C.ACL_ERROR_OP_OUTPUT_NOT_MATCH,
            f"{name}: {len(out_descs)} output descs but {len(out_bufs)} output buffers",
        )
    attrs = S.get(attr, OpAttr, "attr", name).values if attr != 0 else {}
    st = S.stream_of(stream, name)
    if stream:
        if len(_streams) >= _MAX_PLANS:
            _streams.clear()
        _streams[stream] = st
    rec = _Recorder(st)
    ins = [_operand(name, f"input {i}", d, b) for i, (d, b) in enumerate(zip(in_descs, in_bufs))]
    outs = [
        _operand(name, f"output {i}", d, b) for i, (d, b) in enumerate(zip(out_descs, out_bufs))
    ]
    if op_type == "Cast":
        _cast(name, rec, ins, outs, attrs)  # type: ignore[arg-type]
    elif op_type == "MatMul":
        _matmul(name, rec, ins, outs, attrs)  # type: ignore[arg-type]
    else:
        _binary(name, op_type, rec, ins, outs)  # type: ignore[arg-type]
    if key is not None:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = (gen, rec.launches)
    return C.ACL_SUCCESS


def execute_v2(
    op_type: str,
    in_descs: list,
    in_bufs: list,
    out_descs: list,
    out_bufs: list,
    attr: int,
    stream: int,
) -> int:
    """Queue ``op_type`` on ``stream`` (asynchronous; synchronize the stream to read results)."""
    try:
        # Hot path: a repeated call on an explicit stream replays its recorded launches.
        if type(stream) is int and type(in_bufs) is list and type(out_bufs) is list:
            plan = _plans.get(
                (op_type, attr, *in_descs, -1, *in_bufs, -1, *out_descs, -1, *out_bufs)
            )
            if plan is not None and stream and plan[0] == S.state_key():
                st = _streams.get(stream)
                if st is not None:
                    launch = st.launch_kernel
                    for kernel, args in plan[1]:
                        launch(kernel, args)
                    return C.ACL_SUCCESS
        return _run(
            "acl.op.execute_v2", op_type, in_descs, in_bufs, out_descs, out_bufs, attr, stream
        )
    except S.ArgTypeError:
        raise
    except Exception as e:
        return S.fail("acl.op.execute_v2", e)


@api("acl.op.execute")
def execute(
    op_type: str,
    in_descs: list,
    in_bufs: list,
    out_descs: list,
    out_bufs: list,
    attr: int,
    stream: int,
) -> int:
    return _run("acl.op.execute", op_type, in_descs, in_bufs, out_descs, out_bufs, attr, stream)


class OpHandle:
    __slots__ = ("attr", "in_descs", "op_type", "out_descs")

    def __init__(self, op_type: str, in_descs: list, out_descs: list, attr: int):
        self.op_type = op_type
        self.in_descs = list(in_descs)
        self.out_descs = list(out_descs)
        self.attr = attr


@api("acl.op.create_handle", 1)
def create_handle(op_type: str, in_descs: list, out_descs: list, attr: int) -> tuple[int, int]:
    name = "acl.op.create_handle"
    if not isinstance(op_type, str):
        raise S.ArgTypeError(f"{name} args parse failed: op_type must be a str")
    _lists(name, in_descs=in_descs, out_descs=out_descs)
    S.check_init(name)
    if op_type not in OPS:
        raise AclError(C.ACL_ERROR_OP_NOT_FOUND, f"{name}: operator {op_type!r} is not available")
    return S.new_handle(OpHandle(op_type, in_descs, out_descs, attr)), C.ACL_SUCCESS


@api("acl.op.execute_with_handle")
def execute_with_handle(handle: int, in_bufs: list, out_bufs: list, stream: int) -> int:
    name = "acl.op.execute_with_handle"
    need_int(name, handle=handle, stream=stream)  # every type before any lookup, as pyACL
    _lists(name, in_bufs=in_bufs, out_bufs=out_bufs)
    h = S.get(handle, OpHandle, "op handle", name)
    return _run(name, h.op_type, h.in_descs, in_bufs, h.out_descs, out_bufs, h.attr, stream)


def destroy_handle(handle: int) -> None:
    need_int("acl.op.destroy_handle", handle=handle)
    if type(S.handles.get(handle)) is OpHandle:
        S.drop(handle)
        S.bump()


@api("acl.op.cast")
def cast(in_desc: int, in_buf: int, out_desc: int, out_buf: int, truncate: int, stream: int) -> int:
    """``aclopCast``: convert ``in_buf`` to the output desc's dtype."""
    need_int(
        "acl.op.cast",
        in_desc=in_desc,
        in_buf=in_buf,
        out_desc=out_desc,
        out_buf=out_buf,
        truncate=truncate,
        stream=stream,
    )
    return _run("acl.op.cast", "Cast", [in_desc], [in_buf], [out_desc], [out_buf], 0, stream)
