"""``acl.media``: DVPP memory (``dvpp_malloc`` / ``dvpp_free``) as ordinary device memory,
128-byte aligned, freed only by ``dvpp_free`` (``acl.rt.free`` refuses it, as CANN does)."""

from __future__ import annotations

from runtime import _runtime as N

from ._state import api, need_int

__all__ = ["dvpp_free", "dvpp_malloc"]


@api("acl.media.dvpp_malloc", 1)
def dvpp_malloc(size: int) -> tuple[int, int]:
    """``(dev_ptr, ret)``: ``size`` bytes of device memory for DVPP, 128-byte aligned."""
    need_int("acl.media.dvpp_malloc", size=size)
    return N.acl_malloc(size, True)


@api("acl.media.dvpp_free")
def dvpp_free(dev_ptr: int) -> int:
    need_int("acl.media.dvpp_free", dev_ptr=dev_ptr)
    return N.acl_free(dev_ptr, True)
