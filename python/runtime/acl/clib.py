"""The ACL C library the package carries (``libascendcl.so`` and our ``acl/*.h`` headers), laid
out like a CANN install for C and C++ builds.

``prefix()`` is the directory ``python -m runtime.acl --prefix`` prints::

    <prefix>/runtime/include/acl/*.h          <prefix>/include -> runtime/include
    <prefix>/runtime/lib64/libascendcl.so     <prefix>/runtime/lib64/stub/libascendcl.so
    <prefix>/lib64/libacl_rt.so               <prefix>/lib64/libascendcl.so

so that public samples whose CMakeLists use ``$ENV{INSTALL_DIR}/runtime/include`` and
``link_directories($ENV{INSTALL_DIR}/runtime/lib64/stub)`` build unchanged with
``INSTALL_DIR=$(python -m runtime.acl --prefix)`` and run with
``LD_LIBRARY_PATH=<prefix>/runtime/lib64``. The files live once in the package
(``runtime/acl/_c``); the other names are symbolic links to them, made on first use in the
package directory, or, where that is read-only, in a cache directory
(``$XDG_CACHE_HOME/runtime``, else ``~/.cache/runtime``). Every library name is the same file,
whose SONAME is ``libascendcl.so``: a process loads one copy.

In a process that runs Python, the library serves every call through the ``runtime`` package's
own runtime (importing it if needed): C and Python share devices, memory, streams and handles.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["cflags", "include_dir", "libs", "library", "prefix"]

_PACKAGE = Path(__file__).resolve().parent / "_c"
_LIB = "runtime/lib64/libascendcl.so"
_INCLUDE = "runtime/include"


class NoCLibraryError(FileNotFoundError):
    """This build of the package has no C library (built without its ``acl-c-library`` feature)."""


def library() -> str:
    """Path of ``libascendcl.so`` inside the package."""
    lib = _PACKAGE / _LIB
    if not lib.is_file():
        raise NoCLibraryError(
            f"{lib} is missing: this build of runtime has no ACL C library "
            "(build the package with maturin, whose settings turn on the acl-c-library feature)"
        )
    return str(lib)


def _link(path: Path, target: str) -> None:
    """Make ``path`` a symbolic link to ``target`` (replaced atomically if it differs)."""
    if path.is_symlink() and os.readlink(path) == target:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, path)


def _lay_out(root: Path) -> None:
    lib = Path(library())
    if root == _PACKAGE:
        _link(root / "include", _INCLUDE)
        _link(root / "runtime/lib64/stub/libascendcl.so", "../libascendcl.so")
        for name in ("libacl_rt.so", "libascendcl.so"):
            _link(root / "lib64" / name, f"../{_LIB}")
        return
    # A copy of the layout elsewhere: links to the package's files.
    _link(root / _INCLUDE, str(_PACKAGE / _INCLUDE))
    _link(root / "include", _INCLUDE)
    _link(root / _LIB, str(lib))
    _link(root / "runtime/lib64/stub/libascendcl.so", "../libascendcl.so")
    for name in ("libacl_rt.so", "libascendcl.so"):
        _link(root / "lib64" / name, f"../{_LIB}")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = hashlib.sha256(str(_PACKAGE).encode()).hexdigest()[:12]
    return Path(base) / "runtime" / f"acl-prefix-{tag}"


def prefix() -> str:
    """The CANN-like directory (see the module documentation), laid out on first use."""
    library()
    errors = []
    for root in (_PACKAGE, _cache_root()):
        try:
            _lay_out(root)
            return str(root)
        except OSError as e:
            errors.append(f"{root}: {e}")
    raise OSError("cannot lay out the ACL prefix: " + "; ".join(errors))


def include_dir() -> str:
    """The directory holding ``acl/acl.h``."""
    return str(Path(prefix()) / _INCLUDE)


def cflags() -> str:
    """Compiler flags for ``#include "acl/acl.h"``."""
    return f"-I{include_dir()}"


def libs() -> str:
    """Linker flags for ``libascendcl.so`` (with an rpath, so programs run without
    ``LD_LIBRARY_PATH``)."""
    d = Path(prefix()) / "runtime/lib64"
    return f"-L{d} -Wl,-rpath,{d} -lascendcl"
