"""``python -m runtime.bench``: the same as ``python -m runtime bench``."""

from __future__ import annotations

import sys

from .cli import exec_with_quiet_blas, main

exec_with_quiet_blas("runtime.bench", sys.argv[1:])
sys.exit(main())
