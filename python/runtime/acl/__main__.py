"""``python -m runtime.acl script.py [args...]``: run a pyACL script on the virtual devices.
``python -m runtime.acl --prefix | --cflags | --libs``: where the ACL C library is, for C and
C++ builds (see ``runtime.acl.clib``).

``import acl`` in the script (and in modules it imports) resolves to ``runtime.acl``; the
script's folder comes first on ``sys.path``, ``sys.argv`` is ``[script.py, args...]`` and the
script's exit status is the command's. Bad input to the command itself (no script, a script
that does not exist, an unknown option) is one ``python -m runtime.acl: error: ...`` line on
stderr and exit code 2.
"""

from __future__ import annotations

import os
import runpy
import sys

from runtime import _cli

PROG = "python -m runtime.acl"
USAGE = f"usage: {PROG} script.py [args...] | --prefix | --cflags | --libs"
HELP = f"""{USAGE}

Run a pyACL (import acl) script on runtime's virtual devices: 'import acl' resolves to
runtime.acl, the script's folder comes first on sys.path, its arguments follow it, and its
exit status is kept. Devices, memory and profile come from RUNTIME_DEVICE_COUNT,
RUNTIME_DEVICE_MEMORY and RUNTIME_DEVICE_PROFILE.

For C and C++ programs (the ACL C library, libascendcl.so, and its acl/*.h headers):
  --prefix   a directory laid out like a CANN install (INSTALL_DIR for the public samples'
             CMakeLists: <prefix>/runtime/include, <prefix>/runtime/lib64[/stub])
  --cflags   compiler flags:  cc prog.c $(python -m runtime.acl --cflags --libs)
  --libs     linker flags (with an rpath to the library)"""


def _script(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise _cli.UsageError(f"no script given ({USAGE})")
    if argv[0] in ("-h", "--help"):
        print(HELP)
        return 0
    if argv[0] in _FLAGS:
        return _paths(argv)
    if argv[0].startswith("-"):
        raise _cli.UsageError(f"unknown option {argv[0]} ({USAGE})")
    path = argv[0]
    if not os.path.isfile(path):
        raise _cli.UsageError(f"{path}: no such file")
    import runtime.acl as acl

    acl._install_as_acl()
    sys.argv = [path, *argv[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(path))  # as "python script.py" has it
    runpy.run_path(path, run_name="__main__")
    return 0


_FLAGS = ("--prefix", "--cflags", "--libs")


def _paths(argv: list[str]) -> int:
    from . import clib

    bad = [a for a in argv if a not in _FLAGS]
    if bad:
        raise _cli.UsageError(f"{bad[0]}: only --prefix, --cflags and --libs combine ({USAGE})")
    if "--prefix" in argv and len(argv) > 1:
        raise _cli.UsageError(f"--prefix prints a directory on its own ({USAGE})")
    try:
        if argv == ["--prefix"]:
            print(clib.prefix())
            return 0
        parts = []
        if "--cflags" in argv:
            parts.append(clib.cflags())
        if "--libs" in argv:
            parts.append(clib.libs())
    except OSError as e:
        raise _cli.UsageError(str(e)) from e
    print(" ".join(parts))
    return 0


def main(argv: list[str] | None = None) -> int:
    return _cli.guard(PROG, _script, argv)


if __name__ == "__main__":
    sys.exit(main())
