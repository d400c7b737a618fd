"""Simulated timelines as Chrome traces (moe_core.sim.trace) and ``experiments.simulate --trace``."""

import json
from collections import defaultdict

import numpy as np
import pytest

from experiments.__main__ import main as run_entry_point
from moe_core.config.load import load_config
from moe_core.sim.engine import Op, simulate
from moe_core.sim.pipeline import PipelineModel
from moe_core.sim.step import StepModel
from moe_core.sim.topology import Transfer, build_topology
from moe_core.sim.trace import COMPUTE, HOST, TracedTimeline, chrome_trace, lanes, pipeline_trace, step_trace

# Lina's testbed (a GPU profile: the host issues the kernels), 8 ranks, overlapped gradient sync
SMALL_STEP = [
    "hardware_profile=lina-a100-4x4",
    "parallel.world_size=8",
    "moe.num_experts=8",
    "moe.experts_per_rank=1",
    "comm.policy=overlap",
]


def complete_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def track_names(trace: dict) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}


def process_names(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}


def assert_tracks_never_overlap(trace: dict) -> None:
    """Viewers draw a track's events only when they do not partly overlap: ours never overlap at all."""
    spans = defaultdict(list)
    for e in complete_events(trace):
        spans[e["pid"], e["tid"]].append((round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)))
    for track in spans.values():
        track.sort()
        assert all(end <= next_start for (_, end), (next_start, _) in zip(track, track[1:]))


def test_a_step_has_an_event_per_timed_op_at_its_simulated_times():
    cfg = load_config(["configs/default.yaml"], SMALL_STEP)
    sim = StepModel(cfg, build_topology(cfg.hardware)).run()
    trace = json.loads(json.dumps(step_trace(sim, 8, {"point": "small"}), allow_nan=False))  # strict JSON
    events = complete_events(trace)
    start_ns, end_ns = np.rint(sim.timeline.start_s * 1e9), np.rint(sim.timeline.end_s * 1e9)
    timed = [i for i in range(len(sim.ops)) if end_ns[i] > start_ns[i]]
    assert sorted(e["args"]["op"] for e in events) == timed and len(timed) > 50
    tracks, processes = track_names(trace), process_names(trace)
    for e in events:
        i = e["args"]["op"]
        op = sim.ops[i]
        assert e["name"] == op.name and e["cat"] == e["args"]["phase"] == op.phase
        assert e["dur"] > 0 and e["ts"] * 1e3 == pytest.approx(start_ns[i], abs=1e-6)
        assert (e["ts"] + e["dur"]) * 1e3 == pytest.approx(end_ns[i], abs=1e-6)
        track = tracks[e["pid"], e["tid"]]
        if op.on_host:
            assert track == HOST
        elif op.transfer is None:
            assert track == COMPUTE
        else:
            assert e["args"]["latency_us"] == pytest.approx(op.latency_s * 1e6) and e["args"]["busiest_link_bytes"] > 0
            assert track == ("all-to-all" if op.phase.endswith("a2a") else "gradient all-reduce")
    assert set(tracks.values()) == {COMPUTE, HOST, "all-to-all", "gradient all-reduce"}
    assert processes == {1: "ranks 0-7"}
    # the trace spans the step: from its first op's start to its last op's end
    step_ms = sim.metrics()["step_ms"]
    assert min(e["ts"] for e in events) == 0.0
    assert max(e["ts"] + e["dur"] for e in events) / 1e3 == pytest.approx(step_ms, abs=1e-6)
    assert trace["otherData"]["step_ms"] == pytest.approx(step_ms) and "SPMD" in trace["otherData"]["spmd"]
    assert_tracks_never_overlap(trace)


