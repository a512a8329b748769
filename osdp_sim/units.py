"""Parsing and formatting of sizes with units (8GiB, 8192MiB, 8GB)."""

import math
import re

from osdp_sim.errors import UserError

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

GiB = 2**30
MiB = 2**20


def parse_bytes(text: str | int | float, *, field: str = "size", source: str | None = None) -> int:
    """'8GiB' -> 8589934592. Bare numbers are bytes. Decimal (GB) and binary (GiB) units."""
    if isinstance(text, bool):
        raise UserError(f"expected a size such as 8GiB, got {text!r}", source=source, field=field)
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise UserError(f"expected a size such as 8GiB, 8192MiB or 8GB, got {text!r}",
                            source=source, field=field)
        value, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _BYTE_UNITS:
        raise UserError(f"unknown size unit {unit!r} in {text!r}; use B, KiB, MiB, GiB, KB, MB or GB",
                        source=source, field=field)
    out = value * _BYTE_UNITS[unit]
    if not math.isfinite(out):
        raise UserError(f"size must be a finite number, got {text!r}", source=source, field=field)
    if out < 1:                          # 0.5B would round to nothing
        raise UserError(f"size must be at least one byte, got {text!r}", source=source, field=field)
    return int(round(out))


def format_bytes(n: float) -> str:
    """Human size in binary units: 8589934592 -> '8.00 GiB'."""
    n = float(n)
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"
