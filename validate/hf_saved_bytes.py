"""Bytes transformers saves for backward vs the description, per group, on the cpu-hf tiny configs
(bf16, micro-batch 2): the listing docs/accuracy-hf.md quotes. python validate/hf_saved_bytes.py"""

import torch, transformers
from osdp_sim.model import load_model
from osdp_sim.runtime.hf_measure import measure_hf
B = 2
for m in ("llama", "qwen2", "gemma", "mixtral"):
    path = f"validate/models/{m}-tiny-hf"
    cfg = transformers.AutoConfig.from_pretrained(path)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(torch.bfloat16).train()
    spec = load_model(path, notes=[])
    S = spec.config.seq_len
    idx = torch.randint(0, cfg.vocab_size, (B, S))
    hf = measure_hf(model, idx)["saved_bytes"]
    ours = {g.name: g.activations.bytes_per_token(2) * B * S for g in spec.groups}
    th, to = sum(hf.values()), sum(ours.values())
    blk = [g for g in ours if g.startswith("block0.")]
    print(f"{m}: saved for backward, bf16, mb{B} x {S}: transformers {th/2**20:.2f} MiB, description {to/2**20:.2f} MiB ({th/to-1:+.1%}); "
          + ", ".join(f"{g} {hf.get(g,0)/2**20:.3f} vs {ours[g]/2**20:.3f}" for g in blk + ["head"] if g in ours))