def test_collectives_of_one_kind_in_flight_together_take_lanes():
    """Two all-to-alls on separate links at once, then one after them: two lanes, the third on the first."""
    link = [Transfer(np.array([k]), np.array([1e6]), steps=1, crosses_nodes=True) for k in range(2)]
    ops = [
        Op("a", "dispatch_a2a", transfer=link[0]),
        Op("b", "combine_a2a", transfer=link[1], latency_s=1e-4),
        Op("c", "dispatch_a2a", deps=[0, 1], transfer=link[0]),
    ]
    timeline = simulate(ops, capacity=np.array([1e9, 1e9]))
    trace = chrome_trace([TracedTimeline("devices 0-1", ops, timeline)], {})
    tracks = track_names(trace)
    on = {e["name"]: tracks[e["pid"], e["tid"]] for e in complete_events(trace)}
    assert on == {"a": "all-to-all", "b": "all-to-all #2", "c": "all-to-all"}
    assert_tracks_never_overlap(trace)
    # by start: (2, 3) takes the lane (0, 2) freed, (2, 4) a third: three spans are in flight at 2.5
    assert lanes([(0, 2), (1, 3), (2, 4), (2, 3)]) == [0, 1, 2, 0]


def test_a_pipeline_has_a_process_per_stage():
    cfg = load_config(
        ["configs/default.yaml"],
        [
            "hardware_profile=h100-ndr-cluster",
            "hardware.nodes=2",
            "parallel.world_size=16",
            "parallel.pipeline_parallel=2",
            "train.micro_batches=4",
            "moe.num_experts=8",
            "moe.experts_per_rank=1",
        ],
        whole_run=False,
    )
    model = PipelineModel(cfg, build_topology(cfg.hardware))
    trace = pipeline_trace(model, {})
    assert process_names(trace) == {1: "stage 0: ranks 0-7", 2: "stage 1: ranks 8-15"}
    for pid, sim in enumerate(model.stage_simulations(), start=1):
        stage = [e for e in complete_events(trace) if e["pid"] == pid]
        assert max(e["ts"] + e["dur"] for e in stage) / 1e3 == pytest.approx(sim.timeline.makespan_s * 1e3, abs=1e-6)
    # the step composes the stages' micro-batches (1F1B), so it outlasts each stage's timeline
    assert trace["otherData"]["step_ms"] == pytest.approx(model.metrics()["step_ms"])
    assert trace["otherData"]["step_ms"] > max(e["ts"] + e["dur"] for e in complete_events(trace)) / 1e3


def test_simulate_writes_the_trace_of_its_point(tmp_path):
    out, path = tmp_path / "record.json", tmp_path / "traces" / "step.json"
    args = ["--config", "configs/default.yaml", *SMALL_STEP, f"results_dir={tmp_path}", f"--out={out}"]
    assert run_entry_point(["simulate", *args, f"--trace={path}"]) == 0
    trace, record = json.loads(path.read_text()), json.loads(out.read_text())
    events = complete_events(trace)
    assert len(events) == len(trace["traceEvents"]) - sum(e["ph"] == "M" for e in trace["traceEvents"])
    step_ms = record["metrics"]["step_ms"]["median"]
    assert max(e["ts"] + e["dur"] for e in events) / 1e3 == pytest.approx(step_ms, abs=1e-6)
    assert trace["otherData"]["point"] == record["point"]


def test_simulate_refuses_a_trace_of_a_sweep_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "trace.json"
    with pytest.raises(SystemExit) as exit_:
        run_entry_point(
            ["simulate", "--config", "configs/default.yaml", f"results_dir={tmp_path}", "--sweep", f"--trace={path}"]
        )
    assert exit_.value.code == 2 and "--trace writes one point's timeline" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_trace_that_cannot_be_written_leaves_no_record(tmp_path, capsys):
    out = tmp_path / "record.json"
    args = ["--config", "configs/default.yaml", *SMALL_STEP, f"results_dir={tmp_path}", f"--out={out}"]
    assert run_entry_point(["simulate", *args, f"--trace={tmp_path}"]) == 1  # a folder, not a file
    assert f"trace '{tmp_path}' cannot be written" in capsys.readouterr().err
    assert not out.exists()
