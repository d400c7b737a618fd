"""Every entry point of ``python -m experiments NAME``, one line each: what its command line is.

An entry point is one module, ``experiments/<name>.py``: its docstring (what it does, how to run it,
what it writes; the first paragraph is its ``--help``'s description) and ``run(args)``, the work
(``run(args, world_size_key)`` for one that runs under torchrun). Its line here holds what the
runner (experiments/__main__.py) needs before importing that module: the config keys it reads, its
world size's config key, and its own options with their checks. So ``--help`` and a bad option
answer before torch, scipy or pandas are imported, and the launcher (experiments.launch) finds the
world size's key without importing the work. This module imports nothing of moe_core but the
config command line at the top; an option whose limits come from moe_core imports them when its
parser is built.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The widest hidden size advise may ask about: a hundred times the widest of today's MoE models
# (DeepSeek-V3's 7168); beyond, row bytes overflow the model's arithmetic.
MAX_D_MODEL = 2**20
# Published capacity factors are 1 to 2; past this one a capacity path only pads (and its bytes overflow).
MAX_CAPACITY_FACTOR = 100.0
# The option values of a size table of the work (gpu_check.SIZES, op_sweep.SWEEPS; a test keeps them equal).
GPU_CHECK_SIZES = ("cpu", "full", "quick")
OP_SWEEP_SIZES = ("default", "h200", "quick")
OP_SWEEP_DTYPES = ("float32", "bfloat16")  # torch dtypes of the measured ops

Options = Callable[[argparse.ArgumentParser], None]
Check = Callable[[argparse.ArgumentParser, argparse.Namespace], None]


@dataclass(frozen=True)
class EntryPoint:
    """One entry point's command line.

    ``config_keys``: the config sections and keys it reads (named by ``--help``), for one whose
    command line is the config's (``[--config FILE]... [key=value]...``, moe_core.config.cli); None
    for one with a command line of its own. ``world_size_key``: the config key of its world size,
    for one that runs under torchrun (the launcher checks ``--nproc`` against it, and ``run``
    passes it to moe_core.runtime.distributed). ``options`` adds its own options to the parser;
    ``check`` refuses a bad combination of them (``parser.error``: the message, exit 2).
    """

    name: str
    config_keys: tuple[str, ...] | None = None
    world_size_key: str | None = None
    options: Options | None = None
    check: Check | None = None


# -- advise ---------------------------------------------------------------------------------------


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}], got {value}")
        return value

    return parse


def capacity_factor(text: str) -> float:
    """An argparse type: a finite capacity factor in (0, MAX_CAPACITY_FACTOR]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= MAX_CAPACITY_FACTOR:  # also nan and inf
        raise argparse.ArgumentTypeError(f"must be a number in (0, {MAX_CAPACITY_FACTOR:g}], got {text}")
    return value


def ranks(text: str) -> int:
    """An argparse type: expert-parallel ranks within the bound every run has (moe_core.schema.run_checks)."""
    from moe_core.schema.run_checks import too_many_ranks

    value = bounded_int(1, sys.maxsize)(text)
    why = too_many_ranks(value)
    if why:
        raise argparse.ArgumentTypeError(f"{why}; ask about fewer")
    return value


# advise --shape: tokens per rank of a decoding step (DeepEP's low-latency benchmark, 128) and of a
# prefill or training step (its normal kernels' and DeepSeek-V3's pretraining batch, 4,096)
ADVISE_SHAPES = {"decode": 128, "prefill": 4096}


def advise_options(parser: argparse.ArgumentParser) -> None:
    from moe_core.model.capacity import DTYPE_BYTES
    from moe_core.schema.sections import MAX_SEED

    counts = bounded_int(1, 2**31 - 1)
    parser.add_argument("--hardware", required=True, help="a profile of configs/hardware/ or a YAML file")
    parser.add_argument("--ranks", type=ranks, required=True, help="expert-parallel ranks (GPUs) of the layer")
    parser.add_argument("--experts", type=counts, required=True, help="experts, a multiple of --ranks")
    parser.add_argument("--top-k", type=counts, default=2, help="experts per token (default 2)")
    parser.add_argument("--tokens", type=counts, help="tokens per rank and step (or --shape)")
    parser.add_argument(
        "--shape",
        choices=sorted(ADVISE_SHAPES),
        help="tokens per rank of a serving or training step, when --tokens is not given: "
        + ", ".join(f"{name} {tokens}" for name, tokens in ADVISE_SHAPES.items()),
    )
    parser.add_argument("--d-model", type=bounded_int(1, MAX_D_MODEL), required=True, help="hidden size of a token")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16", help="on the wire")
    parser.add_argument("--workload", default="uniform", help="routing workload (default uniform)")
    parser.add_argument(
        "--capacity-factor", type=capacity_factor, default=1.25, help="of the capacity paths (default 1.25)"
    )
    parser.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0, help="of the routing draw")
    parser.add_argument("--json", action="store_true", help="print one JSON object for scripts")


