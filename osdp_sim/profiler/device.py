"""The device one rank measures: which torch device, how to synchronise it, its name and memory."""

import os
import platform
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Device:
    kind: str                 # cpu | cuda
    torch_device: torch.device

    def sync(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.torch_device)

    @property
    def backend(self) -> str:
        return "nccl" if self.kind == "cuda" else "gloo"


def open_device(kind: str, local_rank: int) -> Device:
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return Device("cuda", torch.device("cuda", local_rank))
    return Device("cpu", torch.device("cpu"))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def device_name(kind: str) -> str:
    if kind == "cuda":
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return cpu_model()


def host_facts() -> dict:
    """What the header comment and the provenance say about the machine."""
    facts = {"cpu_model": cpu_model(), "cpu_cores": os.cpu_count() or 1, "torch": str(torch.__version__),
             "hostname": platform.node()}
    if torch.cuda.is_available():
        facts["cuda"] = str(torch.version.cuda)
        facts["gpus"] = torch.cuda.device_count()
    return facts


def total_ram_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemTotal missing from /proc/meminfo")


def process_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True)
class MemoryFacts:
    capacity_bytes: int       # one device (on CPU: total RAM / ranks on the node)
    baseline_bytes: int       # what this process holds before any model tensor exists
    basis: str                # how the capacity was obtained


def memory_facts(device: Device, ranks_per_node: int) -> MemoryFacts:
    """Call after the process group is up and one collective has run, so the runtime context
    (CUDA context, NCCL or gloo buffers) is part of the baseline."""
    if device.kind == "cuda":
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device.torch_device)
        baseline = max(0, (total - free) - torch.cuda.memory_reserved(device.torch_device))
        return MemoryFacts(total, baseline, "torch.cuda.mem_get_info total; baseline = used - reserved "
                                            "after process-group init")
    return MemoryFacts(total_ram_bytes() // ranks_per_node, process_rss_bytes(),
                       f"total RAM / {ranks_per_node} ranks per node; baseline = rank RSS after "
                       "torch import and process-group init")
