"""The outer loop's tuning constants (bnb.py): how much work each phase of search() spends before
the next. None of them affects what is proven, only how soon; search() takes them as one value
(default bnb.TUNING). Where a value was measured, the field says where (docs/search.md, "The
algorithm"; docs/benchmarks.md, "Search")."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchTuning:
    """Work per phase of search(); frozen, so one value is shared by every call."""

    uniform_configs: int = 6
    """Configurations, best bound first, whose uniform plans (one choice everywhere) seed the
    incumbent: cheap plans (one path each) that make the first bound comparisons meaningful."""

    uniform_time_fraction: float = 0.1
    """Share of the time limit those uniform plans may take at most."""

    unsplit_time_fraction: float = 0.5
    """Share of the time left that the nested search without splits may take (its optimum is a
    plan of the split space, usually within 1% of its optimum: a strong incumbent early)."""

    beam_configs: int = 3
    """Configurations, best bound first, that get a beam run with the relaxed bounds in each
    round, before any probe: an incumbent of the best configurations early, at a beam each."""

    beam: int = 64
    """Labels kept per decision by a beam run on models up to about beam_labels / beam (100)
    decisions. Wider finds better incumbents, linearly slower; 64 on the 48-layer models
    (docs/search.md, "The algorithm", step 2: the beam on mingpt-48l-1536's key graph finds
    23.905 samples/s against the optimum 23.908)."""

    beam_labels: int = 6400
    """Beam width times decisions, the cap on longer models (a beam over 2,000 decisions is 3-4
    wide): a 64-wide beam over the 1000-layer synthetic did not finish within a 120 s limit, a
    4-wide one finds a plan within 0.0023% of its bound (docs/benchmarks.md, Search, the
    synthetic row)."""

    min_beam: int = 4
    """The narrowest beam, however long the model."""

    probe_nodes: int = 500_000
    """Labels the probe (the exact search with the relaxed bounds) may create before the
    configuration's key graph is built instead. A count, so the outcome does not depend on the
    machine's speed. Larger finishes more configurations without a graph, smaller builds graphs
    sooner; every configuration of the unsplit 48-layer models finishes within it
    (docs/search.md, step 1)."""

    refine_depth: int = 2
    """Decisions expanded exactly for a configuration's bound (Engine.frontier_bound): the last
    block. On mingpt-48l-1536 at micro-batch 7 it takes the bound from 26.86 to 24.99 samples/s;
    deeper gains little (24.96 after two blocks, 24.93 after four) at a steep cost
    (docs/search.md, "The algorithm")."""

    retry_caps_factor: int = 10
    """A configuration left for its exact search with the merged key graph or none gets the
    real-key graph once more with caps this many times larger: the relaxed bounds alone may not
    end on communication-bound chains, and the merged graph prunes memory less (mingpt-48l-2048
    at micro-batch 4: 44 M labels over its merged graph, 2.7 M over the real one;
    docs/search.md, step 5)."""

    retry_time_fraction: float = 0.5
    """Under a time limit, the share of the time left that this second graph may take; past it
    the configuration is searched with the graph it has."""

    first_round_micro_batches: int = 64
    """A space with at most this many micro-batches is listed at once; beyond, the first round
    lists the powers of two and the round_micro_batches of best bound (gpt2-tiny at 11 GiB on
    cpu-2core: a few dozen listed, proven in about 2 s, where listing all 3,249 configurations
    took 35 s; docs/search.md, "The algorithm")."""

    round_micro_batches: int = 16
    """Micro-batches listed by the second round, best bound first; each later round doubles it."""