def advise_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The layer's shape whole, its routing draw within this host's memory, its workload routable."""
    from moe_core.schema.run_checks import host_memory_bytes

    if args.tokens is None and args.shape is None:
        parser.error("give --tokens N or --shape decode|prefill (the tokens per rank of one step)")
    if args.tokens is None:
        args.tokens = ADVISE_SHAPES[args.shape]
    if args.experts % args.ranks:
        parser.error(f"--experts {args.experts} must be a multiple of --ranks {args.ranks} (whole experts per rank)")
    if args.top_k > args.experts:
        parser.error(f"--top-k {args.top_k} exceeds --experts {args.experts}")
    draw = routing_bytes(args)
    if draw > host_memory_bytes():
        parser.error(
            f"--tokens {args.tokens}: the routing draw of {args.ranks} ranks x {args.experts} experts takes about "
            f"{draw / 2**30:.0f} GiB, over this host's {host_memory_bytes() / 2**30:.0f} GiB; ask about fewer tokens"
        )
    why = workload_error(args)
    if why:
        parser.error(f"--workload {args.workload}: {why}")


def explain_dispatch_options(parser: argparse.ArgumentParser) -> None:
    from moe_core.dispatch import DISPATCHERS
    from moe_core.sim.ep_kernels import FORMATS

    counts = bounded_int(1, 2**31 - 1)
    kernels = sorted(name for name, d in DISPATCHERS.items() if d.kernel)
    parser.add_argument("--hardware", required=True, help="a profile of configs/hardware/ or a YAML file")
    parser.add_argument(
        "--dispatcher",
        choices=kernels,
        required=True,
        help="node-forwarding: DeepEP's normal kernels (Hybrid-EP); direct-sends: its low-latency ones (pplx)",
    )
    parser.add_argument("--ranks", type=ranks, required=True, help="expert-parallel ranks (GPUs)")
    parser.add_argument("--tokens", type=counts, required=True, help="tokens per rank")
    parser.add_argument("--hidden", type=bounded_int(1, MAX_D_MODEL), required=True, help="hidden size of a token")
    parser.add_argument("--format", choices=FORMATS, required=True, help="fp8 (with scales) or bf16")
    parser.add_argument("--phase", choices=("dispatch", "combine"), default="dispatch")
    parser.add_argument("--experts", type=counts, default=256, help="experts, a multiple of --ranks (default 256)")
    parser.add_argument("--top-k", type=counts, default=8, help="experts per token (default 8)")
    parser.add_argument("--topk-groups", type=counts, help="nodes a token may pick (default: all, at most 4)")
    measured = parser.add_mutually_exclusive_group(required=True)
    measured.add_argument("--gbps", type=positive_number, help="the bandwidth as the library counts it (logical)")
    measured.add_argument("--latency-us", type=positive_number, help="the kernel's time in us")
    parser.add_argument("--json", action="store_true", help="print one JSON object for scripts")


def explain_dispatch_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The layer's shape whole: whole experts per rank, top-k within them."""
    if args.experts % args.ranks:
        parser.error(f"--experts {args.experts} must be a multiple of --ranks {args.ranks} (whole experts per rank)")
    if args.top_k > args.experts:
        parser.error(f"--top-k {args.top_k} exceeds --experts {args.experts}")
    if args.topk_groups is None:
        args.topk_groups = 4  # DeepSeek-V3's node limit, DeepEP's benchmark's (capped at the nodes)


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):  # also nan
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def routing_bytes(args: argparse.Namespace) -> int:
    """The memory of the routing draw (moe_core.dispatch.workloads.routing): every rank's choices
    (int64) and one rank's float64 key per token and expert at a time."""
    return 8 * args.tokens * (args.ranks * args.top_k + args.experts)


