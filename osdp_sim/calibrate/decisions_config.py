"""The case file of the decisions campaign (validate/campaigns/decisions-cpu.yaml) and the
profiles it names, a git revision's file included."""

import hashlib
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from osdp_sim.errors import UserError
from osdp_sim.fileio import read_yaml

DEFAULT_RUN_S = 30.0
"""Seconds one run is assumed to take when the case file's run_seconds does not name its model."""

_TOP = {"name", "description", "out_dir", "run_hardware", "profiles", "repeats", "warmup", "iters",
        "threads", "top_n", "tune", "time_limit_s", "run_timeout_s", "search_time_limit_s",
        "precision", "run_seconds", "cases", "baselines", "confirm", "paired"}
BASELINES = ("ddp", "zero2", "zero3", "ddp_per_block", "zero2_per_block", "zero3_per_block")
"""Uniform strategies with checkpointing all or none (each at its best setting), and with per-block
checkpointing (planner/baselines.py)."""

_CASE = {"name", "model", "mem_limit", "micro_batches", "ranks", "seq_len"}


# ---------------------------------------------------------------- the case file

@dataclass(frozen=True)
class DecisionCase:
    """One (model, memory limit) decision."""

    name: str
    """Folder and table name of the case (letters, digits, '-', '_', '.')."""
    model: str
    """As --model takes it: a built-in name, a model YAML or a config.json folder."""
    mem_limit_bytes: float
    """Peak memory limit per device."""
    micro_batches: tuple[int, ...]
    """The search space's micro-batches (--micro-batch)."""
    ranks: int = 2
    """Ranks (devices) of every plan and run."""
    seq_len: int | None = None
    """Sequence length override (None: the model's)."""


@dataclass(frozen=True)
class DecisionsConfig:
    """A parsed decisions case file (validate/campaigns/decisions-cpu.yaml documents the keys)."""

    name: str
    source: str
    out_dir: Path
    """Records under out_dir/records/<model>/n<ranks>/, each case's reference.json under out_dir/<case>/."""
    run_hardware: str
    """The profile `osdp-sim validate` gets (only its prediction in the record depends on it)."""
    profiles: dict[str, str]
    """Profile name (e.g. before, after) -> a profile file, a shipped name, or REV:PATH (git show)."""
    cases: tuple[DecisionCase, ...]
    repeats: int = 3
    warmup: int = 2
    iters: int = 6
    threads: int | None = 1
    top_n: int = 6
    """The search's top-N distinct plans per profile go into the reference set."""
    tune_candidates: int = 3
    """tune --candidates K of the tune pick."""
    tune_baselines: int = 2
    """tune --baselines B of the tune pick."""
    tune_near: int = 0
    """tune --near N of the tune pick: the search's next N distinct plans (at most top_n - 1: the
    set's top-N holds them)."""
    time_limit_s: float = 2400.0
    run_timeout_s: float = 300.0
    search_time_limit_s: float = 30.0
    """Per search call (the top-N search, each baseline, the tune's choice)."""
    precision: str = "bf16"
    run_seconds: dict[str, float] = field(default_factory=dict)
    """Model -> measured wall seconds of one run, for the estimate printed before running."""
    baselines: tuple[str, ...] = BASELINES
    """The baselines in the reference set (default every one; a smaller set for quick checks)."""
    confirm_repeats: int = 0
    """Extra repeats of each case's contenders after the first `repeats` (0: no confirmation)."""
    confirm_within: float = 0.08
    """Contenders: plans whose first-round median is within this fraction of the case's best, each
    profile's search pick, and each profile's tune candidates within it of the best of them."""
    paired_rounds: int = 0
    """Rounds of the paired comparison of each case's deciding plans after the confirmation
    (calibrate/decisions_paired.py; 0: no paired round)."""
    paired_within: float = 0.05
    """Besides the picks, the fastest baseline and the best: the plans whose confirmed median is
    within this fraction of the best join the comparison."""
    paired_max_plans: int = 6
    """At most this many plans per comparison (the picks, baseline and best always)."""


