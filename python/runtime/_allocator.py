"""``using_allocator``: a plugged allocator for the length of a ``with`` block (CuPy's
``cupy.cuda.using_allocator``), over :func:`runtime.set_allocator`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ._runtime import get_allocator, set_allocator


@contextlib.contextmanager
def using_allocator(
    alloc: Callable[..., Any] | None = None, free: Callable[..., Any] | None = None
) -> Iterator[None]:
    """Plug ``alloc`` (and ``free``) in as :func:`runtime.set_allocator` does (None: the
    built-in pool) for the body of the ``with``, then plug back whatever was plugged before,
    also when the body raises. Blocks stay with the allocator that made them.

    Unlike CuPy's, which is per thread, the plugged allocator is the process's: allocations
    from other threads during the block go through it too.
    """
    before = get_allocator()
    set_allocator(alloc, free)
    try:
        yield
    finally:
        if before is None:
            set_allocator(None)
        else:
            set_allocator(*before)
