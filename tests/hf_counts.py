"""Parameter counts of the published configs under tests/data/hf as transformers builds them
(meta device, unique parameters as model.parameters() yields them). Run as a script to rewrite
tests/data/hf/param_counts.json: python tests/hf_counts.py"""

import json
from pathlib import Path

HF_DIR = Path(__file__).parent / "data" / "hf"
COUNTS = HF_DIR / "param_counts.json"


def transformers_param_count(folder: Path) -> int:
    import torch
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(str(folder))
    auto = (transformers.AutoModelForMaskedLM if "ForMaskedLM" in cfg.architectures[0]
            else transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = auto.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    import transformers
    counts = {"transformers": transformers.__version__,
              "counts": {d.name: transformers_param_count(d) for d in sorted(HF_DIR.iterdir())
                         if (d / "config.json").is_file()}}
    COUNTS.write_text(json.dumps(counts, indent=1) + "\n")
    print(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main()
