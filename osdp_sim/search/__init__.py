"""Plan search: the exact branch-and-bound, baselines, the OSDP knapsack DP, reports."""
