"""A safety margin (--headroom) below the device's usable memory, and the margin a plan leaves.

The predicted peak already includes the profile's context allowance (memory.context_mib) and its
allocator margin (memory.fragmentation): headroom is memory left free beyond both, e.g. for the
caching allocator's reserved-but-unallocated blocks (docs/search-usage.md, "A safety margin").
"""

import math
import re
from dataclasses import dataclass

from osdp_sim.errors import UserError
from osdp_sim.units import _SIZE_RE, format_bytes, parse_bytes

_PERCENT_RE = re.compile(r"^\s*(.+?)\s*%\s*$")


@dataclass(frozen=True)
class Headroom:
    """A size in bytes, or a fraction of the limit in effect, min(--mem-limit, usable memory):
    the caching allocator's overhead grows with what is allocated, so a share of the limit
    tracks it (never both)."""

    size_bytes: int = 0
    fraction_of_limit: float = 0.0

    def bytes_on(self, cap_bytes: float) -> float:
        return self.size_bytes + self.fraction_of_limit * cap_bytes


NONE = Headroom()


def parse_headroom(value: str | int | float | None, *, field: str = "--headroom") -> Headroom:
    """'2GiB' (a size; bare numbers are bytes), '10%' (of min(limit, usable memory)), 0 or None."""
    if value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and value == 0):
        return NONE
    if isinstance(value, str):
        m = _PERCENT_RE.match(value)
        if m:
            try:
                pct = float(m.group(1))
            except ValueError:
                raise UserError(f"expected a percentage such as 10%, got {value!r}", field=field) from None
            if not (math.isfinite(pct) and 0.0 <= pct < 100.0):
                raise UserError(f"expected a percentage in 0..100 (below 100), got {value!r}", field=field)
            return Headroom(fraction_of_limit=pct / 100.0)
        m = _SIZE_RE.match(value)
        if m and float(m.group(1)) == 0:          # 0, 0B, 0GiB: none (parse_bytes wants a byte at least)
            return NONE
        if value.strip().startswith("-"):
            raise UserError(f"must not be negative, got {value!r}", field=field)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        raise UserError(f"must not be negative, got {value!r}", field=field)
    return Headroom(size_bytes=parse_bytes(value, field=field))


def planning_limit(limit_bytes: float, usable_bytes: float, headroom: Headroom,
                   field: str = "--headroom") -> tuple[float, float]:
    """(the limit the search plans for, the headroom in bytes): min(limit, usable) less the
    headroom. A headroom that leaves nothing is a UserError naming the flag."""
    cap = min(limit_bytes, usable_bytes)          # as given (a whole number stays one in the JSON)
    room = headroom.bytes_on(cap)
    if room >= cap:
        raise UserError(f"{format_bytes(room)} leaves no memory below the {format_bytes(cap)} limit "
                        f"(min of the limit and the device's usable {format_bytes(usable_bytes)})", field=field)
    return (cap - room if room else cap), room


def margin_bytes(peak_bytes: float, usable_bytes: float) -> float:
    """What a plan leaves free on the device: usable memory less its predicted peak."""
    return float(usable_bytes) - float(peak_bytes)


def margin_line(peak_bytes: float, usable_bytes: float, headroom_bytes: float | None = None) -> str:
    """The reports' line, e.g. '1.20 GiB below the 11.55 GiB usable per device (10.4%); headroom
    asked 0 B' (the headroom part only where a headroom could be asked)."""
    m = margin_bytes(peak_bytes, usable_bytes)
    return (f"{format_bytes(m)} below the {format_bytes(usable_bytes)} usable per device ({m / usable_bytes:.1%})"
            + ("" if headroom_bytes is None else f"; headroom asked {format_bytes(headroom_bytes)}"))
