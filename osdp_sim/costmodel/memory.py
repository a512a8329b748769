"""Peak memory from the liveness of tensors along the simulated step (not a sum of maxima)."""

from dataclasses import dataclass

from osdp_sim.costmodel.schedule import CATEGORIES, MemEvent
from osdp_sim.costmodel.simulate import Task


@dataclass(frozen=True)
class MemoryPeak:
    peak_bytes: float                 # live tensors at the worst moment
    at_s: float                       # when
    during: str                       # the task running (or starting) then
    breakdown: dict                   # category -> bytes at that moment


def peak_memory(tasks: list[Task], events: list[MemEvent]) -> MemoryPeak:
    """Walk allocation and free events in time order; at equal times frees come first, except
    that a task's own start precedes its own end."""
    def when(e: MemEvent) -> tuple:
        if e.task < 0:
            return (-1.0, 0, 0)
        t = tasks[e.task]
        if e.at == "start":
            return (t.start_s, 1 if e.delta_bytes > 0 else 0, e.task)
        end = t.end_s if t.end_s > t.start_s else t.start_s + 1e-12
        return (end, 1 if e.delta_bytes > 0 else 0, e.task)

    live = {c: 0.0 for c in CATEGORIES}
    total = 0.0
    best = MemoryPeak(0.0, 0.0, "", dict(live))
    for e in sorted(events, key=when):
        live[e.category] += e.delta_bytes
        total += e.delta_bytes
        if total > best.peak_bytes + 1e-6:
            name = tasks[e.task].name if e.task >= 0 else "start of step"
            best = MemoryPeak(total, max(0.0, when(e)[0]), name, dict(live))
    return best


def category_peak(tasks: list[Task], events: list[MemEvent], category: str) -> float:
    """The most bytes of one category live at any moment (e.g. activations alone)."""
    return peak_memory(tasks, [e for e in events if e.category == category]).peak_bytes
