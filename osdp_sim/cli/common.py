"""Shared by the commands and scripts: argument types, resolving model and hardware arguments,
and run_reporting (a UserError is one line and exit code 2)."""

import argparse
import sys
from pathlib import Path

from osdp_sim.errors import UserError
from osdp_sim.units import parse_bytes


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return v


def nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return v


def byte_size(text: str) -> int:
    try:
        return parse_bytes(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="built-in model name (osdp-sim models), a model YAML file, or a Hugging Face "
                   "config.json or a folder holding one (docs/models.md)")
    p.add_argument("--seq-len", type=positive_int, help="override the model's sequence length")


def add_hw_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hw", required=True, help="hardware profile: a YAML path or a shipped name (osdp-sim profiles)")
    p.add_argument("--gpus", type=positive_int, help="devices to use (default: the profile's count)")


def load_hw(args):
    from osdp_sim.hardware.load import load_profile
    hw = load_profile(args.hw)
    gpus = getattr(args, "gpus", None)
    if gpus:
        if gpus > hw.device.count:
            raise UserError(f"{gpus} devices requested but the profile {hw.name!r} has {hw.device.count}; "
                            "use a profile with more devices", field="--gpus")
        hw = hw.with_devices(gpus)
    return hw


def warn_if_documented(hw) -> None:
    """A documented (never measured) profile's one-line warning, on stderr so --json stays clean."""
    from osdp_sim.hardware.trust import trust_of
    warning = trust_of(hw).warning()
    if warning:
        print(f"osdp-sim: warning: {hw.name}: {warning}", file=sys.stderr, flush=True)


def load_spec(args):
    from osdp_sim.model.load import load_model
    return load_model(args.model, seq_len=getattr(args, "seq_len", None))


def percent(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage 0-100, got {text!r}") from None
    if not 0.0 <= v <= 100.0:
        raise argparse.ArgumentTypeError(f"expected a percentage 0-100, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A positive, finite number (inf would make a time limit or a size unbounded)."""
    import math
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (v > 0.0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number, got {text!r}")
    return v


def int_list(text: str) -> tuple[int, ...]:
    """'8,16,24': positive whole numbers, comma-separated."""
    return tuple(positive_int(x.strip()) for x in text.split(","))


def float_list(text: str) -> tuple[float, ...]:
    """'0,1e-4,1e-3': numbers >= 0, comma-separated."""
    out = []
    for x in text.split(","):
        try:
            v = float(x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
        if not v >= 0.0:
            raise argparse.ArgumentTypeError(f"expected numbers >= 0, got {text!r}")
        out.append(v)
    return tuple(out)


def run_reporting(fn, prog: str) -> int:
    """The exit code of fn(): a UserError is one line on stderr naming `prog` and exit code 2
    (never a traceback), Ctrl-C is 130, a closed output pipe (`| head`) is 0."""
    try:
        return int(fn() or 0)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:       # Ctrl-C, or SIGTERM where a command turns it into this
        print(f"{prog}: interrupted" + (f" ({e})" if str(e) else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def run_script(main) -> int:
    """run_reporting for the scripts under bench/ and validate/, named as they were started."""
    return run_reporting(main, Path(sys.argv[0]).name)


def check_plot_path(path: str, field: str) -> None:
    """A --plot PNG (an SVG is written beside it): the suffix, and both files writable, before the
    work that makes the picture."""
    from osdp_sim.fileio import check_writable
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise UserError(f"expected a .png path, got {path!r} (an SVG is written beside it)", field=field)
    check_writable(p, field)
    check_writable(p.with_suffix(".svg"), field)


def check_seconds(value: float | None, field: str) -> None:
    """A time limit or timeout: a positive, finite number of seconds (NaN would never expire, 0 or
    less would stop the work before it starts). A UserError naming the flag otherwise."""
    import math
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UserError(f"expected a positive, finite number of seconds, got {value:g}", field=field)
