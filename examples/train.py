"""Train a Hugging Face causal LM with a plan searched by osdp-sim. Copy and adapt it.

    osdp-sim search --hw HW.yaml --model CONFIG.json --mem-limit 40GiB -o plan.json
    torchrun --standalone --nproc-per-node N examples/train.py \\
        --config CONFIG.json --plan plan.json --data corpus.txt --steps 100 --save ckpt/

One process per rank (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK): NCCL on GPUs, gloo on CPU.
The model is built from a config.json (a file, or a folder holding one) with random weights
(seeded, the same on every rank), or loaded from a local `from_pretrained` folder with
--weights. The plan is applied with osdp_sim.runtime.apply_plan (sharding per group, splits,
checkpointing per block, mixed precision, hybrid sharding); one optimizer step is
plan.grad_accum micro-steps of plan.micro_batch sequences per rank.

Data: --data FILE (a text file; bytes 0-255 are the token ids unless --tokenizer gives a
tokenizers JSON file) or synthetic tokens (no --data). Every step draws one global batch of
windows from a seeded generator, the same on every rank; rank r trains on its share, so the
run's loss is the loss of single-process training on the global batch.

Logs, on rank 0: the loss of each step (mean over ranks) and tokens/s; for every rank at the end:
peak memory (CUDA: max_memory_allocated; CPU: the process's RSS high-water mark), and with
--track-memory the peak of live tensors in step 2 (MemTracker), which `osdp-sim estimate` predicts. --log-json
FILE writes the same as JSON lines. --save DIR writes a sharded checkpoint with
torch.distributed.checkpoint (model state_dict keys as the unsplit HF model has them; the
optimizer state under the parameters' names).

Run without torchrun it is one process (for plans of one device).

Failure: a bad argument or a plan that does not fit the model or the launch is a one-line
error and exit status 2 on every rank. If a rank fails
later, torchrun's agent stops all the other ranks of the run (and exits non-zero), so no child
process outlives a failure.
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from osdp_sim.errors import UserError
from osdp_sim.plan import load_plan
from osdp_sim.runtime import apply_plan
from osdp_sim.runtime.parallelize import make_optimizer
from osdp_sim.runtime.worker import rss_hwm_bytes

BYTE_VOCAB = 256


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="config.json, or a folder holding one")
    p.add_argument("--plan", required=True, help="plan file written by `osdp-sim search -o`")
    p.add_argument("--weights", help="local from_pretrained folder to load weights from")
    p.add_argument("--data", help="text file to train on (default: synthetic tokens)")
    p.add_argument("--tokenizer", help="tokenizers JSON file (default: bytes as token ids)")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the plan's)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="weights and data seed (default 0)")
    p.add_argument("--attn-implementation", default="sdpa", choices=("sdpa", "eager"),
                   help="transformers attention implementation (default sdpa)")
    p.add_argument("--track-memory", action="store_true",
                   help="run step 2 under torch's MemTracker and log each rank's peak of live "
                        "tensors, the quantity `osdp-sim estimate` predicts (slows that step)")
    p.add_argument("--log-json", help="write one JSON line per step (rank 0) and per rank's memory")
    p.add_argument("--save", help="folder for a torch.distributed.checkpoint checkpoint")
    args = p.parse_args(argv)
    for name in ("steps", "seq_len"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.lr <= 0:
        p.error(f"--lr must be positive, got {args.lr}")
    for name in ("config", "plan", "weights", "data", "tokenizer"):
        path = getattr(args, name)
        if path is not None and not Path(path).exists():
            p.error(f"--{name}: {path} does not exist")
    if args.tokenizer and not args.data:
        p.error("--tokenizer needs --data (synthetic tokens are ids already)")
    return args


# ---------------------------------------------------------------- model

def load_config(path: str):
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"cannot read a transformers config ({str(e).splitlines()[0]})",
                        source=path) from None


def build_model(config, *, weights: str | None, attn: str, seed: int):
    """The causal LM of `config`: random weights from `seed` (every rank the same), or loaded."""
    import transformers
    arch = (getattr(config, "architectures", None) or [None])[0]
    if not arch or not hasattr(transformers, arch):
        raise UserError(f"config has no known architectures entry (got {arch!r})",
                        field="architectures")
    if not (arch.endswith("ForCausalLM") or arch.endswith("LMHeadModel")):
        raise UserError(f"{arch} is not a causal LM; this example trains next-token prediction",
                        field="architectures")
    cls = getattr(transformers, arch)
    if weights:
        return cls.from_pretrained(weights, attn_implementation=attn, dtype=torch.float32)
    torch.manual_seed(seed)
    return cls._from_config(config, attn_implementation=attn, dtype=torch.float32)


# ---------------------------------------------------------------- data

def load_tokens(path: str, tokenizer: str | None) -> torch.Tensor:
    """The token ids of a text file: its bytes, or what a tokenizers JSON file makes of it."""
    if tokenizer is None:
        return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(tokenizer).encode(Path(path).read_text(errors="replace")).ids
    return torch.tensor(ids, dtype=torch.long)


class Batches:
    """One global batch of `rows` windows of seq_len tokens per step, drawn by a seeded generator
    (the same on every rank and in a single-process reference)."""

    def __init__(self, tokens: torch.Tensor | None, vocab: int, rows: int, seq_len: int, seed: int):
        if tokens is not None and len(tokens) < seq_len + 1:
            raise UserError(f"the data has {len(tokens)} tokens, fewer than one sequence "
                            f"({seq_len})", field="--data")
        if tokens is not None and int(tokens.max()) >= vocab:
            raise UserError(f"token id {int(tokens.max())} >= the model's vocab_size {vocab}",
                            field="--tokenizer")
        self.tokens, self.vocab, self.rows, self.seq_len = tokens, vocab, rows, seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> torch.Tensor:
        if self.tokens is None:
            return torch.randint(0, self.vocab, (self.rows, self.seq_len), generator=self.gen)
        starts = torch.randint(0, len(self.tokens) - self.seq_len + 1, (self.rows,), generator=self.gen)
        return torch.stack([self.tokens[s:s + self.seq_len] for s in starts.tolist()])


def micro_batches(batch: torch.Tensor, rank: int, world: int, micro_batch: int, grad_accum: int):
    """This rank's micro-batches of a global batch: micro-step m takes rows
    [(m * world + rank) * micro_batch, ...) so every row is trained once."""
    for m in range(grad_accum):
        first = (m * world + rank) * micro_batch
        yield batch[first:first + micro_batch]


# ---------------------------------------------------------------- training

def train_step(model, opt, batch, *, rank, world, applied, device,
               before_micro_step=None) -> torch.Tensor:
    total = torch.zeros((), device=device)
    for m, ids in enumerate(micro_batches(batch, rank, world, applied.micro_batch,
                                          applied.grad_accum)):
        if before_micro_step is not None:
            before_micro_step()
        last = m == applied.grad_accum - 1
        if not applied.reduce_every_microbatch:
            model.set_requires_gradient_sync(last)
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss       # HF shifts the labels itself
        (loss / applied.grad_accum).backward()
        total += loss.detach().float()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total / applied.grad_accum


def tracked_step(model, opt, batch, device, **kw) -> tuple[torch.Tensor, int]:
    """One step under MemTracker: (loss, peak bytes of live tensors on this rank's device)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        # MemTracker refuses a second forward of a module unless its per-module stats are reset;
        # the global peak survives the reset.
        loss = train_step(model, opt, batch, device=device,
                          before_micro_step=tracker.reset_mod_stats, **kw)
    snap = tracker.get_tracker_snapshot("peak")
    per_device = snap.get(device) or next(v for k, v in snap.items() if k.type == device.type)
    return loss, int(per_device.get("Total", 0))


def peak_memory(device) -> tuple[int | None, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda max_memory_allocated"
    return rss_hwm_bytes(), "RSS high-water mark"


def save_checkpoint(path: str, model, opt) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    # model.state_dict(), not get_model_state_dict: split modules save their slices under the
    # unsplit module's keys, which get_model_state_dict would look up as attributes.
    state = {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}
    dcp.save(state, checkpoint_id=path)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    # Without torchrun: one process (plans for one device).
    init = "env://" if "RANK" in os.environ else f"tcp://127.0.0.1:{_free_port()}"
    kw = dict(init_method=init, rank=rank, world_size=world, timeout=timedelta(minutes=10))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **kw)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, world)))
        dist.init_process_group("gloo", **kw)
    try:
        code = run(args, rank, world, device)
        dist.barrier()           # no rank tears its gloo connections down while a peer still sends
        return code
    except UserError as e:
        print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        dist.destroy_process_group()