def load_config(path: str) -> DecisionsConfig:
    data = read_yaml(path, "decisions case file")

    def fail(fld, msg):
        raise UserError(msg, source=str(path), field=fld)

    if not isinstance(data, dict):
        fail(None, "expected a mapping with keys name, out_dir, run_hardware, profiles, cases")
    for k in data:
        if k not in _TOP:
            fail(k, f"unknown key; expected some of {', '.join(sorted(_TOP))}")
    for k in ("name", "out_dir", "run_hardware", "profiles", "cases"):
        if k not in data:
            fail(k, "missing required key")
    profiles = data["profiles"]
    if not isinstance(profiles, dict) or not profiles or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in profiles.items()):
        fail("profiles", "expected a mapping name -> profile file, shipped name or REV:PATH, "
                         "e.g. {before: 'HEAD:hwprofiles/cpu-2core-calibrated.yaml'}")
    confirm = data.get("confirm") or {}
    if not isinstance(confirm, dict) or set(confirm) - {"repeats", "within"}:
        fail("confirm", "expected {repeats: N, within: FRACTION}")
    within = confirm.get("within", 0.08)
    if isinstance(within, bool) or not isinstance(within, (int, float)) or not 0 < within < 1:
        fail("confirm.within", f"expected a fraction between 0 and 1, got {within!r}")
    paired = data.get("paired") or {}
    if not isinstance(paired, dict) or set(paired) - {"rounds", "within", "max_plans"}:
        fail("paired", "expected {rounds: N, within: FRACTION, max_plans: M}")
    paired_within = paired.get("within", 0.05)
    if isinstance(paired_within, bool) or not isinstance(paired_within, (int, float)) or not 0 <= paired_within < 1:
        fail("paired.within", f"expected a fraction between 0 and 1, got {paired_within!r}")
    tune = data.get("tune") or {}
    if not isinstance(tune, dict) or set(tune) - {"candidates", "baselines", "near"}:
        fail("tune", "expected {candidates: K, baselines: B, near: N}")
    from osdp_sim.units import parse_bytes
    cases, names = [], set()
    if not isinstance(data["cases"], list) or not data["cases"]:
        fail("cases", "expected a non-empty list of {name, model, mem_limit, micro_batches}")
    for i, c in enumerate(data["cases"]):
        f = f"cases[{i}]"
        if not isinstance(c, dict):
            fail(f, "expected a mapping {name, model, mem_limit, micro_batches, ranks}")
        for k in c:
            if k not in _CASE:
                fail(f"{f}.{k}", f"unknown key; expected some of {', '.join(sorted(_CASE))}")
        for k in ("name", "model", "mem_limit", "micro_batches"):
            if k not in c:
                fail(f"{f}.{k}", "missing required key")
        name = c["name"]
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in names:
            fail(f"{f}.name", f"expected a new name of letters, digits, '-', '_', '.', got {name!r}")
        names.add(name)
        mbs = c["micro_batches"]
        if not isinstance(mbs, list) or not mbs or not all(_whole(m, 1) for m in mbs):
            fail(f"{f}.micro_batches", f"expected a non-empty list of positive whole numbers, got {mbs!r}")
        ranks = c.get("ranks", 2)
        if not _whole(ranks, 1):
            fail(f"{f}.ranks", f"expected a positive whole number, got {ranks!r}")
        seq = c.get("seq_len")
        if seq is not None and not _whole(seq, 1):
            fail(f"{f}.seq_len", f"expected a positive whole number, got {seq!r}")
        if not isinstance(c["mem_limit"], str):
            fail(f"{f}.mem_limit", f"expected a size such as 260MiB, got {c['mem_limit']!r}")
        limit = parse_bytes(c["mem_limit"], field=f"{f}.mem_limit")
        cases.append(DecisionCase(name, str(c["model"]), limit, tuple(sorted(mbs)), ranks, seq))

    def count(key, default, lo=1, src=data, where=""):
        v = src.get(key, default)
        if v is None and key == "threads":
            return None
        if not _whole(v, lo):
            fail(where + key, f"expected a whole number >= {lo}, got {v!r}")
        return v

    def seconds(key, default):
        v = data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e7:
            fail(key, f"expected a positive number of seconds, got {v!r}")
        return float(v)

    run_s = data.get("run_seconds") or {}
    if not isinstance(run_s, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                              and v > 0 for v in run_s.values()):
        fail("run_seconds", "expected a mapping model -> seconds of one run")
    bases = data.get("baselines", list(BASELINES))
    if not isinstance(bases, list) or not bases or any(b not in BASELINES for b in bases):
        fail("baselines", f"expected a non-empty list of {', '.join(BASELINES)}, got {bases!r}")
    near, top_n = tune.get("near", 0), data.get("top_n", 6)
    if _whole(near, 0) and _whole(top_n, 1) and near > top_n - 1:
        fail("tune.near", f"the tune's {near} near-ties must be among the set's top {top_n} (near <= top_n - 1)")
    precision = data.get("precision", "bf16")
    if precision not in ("fp32", "bf16"):
        fail("precision", f"expected fp32 or bf16, got {precision!r}")
    return DecisionsConfig(
        name=str(data["name"]), source=str(path), out_dir=Path(str(data["out_dir"])),
        run_hardware=str(data["run_hardware"]), profiles=dict(profiles), cases=tuple(cases),
        repeats=count("repeats", 3), warmup=count("warmup", 2, lo=0), iters=count("iters", 6),
        threads=count("threads", 1), top_n=count("top_n", 6),
        tune_candidates=count("candidates", 3, src=tune, where="tune."),
        tune_baselines=count("baselines", 2, lo=0, src=tune, where="tune."),
        tune_near=count("near", 0, lo=0, src=tune, where="tune."),
        time_limit_s=seconds("time_limit_s", 2400), run_timeout_s=seconds("run_timeout_s", 300),
        search_time_limit_s=seconds("search_time_limit_s", 30), precision=precision,
        run_seconds={str(k): float(v) for k, v in run_s.items()}, baselines=tuple(bases),
        confirm_repeats=count("repeats", 0, lo=0, src=confirm, where="confirm."), confirm_within=float(within),
        paired_rounds=count("rounds", 0, lo=0, src=paired, where="paired."), paired_within=float(paired_within),
        paired_max_plans=count("max_plans", 6, lo=2, src=paired, where="paired."))


