"""Bytes transformers saves for backward against the description, per run of the cpu-hf tiny
configs (bf16, micro-batch 2, saved-tensor hooks: runtime/hf_measure.py), with the description of
transformers' implementation (implementation hf) and of the built-in modules (osdp): the listing
docs/accuracy-hf.md quotes.

    python validate/hf_saved_bytes.py
"""

import torch
import transformers

from osdp_sim.model.config import for_implementation
from osdp_sim.model.load import load_model_config
from osdp_sim.model.spec import build_spec
from osdp_sim.runtime.hf_measure import measure_hf

B = 2
MiB = 2**20


def main() -> None:
    for m in ("llama", "qwen2", "gemma", "mixtral"):
        path = f"validate/models/{m}-tiny-hf"
        cfg = load_model_config(path, notes=[])
        hf_cfg = transformers.AutoConfig.from_pretrained(path)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            hf_cfg, attn_implementation="sdpa").to(torch.bfloat16).train()
        idx = torch.randint(0, hf_cfg.vocab_size, (B, cfg.seq_len))
        saved = sum(measure_hf(model, idx)["saved_bytes"].values())
        desc = {impl: sum(g.activations.bytes_per_token(2) for g in build_spec(for_implementation(cfg, impl)).groups)
                * B * cfg.seq_len for impl in ("hf", "osdp")}
        print(f"{m}: saved for backward, bf16, mb{B} x {cfg.seq_len}: transformers {saved / MiB:.2f} MiB; "
              f"description hf {desc['hf'] / MiB:.2f} MiB ({saved / desc['hf'] - 1:+.1%}), "
              f"osdp {desc['osdp'] / MiB:.2f} MiB ({saved / desc['osdp'] - 1:+.1%})")


if __name__ == "__main__":
    main()
