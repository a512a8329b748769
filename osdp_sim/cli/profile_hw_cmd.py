"""`osdp-sim profile-hw -o PROFILE.yaml`: measure this machine and write a hardware profile.

Launches --nproc local ranks itself (or, started by torchrun, joins that launch); rank 0 writes
the profile. torch is imported only when the command runs."""

import datetime
import os
import shlex
import sys
import time

from osdp_sim.cli.common import check_seconds
from osdp_sim.errors import UserError
from osdp_sim.fileio import check_writable
from osdp_sim.units import format_bytes, parse_bytes

HELP = "measure this machine (GEMM, memory bandwidth, collectives, overlap) and write a hardware profile"

_DTYPES = ("fp32", "bf16", "fp16")
_DEFAULT_MAX_MESSAGE = {"cpu": "64MiB", "cuda": "1GiB"}


def add_arguments(parser) -> None:
    parser.add_argument("-o", "--output", required=True, metavar="PROFILE.yaml",
                        help="where to write the profile (YAML, schema osdp-sim/hardware v1)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="what one rank measures: a CPU rank (gloo) or one GPU (nccl); default cpu")
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="ranks to launch on this machine (default: 2 on cpu, every GPU on cuda); "
                             "collectives are measured for group sizes 2, 4, ... up to N")
    parser.add_argument("--dtype", default=None, metavar="LIST",
                        help="GEMM dtypes, comma-separated (fp32 and bf16 required; default fp32,bf16 "
                             "on cpu, fp32,bf16,fp16 on cuda)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (about a minute)")
    parser.add_argument("--tiny", action="store_true",
                        help="smallest sizes, for smoke tests; the numbers are not representative")
    parser.add_argument("--max-message-bytes", default=None, metavar="SIZE",
                        help="largest collective message (full buffer), e.g. 256MiB "
                             "(default 64MiB on cpu, 1GiB on cuda)")
    parser.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    parser.add_argument("--peak-tflops", default=None, metavar="DTYPE=TFLOPS,...",
                        help="nominal peaks (e.g. fp32=19.5,bf16=312): the GEMM efficiency curve is then "
                             "relative to them instead of the best measured rate")
    parser.add_argument("--nominal-bandwidth-gbps", type=float, default=None, metavar="GBPS",
                        help="nominal memory bandwidth; the measured one becomes its efficiency")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                        help="time limit of the whole measurement, the ranks' start-up included: past "
                             "it every rank is stopped and nothing is written (default 3600)")


def run(args) -> int:
    started_s = time.monotonic()                 # --timeout bounds the whole command
    cfg, name = _config(args)
    check_writable(args.output, "-o")         # before minutes of measuring, not after
    torchrun = _under_torchrun()
    if torchrun:
        cfg = _with(cfg, nproc=int(os.environ["WORLD_SIZE"]))
    command = _command_line(args, cfg)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    start_s = time.perf_counter()
    load_before = round(os.getloadavg()[0], 2)     # other work on the machine skews every number
    if load_before > 0.5 and not torchrun:
        print(f"osdp-sim profile-hw: warning: the machine is busy (1-minute load average {load_before}); "
              "other work lowers every measured rate, so profile an idle machine", file=sys.stderr)

    from osdp_sim.profiler.run import ProfilingFailed, finish_rank, measure_rank, profile_ranks
    if not torchrun:
        try:
            merged = profile_ranks(cfg, started_s=started_s)
        except ProfilingFailed as e:
            raise UserError(f"profiling failed: {e}") from None
        _write(args, cfg, name, merged, command, date, time.perf_counter() - start_s, load_before)
        return 0
    merged = measure_rank(cfg)
    try:
        if merged is not None:    # rank 0 writes; the others wait for it in finish_rank
            _write(args, cfg, name, merged, command, date, time.perf_counter() - start_s, load_before)
    finally:
        finish_rank()
    return 0


def _write(args, cfg, name: str, merged: dict, command: str, date: str, took_s: float,
           load_before: float) -> None:
    from osdp_sim.hardware.dump import save_profile
    from osdp_sim.profiler.assemble import build_profile
    from osdp_sim.profiler.device import host_facts
    from osdp_sim.profiler.measurements import from_dict
    host = {**host_facts(), "load_average_1m_before": load_before}
    profile = build_profile(from_dict(merged), name=name, dtypes=cfg.dtypes,
                            nominal_peak_tflops=cfg.peak_tflops,
                            nominal_bandwidth_gbps=cfg.nominal_bandwidth_gbps,
                            command=command, date=date, host=host)
    profile.provenance["total_s"] = round(took_s, 1)
    machine = f"{host['cpu_model']}, {host['cpu_cores']} cores, torch {host['torch']}"
    if cfg.device == "cuda":
        machine += f", {cfg.nproc} x {profile.device.name}"
    header = (f"Measured by: {command}\nDate: {date}\nMachine: {machine}\n"
              f"Took {took_s:.0f} s. Provenance (at the end) records every measurement's spread.")
    save_profile(profile, args.output, header)
    # the progress lines are rank 0's; the profile holds the median over ranks
    print(f"wrote {args.output} ({profile.name}: {cfg.nproc} ranks, took {took_s:.0f} s; overlap slowdown "
          f"{profile.overlap_slowdown:g}, from the median over ranks)", file=sys.stderr)


