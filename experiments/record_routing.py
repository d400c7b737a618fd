"""Record the routing of the suite's own trained gate as a trace the dispatcher study can replay.

    python -m experiments record_routing --config configs/default.yaml moe.num_experts=16 moe.experts_per_rank=4 \\
        --name markov-e16-top2 --train-steps 200 --batch 32

Trains the model of the config on its Markov data for ``--train-steps`` steps on one process, keeps
every MoE layer's top-k choices for one unseen batch of ``--batch`` sequences, and writes them to
``--out`` (default: results/reference/routing_traces/<name>.npz, where ``trace:<name>`` finds them;
moe_core.dispatch.routing_trace). It then prints the imbalance factor (max tokens per expert / mean)
and the Gini coefficient of every layer's per-expert load, for the data's tokens and for mock tokens
(uniformly random ids through the same model, as benchmark harnesses feed it; DODOCO, arXiv
2605.20982, finds that mock tokens misstate the skew), beside the synthetic skews at the same
experts, top-k and tokens. Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from moe_core.config.load import ConfigError, load_config
from moe_core.dispatch import routing_trace
from moe_core.dispatch.workloads import routing, routing_counts
from moe_core.dispatch_study import imbalance
from moe_core.records.console import table

SYNTHETIC = ("uniform", "zipf:1.0", "lognormal:1.0", "hot_expert_set")  # the study's skews to compare with


def skew_rows(trace: routing_trace.RoutingTrace, label: str) -> list[dict]:
    """Per layer of ``trace``: its imbalance factor and Gini over the experts."""
    rows = []
    for layer in range(trace.layers):
        loads = np.bincount(trace.choices[layer].ravel(), minlength=trace.experts)
        rows.append(
            {
                "routing": f"{label}, layer {layer}",
                "imbalance": imbalance(loads[None]),
                "gini": routing_trace.gini(loads),
            }
        )
    return rows


def synthetic_rows(trace: routing_trace.RoutingTrace, seed: int) -> list[dict]:
    """The synthetic skews at the trace's experts, top-k and tokens (on one rank)."""
    tokens = trace.choices.shape[1]
    rows = []
    for skew in SYNTHETIC:
        routes = routing(
            skew, seed=seed, step=0, tokens_per_rank=tokens, experts=trace.experts, ranks=1, top_k=trace.top_k
        )
        counts = routing_counts(routes, trace.experts)
        rows.append({"routing": skew, "imbalance": imbalance(counts), "gini": routing_trace.gini(counts.sum(axis=0))})
    return rows


def run(args: argparse.Namespace) -> int:
    """Record, save and compare the trace of ``args`` (experiments.record_routing's command line); exit
    code 2, writing nothing, on a bad config or trace name."""
    if not routing_trace.SAFE_TRACE_NAME.fullmatch(args.name):
        print(
            f"error: --name {args.name!r}: use letters, digits, '-' and '_' (it becomes a point name)", file=sys.stderr
        )
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    trace = routing_trace.record(cfg, args.train_steps, args.batch)
    mock = routing_trace.record(cfg, args.train_steps, args.batch, mock_tokens=True)
    out = args.out or routing_trace.TRACES_DIR / f"{args.name}.npz"
    routing_trace.save(trace, out)
    layers, tokens, top_k = trace.choices.shape
    print(f"wrote {out}: {layers} MoE layers x {tokens} tokens x top-{top_k} of {trace.experts} experts")
    rows = skew_rows(trace, "recorded") + skew_rows(mock, "mock tokens") + synthetic_rows(trace, cfg.train.seed)
    print(table(rows))
    return 0
