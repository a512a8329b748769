"""`osdp-sim models`: the built-in model shapes; `osdp-sim models PATH`: what a model file becomes."""

from osdp_sim.model import BUILTIN, build_spec

HELP = ("list the built-in models (name, family and shape), any of them usable as --model NAME, and "
        "the Hugging Face config.json architectures --model PATH accepts; with a PATH (model YAML, "
        "config.json or a folder holding one), print the description it becomes")


def add_arguments(parser) -> None:
    parser.add_argument("path", nargs="?", help="a model YAML, a config.json (or its folder) or a "
                        "built-in name to describe")
    parser.add_argument("--seq-len", type=_positive_int, help="override the model's sequence length")


def _positive_int(text: str) -> int:
    from osdp_sim.cli.common import positive_int
    return positive_int(text)


def run(args) -> int:
    if args.path:
        return describe(args.path, args.seq_len)
    rows = [("name", "family", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "seq", "params")]
    for name, cfg in BUILTIN.items():
        params = build_spec(cfg).param_count
        rows.append((name, cfg.family, cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.kv_heads, cfg.ffn,
                     cfg.vocab_size, cfg.seq_len, format_params(params)))
    _table(rows, left=2)
    from osdp_sim.model.hf import ARCHITECTURES
    print("\nHugging Face config.json (--model path/to/config.json or its folder), architectures:")
    for arch in ARCHITECTURES.values():
        print(f"  {arch.name} ({arch.family} family)")
    print("A model YAML file (--model m.yaml) describes any other shape: docs/models.md.")
    return 0


def describe(path: str, seq_len: int | None) -> int:
    """One line per distinct group: parameters, forward FLOPs and activation bytes per token."""
    from osdp_sim.model import load_model
    spec = load_model(path, seq_len=seq_len)
    cfg = spec.config
    print(f"model {cfg.name}: {cfg.family} family, {cfg.n_layers} layers, hidden {cfg.hidden}, "
          f"seq_len {cfg.seq_len}, {format_params(spec.param_count)} parameters "
          f"({spec.param_count:,}), {spec.fwd_flops_per_token:,.0f} FLOP forward per token")
    print(f"source {cfg.source}")
    if cfg.described is not None:
        # Measured groups (describe_module): the family's shape fields mean nothing here.
        extra = [f"logits_per_token {cfg.vocab_size}", f"block entries {len(cfg.described.blocks)}"]
        print("shape  described, " + ", ".join(extra))
        return _groups_table(spec)
    extra = [f"{k} {v}" for k, v in (("heads", cfg.n_heads), ("kv_heads", cfg.kv_heads),
                                     ("head_dim", cfg.head_dim), ("ffn", cfg.ffn),
                                     ("vocab", cfg.vocab_size), ("mlp", cfg.mlp_kind),
                                     ("norm", cfg.norm_kind), ("tied_head", cfg.tied_head),
                                     ("implementation", cfg.implementation))]
    if cfg.sliding_window:
        extra.append(f"sliding_window {cfg.sliding_window}")
    if cfg.moe:
        extra.append(f"experts {cfg.n_experts} top_k {cfg.top_k}")
    print("shape  " + ", ".join(extra))
    return _groups_table(spec)


def _groups_table(spec) -> int:
    rows = [("group", "kind", "linears", "params", "fwd FLOP/token", "act B/token bf16", "act B/token fp32")]
    blocks = spec.blocks
    shown = [g for u in spec.units if u.kind != "block" or u is blocks[0] for g in u.groups]
    for g in shown:
        name = g.name.replace("block0.", f"block{{0..{len(blocks) - 1}}}.") if blocks else g.name
        lin = ", ".join(_linear(l) for l in g.linears) or "-"
        rows.append((name, g.kind, lin, f"{g.param_count:,}", f"{g.fwd_flops_per_token:,.0f}",
                     f"{g.activations.bytes_per_token(2):,.0f}", f"{g.activations.bytes_per_token(4):,.0f}"))
    _table(rows, left=3)
    # What is kept once per micro-batch forward, whatever the batch (transformers' rotary tables,
    # position ids, ...): block 0 may differ from the other blocks (the rotary tables).
    once = []
    for g in shown:
        fwd = g.activations.bytes_per_forward
        if not fwd(4):
            continue
        name = g.name
        if g.kind in ("attn", "mlp"):
            same = [h for u in blocks for h in u.groups if h.kind == g.kind]
            if all(h.activations.bytes_per_forward(4) == fwd(4) for h in same):
                name = name.replace("block0.", f"block{{0..{len(blocks) - 1}}}.") + " each"
        once.append(f"{name} {fwd(2):,.0f} B bf16, {fwd(4):,.0f} B fp32")
    if once:
        print("kept once per forward, not per token: " + "; ".join(once))
    return 0


def _linear(l) -> str:
    """'q_proj 4096x4096+b'; an expert stack 'experts.down_proj 8x14336x4096 (2/token)'."""
    stack = f"{l.copies}x" if l.copies > 1 else ""
    routed = f" ({l.active}/token)" if l.copies > 1 else ""
    return f"{l.name} {stack}{l.in_features}x{l.out_features}{'+b' if l.bias else ''}{routed}"


def _table(rows, left: int) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).ljust(w) if i < left else str(v).rjust(w)
                        for i, (v, w) in enumerate(zip(r, widths))).rstrip())


def format_params(n: int) -> str:
    """124439808 -> '124.4M'; 6738415616 -> '6.74B'."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.1f}K"
