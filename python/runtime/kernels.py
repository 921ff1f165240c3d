"""Native kernels, implemented in Rust and run without the GIL.

Arguments are output first, like ``memcpy(dst, src)``; tensors are typed DeviceBuffers
(``runtime.empty``, ``runtime.to_device`` or ``buf.view(dtype)``):

==========  ===============  ================================
kernel      arguments        effect
==========  ===============  ================================
``noop``    none             nothing (launch overhead)
``fill``    x, value         ``x[:] = value``
``copy``    dst, src         ``dst[:] = src``
``scale``   out, x, alpha    ``out = alpha * x``
``axpy``    y, x, alpha      ``y = alpha * x + y``
``add``     out, a, b        ``out = a + b``
``mul``     out, a, b        ``out = a * b``
``sum``     out, x           ``out[0] = x.sum()``
``matmul``  c, a, b          ``c = a @ b`` (2-D)
==========  ===============  ================================

dtypes: every numpy number type (bool, int8-64, uint8-64, float16-64, complex64/128) and
bfloat16 (``ml_dtypes.bfloat16``, with the ``bfloat16`` extra), one per launch; ``scale``,
``axpy`` and ``sum`` refuse bool, where numpy's result is an integer (bool ``add``/``mul``
are or/and). Integers wrap; float16 and bfloat16 are computed in float32 and rounded per
result (as numpy's float16 and ml_dtypes' bfloat16 loops); ``sum`` accumulates floats in
float64, ``matmul`` float16/bfloat16 in float32; scalars for integer and bool buffers must fit
the dtype. Launch with ``stream.launch_kernel(kernels.add,
(out, a, b))`` or call the kernel: ``kernels.add(out, a, b, stream=s)``. Kernels registered
from Rust by other crates are found with :func:`get`.
"""

from __future__ import annotations

from ._runtime import Kernel, kernel_names

noop = Kernel("noop")
fill = Kernel("fill")
copy = Kernel("copy")
scale = Kernel("scale")
axpy = Kernel("axpy")
add = Kernel("add")
mul = Kernel("mul")
sum = Kernel("sum")  # noqa: A001 - the kernel's name
matmul = Kernel("matmul")


def get(name: str) -> Kernel:
    """The registered native kernel called ``name`` (ValueError listing the names if none)."""
    return Kernel(name)


def names() -> list[str]:
    """Names of all registered native kernels."""
    return kernel_names()


__all__ = ["add", "axpy", "copy", "fill", "get", "matmul", "mul", "names", "noop", "scale", "sum"]
