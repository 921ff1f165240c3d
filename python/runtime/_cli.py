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
    """argparse, but a bad flag is a ``UsageError`` (one line) instead of usage text + exit,
    and an option's value may start with ``-`` (``--memory -5GiB`` reaches the check of the
    value, which refuses it in its own words, instead of argparse's "expected one argument")."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._attach_dash_values(argv), namespace)

    def _attach_dash_values(self, argv: list[str]) -> list[str]:
        """``--flag -x`` as ``--flag=-x`` for each option that takes one value, when ``-x`` is
        not itself an option of this parser."""
        takes_value = {
            s
            for a in self._actions
            if isinstance(a, argparse._StoreAction) and a.nargs is None
            for s in a.option_strings
        }
        known = {s for a in self._actions for s in a.option_strings}
        out: list[str] = []
        i = 0
        while i < len(argv):
            tok = argv[i]
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if (
                tok in takes_value
                and tok.startswith("--")
                and nxt is not None
                and nxt.startswith("-")
                and nxt.split("=", 1)[0] not in known
                and nxt != "--"
            ):
                out.append(f"{tok}={nxt}")
                i += 2
                continue
            out.append(tok)
            i += 1
        return out


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


def integer(flag: str) -> Callable[[str], int]:
    """An argparse ``type`` for an integer option: text that is not an integer is refused in
    the core's wording for ``RUNTIME_DEVICE_COUNT`` (``NAME: cannot parse "x" as an integer``);
    the range is left to the check that owns it (``runtime.init``)."""

    def parse(text: str) -> int:
        try:
            return int(text.strip(), 10)
        except ValueError:
            raise UsageError(f'{flag}: cannot parse "{text}" as an integer') from None

    parse.__name__ = "integer"
    return parse


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
