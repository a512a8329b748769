"""Where a torch model keeps what a plan addresses: its block list, each block's attention and MLP
groups, the modules operator splitting may cut, and what belongs to the root.

A layout is plain data (no torch import): the runtime (osdp_sim/runtime/apply.py) resolves it
against a real module, and the model stage's describe_module uses the same type to say what it
measured. Paths are dotted module names as `nn.Module.get_submodule` takes them; block-relative
paths start below one block ("self_attn.q_proj"), model paths from the model ("model.layers").

The worked example (docs/runtime.md), a torchtitan-style Llama written in plain torch:

    ModelLayout(
        name="torchtitan-llama",
        blocks="layers",
        attn=GroupLayout(modules=("attention_norm", "attention"),
                         splits=tuple(SplitTarget(f"attention.{w}") for w in ("wq", "wk", "wv", "wo"))),
        mlp=GroupLayout(modules=("ffn_norm", "feed_forward"),
                        splits=tuple(SplitTarget(f"feed_forward.{w}") for w in ("w1", "w2", "w3"))),
        root=("tok_embeddings", "norm", "output"),
    )
"""

from collections.abc import Collection
from dataclasses import dataclass, field

from osdp_sim.errors import UserError

SPLIT_KINDS = ("linear", "conv1d", "experts")


@dataclass(frozen=True)
class SplitTarget:
    """One module of a group that operator splitting may cut into k slices."""

    path: str
    """Block-relative dotted path of the module, e.g. "self_attn.q_proj"."""

    kind: str = "linear"
    """How it is cut. "linear": an nn.Linear (weight [out, in]), cut along its input features;
    a fused projection (Phi3's qkv_proj, gate_up_proj) is one Linear and is cut the same way,
    since a cut along input features never separates the fused outputs. "conv1d": Hugging Face's
    GPT-2 Conv1D (weight stored [in, out]), cut along input features (weight rows). "experts":
    a mixture-of-experts module holding fused 3-D parameters gate_up_proj [E, 2f, h] and
    down_proj [E, h, f] (transformers 5.x), cut along the experts: slice s holds experts
    s*E/k .. (s+1)*E/k - 1."""

    def __post_init__(self):
        if not self.path or self.path.startswith(".") or self.path.endswith("."):
            raise UserError(f"expected a dotted module path, got {self.path!r}",
                            field="layout.splits.path")
        if self.kind not in SPLIT_KINDS:
            raise UserError(f"{self.path}: unknown split kind {self.kind!r}; expected one of "
                            f"{', '.join(SPLIT_KINDS)}", field="layout.splits.kind")


@dataclass(frozen=True)
class GroupLayout:
    """The submodules of one block that form one operator group (one FSDP unit, or one split
    family of them)."""

    modules: tuple[str, ...]
    """Block-relative paths of the group's modules, its norm included, e.g. ("input_layernorm",
    "self_attn"). Every parameter of a block must lie under exactly one of the two groups."""

    splits: tuple[SplitTarget, ...] = ()
    """The modules a split plan cuts, each under one of `modules`. Empty: the group cannot be
    split, and a plan that splits it is refused."""

    def __post_init__(self):
        if not self.modules:
            raise UserError("a group needs at least one module", field="layout.modules")
        for target in self.splits:
            if not any(_under(target.path, m) for m in self.modules):
                raise UserError(f"split target {target.path!r} is under none of the group's "
                                f"modules {list(self.modules)}", field="layout.splits")


