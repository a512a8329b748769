"""A command's (or an API call's) time limit, shared by the search and what follows it."""

import time

# The time limit is the whole command's: the search gets what is left after this share (at least
# MIN_RESERVE_S) for the baselines, the OSDP knapsack DP, the explanation and the output.
RESERVE_SHARE = 0.1
MIN_RESERVE_S = 1.0


class Budget:
    """The command's time limit as a deadline (time.perf_counter()); None: no limit."""

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.perf_counter() + seconds
        self.seconds = seconds

    def left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.perf_counter())

    def search_share(self, min_reserve_s: float = MIN_RESERVE_S, share: float = RESERVE_SHARE) -> float | None:
        """The search's limit: what is left less the reserve for everything after it."""
        left = self.left()
        if left is None:
            return None
        reserve = min(max(min_reserve_s, share * self.seconds), left / 2)
        return max(0.0, left - reserve)
