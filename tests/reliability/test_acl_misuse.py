"""Misuse battery of the pyACL face (``runtime.acl``): every public function, every argument
pyACL parses as an int, given a wrong type (a list, a numpy array, a str, a float, None), and
every function called with no arguments and with one too many. pyACL's argument parsing
raises ``TypeError`` for these before it looks anything up; the face must do the same, never
return a code (100000 was returned where a table lookup ran before the type check) and never
change anything: a canary allocation keeps its bytes.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import runtime
import runtime.acl as acl

WRONG = {
    "list": lambda p: [p],
    "ndarray": lambda p: np.array([p]),
    "str": lambda p: "1",
    "float": lambda p: 1.5,
    "None": lambda p: None,
}
MODULES = {"acl": acl, "acl.rt": acl.rt, "acl.util": acl.util, "acl.op": acl.op}
# Set up and torn down by the fixture; not called with wrong arguments here.
SKIP = {"acl.init", "acl.finalize"}


def functions():
    out = []
    for prefix, mod in MODULES.items():
        for name in getattr(mod, "__all__", []):
            f = getattr(mod, name)
            if not callable(f) or inspect.isclass(f) or inspect.ismodule(f):
                continue
            if f"{prefix}.{name}" in SKIP:
                continue
            try:
                sig = inspect.signature(f)
            except (TypeError, ValueError):
                continue
            out.append((f"{prefix}.{name}", f, list(sig.parameters.values())))
    return out


FUNCTIONS = functions()
CASES = [
    (f"acl-{qual}-{p.name}-{kind}", qual, i, kind)
    for qual, _, params in FUNCTIONS
    for i, p in enumerate(params)
    if p.annotation in (int, "int")
    for kind in WRONG
] + [
    (f"acl-{qual}-{arity}", qual, -1, arity)
    for qual, _, params in FUNCTIONS
    for arity in ("no-args", "one-too-many")
    if params or arity == "one-too-many"
]


@pytest.fixture(scope="module", autouse=True)
def acl_up():
    runtime.shutdown()
    assert acl.init() == acl.ACL_SUCCESS
    assert acl.rt.set_device(0) == acl.ACL_SUCCESS
    yield
    acl.rt.reset_device(0)
    acl.finalize()


@pytest.fixture(scope="module")
def canary():
    """A live device allocation with known bytes: no refused call may change it."""
    p, ret = acl.rt.malloc(256, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == acl.ACL_SUCCESS
    assert acl.rt.memset(p, 256, 0x3C, 256) == acl.ACL_SUCCESS
    yield p
    acl.rt.free(p)


def test_there_are_cases():
    assert len(CASES) > 200


@pytest.mark.filterwarnings("ignore:acl.util.*is deprecated")  # pyACL warns, then parses
@pytest.mark.parametrize("cid,qual,index,kind", CASES, ids=[c[0] for c in CASES])
def test_acl_wrong_argument_types_and_counts_raise_type_error(cid, qual, index, kind, canary):
    f = dict((q, f) for q, f, _ in FUNCTIONS)[qual]
    params = dict((q, ps) for q, _, ps in FUNCTIONS)[qual]
    if index >= 0:
        args = [0] * len(params)
        args[index] = WRONG[kind](canary)
    elif kind == "no-args":
        args = []
    else:
        args = [0] * (len(params) + 1)
    with pytest.raises(TypeError):
        f(*args)
    back = bytes(256)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(back), 256, canary, 256, 2) == acl.ACL_SUCCESS, (
        acl.get_recent_err_msg()
    )
    assert back == b"\x3c" * 256, "a refused call changed device memory"
