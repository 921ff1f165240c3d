"""pyACL (``import acl``) on runtime's virtual devices.

``runtime.acl`` has pyACL's layout and conventions: ``init`` / ``finalize`` /
``get_recent_err_msg`` and the tensor-descriptor and data-buffer functions at the top level,
and the submodules ``rt`` (devices, contexts, streams, events, memory, callbacks), ``util``,
``media`` (DVPP memory) and ``op`` (single operators); ``clib`` locates the C library
(``libascendcl.so`` and its headers) for C and C++ programs. Every call returns what pyACL returns
(a bare ``ret``, or a tuple whose last element is ``ret``) and never raises for an ACL error:
it returns CANN's numeric code (``ACL_SUCCESS`` = 0, ``ACL_ERROR_INVALID_PARAM`` = 100000, ...,
all in this module) and records a message for :func:`get_recent_err_msg`. Arguments of the
wrong Python type raise ``TypeError``, as pyACL's argument parsing does.

Run an unmodified pyACL script with ``python -m runtime.acl script.py [args...]`` (``import
acl`` then resolves to this module), or write ``import runtime.acl as acl``.
"""

from __future__ import annotations

import sys

import runtime
from runtime import _runtime as N

from . import _state as S
from . import clib, media, op, rt, util
from ._consts import *  # noqa: F403 - pyACL's constants, by their CANN names
from ._consts import (
    ACL_ERROR_INVALID_PARAM,
    ACL_SUCCESS,
)
from ._state import AclError, api
from ._tensor import (
    create_data_buffer,
    create_tensor_desc,
    data_type_size,
    destroy_data_buffer,
    destroy_tensor_desc,
    get_data_buffer_addr,
    get_data_buffer_size,
    get_data_buffer_size_v2,
    get_tensor_desc_dim,
    get_tensor_desc_dim_v2,
    get_tensor_desc_element_count,
    get_tensor_desc_format,
    get_tensor_desc_num_dims,
    get_tensor_desc_size,
    get_tensor_desc_type,
    update_data_buffer,
)

VERSION = tuple(int(x) for x in runtime.__version__.split(".")[:3])


@api("acl.init")
def init(config_path: str | None = None) -> int:
    """Start ACL (and the runtime, if nothing started it yet, with the settings of
    RUNTIME_DEVICE_COUNT / _MEMORY / _PROFILE). ``config_path``, when given, must name a file
    that is empty or holds a JSON object; its dump/profiling settings are not applied."""
    if config_path is not None and not isinstance(config_path, str):
        raise S.ArgTypeError("acl.init args parse failed: config_path must be a str")
    return N.acl_init(config_path)


@api("acl.finalize")
def finalize() -> int:
    """Release everything ACL made (waits for streams, frees memory, from Python and C alike);
    shut the runtime down if ``acl.init`` started it."""
    ret = N.acl_finalize()
    if ret == ACL_SUCCESS:
        S.reset_all()
        op._forget()
    return ret


def get_recent_err_msg() -> str | None:
    """The message of this thread's latest failed call (then cleared), or None; C calls of
    ``libascendcl.so`` in this process leave theirs here too."""
    return S.recent_msg()


def get_version() -> tuple[int, int, int, int]:
    """``(major, minor, patch, ret)`` of this implementation (runtime's version)."""
    return (*VERSION, ACL_SUCCESS)  # type: ignore[return-value]


def get_version_str(pkg_name: str) -> tuple[str, int]:
    return runtime.__version__, ACL_SUCCESS


def get_soc_name() -> str | None:
    """The device profile as a SoC name ("Ascend910" for the default profile), None before init."""
    if not S.is_initialized():
        S.record_msg("acl.get_soc_name: acl.init() has not been called")
        return None
    profile = runtime.get_device_properties(0).profile
    return "Ascend910" if profile == "ascend910" else profile


def _install_as_acl() -> None:
    """Make ``import acl`` (and ``import acl.rt`` ...) resolve to this package."""
    me = sys.modules[__name__]
    sys.modules["acl"] = me
    for sub in ("rt", "util", "media", "op"):
        sys.modules[f"acl.{sub}"] = getattr(me, sub)


__all__ = [
    "AclError",
    "clib",
    "create_data_buffer",
    "create_tensor_desc",
    "data_type_size",
    "destroy_data_buffer",
    "destroy_tensor_desc",
    "finalize",
    "get_data_buffer_addr",
    "get_data_buffer_size",
    "get_data_buffer_size_v2",
    "get_recent_err_msg",
    "get_soc_name",
    "get_tensor_desc_dim",
    "get_tensor_desc_dim_v2",
    "get_tensor_desc_element_count",
    "get_tensor_desc_format",
    "get_tensor_desc_num_dims",
    "get_tensor_desc_size",
    "get_tensor_desc_type",
    "get_version",
    "get_version_str",
    "init",
    "media",
    "op",
    "rt",
    "update_data_buffer",
    "util",
    "ACL_ERROR_INVALID_PARAM",
]
