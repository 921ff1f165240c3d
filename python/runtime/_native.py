"""Native kernels: where the C ABI header lives.

``runtime/kernel.h`` declares the one signature every native kernel has
(``int32_t k(uint32_t block_idx, uint32_t block_num, void **params)``) and how arguments
arrive; :func:`get_include` is the folder to put on the compiler's include path, as
``numpy.get_include()``. Kernels are made with :meth:`runtime.Kernel.load` (a shared library)
and :meth:`runtime.Kernel.from_cfunc` (numba ``@cfunc``, ctypes function, address).
"""

from __future__ import annotations

import os


def get_include() -> str:
    """The folder that holds ``runtime/kernel.h``: compile native kernels with
    ``cc -I"$(python -c 'import runtime; print(runtime.get_include())')"``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
