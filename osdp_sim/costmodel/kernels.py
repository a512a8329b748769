"""What one group's forward and backward run, kernel by kernel (pure functions of the model).

A group's compute is split by what bounds it (docs/cost-model.md, "Compute time"):

* GEMMs, one per Linear (per expert for a stack of experts), each with its own (M, N, K): the
  forward Y = X W^T (M tokens, N out, K in) and, in backward, the input gradient (M tokens, N in,
  K out) and the weight gradient (M out, N in, K tokens);
* the attention kernel (SDPA's flash / memory-efficient backends): causal attention computes
  about half of the score matrix;
* memory-bound kernels (normalisation, activation, rotary, residual adds, the loss's fp32
  softmax, the embedding lookup), each costed by the bytes it reads and writes;
* host work: every eager op is dispatched from the CPU (aten ops, counted per group as the
  runtime's modules issue them on torch 2.13), and FSDP2 runs hooks per unit.

Counts are per micro-batch of `tokens` tokens; bytes use `cb`, the compute dtype's size.
"""

from dataclasses import dataclass

from osdp_sim.model.config import ModelConfig
from osdp_sim.model.spec import LinearShape, OpGroup


@dataclass(frozen=True)
class Gemm:
    """One forward matrix multiply Y[M, N] = X[M, K] W[N, K]^T, repeated `count` times."""

    name: str
    m: float                      # rows: tokens (per expert for a stack of experts)
    n: int                        # output features
    k: int                        # input features
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class Attention:
    """The fused attention kernel of one attention group."""

    flops: float                  # forward FLOPs it executes (causal: about half the scores)
    keys: int                     # keys each query attends (sequence, or sliding window)
    bytes_moved: float            # q, k, v read, output written (forward)


@dataclass(frozen=True)
class MemoryWork:
    """Memory-bound kernels of one group: bytes read + written, and how many kernels."""

    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0
    fwd_kernels: int = 0
    bwd_kernels: int = 0

    def __add__(self, o: "MemoryWork") -> "MemoryWork":
        return MemoryWork(self.fwd_bytes + o.fwd_bytes, self.bwd_bytes + o.bwd_bytes,
                          self.fwd_kernels + o.fwd_kernels, self.bwd_kernels + o.bwd_kernels)

    def scaled(self, x: float) -> "MemoryWork":
        return MemoryWork(self.fwd_bytes * x, self.bwd_bytes * x, self.fwd_kernels, self.bwd_kernels)


@dataclass(frozen=True)
class GroupWork:
    """Everything one group's forward and backward run for one micro-batch."""

    gemms: tuple[Gemm, ...]
    attention: Attention | None
    memory: MemoryWork
    fwd_ops: int                  # eager ops the host dispatches in forward (views included)
    bwd_ops: int                  # ... in backward (autograd's nodes and their kernels)


# Eager aten ops per group forward and backward, counted with a TorchDispatchMode on the runtime's
# modules (osdp_sim/runtime/modules.py) in bf16 on torch 2.13 CPU; tests/test_costmodel_kernels.py
# recounts them. Key: (family, group kind).
HOST_OPS = {
    ("gpt2", "attn"): (21, 40), ("gpt2", "mlp"): (11, 30),
    ("llama", "attn"): (54, 81), ("llama", "mlp"): (26, 52),
    ("bert", "attn"): (28, 65), ("bert", "mlp"): (11, 30),
}
HOST_OPS_DESCRIBED = (25, 50)      # a described group: the runtime's median group
HOST_OPS_ROOT = {"embed": (4, 6), "head": (12, 20)}
HOST_OPS_PER_EXPERT = (8, 14)      # a routed expert: index, gather, its GEMMs, weighting, index_add

LINEAR_BIAS_BWD_READ = 1.0        # bias gradient: one read of the output gradient (sum over tokens)


def _norm(cfg: ModelConfig, h: int, cb: int, cpu: bool) -> MemoryWork:
    """One LayerNorm / RMSNorm over h features per token (bytes per token).

    LayerNorm and CUDA's fused RMSNorm read x and write y in forward (2h cb); backward reads x and
    dy and writes dx (3h cb). The runtime's CPU RMSNorm is composed of pointwise ops in fp32
    (modules.py _RMSNormFunction): x.float(), pow, mean, x * rstd, * weight, .to(bf16) in forward
    (2h cb + 28h bytes), and about 1.5 times that in backward."""
    if cfg.norm_kind == "rmsnorm" and cpu:
        fwd = 2.0 * h * cb + 28.0 * h
        return MemoryWork(fwd, 1.5 * fwd, 6, 9)
    return MemoryWork(2.0 * h * cb, 3.0 * h * cb, 1, 2)


def _pointwise(elems: float, cb: int, inputs: int = 1) -> MemoryWork:
    """An elementwise op over `elems` per token with `inputs` inputs: forward reads them and writes
    one output; backward reads the output gradient and the saved inputs and writes one gradient
    per input."""
    return MemoryWork((inputs + 1) * elems * cb, (2 * inputs + 1) * elems * cb, 1, inputs)


def _linear_bias(linears: tuple[LinearShape, ...], cb: int) -> MemoryWork:
    """Bias gradients: one read of each biased Linear's output gradient."""
    return MemoryWork(bwd_bytes=sum(LINEAR_BIAS_BWD_READ * l.out_features * l.active * cb
                                    for l in linears if l.bias))


def _gemms(linears: tuple[LinearShape, ...], tokens: float) -> tuple[Gemm, ...]:
    out = []
    for l in linears:
        if l.copies == 1:
            out.append(Gemm(l.name, tokens, l.out_features, l.in_features))
        else:
            # balanced routing: each expert of the stack sees tokens x active / copies rows
            out.append(Gemm(l.name, tokens * l.active / l.copies, l.out_features, l.in_features, l.copies))
    return tuple(out)


