"""Aurora's workloads: traffic matrices from real gating of our model, and parametric Zipf matrices."""

import numpy as np
import pytest
import torch

from moe_core.comm.workloads import coarsen, gating_token_matrices, receiver_skew, traffic_bytes, zipf_token_matrices
from moe_core.config.load import load_config
from moe_core.papers.aurora.study import trace_config

TRACE = dict(train_steps=10, trace_batch_size=16, dropless=True)  # 16 sequences x 32 tokens = 512 tokens


def _cfg(data_zipf: float):
    base = load_config(["configs/default.yaml", "configs/ci.yaml"])  # the small CI model
    return trace_config(base, data_zipf)


@pytest.fixture(scope="module")
def traces():
    """Token matrices (layers, 8, 8) of an almost uniform and a very skewed data distribution."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small GEMMs: threads only contend on a shared CI machine
    try:
        yield {z: gating_token_matrices(_cfg(z), 8, **TRACE) for z in (0.0, 2.0)}
    finally:
        torch.set_num_threads(threads)


def test_gating_rows_sum_to_each_shards_tokens(traces):
    tokens = TRACE["trace_batch_size"] * _cfg(0.0).model.seq_len
    for m in traces.values():
        assert m.shape == (4, 8, 8) and m.dtype == np.int64  # aurora.moe_layers MoE layers
        assert (m.sum(axis=2) == tokens // 8).all()  # top-1 dropless: every token goes exactly once
        assert (m.sum(axis=(1, 2)) == tokens).all()


def test_gating_skew_grows_with_the_data_skew(traces):
    uniform, skewed = (np.mean([receiver_skew(layer) for layer in traces[z]]) for z in (0.0, 2.0))
    assert skewed > 1.3 * uniform, (uniform, skewed)


def test_gating_is_deterministic_and_coarsens_exactly(traces):
    assert np.array_equal(gating_token_matrices(_cfg(2.0), 8, **TRACE), traces[2.0])
    # shards are consecutive slices and experts sit in order, so 4 GPUs = neighbours merged
    assert np.array_equal(gating_token_matrices(_cfg(2.0), 4, **TRACE), np.stack([coarsen(m, 4) for m in traces[2.0]]))


def test_gating_rejects_a_shard_count_that_does_not_divide_the_experts():
    with pytest.raises(ValueError, match="n_gpus"):
        gating_token_matrices(_cfg(1.0), 3, **TRACE)


def test_zipf_token_matrices_have_their_own_popular_experts_per_layer():
    m = zipf_token_matrices(8, 512, 1.2, layers=4, seed=0)
    assert m.shape == (4, 8, 8) and (m.sum(axis=2) == 512).all()
    hottest = {int(np.argmax(layer.sum(axis=0))) for layer in m}
    assert len(hottest) > 1
    assert np.array_equal(zipf_token_matrices(8, 512, 1.2, layers=4, seed=0), m)


def test_traffic_bytes_and_coarsen():
    tokens = np.arange(16).reshape(4, 4)
    assert traffic_bytes(tokens, 768, 2)[1, 2] == 6 * 768 * 2
    assert coarsen(tokens, 2).tolist() == [[0 + 1 + 4 + 5, 2 + 3 + 6 + 7], [8 + 9 + 12 + 13, 10 + 11 + 14 + 15]]
    with pytest.raises(ValueError, match="divisor"):
        coarsen(tokens, 3)
