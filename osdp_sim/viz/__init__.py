"""Figures (matplotlib, no torch): timelines, Pareto fronts, calibration plots."""
