"""Recorded routing: the trained gate's choices saved, read back and replayed as a study workload,
and the Gini coefficient the study reports beside the imbalance factor."""

import json

import numpy as np
import pytest

from moe_core.config.load import ConfigError, load_config
from moe_core.dispatch import routing_trace
from moe_core.dispatch.workloads import period, routing, routing_counts
from moe_core.dispatch_study import parse_skew, routing_metrics

COMMITTED = "markov-e16-top2"


def _trace(layers=2, tokens=12, top_k=2, experts=8, seed=0) -> routing_trace.RoutingTrace:
    rng = np.random.default_rng(seed)
    choices = np.stack([[rng.choice(experts, top_k, replace=False) for _ in range(tokens)] for _ in range(layers)])
    return routing_trace.RoutingTrace(choices.astype(np.int64), experts, {"experts": experts})


def test_gini_is_zero_when_even_and_the_mean_difference_otherwise():
    assert routing_trace.gini(np.full(8, 5)) == 0.0
    assert routing_trace.gini(np.zeros(8)) == 0.0  # nothing routed
    assert routing_trace.gini(np.array([0, 0, 0, 12])) == pytest.approx(3 / 4)  # one of n takes all: (n-1)/n
    loads = np.array([4, 1, 3, 2])
    pairs = np.abs(loads[:, None] - loads[None, :]).sum()
    assert routing_trace.gini(loads) == pytest.approx(pairs / (2 * loads.size**2 * loads.mean()))  # 0.25


def test_replay_merges_experts_keeping_each_ranks_load_and_cycles_layers_and_tokens():
    trace = _trace(layers=2, tokens=12, top_k=2, experts=8)
    replay = routing_trace.replay(trace, step=3, tokens_per_rank=[3, 3], experts=4, top_k=2)
    layer = trace.choices[1]  # step 3 of a 2-layer trace
    assert np.array_equal(replay[0], layer[:3] // 2) and np.array_equal(replay[1], layer[3:6] // 2)
    # merging experts 2e and 2e+1 moves no load between ranks (experts contiguous on the ranks)
    fine = routing_counts([layer[:6]], 8)[0].reshape(4, 2).sum(axis=1)
    assert np.array_equal(routing_counts([np.concatenate(replay)], 4)[0], fine)
    wrapped = routing_trace.replay(trace, step=0, tokens_per_rank=[8, 8], experts=8, top_k=1)
    assert np.array_equal(wrapped[1], trace.choices[0, np.r_[8:12, 0:4], :1])  # more tokens than traced
    with pytest.raises(ValueError, match="replays on a divisor of 8 experts, not 3"):
        routing_trace.replay(trace, step=0, tokens_per_rank=[1], experts=3, top_k=1)
    with pytest.raises(ValueError, match="top 2 choices; top_k=3"):
        routing_trace.replay(trace, step=0, tokens_per_rank=[1], experts=8, top_k=3)


def test_a_saved_trace_reads_back_and_a_damaged_one_is_refused(tmp_path):
    trace = _trace()
    routing_trace.save(trace, tmp_path / "t.npz")
    back = routing_trace.read(tmp_path / "t.npz")
    assert np.array_equal(back.choices, trace.choices) and back.experts == trace.experts
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]  # no temporary file left beside it
    (tmp_path / "bad.npz").write_bytes(b"not a trace")
    with pytest.raises(ValueError, match="cannot read it .*record_routing"):
        routing_trace.read(tmp_path / "bad.npz")
    np.savez(tmp_path / "ids.npz", choices=np.full((1, 2, 1), 9, np.int16), meta=json.dumps({"experts": 8}))
    with pytest.raises(ValueError, match="ids below meta.experts"):
        routing_trace.read(tmp_path / "ids.npz")


