"""How sizes are printed to users: binary units (KiB = 1024 B), as the allocator counts them."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def binary_size(n: float) -> str:
    """``n`` bytes in binary units: ``"32 GiB"``, ``"1.50 MiB"``, ``"17 B"``.

    Whole multiples print without decimals; other values with two.
    """
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            if unit == "B" or float(n).is_integer():
                return f"{n:.0f} {unit}"
            return f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
