"""When a measurement may overrule the model: the tune keeps the search's pick unless a candidate
measured faster is ahead by more than SIGNIFICANCE standard errors of the difference (docs/tune.md,
"Ranking"). On the 2-core CPU separate runs of one plan differ by 4-8%, while the calibrated model
ranks near-ties to 1-2% (docs/accuracy.md, Decisions): a 3% lead over medians of a few runs is
mostly luck, and switching on it loses as often as it gains."""

import math
import statistics

SIGNIFICANCE = 2.0
"""Standard errors a measured lead must exceed to overrule the search's pick (about 95%, one-sided
98%)."""
MEDIAN_SE = math.sqrt(math.pi / 2)
"""A median of n normal samples has standard error 1.2533 sigma / sqrt(n)."""


def median_se(values: list[float]) -> float | None:
    """Relative standard error of the median of `values` (None below 2 values)."""
    if len(values) < 2:
        return None
    return MEDIAN_SE * statistics.stdev(values) / statistics.fmean(values) / math.sqrt(len(values))


def lead(a: list[float], b: list[float]) -> tuple[float, float | None]:
    """(median(a) / median(b) - 1, its standard error), both relative; the error is None unless
    both have 2 values or more."""
    gap = statistics.median(a) / statistics.median(b) - 1
    sa, sb = median_se(a), median_se(b)
    return gap, None if sa is None or sb is None else math.hypot(sa, sb)


def overrules(gap: float, se: float | None) -> bool:
    """A measured lead `gap` (with standard error `se`) overrules the model's choice: beyond
    SIGNIFICANCE standard errors; any lead when the error is unknown (one run each)."""
    return gap > 0 if se is None else gap > SIGNIFICANCE * se