def test_the_committed_trace_is_a_study_workload_of_one_step_per_layer():
    trace = routing_trace.load(COMMITTED)
    assert (trace.layers, trace.choices.shape[1], trace.top_k, trace.experts) == (2, 8192, 2, 16)
    assert period(f"trace:{COMMITTED}", 4) == 2
    routes = routing(f"trace:{COMMITTED}", seed=0, step=1, tokens_per_rank=2048, experts=4, ranks=4, top_k=1)
    assert [r.shape for r in routes] == [(2048, 1)] * 4
    assert np.array_equal(np.concatenate(routes)[:, 0], trace.choices[1, :, 0] // 4)
    metrics = routing_metrics([routing_counts(routes, 4)], capacity=10**6, drops=True, row_bytes=4)
    assert 0 < metrics["gini"] < 1 and metrics["imbalance"] > 1


def test_an_unknown_or_unsafe_trace_is_refused_at_config_time():
    with pytest.raises(ConfigError, match="no routing trace 'nope'.*there: .*markov-e16-top2"):
        parse_skew("trace:nope")
    with pytest.raises(ConfigError, match="dispatch_study.skews"):
        load_config(overrides=["dispatch_study.skews=[trace:../x]"])


def test_recording_keeps_every_moe_layers_choices_and_mock_tokens_route_otherwise():
    cfg = load_config(overrides=["moe.num_experts=8", "moe.experts_per_rank=2", "model.n_layers=2", "model.seq_len=16"])
    data = routing_trace.record(cfg, train_steps=2, trace_batch_size=4)
    mock = routing_trace.record(cfg, train_steps=2, trace_batch_size=4, mock_tokens=True)
    assert data.choices.shape == (1, 64, 2) and data.experts == 8  # one MoE layer of two, 4 x 16 tokens
    assert ((data.choices >= 0) & (data.choices < 8)).all()
    assert (data.choices[..., 0] != data.choices[..., 1]).all()  # two distinct experts per token
    assert not np.array_equal(data.choices, mock.choices)
    assert data.meta["train_steps"] == 2 and mock.meta["mock_tokens"] is True


def test_the_recording_command_writes_a_trace_and_compares_it_with_mock_tokens(tmp_path, capsys):
    from experiments.__main__ import main as run_entry_point

    out = tmp_path / "t.npz"
    overrides = ["moe.num_experts=8", "moe.experts_per_rank=2", "model.seq_len=16", "--train-steps", "1"]
    assert run_entry_point(["record_routing", *overrides, "--name", "t", "--batch", "4", "--out", str(out)]) == 0
    assert routing_trace.read(out).choices.shape == (2, 64, 2)  # the default model's two MoE layers
    printed = capsys.readouterr().out
    assert "recorded, layer 1" in printed and "mock tokens, layer 0" in printed and "zipf:1.0" in printed
    assert run_entry_point(["record_routing", "--name", "../x"]) == 2


COMMITTED_BYTES = (routing_trace.TRACES_DIR / f"{COMMITTED}.npz").read_bytes()


def _committed_fields() -> tuple[np.ndarray, dict]:
    with np.load(routing_trace.TRACES_DIR / f"{COMMITTED}.npz") as data:
        return data["choices"], json.loads(str(data["meta"]))


def _with(meta_change: dict) -> dict:
    choices, meta = _committed_fields()
    return {"choices": choices, "meta": json.dumps({**meta, **meta_change})}


DAMAGED_TRACES = {
    "truncated": lambda path: path.write_bytes(COMMITTED_BYTES[: len(COMMITTED_BYTES) // 2]),
    "no meta": lambda path: np.savez(path, choices=_committed_fields()[0]),
    "meta not json": lambda path: np.savez(path, choices=_committed_fields()[0], meta="{experts: 16"),
    "meta a list": lambda path: np.savez(path, choices=_committed_fields()[0], meta="[16]"),
    "experts missing": lambda path: np.savez(path, choices=_committed_fields()[0], meta="{}"),
    "experts too many": lambda path: np.savez(path, **_with({"experts": 1024})),
    "top_k disagrees": lambda path: np.savez(path, **_with({"top_k": 4})),
    "choices float": lambda path: np.savez(path, choices=np.zeros((1, 2, 1)), meta='{"experts": 1}'),
    "choices repeat": lambda path: np.savez(path, choices=np.zeros((1, 2, 2), np.int16), meta='{"experts": 1}'),
}
DAMAGE_MESSAGES = {
    "truncated": "cannot read it",
    "no meta": "cannot read it",
    "meta not json": "cannot read it",
    "meta a list": "field meta:",
    "experts missing": "field meta:",
    "experts too many": "field meta.experts: 1024 experts, but the choices name 16",
    "top_k disagrees": "field meta.top_k",
    "choices float": "field choices",
    "choices repeat": "field choices: a token names one expert twice",
}


@pytest.mark.parametrize("damage", DAMAGED_TRACES)
def test_a_damaged_or_inconsistent_trace_is_refused_naming_the_file_and_field(tmp_path, damage):
    path = tmp_path / "t.npz"
    DAMAGED_TRACES[damage](path)
    with pytest.raises(ValueError) as err:
        routing_trace.read(path)
    message = str(err.value)
    assert message.startswith(f"routing trace {path}: ") and DAMAGE_MESSAGES[damage] in message, message
    assert "record_routing" in message
