"""Spawn target and models of tests/test_runtime_apply_hf.py: plans applied with
osdp_sim.runtime.apply_plan to models osdp-sim did not write (a tiny Hugging Face Llama and
Mixtral, and a torchtitan-style Llama in plain torch), trained on 2 gloo ranks and compared with
single-process training of the same model on the global batch (as osdp_sim/runtime/equivalence.py
does for the built-in modules).

Per case every rank records: the mean loss of each step, how many times each block's group
modules ran forward in one training step (a checkpointed block recomputes: 2, else 1), the
state_dict keys and shapes of the sharded model, and the loss of a fresh model with the same plan
after loading that state_dict (a resume). Importable by the spawned children because
spawn passes sys.path (pytest puts tests/ on it).
"""

import json
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from osdp_sim.model.config import ModelConfig
from osdp_sim.plan.plan import Plan, uniform_plan
from osdp_sim.runtime import parallelize

VOCAB, SEQ, HIDDEN, FFN, LAYERS = 256, 16, 64, 128, 2
DATA_SEED = 4321
# The group module whose forward calls are counted, per model.
COUNTED = {"llama": ("self_attn", "mlp"), "mixtral": ("self_attn", "mlp"), "gpt2": ("attn", "mlp"),
           "torchtitan": ("attention", "feed_forward")}


@dataclass(frozen=True)
class ModelCase:
    """One training run. model: llama | mixtral | gpt2 | torchtitan. broken (negative control):
    'size1_mesh' builds every unit on a mesh of size one per rank (docs/runtime.md's trap 2), so
    no gradient is ever synchronised."""

    name: str
    model: str
    plan: Plan
    broken: str = ""


def plan_config() -> ModelConfig:
    """The cost model's description a plan embeds; apply_plan checks only its block count."""
    return ModelConfig(name="tiny-hf", family="llama", n_layers=LAYERS, hidden=HIDDEN, n_heads=4,
                       n_kv_heads=2, vocab_size=VOCAB, seq_len=SEQ, ffn_hidden=FFN, tied_head=False)


def make_plan(choices: dict, *, checkpoint=(False,) * LAYERS, **kw) -> Plan:
    kw.setdefault("precision", "fp32")
    base = uniform_plan(plan_config(), "zero3", devices=2, micro_batch=2, **kw)
    return base.with_choices(choices={**base.choices, **choices}, checkpoint=tuple(checkpoint))


def build(model: str):
    """The model with the same weights on every rank (seed 0)."""
    torch.manual_seed(0)
    if model == "torchtitan":
        import torchtitan_llama
        return torchtitan_llama.build(dim=HIDDEN, n_layers=LAYERS, vocab_size=VOCAB,
                                      ffn_dim=FFN, max_seq_len=SEQ)
    import transformers
    common = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                  max_position_embeddings=SEQ, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if model == "gpt2":          # Conv1D weights [in, out]; lm_head tied to wte; no dropout
        return transformers.GPT2LMHeadModel._from_config(transformers.GPT2Config(
            n_embd=HIDDEN, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
            bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
            attn_implementation="sdpa")
    if model == "llama":
        cls, cfg = transformers.LlamaForCausalLM, transformers.LlamaConfig(**common)
    else:
        cls, cfg = transformers.MixtralForCausalLM, transformers.MixtralConfig(
            **common, num_local_experts=4, num_experts_per_tok=2)
    return cls._from_config(cfg, attn_implementation="sdpa")


def loss_of(model_kind: str, model, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if model_kind == "torchtitan":
        logits = model(ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return model(input_ids=ids, labels=targets).loss       # HF shifts the labels itself


def global_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(DATA_SEED)
    ids = torch.randint(3, VOCAB, (n, SEQ), generator=gen)
    return ids, ids.clone()


def reference_losses(case: ModelCase, steps: int) -> list[float]:
    model = build(case.model)
    opt = parallelize.make_optimizer(model, case.plan)
    ids, targets = global_batch(case.plan.micro_batch * case.plan.devices)
    out = []
    for _ in range(steps):
        loss = loss_of(case.model, model, ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


def unsharded_state_dict_shapes(model_kind: str) -> dict:
    return {k: list(v.shape) for k, v in build(model_kind).state_dict().items()}


def _blocks(model_kind: str, model):
    if model_kind == "torchtitan":
        return list(model.layers.values())
    return list(model.transformer.h) if model_kind == "gpt2" else list(model.model.layers)


def _train(case: ModelCase, steps: int, rank: int, world: int) -> dict:
    from osdp_sim.runtime import apply_plan

    model = build(case.model)
    layout = None
    if case.model == "torchtitan":
        import torchtitan_llama
        layout = torchtitan_llama.LAYOUT
    build_meshes = parallelize.build_meshes
    if case.broken == "size1_mesh":
        def alone(plan, device):
            mesh = parallelize._mesh(device.type, (world, 1))["shard"]   # each rank by itself
            return parallelize.Meshes(shard=mesh, replicate=mesh)
        parallelize.build_meshes = alone
    elif case.broken:
        raise ValueError(f"unknown broken mode {case.broken!r}")
    try:
        applied = apply_plan(model, case.plan, device=torch.device("cpu"), layout=layout)
    finally:
        parallelize.build_meshes = build_meshes
    model = applied.model
    counts = [[0, 0] for _ in range(LAYERS)]
    for i, block in enumerate(_blocks(case.model, model)):
        for g, name in enumerate(COUNTED[case.model]):
            def count(module, args, i=i, g=g):
                counts[i][g] += 1
            block.get_submodule(name).register_forward_pre_hook(count)
    opt = parallelize.make_optimizer(model, case.plan)
    ids, targets = global_batch(case.plan.micro_batch * world)
    mine = slice(rank * case.plan.micro_batch, (rank + 1) * case.plan.micro_batch)
    ids, targets = ids[mine], targets[mine]
    losses, counts_step0 = [], None
    for step in range(steps):
        loss = loss_of(case.model, model, ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            counts_step0 = [list(c) for c in counts]
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    sharding = parallelize.describe_sharding(model)
    state = model.state_dict()                         # a collective: split slices are gathered
    shapes = {k: list(v.shape) for k, v in state.items()}
    out = {"losses": losses, "forward_counts": counts_step0, "state_dict_shapes": shapes,
           "checkpointed_blocks": list(applied.checkpointed_blocks), **sharding}
    if case.broken:
        return out
    # Resume: the state_dict loads into a fresh model with the same plan (split modules cut the
    # full tensors and keep their own shards) and computes the same loss.
    resumed = build(case.model)
    torch.manual_seed(1)
    for p in resumed.parameters():                     # other weights: the load must replace them
        torch.nn.init.normal_(p)
    resumed = apply_plan(resumed, case.plan, device=torch.device("cpu"), layout=layout).model
    resumed.load_state_dict(state)
    with torch.no_grad():
        loss_trained = loss_of(case.model, model, ids, targets).item()
        loss_resumed = loss_of(case.model, resumed, ids, targets).item()
    return {**out, "loss_trained": loss_trained, "loss_resumed": loss_resumed}


def run(rank: int, world: int, port: int, cases: list, steps: int, out_path: str,
        fault: str = "") -> None:
    """Spawn target (the signature of osdp_sim.runtime.equivalence.run_cases)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    results = {}
    for case in cases:
        try:
            results[case.name] = _train(case, steps, rank, world)
        except Exception as exc:   # reported per case; the other cases still run
            results[case.name] = {"error": f"{type(exc).__name__}: {exc}"}
            dist.barrier()
    if rank == 0:
        with open(out_path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)
    dist.barrier()
    dist.destroy_process_group()
