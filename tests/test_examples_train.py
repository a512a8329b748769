"""examples/train.py under torchrun on 2 gloo ranks: a tiny HF Llama from a config.json, a plan
file with splits, checkpointing, mixed strategies and gradient accumulation (reduced once per
step), a local text file through the byte-level tokenizer. Its logged losses must match
single-process training on the global batch (fp32), and its checkpoint must hold the unsplit
model's state_dict keys and the trained weights. Step 2 runs under MemTracker (--track-memory) and must train the same."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from osdp_sim.plan import save_plan  # noqa: E402
from osdp_sim.plan.plan import GroupChoice  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train.py"
STEPS = 3
FP32_RTOL = 1e-4


def _train_module():
    spec = importlib.util.spec_from_file_location("example_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests"))
    import apply_equivalence as eq
    tmp = tmp_path_factory.mktemp("train")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=16, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2, architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(tmp / "model")
    plan = eq.make_plan({"root": GroupChoice("zero2"), "block0.mlp": GroupChoice("ddp", 4, 1),
                         "block1.attn": GroupChoice("zero2", 2, 1)},
                        checkpoint=(True, False), grad_accum=2, reduce_every_microbatch=False)
    save_plan(plan, tmp / "plan.json")
    (tmp / "corpus.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40)
    return tmp


def _run(cmd, timeout_s: float) -> subprocess.CompletedProcess:
    """subprocess.run in its own process group, all of it killed at the timeout: torchrun's ranks
    must not outlive a hung launch."""
    import signal
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_torchrun_losses_match_single_process(setup):
    tmp = setup
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPT), "--config", str(tmp / "model" / "config.json"), "--plan",
           str(tmp / "plan.json"), "--data", str(tmp / "corpus.txt"), "--steps", str(STEPS),
           "--log-json", str(tmp / "log.jsonl"), "--save", str(tmp / "ckpt"), "--track-memory"]
    run = _run(cmd, 240)
    if run.returncode != 0 and "exitcode: -6" in run.stderr:
        # gloo's TCP transport can abort a rank outright (std::terminate, SIGABRT) when a
        # connection drops; as runtime/equivalence.py does, one fresh start, never more.
        run = _run(cmd, 240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "checkpointed blocks [0]" in run.stdout
    records = [json.loads(line) for line in (tmp / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "step" in r]
    memory = [r for r in records if "rank" in r]
    assert [m["rank"] for m in memory] == [0, 1] and all(m["peak_memory_bytes"] > 0 for m in memory)
    assert all(0 < m["tracked_peak_bytes"] < m["peak_memory_bytes"] for m in memory)
    assert all(r["tokens_per_s"] > 0 for r in records if "step" in r)

    # The reference: one process, the whole global batch (8 windows) per step, same draws.
    train = _train_module()
    config = train.load_config(str(tmp / "model"))
    model = train.build_model(config, weights=None, attn="sdpa", seed=0)
    from osdp_sim.plan import load_plan
    from osdp_sim.runtime.parallelize import make_optimizer
    plan = load_plan(tmp / "plan.json")
    opt = make_optimizer(model, plan, lr=1e-3)
    batches = train.Batches(train.load_tokens(str(tmp / "corpus.txt"), None), 256,
                            plan.global_batch, plan.model.seq_len, seed=1)
    want = []
    for _ in range(STEPS):
        ids = batches.next()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        want.append(loss.item())
    assert losses == pytest.approx(want, rel=FP32_RTOL)
    assert all(b < a - 1e-3 for a, b in zip(losses, losses[1:])), losses

    # The sharded checkpoint holds the unsplit model's keys (splits save under their old names).
    from torch.distributed.checkpoint import FileSystemReader
    saved = FileSystemReader(str(tmp / "ckpt")).read_metadata().state_dict_metadata
    model_keys = {k[len("model."):] for k in saved if k.startswith("model.")}
    assert model_keys == set(model.state_dict())
    shapes = {k[len("model."):]: tuple(v.size) for k, v in saved.items() if k.startswith("model.")}
    assert shapes == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # ...and it holds the trained weights: loaded into a plain (unsharded, unsplit) model in this
    # process, they equal the reference's after the same steps (to 1e-4: AdamW's first steps
    # move every weight by about lr = 1e-3 whatever its gradient, so rounding in a near-zero
    # gradient shows at that scale; an untrained or wrong weight is off by 1e-3 to 1e-2).
    import torch.distributed.checkpoint as dcp
    fresh = train.build_model(config, weights=None, attn="sdpa", seed=9)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp / "ckpt"))
    trained = model.state_dict()
    for key, value in state["model"].items():
        torch.testing.assert_close(value, trained[key], rtol=1e-4, atol=1e-4, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be positive, got 0"),
    (["--data", "/nonexistent.txt"], "--data: /nonexistent.txt does not exist"),
    # After the process group is up (one process without torchrun): the plan is for 2.
    ([], "devices: the plan is for 2 devices but 1 processes are running; launch 2"),
    (["--seq-len", "64"], "--seq-len: 64 tokens per sequence > the model's 16 positions"),
])
def test_bad_arguments_are_one_line_errors(setup, args, message):
    tmp = setup
    cmd = [sys.executable, str(SCRIPT), "--config", str(tmp / "model"), "--plan",
           str(tmp / "plan.json"), *args]
    run = _run(cmd, 60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].endswith(message), run.stderr


def test_batches_split_the_global_batch_across_ranks_and_micro_steps():
    train = _train_module()
    batch = torch.arange(8).unsqueeze(1)
    rows = sorted(int(x) for r in range(2)
                  for mb in train.micro_batches(batch, r, 2, 2, 2) for x in mb[:, 0])
    assert rows == list(range(8))
    synthetic = train.Batches(None, 256, 4, 16, seed=3)
    assert synthetic.next().shape == (4, 16)


def test_weights_load_from_a_local_folder_and_non_causal_models_are_refused(setup, tmp_path):
    train = _train_module()
    config = train.load_config(str(setup / "model" / "config.json"))
    saved = train.build_model(config, weights=None, attn="sdpa", seed=5)
    saved.save_pretrained(tmp_path / "weights")
    loaded = train.build_model(config, weights=str(tmp_path / "weights"), attn="sdpa", seed=0)
    for key, value in saved.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    bert = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, vocab_size=64,
                                   architectures=["BertForMaskedLM"])
    from osdp_sim.errors import UserError
    with pytest.raises(UserError, match="BertForMaskedLM is not a causal LM"):
        train.build_model(bert, weights=None, attn="sdpa", seed=0)
