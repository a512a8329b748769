"""Built-in models with their real shapes."""

from osdp_sim.model.config import ModelConfig, with_overrides

_GPT2 = dict(family="gpt2", vocab_size=50257, seq_len=1024, max_positions=1024)

_BUILTIN = (
    ModelConfig(name="gpt2-124m", n_layers=12, hidden=768, n_heads=12, **_GPT2),
    ModelConfig(name="gpt2-350m", n_layers=24, hidden=1024, n_heads=16, **_GPT2),
    ModelConfig(name="gpt2-774m", n_layers=36, hidden=1280, n_heads=20, **_GPT2),
    ModelConfig(name="gpt2-1.5b", n_layers=48, hidden=1600, n_heads=25, **_GPT2),
    # The OSDP paper's minGPT settings: 48 layers at hidden 1536 and 2048.
    ModelConfig(name="mingpt-48l-1536", n_layers=48, hidden=1536, n_heads=16, **_GPT2),
    ModelConfig(name="mingpt-48l-2048", n_layers=48, hidden=2048, n_heads=16, **_GPT2),
    ModelConfig(name="bert-large", family="bert", n_layers=24, hidden=1024, n_heads=16,
                vocab_size=30522, seq_len=512, max_positions=512, type_vocab_size=2),
    ModelConfig(name="llama-7b", family="llama", n_layers=32, hidden=4096, n_heads=32,
                vocab_size=32000, seq_len=2048, ffn_hidden=11008, tied_head=False),
    ModelConfig(name="llama-13b", family="llama", n_layers=40, hidden=5120, n_heads=40,
                vocab_size=32000, seq_len=2048, ffn_hidden=13824, tied_head=False),
    ModelConfig(name="llama-8b", family="llama", n_layers=32, hidden=4096, n_heads=32,
                n_kv_heads=8, vocab_size=128256, seq_len=8192, ffn_hidden=14336, tied_head=False),
    # Small shapes for real runs on CPU (same structure, shrunk).
    ModelConfig(name="gpt2-tiny", n_layers=4, hidden=256, n_heads=4, family="gpt2",
                vocab_size=8192, seq_len=128, max_positions=128),
    ModelConfig(name="gpt2-small-cpu", n_layers=8, hidden=512, n_heads=8, family="gpt2",
                vocab_size=8192, seq_len=128, max_positions=128),
    ModelConfig(name="llama-tiny", family="llama", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2,
                vocab_size=8192, seq_len=128, ffn_hidden=688, tied_head=False),
    ModelConfig(name="bert-tiny", family="bert", n_layers=4, hidden=256, n_heads=4,
                vocab_size=8192, seq_len=128, max_positions=128),
)

BUILTIN: dict[str, ModelConfig] = {c.name: with_overrides(c, source=f"builtin:{c.name}") for c in _BUILTIN}