@dataclass(frozen=True)
class ModelLayout:
    """Where a model's blocks, groups and root are. One layout serves every model of an
    architecture (the block count is read from the model)."""

    name: str
    """What the layout is for, used in messages (an architecture or class name)."""

    blocks: str
    """Dotted path of the block list from the model: an nn.ModuleList, or an nn.ModuleDict whose
    values are the blocks in order (torchtitan), e.g. "model.layers"."""

    attn: GroupLayout
    """The attention group of each block (plan key 'block{i}.attn')."""

    mlp: GroupLayout
    """The MLP group of each block (plan key 'block{i}.mlp'), experts and router included."""

    root: tuple[str, ...]
    """Dotted paths of the root's modules from the model: embeddings, final norm, head (plan key
    'root'). Every parameter outside the blocks must lie under one of them."""

    embed: tuple[str, ...] = ()
    """Those of `root` that run before the blocks (the embeddings); the rest run after them (final
    norm, head). Measuring a module per description unit (runtime/hf_measure.py) charges the
    first to the 'embed' unit and the rest to 'head'; applying a plan needs only `root`."""

    disable_cache: bool = False
    """Hugging Face models: turn off the key/value cache (config.use_cache = False) when the plan
    is applied. A cache filled during forward would be filled again by a checkpointed layer's
    recompute, and training never reads it."""

    notes: tuple[str, ...] = field(default=(), compare=False)
    """What a reader of this layout should know (e.g. tied weights), shown by describe()."""

    def __post_init__(self):
        if not self.blocks:
            raise UserError("the path of the block list is empty", field="layout.blocks")
        stray = [e for e in self.embed if e not in self.root]
        if stray:
            raise UserError(f"embed module {stray[0]!r} is not one of root's", field="layout.embed")
        overlap = [(a, m) for a in self.attn.modules for m in self.mlp.modules
                   if _under(a, m) or _under(m, a)]
        if overlap:
            raise UserError(f"module {overlap[0][0]!r} is in both the attn and the mlp group",
                            field="layout.mlp.modules")

    def group(self, kind: str) -> GroupLayout:
        if kind not in ("attn", "mlp"):
            raise ValueError(f"unknown group kind {kind!r}")
        return self.attn if kind == "attn" else self.mlp

    def block_path(self, key: str) -> str:
        """Model path of one block, from the key it has in the block list ("0", "1", ...)."""
        return f"{self.blocks}.{key}"

    def check_paths(self, module_names: Collection[str], block_keys: Collection[str],
                    *, model: str = "") -> None:
        """Raise a one-line UserError naming the first path of this layout that is not among
        `module_names` (the dotted names of the model's modules, as named_modules() gives them);
        `block_keys` are the block list's keys."""
        names = set(module_names)
        where = f" in {model}" if model else ""

        def need(path: str, field_name: str) -> None:
            if path not in names:
                raise UserError(f"no module {path!r}{where}", field=f"layout.{field_name}")

        need(self.blocks, "blocks")
        if not block_keys:
            raise UserError(f"the block list {self.blocks!r}{where} is empty", field="layout.blocks")
        for key in block_keys:
            block = self.block_path(key)
            for kind in ("attn", "mlp"):
                group = self.group(kind)
                for m in group.modules:
                    need(f"{block}.{m}", f"{kind}.modules")
                for target in group.splits:
                    need(f"{block}.{target.path}", f"{kind}.splits")
        for path in self.root:
            need(path, "root")

    def describe(self) -> str:
        lines = [f"layout {self.name}: blocks at {self.blocks}"]
        for kind in ("attn", "mlp"):
            g = self.group(kind)
            cuts = ", ".join(f"{t.path} ({t.kind})" for t in g.splits) or "none"
            lines.append(f"  {kind}: {', '.join(g.modules)}; splittable: {cuts}")
        lines.append(f"  root: {', '.join(self.root)}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


# ---------------------------------------------------------------- built-in layouts

def _linears(group: str, *names: str, kind: str = "linear") -> tuple[SplitTarget, ...]:
    return tuple(SplitTarget(f"{group}.{n}", kind) for n in names)


_DECODER_ATTN = GroupLayout(modules=("input_layernorm", "self_attn"),
                            splits=_linears("self_attn", "q_proj", "k_proj", "v_proj", "o_proj"))
_DECODER_MLP = GroupLayout(modules=("post_attention_layernorm", "mlp"),
                           splits=_linears("mlp", "gate_proj", "up_proj", "down_proj"))
_DECODER_ROOT = ("model.embed_tokens", "model.norm", "lm_head")


def _decoder(name: str, attn: GroupLayout = _DECODER_ATTN, mlp: GroupLayout = _DECODER_MLP,
             notes: tuple[str, ...] = ()) -> ModelLayout:
    return ModelLayout(name=name, blocks="model.layers", attn=attn, mlp=mlp, root=_DECODER_ROOT,
                       embed=_DECODER_ROOT[:1], disable_cache=True, notes=notes)


HF_LAYOUTS: dict[str, ModelLayout] = {layout.name: layout for layout in (
    _decoder("LlamaForCausalLM"),
    _decoder("MistralForCausalLM"),
    _decoder("Qwen2ForCausalLM", notes=("q/k/v projections carry a bias (kept whole by a split)",)),
    _decoder("GemmaForCausalLM", notes=("lm_head is tied to embed_tokens (one root parameter)",)),
    _decoder("Phi3ForCausalLM",
             attn=GroupLayout(modules=("input_layernorm", "self_attn"),
                              splits=_linears("self_attn", "qkv_proj", "o_proj")),
             mlp=GroupLayout(modules=("post_attention_layernorm", "mlp"),
                             splits=_linears("mlp", "gate_up_proj", "down_proj")),
             notes=("qkv_proj and gate_up_proj are fused; cut along input features they stay "
                    "fused",)),
    _decoder("MixtralForCausalLM",
             mlp=GroupLayout(modules=("post_attention_layernorm", "mlp"),
                             splits=(SplitTarget("mlp.experts", "experts"),)),
             notes=("the MLP group is the router (mlp.gate) and the fused 3-D experts; a split "
                    "cuts the experts, the router stays whole",)),
    ModelLayout(
        name="GPT2LMHeadModel", blocks="transformer.h",
        attn=GroupLayout(modules=("ln_1", "attn"),
                         splits=_linears("attn", "c_attn", "c_proj", kind="conv1d")),
        mlp=GroupLayout(modules=("ln_2", "mlp"),
                        splits=_linears("mlp", "c_fc", "c_proj", kind="conv1d")),
        root=("transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head"),
        embed=("transformer.wte", "transformer.wpe"), disable_cache=True,
        notes=("Conv1D weights are stored [in, out]", "lm_head is tied to transformer.wte")),
    ModelLayout(
        name="BertForMaskedLM", blocks="bert.encoder.layer",
        attn=GroupLayout(modules=("attention",),
                         splits=_linears("attention", "self.query", "self.key", "self.value",
                                         "output.dense")),
        mlp=GroupLayout(modules=("intermediate", "output"),
                        splits=(SplitTarget("intermediate.dense"), SplitTarget("output.dense"))),
        root=("bert.embeddings", "cls"), embed=("bert.embeddings",),
        notes=("post-LN: each group's LayerNorm is inside it (attention.output.LayerNorm, "
               "output.LayerNorm)", "the MLM decoder is tied to the word embeddings")),
)}

_BUILTIN_SPLITS = {
    "gpt2": (("c_attn", "c_proj"), ("c_fc", "c_proj")),
    "bert": (("query", "key", "value", "dense"), ("intermediate", "output")),
    "llama": (("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")),
}


def builtin_layout(family: str) -> ModelLayout:
    """The layout of osdp-sim's own modules (osdp_sim/runtime/modules.py) of one family."""
    if family not in _BUILTIN_SPLITS:
        raise UserError(f"unknown family {family!r}; expected one of {', '.join(_BUILTIN_SPLITS)}",
                        field="family")
    attn_linears, mlp_linears = _BUILTIN_SPLITS[family]
    return ModelLayout(name=f"osdp-sim {family}", blocks="blocks",
                       attn=GroupLayout(modules=("attn",), splits=_linears("attn", *attn_linears)),
                       mlp=GroupLayout(modules=("mlp",), splits=_linears("mlp", *mlp_linears)),
                       root=("embed", "head"), embed=("embed",))


def hf_layout(class_name: str) -> ModelLayout:
    """The built-in layout of a Hugging Face model class; a one-line error listing the known
    classes otherwise."""
    if class_name not in HF_LAYOUTS:
        raise UserError(f"no built-in layout for {class_name}; known: {', '.join(HF_LAYOUTS)}; "
                        "pass layout=ModelLayout(...) (docs/runtime.md)", field="layout")
    return HF_LAYOUTS[class_name]
