"""Model-state bytes per parameter: what each strategy keeps resident on one device.

PyTorch FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) keeps fp32 sharded
parameters (4 B), fp32 sharded gradients (4 B) and the optimizer state in fp32 (AdamW m and v: 8 B;
SGD momentum: 4 B); the bf16 copies exist only while a unit is gathered (PyTorch FSDP2
docs, torch.distributed.fsdp.MixedPrecisionPolicy; [ZeRO] Rajbhandari et al. 2020, section 3).
Pure fp32 training keeps the same 4 + 4 + 8. So resident bytes per parameter do not depend on the
precision policy; the transient gathered copies and the communicated bytes do.
"""

from dataclasses import dataclass

PARAM_BYTES = 4          # fp32 master / sharded parameters
GRAD_BYTES = 4           # fp32 gradients (reduce dtype)
OPTIMIZER_BYTES = {"adamw": 8, "sgd": 4}
COMPUTE_DTYPE = {"fp32": "fp32", "bf16": "bf16"}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def compute_bytes(precision: str) -> int:
    """Bytes of a parameter / activation element in the compute dtype (gathered copies, activations)."""
    return DTYPE_BYTES[COMPUTE_DTYPE[precision]]


def reduce_bytes(precision: str) -> int:
    """Bytes per gradient element on the wire: FSDP2 reduces in fp32 for both policies here."""
    return GRAD_BYTES


@dataclass(frozen=True)
class StateBytes:
    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def state_bytes(n_params: float, strategy: str, shard_size: int, optimizer: str) -> StateBytes:
    """Resident model-state bytes on one device for n_params parameters under one strategy.

    ddp   - everything replicated:                 4 P + 4 P + o P
    zero2 - grads and optimizer sharded, params too between steps (FSDP2 SHARD_GRAD_OP keeps the
            fp32 params sharded; the gathered copy is transient): 4 P/N + 4 P/N + o P/N
    zero3 - everything sharded:                    4 P/N + 4 P/N + o P/N
    The difference between zero2 and zero3 is in the transient gathered copy (see schedule.py).
    """
    o = OPTIMIZER_BYTES[optimizer]
    if strategy == "ddp":
        return StateBytes(PARAM_BYTES * n_params, GRAD_BYTES * n_params, o * n_params)
    n = shard_size
    return StateBytes(PARAM_BYTES * n_params / n, GRAD_BYTES * n_params / n, o * n_params / n)
