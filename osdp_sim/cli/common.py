"""Argument helpers shared by the commands: resolving model, hardware and plan arguments."""

import argparse

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


def byte_size(text: str) -> int:
    try:
        return parse_bytes(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="built-in model name (osdp-sim models) or a model YAML file")
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


def load_spec(args):
    from osdp_sim.model.load import load_model
    return load_model(args.model, seq_len=getattr(args, "seq_len", None))


def percent(text: str) -> float:
    import argparse
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage 0-100, got {text!r}") from None
    if not 0.0 <= v <= 100.0:
        raise argparse.ArgumentTypeError(f"expected a percentage 0-100, got {text!r}")
    return v