def _whole(v, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= 2**31 - 1


def load_profile_ref(ref: str, *, source: str = "<decisions>", field: str = "profiles"):
    """A profile from a file, a shipped name, or REV:PATH: the file as committed at git revision
    REV (`git show REV:PATH`), so a profile that has been overwritten since is still the one used.
    Returns (profile, sha256 of its text)."""
    from osdp_sim.hardware.load import load_profile, resolve_profile_path
    if ":" in ref and not Path(ref).exists():
        rev, path = ref.split(":", 1)
        try:
            text = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True,
                                  check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            msg = getattr(e, "stderr", "") or str(e)
            raise UserError(f"git show {ref} failed: {msg.strip().splitlines()[-1] if msg.strip() else e}",
                            source=source, field=field) from None
        with tempfile.TemporaryDirectory(prefix="osdp-sim-decisions-") as tmp:
            p = Path(tmp) / Path(path).name
            p.write_text(text)
            hw = load_profile(p)
        return hw, hashlib.sha256(text.encode()).hexdigest()
    try:
        path = resolve_profile_path(ref)
    except UserError as e:
        raise UserError(str(e).split(": ", 1)[-1], source=source, field=field) from None
    return load_profile(path), hashlib.sha256(Path(path).read_bytes()).hexdigest()