def workload_error(args: argparse.Namespace) -> str | None:
    """Why ``--workload`` cannot route this layer (None: it can): a malformed name, a sigma that
    overflows, a trace that does not load or fit, a layout the workload cannot heat."""
    from moe_core.dispatch.workloads import IMBALANCE_WORKLOADS, split_name, why_not
    from moe_core.dispatch_study import MAX_LOGNORMAL_SIGMA

    names = ", ".join(IMBALANCE_WORKLOADS)
    try:
        kind, parameter = split_name(args.workload)
        if kind == "lognormal" and parameter > MAX_LOGNORMAL_SIGMA:
            return f"sigma above {MAX_LOGNORMAL_SIGMA:g} overflows the expert weights"
        return why_not(args.workload, experts=args.experts, ranks=args.ranks, top_k=args.top_k)
    except ValueError as err:
        return f"{err}; use uniform, zipf:<s>, lognormal:<sigma>, trace:<name> or one of {names}"


# -- the other entry points' own options, in the order of ENTRY_POINTS -----------------------------


def calibrate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", action="append", default=[], help="YAML config (the measured runs' one)")
    parser.add_argument("--out", required=True, help="calibrated hardware YAML to write")
    parser.add_argument("records", nargs="+", help="raw record JSON files")


def collectives_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="check every point's result before timing it: #wrong in the table, wrong_elements in its record",
    )


def gpu_check_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for gpu_check.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--sizes", choices=GPU_CHECK_SIZES, default="full", help="full (an H200), cpu (minutes on CPU), quick (a test)"
    )


def inference_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", help="load trained weights from here, or train and save here")
    parser.add_argument("--out-dir", help="record directory (default: results/raw/lina/inference)")


def link_sharing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", help="JSON file for the measurements and predictions")
    parser.add_argument("--rate-mbit", type=float, default=200.0, help="nodes 0 and 2 (node 1: half)")
    parser.add_argument("--mbytes", type=float, default=12.5, help="size of each flow, MB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--burst-kb", type=int, default=256, help="tc tbf bucket per link")
    parser.add_argument("--receive", type=int, help=argparse.SUPPRESS)  # inside a node: flows to accept
    parser.add_argument("--send", help=argparse.SUPPRESS)  # inside node 0: {"flow": address}
    parser.add_argument("--nbytes", type=int, help=argparse.SUPPRESS)


