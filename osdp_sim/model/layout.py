"""Where a torch module keeps the description's units and groups: attribute paths, no torch.

One layout type for everything that maps a model description onto real modules: measuring a
transformers model per group (runtime.hf_measure), and later applying a plan to a user's model
and describing a module by measurement (issues 13 and 14: describe_module, apply_plan).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """Dotted attribute paths, relative to the model (blocks) or to one block (attn, mlp)."""

    blocks: str
    """The nn.ModuleList of transformer blocks, e.g. 'model.layers'."""
    attn: tuple[str, ...]
    """Inside a block, the submodules of the attention group (its norm included)."""
    mlp: tuple[str, ...]
    """Inside a block, the submodules of the MLP group (its norm included)."""
    embed: tuple[str, ...]
    """The root's embedding submodules."""
    head: tuple[str, ...]
    """The root's head submodules (final norm, LM head); the loss computed by the model's own
    forward outside every submodule is charged to the head too."""


BUILTIN_LAYOUT = Layout(blocks="blocks", attn=("attn",), mlp=("mlp",), embed=("embed",), head=("head",))
"""osdp_sim.runtime.modules.TransformerLM."""

_HF_DECODER = Layout(blocks="model.layers", attn=("input_layernorm", "self_attn"),
                     mlp=("post_attention_layernorm", "mlp"), embed=("model.embed_tokens",),
                     head=("model.norm", "lm_head"))

HF_LAYOUTS: dict[str, Layout] = {
    "LlamaForCausalLM": _HF_DECODER, "MistralForCausalLM": _HF_DECODER,
    "Qwen2ForCausalLM": _HF_DECODER, "GemmaForCausalLM": _HF_DECODER,
    "Phi3ForCausalLM": _HF_DECODER, "MixtralForCausalLM": _HF_DECODER,
    "GPT2LMHeadModel": Layout(blocks="transformer.h", attn=("ln_1", "attn"), mlp=("ln_2", "mlp"),
                              embed=("transformer.wte", "transformer.wpe"),
                              head=("transformer.ln_f", "lm_head")),
    "BertForMaskedLM": Layout(blocks="bert.encoder.layer", attn=("attention",),
                              mlp=("intermediate", "output"), embed=("bert.embeddings",),
                              head=("cls",)),
}
"""transformers 5.x module structure of the architectures read from config.json."""
