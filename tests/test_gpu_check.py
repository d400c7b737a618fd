"""experiments/gpu_check.py end to end on CPU with tiny sizes (the real run needs one H200)."""

import json

import torch.distributed as dist

from experiments.__main__ import main as run_entry_point
from experiments.entry_points import GPU_CHECK_SIZES
from experiments.gpu_check import SIZES
from experiments.op_sweep import fit


def test_the_sizes_option_offers_every_size_table():
    assert tuple(sorted(SIZES)) == GPU_CHECK_SIZES


def test_gpu_check_writes_a_complete_record_on_cpu(tmp_path, capsys):
    assert run_entry_point(["gpu_check", "--device", "cpu", "--sizes", "quick", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    # an H200's targets are shown but not judged on a CPU, and no CPU number is called a share of an H200
    assert out.count("not judged on CPU") == 2 and "H200 peak" not in out and "CUDA events" not in out
    assert "gpu_check on cpu: the op sweep" in err
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {"date", "checks", "pass", "environment"} <= record.keys()
    c = record["checks"]
    positive = [
        c["matmul"]["tflops"],
        c["moe"]["tokens_per_s"],
        c["moe"]["tflops_routed"],
        c["moe"]["tflops_padded"],
        c["dense"]["tokens_per_s"],
        c["dense"]["tflops"],
        c["moe_over_dense_tokens_per_s"],
        c["timing"]["cuda_events_ms"],
        c["timing"]["wall_ms"],
    ]
    assert all(v > 0 for v in positive)
    # capacity factor 1 at top-2: E*C = 2 x tokens (2 x 64); routing never keeps more pairs than slots
    assert c["moe"]["capacity_slots"] == 2 * 2 * 64 and 0 < c["moe"]["routed_pairs"] <= c["moe"]["capacity_slots"]
    # the collectives ran on gloo at world size 1, exactly, and the group was torn down
    assert c["collectives"] == {"backend": "gloo", "world_size": 1, "nccl_version": None}
    judged = {k: v for k, v in record["pass"].items() if k not in ("moe_over_dense", "timing_agreement")}
    assert record["pass"]["moe_over_dense"] is None and record["pass"]["timing_agreement"] is None
    assert record["pass"]["collectives_exact"] and all(isinstance(v, bool) for v in judged.values())
    # the throughput table: every point in every routing mode, its forward split measured
    assert [p["mode"] for p in c["points"]] == ["capacity-1.0", "capacity-1.25", "dropless"]
    assert all(p["moe_over_dense_tokens_per_s"] > 0 and p["forward_split_ms"]["expert"] > 0 for p in c["points"])
    assert all(0 < p["routing_share_of_forward"] < 1 for p in c["points"])
    # the op sweep (experiments/op_sweep.py's): 2 token counts x 1 weight shape of GEMMs, its 7
    # memory-bound ops x 2 sizes, a launch cost; what experiments/op_sweep.py --fit fits
    sweep = c["op_sweep"]
    assert [(g["m"], g["n"], g["k"]) for g in sweep["gemm"]] == [(8, 32, 64), (64, 32, 64)]
    assert all(g["tflops"] > 0 for g in sweep["gemm"]) and len(sweep["memory_bound"]) == 7 * 2
    assert all(o["GBps"] > 0 for o in sweep["memory_bound"]) and sweep["launch_us"] > 0
    assert fit(sweep)["converged"]
    assert record["environment"]["device"] == "cpu" and record["hardware"] == "local-cpu"
    assert not dist.is_initialized()
