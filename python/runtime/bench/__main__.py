"""``python -m runtime.bench``: the same as ``python -m runtime bench``."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
