"""`osdp-sim` entry point. Each subcommand lives in its own module with
`HELP`, `add_arguments(parser)` and `run(args) -> int`; modules are imported lazily so the core
commands never import torch."""

import argparse
import importlib
import importlib.util
import sys

from osdp_sim.cli.common import run_reporting
from osdp_sim.errors import UserError

COMMANDS = {
    "estimate": "osdp_sim.cli.estimate_cmd",
    "search": "osdp_sim.cli.search_cmd",
    "pareto": "osdp_sim.cli.pareto_cmd",
    "models": "osdp_sim.cli.list_cmd",
    "profiles": "osdp_sim.cli.profiles_cmd",
    "validate": "osdp_sim.cli.validate_cmd",
    "profile-hw": "osdp_sim.cli.profile_hw_cmd",
    "calibrate": "osdp_sim.cli.calibrate_cmd",
    "campaign": "osdp_sim.cli.campaign_cmd",
    "sweep": "osdp_sim.cli.sweep_cmd",
    "tune": "osdp_sim.cli.tune_cmd",
    "compare": "osdp_sim.cli.compare_cmd",
}


def _available() -> dict:
    mods = {}
    for name, path in COMMANDS.items():
        try:
            mods[name] = importlib.import_module(path)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("osdp_sim.cli"):
                continue      # command not built yet
            raise
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="osdp-sim", description="Cost model, exact plan search and "
                                     "real-execution validation for sharded data-parallel training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in _available().items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


# Commands that run torch; the core (estimate, search, pareto, calibrate) never imports it.
NEEDS_TORCH = ("validate", "profile-hw", "campaign", "compare")


def _require_torch(command: str) -> None:
    if importlib.util.find_spec("torch") is None:
        raise UserError(f"`osdp-sim {command}` runs PyTorch, which is not installed; install the runtime "
                        "extra: pip install torch==2.13.0 && pip install -e '.[runtime]'")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    def run() -> int:
        if args.command in NEEDS_TORCH:
            _require_torch(args.command)
        return args._run(args)

    return run_reporting(run, f"osdp-sim {args.command}")


if __name__ == "__main__":
    sys.exit(main())
