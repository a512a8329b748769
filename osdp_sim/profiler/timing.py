"""Repeated timing with warm-up: the median is kept, the spread (IQR / median) is recorded."""

import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    median_s: float       # median time of one call
    spread: float         # interquartile range / median over the samples
    samples: int
    calls_per_sample: int


@dataclass(frozen=True)
class Repeats:
    """How hard to measure: warm-up calls, timed samples, and the least time one sample should take
    (short calls are batched into one sample so the clock's resolution does not dominate)."""

    warmup: int = 2
    samples: int = 7
    min_sample_s: float = 2e-3
    budget_s: float = 0.0         # fast calls: take more samples, up to this much time ...
    max_samples: int = 7          # ... and this many samples (collectives raise it)


def relative_spread(values: list[float]) -> float:
    """Interquartile range over the median (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    if med <= 0:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[2] - q[0]) / med


def summarize(per_call_s: list[float], calls_per_sample: int = 1) -> Timing:
    return Timing(median_s=statistics.median(per_call_s), spread=relative_spread(per_call_s),
                  samples=len(per_call_s), calls_per_sample=calls_per_sample)


def time_calls(fn: Callable[[], object], sync: Callable[[], None], repeats: Repeats,
               agree: Callable[[list[int]], list[int]] | None = None) -> Timing:
    """Time `fn` (synchronising the device around each sample): warm-up, size a sample, take samples.
    For a collective, `agree` turns this rank's [calls per sample, samples] into the group's common
    choice (every member must issue the same number of calls)."""
    for _ in range(max(1, repeats.warmup)):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    single_s = max(time.perf_counter() - t0, 1e-9)
    calls = max(1, math.ceil(repeats.min_sample_s / single_s))
    samples = max(1, repeats.samples, min(repeats.max_samples, int(repeats.budget_s / (single_s * calls))))
    if agree is not None:
        calls, samples = agree([calls, samples])
    per_call = []
    for _ in range(samples):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - t0) / calls)
    return summarize(per_call, calls)


def time_interleaved(fns: list[Callable[[], object]], sync: Callable[[], None], repeats: Repeats,
                     on_sized: Callable[[int], None] | None = None) -> list[Timing]:
    """Like time_calls for several functions, but sample them round-robin: a burst of other work
    on the machine then costs every function one sample instead of all samples of one.
    `on_sized(i)` is called once function i is warmed up (for progress)."""
    calls = []
    for i, fn in enumerate(fns):
        for _ in range(max(1, repeats.warmup)):
            fn()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        calls.append(max(1, math.ceil(repeats.min_sample_s / max(time.perf_counter() - t0, 1e-9))))
        if on_sized:
            on_sized(i)
    per_call: list[list[float]] = [[] for _ in fns]
    for _ in range(max(1, repeats.samples)):
        for fn, n, out in zip(fns, calls, per_call):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            out.append((time.perf_counter() - t0) / n)
    return [summarize(v, n) for v, n in zip(per_call, calls)]


class Progress:
    """Prints `[profile-hw] what i/n: detail` to stderr; silent on ranks other than 0."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.start_s = time.perf_counter()

    def __call__(self, what: str, i: int, n: int, detail: str = "") -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.start_s
            tail = f": {detail}" if detail else ""
            print(f"[profile-hw {elapsed:6.1f}s] {what} {i}/{n}{tail}", file=sys.stderr, flush=True)
