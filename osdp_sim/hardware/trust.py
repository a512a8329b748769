"""How much to trust a profile's numbers, from its provenance: documented (datasheet figures and
assumptions, never measured), measured (osdp-sim profile-hw on the machine), or calibrated
(osdp-sim calibrate fitted it to real runs, with its leave-one-plan-out errors)."""

from dataclasses import dataclass

from osdp_sim.hardware.profile import HardwareProfile

KINDS = ("documented", "measured", "calibrated")


@dataclass(frozen=True)
class Trust:
    kind: str
    """documented | measured | calibrated."""
    runs: int | None = None
    """Calibrated: the real runs it was fitted on."""
    time_error: float | None = None
    """Calibrated: leave-one-plan-out mean absolute relative error of the step time."""
    memory_error: float | None = None
    """Calibrated: the same for peak memory."""
    measured_on: str = ""
    """Measured or calibrated: when profile-hw measured the machine (or the base profile's date)."""
    published_fit: dict | None = None
    """Documented: the coefficient fitted to published runs (provenance.published_fit, written by
    bench/external_fit.py): its runs, held_out_runs and held_out_mape."""

    def line(self) -> str:
        """One line for the reports, next to throughput."""
        if self.kind == "calibrated":
            err = "" if self.time_error is None else \
                f"; leave-one-plan-out error: time {self.time_error:.1%}" + \
                ("" if self.memory_error is None else f", memory {self.memory_error:.1%}")
            return f"profile calibrated on {self.runs} real runs{err}"
        if self.kind == "measured":
            return f"profile measured on the machine ({self.measured_on}), not calibrated against runs"
        fit = self.published_fit
        if fit:
            held = fit.get("held_out_mape")
            return ("profile documented (datasheet figures and assumptions), its "
                    f"{str(fit.get('coefficient', '')).split('.')[-1]} fitted to {fit.get('runs')} published runs"
                    + (f"; error {held:.1%} on {fit.get('held_out_runs')} published runs it was not fitted on"
                       if isinstance(held, (int, float)) else "")
                    + " (docs/external-validation.md)")
        return "profile documented (datasheet figures and assumptions, never measured): times are rough"

    def warning(self) -> str | None:
        """The stderr warning a documented profile carries (None otherwise)."""
        if self.kind != "documented":
            return None
        held = (self.published_fit or {}).get("held_out_mape")
        if isinstance(held, (int, float)):
            return ("the hardware profile is documented, not measured on this machine: on published runs "
                    f"of other machines it was not fitted on, its step times are off by {held:.0%} on average "
                    "(docs/external-validation.md); measure it (osdp-sim profile-hw) and calibrate it "
                    "(osdp-sim calibrate) before trusting small differences between plans")
        return ("the hardware profile is documented, not measured: its step times can be off by tens of "
                "percent (docs/external-validation.md); measure it (osdp-sim profile-hw) and calibrate it "
                "(osdp-sim calibrate) before trusting them")

    def to_json(self) -> dict:
        return {"kind": self.kind, "runs": self.runs, "time_error": self.time_error,
                "memory_error": self.memory_error}


def trust_of(hw: HardwareProfile) -> Trust:
    prov = hw.provenance or {}
    cal = prov.get("calibration")
    if isinstance(cal, dict):
        errors = cal.get("errors") or {}

        def loo(metric: str):
            value = ((errors.get(metric) or {}).get("loo") or {}).get("mape")
            return float(value) if isinstance(value, (int, float)) else None
        runs = (cal.get("records") or {}).get("count")
        return Trust("calibrated", runs if isinstance(runs, int) else None, loo("iteration_time"),
                     loo("peak_memory"), str(prov.get("date", "")))
    if prov.get("tool") == "osdp-sim profile-hw":
        return Trust("measured", measured_on=str(prov.get("date", "")))
    fit = prov.get("published_fit")
    return Trust("documented", published_fit=dict(fit) if isinstance(fit, dict) else None)