def link_sharing_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The measurement's options (a node's side, ``--receive`` or ``--send``, takes none of them)."""
    if args.receive is not None or args.send is not None:
        return
    if args.out is None:
        parser.error("--out is required")
    if args.rate_mbit <= 0 or args.mbytes <= 0 or args.repeats < 1 or args.burst_kb <= 0:
        parser.error("--rate-mbit, --mbytes and --burst-kb must be > 0 and --repeats >= 1")


def op_sweep_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for op_sweep.json and profile.yaml")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=OP_SWEEP_DTYPES, default="float32")
    parser.add_argument("--sweep", choices=OP_SWEEP_SIZES, default="default", help="sizes: default (CPU), h200, quick")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (a CPU testbed's rank runs one)")
    parser.add_argument("--peak-tflops", type=float, help="the device's spec peak in --dtype (else: the fitted rate)")
    parser.add_argument("--memory-GBps", type=float, help="the device's spec memory bandwidth (else: the fitted one)")
    parser.add_argument("--fit", metavar="RECORD", help="fit the op sweep of this record instead of measuring")


def op_sweep_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("threads", "peak_tflops", "memory_GBps"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            parser.error(f"--{name.replace('_', '-')} must be a number > 0, got {value}")


def record_routing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="the trace's name: the workload trace:<name> replays it")
    parser.add_argument("--train-steps", type=int, default=200, help="router training before the trace")
    parser.add_argument("--batch", type=int, default=32, help="sequences of the traced batch")
    parser.add_argument("--out", type=Path, help="where to write it (default: the committed traces' folder)")


def record_routing_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.train_steps < 0 or args.batch < 1:
        parser.error(f"--train-steps must be >= 0 and --batch >= 1, got {args.train_steps} and {args.batch}")


def sim_bench_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--hardware", default="h100-ndr-cluster")


def simulate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", help="record path of a single point (default: results/raw/<paper>/sim_train_step/<point>.json)"
    )
    parser.add_argument("--sweep", action="store_true", help="simulate every point of the config's simulated sweeps")
    parser.add_argument("--paper", help="with --sweep: only this paper's points (a run at its fitted testbed)")
    parser.add_argument("--trace", metavar="PATH", help="also write the point's timeline as a Chrome/Perfetto trace")


def simulate_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.sweep and args.out:
        parser.error("--out names one record; --sweep writes one per point under results_dir")
    if args.sweep and args.trace:
        parser.error("--trace writes one point's timeline; drop --sweep and give the point's overrides")
    if args.paper and not args.sweep:
        parser.error("--paper selects points of the sweep; give --sweep too")


def train_step_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", help="record path (default: results/raw/<paper>/<experiment>/<point>.json)")
    parser.add_argument("--profile", metavar="DIR", help="after the timed steps, trace more under torch.profiler")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps to trace with --profile (default 3)")


def train_step_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.profile_steps < 1:
        parser.error(f"--profile-steps must be at least 1, got {args.profile_steps}")


def validate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calibrated", required=True, help="calibrated hardware YAML (experiments/calibrate.py)")
    parser.add_argument("--out", required=True, help="validation CSV to write")
    parser.add_argument("records", nargs="+", help="raw record JSON files")


# What most entry points read besides their own section: where records go and how they are named and mirrored.
OUTPUT = ("results_dir", "sweep.name", "wandb")

ENTRY_POINTS = {
    e.name: e
    for e in (
        EntryPoint("advise", options=advise_options, check=advise_check),
        EntryPoint("aurora", ("aurora", "model", "train.seed", *OUTPUT)),
        EntryPoint(
            "aurora_a2a",
            ("aurora", "model", "train", "hardware_profile", "parallel.timeout_s", *OUTPUT),
            world_size_key="aurora.world_size",
        ),
        EntryPoint("axonn", ("axonn", *OUTPUT)),
        EntryPoint("axonn_grid_predictions", ("axonn", "hardware_profile", *OUTPUT)),
        EntryPoint(
            "axonn_grids", ("axonn", "model", "train", "hardware_profile", *OUTPUT), world_size_key="axonn.world_size"
        ),
        EntryPoint("calibrate", options=calibrate_options),
        EntryPoint(
            "collectives",
            ("collectives", "hardware_profile", "parallel.timeout_s", *OUTPUT),
            world_size_key="collectives.world_size",
            options=collectives_options,
        ),
        EntryPoint(
            "dispatchers",
            ("dispatch_study", "hardware_profile", "parallel.timeout_s", *OUTPUT),
            world_size_key="dispatch_study.world_size",
        ),
        EntryPoint("dispatchers_predictions", ("dispatch_study", "hardware_profile", *OUTPUT)),
        EntryPoint("dispatchers_sim", ("dispatch_study", *OUTPUT)),
        EntryPoint("explain_dispatch", options=explain_dispatch_options, check=explain_dispatch_check),
        EntryPoint("external_dispatch", OUTPUT),
        EntryPoint("external_steps", OUTPUT),
        EntryPoint("external_validation", OUTPUT),
        EntryPoint("gpu_check", options=gpu_check_options),
        EntryPoint("gshard", ("gshard", *OUTPUT)),
        EntryPoint(
            "inference",
            ("inference", "model", "moe", "train", "parallel", "hardware_profile", *OUTPUT),
            world_size_key="parallel.world_size",
            options=inference_options,
        ),
        EntryPoint("lina_inference_sim", ("lina", "inference", "train.seed", *OUTPUT)),
        EntryPoint("link_sharing", options=link_sharing_options, check=link_sharing_check),
        EntryPoint("monta", ("monta", *OUTPUT)),
        EntryPoint(
            "monta_a2a",
            ("monta", "hardware_profile", "parallel.timeout_s", *OUTPUT),
            world_size_key="monta.world_size",
        ),
        EntryPoint("op_sweep", options=op_sweep_options, check=op_sweep_check),
        EntryPoint(
            "record_routing", ("model", "moe", "train"), options=record_routing_options, check=record_routing_check
        ),
        EntryPoint("sim_bench", options=sim_bench_options),
        EntryPoint(
            "simulate",
            ("paper", "model", "moe", "parallel", "comm", "train", "sim_sweep", "hardware_profile", *OUTPUT),
            options=simulate_options,
            check=simulate_check,
        ),
        EntryPoint(
            "train_step",
            ("paper", "experiment", "model", "moe", "parallel", "comm", "train", "hardware_profile", *OUTPUT),
            world_size_key="parallel.world_size",
            options=train_step_options,
            check=train_step_check,
        ),
        EntryPoint("validate", options=validate_options),
    )
}
