"""`osdp-sim models`: the built-in model shapes."""

from osdp_sim.model import BUILTIN, build_spec

HELP = "list the built-in models (name, family and shape); any of them can be given as --model NAME"


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    rows = [("name", "family", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "seq", "params")]
    for name, cfg in BUILTIN.items():
        params = build_spec(cfg).param_count
        rows.append((name, cfg.family, cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.kv_heads, cfg.ffn,
                     cfg.vocab_size, cfg.seq_len, format_params(params)))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).ljust(w) if i < 2 else str(v).rjust(w)
                        for i, (v, w) in enumerate(zip(r, widths))).rstrip())
    return 0


def format_params(n: int) -> str:
    """124439808 -> '124.4M'; 6738415616 -> '6.74B'."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.1f}K"
