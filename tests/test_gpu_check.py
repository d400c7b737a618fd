"""experiments/gpu_check.py end to end on CPU with tiny sizes (the real run needs one H200)."""

import json

import torch.distributed as dist

from experiments.gpu_check import main


def test_gpu_check_writes_a_complete_record_on_cpu(tmp_path):
    assert main(["--device", "cpu", "--sizes", "quick", "--out", str(tmp_path)]) == 0
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
    assert record["pass"]["collectives_exact"] and set(record["pass"]) >= {"moe_over_dense", "timing_agreement"}
    assert all(isinstance(v, bool) for v in record["pass"].values())
    assert record["environment"]["device"] == "cpu" and record["hardware"] == "local-cpu"
    assert not dist.is_initialized()