def _config(args):
    from osdp_sim.profiler.run import ProfileConfig    # no torch import in this module
    if args.quick and args.tiny:
        raise UserError("choose one of --quick and --tiny", field="--tiny")
    dtypes = tuple(args.dtype.split(",")) if args.dtype else (
        ("fp32", "bf16", "fp16") if args.device == "cuda" else ("fp32", "bf16"))
    for dt in dtypes:
        if dt not in _DTYPES:
            raise UserError(f"unknown dtype {dt!r}; use some of {', '.join(_DTYPES)}", field="--dtype")
    if "fp32" not in dtypes or "bf16" not in dtypes:
        raise UserError("fp32 and bf16 are required by the profile schema; e.g. --dtype fp32,bf16",
                        field="--dtype")
    if args.device == "cuda" and not _under_torchrun():
        # before the rank count: with no GPU the default count is 0, which is not the problem
        from osdp_sim.runtime.launch import check_gpus
        check_gpus(1, "profiling cuda devices", field="--device")
    nproc = args.nproc if args.nproc is not None else _default_nproc(args.device)
    if nproc < 2 and not _under_torchrun():
        raise UserError(f"collectives need at least 2 ranks, got {nproc}", field="--nproc")
    if args.device == "cpu" and not _under_torchrun():
        from osdp_sim.runtime.launch import check_cpu_ranks
        check_cpu_ranks(nproc, field="--nproc")
    if args.device == "cuda" and not _under_torchrun() and nproc > _cuda_count():
        raise UserError(f"{nproc} ranks but only {_cuda_count()} GPUs visible (one per NCCL rank)",
                        field="--nproc")
    max_message = parse_bytes(args.max_message_bytes or _DEFAULT_MAX_MESSAGE[args.device],
                              field="--max-message-bytes")
    if max_message < 4096:
        raise UserError(f"must be at least 4KiB, got {format_bytes(max_message)}", field="--max-message-bytes")
    from osdp_sim.runtime.launch import physical_memory_bytes
    ram = physical_memory_bytes()
    if args.device == "cpu" and ram and 2 * max_message * nproc > ram:
        # every CPU rank holds a full-size input or output buffer (plus its shard) at the largest size
        raise UserError(f"{nproc} ranks x 2 x {format_bytes(max_message)} of buffers exceed this machine's "
                        f"{format_bytes(ram)} of memory; give a smaller size", field="--max-message-bytes")
    check_seconds(args.timeout, "--timeout")
    bw = args.nominal_bandwidth_gbps
    if bw is not None and not 0 < bw < float("inf"):
        raise UserError(f"must be a positive, finite number, got {bw}", field="--nominal-bandwidth-gbps")
    name = args.name or os.path.splitext(os.path.basename(args.output))[0] or "measured"
    cfg = ProfileConfig(device=args.device, nproc=nproc, dtypes=dtypes, quick=args.quick, tiny=args.tiny,
                        max_message_bytes=max_message, timeout_s=args.timeout,
                        peak_tflops=_peaks(args.peak_tflops, dtypes), nominal_bandwidth_gbps=bw)
    return cfg, name


def _peaks(text: str | None, dtypes: tuple[str, ...]) -> dict:
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in dtypes:
            raise UserError(f"{key!r} is not one of the measured dtypes ({', '.join(dtypes)}); "
                            "write e.g. fp32=19.5,bf16=312", field="--peak-tflops")
        try:
            out[key] = float(value)
        except ValueError:
            raise UserError(f"expected DTYPE=TFLOPS, got {item!r}", field="--peak-tflops") from None
        if not out[key] > 0 or out[key] == float("inf"):
            raise UserError(f"peak must be a positive number, got {item!r}", field="--peak-tflops")
    return out


def _under_torchrun() -> bool:
    from osdp_sim.profiler.run import WORKER_ENV
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")) \
        and WORKER_ENV not in os.environ


def _cuda_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _default_nproc(device: str) -> int:
    return _cuda_count() if device == "cuda" else 2


def _with(cfg, **changes):
    from dataclasses import replace
    return replace(cfg, **changes)


def _command_line(args, cfg) -> str:
    """The command that reproduces this run (defaults spelled out for device and ranks)."""
    parts = ["osdp-sim", "profile-hw", "--device", cfg.device, "--nproc", str(cfg.nproc)]
    if args.dtype:
        parts += ["--dtype", args.dtype]
    if args.quick:
        parts.append("--quick")
    if args.tiny:
        parts.append("--tiny")
    if args.max_message_bytes:
        parts += ["--max-message-bytes", args.max_message_bytes]
    if args.name:
        parts += ["--name", args.name]
    if args.peak_tflops:
        parts += ["--peak-tflops", args.peak_tflops]
    if args.nominal_bandwidth_gbps is not None:
        parts += ["--nominal-bandwidth-gbps", f"{args.nominal_bandwidth_gbps:g}"]
    if args.timeout != 3600.0:
        parts += ["--timeout", f"{args.timeout:g}"]
    parts += ["-o", args.output]
    if _under_torchrun():
        parts = ["torchrun", f"--nproc-per-node={os.environ.get('LOCAL_WORLD_SIZE', cfg.nproc)}",
                 "-m", "osdp_sim.cli.main"] + parts[1:]
    return shlex.join(parts)