def _attention_kernel(cfg: ModelConfig, g: OpGroup, tokens: float, cb: int) -> Attention | None:
    core = g.fwd_flops_per_token - sum(l.fwd_flops_per_token for l in g.linears)
    if core <= 0:
        return None
    # Flash kernels skip the score blocks above the diagonal (causal masks): half the FLOPs.
    causal = cfg.family != "bert"
    executed = tokens * core * (0.5 if causal else 1.0)
    moved = tokens * (2.0 * cfg.q_dim + 2.0 * cfg.kv_dim) * cb
    return Attention(executed, cfg.attended_keys, moved)


def group_work(cfg: ModelConfig, g: OpGroup, tokens: float, cb: int, cpu: bool) -> GroupWork:
    """The kernels of one group (attn, mlp, embed or head) over `tokens` tokens."""
    h = cfg.hidden
    gemms = _gemms(g.linears, tokens)
    attn = _attention_kernel(cfg, g, tokens, cb) if g.kind == "attn" else None
    if cfg.family == "described":
        # Measured groups carry no op list: their saved bytes are the tensors their non-GEMM ops
        # produced; each is written once and read once in forward, and read twice and a gradient
        # written in backward.
        act = g.activations.bytes_for(cb, tokens)
        fwd_ops, bwd_ops = HOST_OPS_DESCRIBED
        return GroupWork(gemms, attn, MemoryWork(2.0 * act, 3.0 * act, 8, 12), fwd_ops, bwd_ops)
    per_token = MemoryWork()
    f = cfg.ffn
    if g.kind == "attn":
        per_token += _norm(cfg, h, cb, cpu) + _pointwise(h, cb, inputs=2)      # norm, residual add
        if cfg.family == "llama":
            # rotary on q and k (modules.py _RotaryFunction): x*cos, the half negated, cat,
            # *sin, add: 9 x the elements' bytes each way
            rot = (cfg.q_dim + cfg.kv_dim) * cb * 9.0
            per_token += MemoryWork(rot, rot, 10, 10)
        per_token += _linear_bias(g.linears, cb)
    elif g.kind == "mlp":
        k = cfg.top_k if cfg.moe else 1
        act = _pointwise(f * k, cb)                                           # GELU / SiLU
        if cfg.gated:
            act += _pointwise(f * k, cb, inputs=2)                            # act(gate) * up
        per_token += _norm(cfg, h, cb, cpu) + _pointwise(h, cb, inputs=2) + act
        if cfg.moe:
            # gather each routed row, weight and index_add it back: 3 x h per pair each way
            per_token += MemoryWork(3.0 * k * h * cb, 3.0 * k * h * cb, 4, 4)
        per_token += _linear_bias(g.linears, cb)
    elif g.kind == "embed":
        per_token += MemoryWork(2.0 * h * cb, 2.0 * h * cb, 1, 1)             # lookup / index_add
        if cfg.family in ("gpt2", "bert"):
            per_token += _pointwise(h, cb, inputs=2)                          # + positions
        if cfg.family == "bert":
            per_token += _norm(cfg, h, cb, cpu)
    elif g.kind == "head":
        v = cfg.vocab_size
        per_token += _norm(cfg, h, cb, cpu)
        if cfg.family == "bert":
            per_token += _pointwise(h, cb)                                    # transform's GELU
        # logits.float(), log_softmax, nll in fp32; backward: nll's scatter, log_softmax's
        # backward (reads output and gradient), the cast back
        per_token += MemoryWork(v * (cb + 4) + 8.0 * v, 4.0 * v + 12.0 * v + v * (4 + cb), 3, 3)
        per_token += _linear_bias(g.linears, cb)
    mem = per_token.scaled(tokens)
    if g.kind == "embed":
        # the dense embedding gradient is zeroed once per backward (vocab x hidden, compute dtype)
        mem += MemoryWork(bwd_bytes=cfg.vocab_size * h * cb, bwd_kernels=1)
    fwd_ops, bwd_ops = HOST_OPS.get((cfg.family, g.kind)) or HOST_OPS_ROOT.get(g.kind, HOST_OPS_DESCRIBED)
    if g.kind == "mlp" and cfg.moe:
        fwd_ops += HOST_OPS_PER_EXPERT[0] * cfg.n_experts
        bwd_ops += HOST_OPS_PER_EXPERT[1] * cfg.n_experts
    return GroupWork(gemms, attn, mem, fwd_ops, bwd_ops)


def param_tensors(cfg: ModelConfig, g: OpGroup) -> int:
    """Parameter tensors of one group (the optimizer's single-tensor loop works per tensor): each
    Linear's weight and bias (a stack of experts is one tensor), one per norm vector."""
    linears = sum(1 + (1 if l.bias else 0) for l in g.linears)
    if cfg.family == "described" or g.kind not in ("embed", "head"):
        h = max(cfg.hidden, 1)
        vectors = max(0, round((g.other_params - (cfg.hidden if g.kind == "embed" else 0)) / h))
        return max(1, linears + vectors) if g.kind != "embed" else 1 + vectors
    norm = 1 if cfg.norm_kind == "rmsnorm" else 2
    if g.kind == "embed":
        tables = 1 + (1 if cfg.family in ("gpt2", "bert") else 0) + (1 if cfg.family == "bert" else 0)
        return tables + (norm if cfg.family == "bert" else 0)
    return linears + norm + (1 if cfg.family == "bert" else 0)          # BERT: the decoder bias