def run(args, rank: int, world: int, device: torch.device) -> int:
    plan = load_plan(args.plan)
    config = load_config(args.config)
    seq_len = args.seq_len or plan.model.seq_len
    max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if max_pos and seq_len > max_pos:
        raise UserError(f"{seq_len} tokens per sequence > the model's {max_pos} positions",
                        field="--seq-len")
    vocab = config.vocab_size
    tokens = load_tokens(args.data, args.tokenizer) if args.data else None
    if args.data and not args.tokenizer and vocab < BYTE_VOCAB:
        raise UserError(f"byte-level tokens need vocab_size >= {BYTE_VOCAB}, the model has "
                        f"{vocab}; give --tokenizer", field="--data")
    model = build_model(config, weights=args.weights, attn=args.attn_implementation, seed=args.seed)
    model.train()
    applied = apply_plan(model, plan, device=device)
    model = applied.model
    opt = make_optimizer(model, plan, lr=args.lr)
    batches = Batches(tokens, vocab, applied.global_batch, seq_len, args.seed + 1)
    log = open(args.log_json, "a") if args.log_json and rank == 0 else None
    if rank == 0:
        print(f"plan {args.plan}: {world} ranks, micro-batch {applied.micro_batch} x "
              f"{applied.grad_accum} accumulation, global batch {applied.global_batch} x "
              f"{seq_len} tokens, {plan.precision}, checkpointed blocks "
              f"{list(applied.checkpointed_blocks)}", flush=True)
        for note in applied.notes:
            print(f"note: {note}", flush=True)
    tracked = None
    for step in range(args.steps):
        batch = batches.next()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        kw = dict(rank=rank, world=world, applied=applied)
        if args.track_memory and step == min(1, args.steps - 1):
            loss, tracked = tracked_step(model, opt, batch, device, **kw)
        else:
            loss = train_step(model, opt, batch, device=device, **kw)
        dist.all_reduce(loss)
        loss = loss.item() / world              # .item() waits for the step on GPU
        seconds = time.perf_counter() - start
        tokens_per_s = batch.numel() / seconds
        if rank == 0:
            print(f"step {step + 1}/{args.steps} loss {loss:.6f} {tokens_per_s:,.0f} tokens/s",
                  flush=True)
            if log:
                log.write(json.dumps({"step": step + 1, "loss": loss, "seconds": seconds,
                                      "tokens_per_s": tokens_per_s}) + "\n")
                log.flush()
    peak, what = peak_memory(device)
    peaks = [None] * world
    dist.all_gather_object(peaks, (peak, tracked))
    if rank == 0:
        for r, (b, t) in enumerate(peaks):
            shown = f"{b / 2**20:.1f} MiB" if b is not None else "unknown"
            extra = f", live tensors {t / 2**20:.2f} MiB (MemTracker)" if t is not None else ""
            print(f"rank {r}: peak memory {shown} ({what}){extra}", flush=True)
            if log:
                log.write(json.dumps({"rank": r, "peak_memory_bytes": b, "memory": what,
                                      "tracked_peak_bytes": t}) + "\n")
    if args.save:
        save_checkpoint(args.save, model, opt)
        if rank == 0:
            print(f"checkpoint saved to {args.save}", flush=True)
    if log:
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
