"""How the command line reports bad input: one line on stderr, exit code 2, never a traceback.

Every entry point (``python -m runtime``, its ``bench`` and ``trace-plot`` sub-commands) runs
through ``guard``. Code below it raises ``UsageError`` for input it refuses; ``ArgumentParser``
turns argparse's own errors into ``UsageError`` too, and ``init`` turns the runtime's refusal of
its arguments (profile, memory, device count, ``RUNTIME_*`` variables) into one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

import runtime

EXIT_USAGE = 2


class UsageError(Exception):
    """Input the command line refuses; the message is printed as one line."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a ``UsageError`` (one line) instead of usage text + exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def guard(prog: str, fn: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """Run ``fn(argv)``; a ``UsageError`` becomes ``prog: error: message`` and exit code 2."""
    try:
        return fn(argv)
    except UsageError as e:
        print(f"{prog}: error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_USAGE


def init(**kwargs) -> None:
    """``runtime.init(**kwargs)``; what it refuses as an argument becomes a ``UsageError``."""
    try:
        runtime.init(**kwargs)
    except (ValueError, TypeError, OverflowError) as e:
        raise UsageError(str(e)) from e


def _named(path: str, flag: str) -> str:
    return f"{flag} {path}" if flag else path


def check_writable(path: str, flag: str) -> None:
    """Refuse, before any work, an output path that cannot be written: a folder, a missing
    folder, or one without write permission. ``flag`` names the option (empty: positional)."""
    name = _named(path, flag)
    if os.path.isdir(path):
        raise UsageError(f"{name}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{name}: no such directory: {parent}")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{name}: permission denied")


def fail_write(path: str, flag: str, e: OSError) -> NoReturn:
    """An output file that could not be written after all (``check_writable`` passed)."""
    raise UsageError(f"{_named(path, flag)}: cannot write: {e.strerror or e}") from e
