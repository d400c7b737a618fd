"""python -m experiments advise: the dispatchers ranked on a profile, for a layer's shape and routing."""

import json

import pytest

from experiments.__main__ import main as run_entry_point
from experiments.simulate import sized_hardware
from moe_core.config.load import load_config
from moe_core.dispatch_study import rank_dispatchers

LAYER = ["--ranks", "16", "--experts", "32", "--top-k", "2", "--tokens", "2048", "--d-model", "1024"]


def ranking(workload: str, **shape) -> dict[str, dict]:
    cfg = load_config(overrides=["hardware_profile=monta-a800-2x8", "parallel.world_size=16"], whole_run=False)
    shape = {"ranks": 16, "experts": 32, "top_k": 2, "tokens_per_rank": 2048, "row_bytes": 2048, **shape}
    rows = rank_dispatchers(sized_hardware(cfg), capacity_factor=1.25, workload=workload, **shape)
    assert [r["exchange_ms"] for r in rows] == sorted(r["exchange_ms"] for r in rows) and rows[0]["vs_fastest"] == 1
    return {r["dispatcher"]: r for r in rows}


def test_the_ranking_reacts_to_imbalance_as_the_mechanisms_do():
    balanced, hot = ranking("balanced"), ranking("hot_rank")
    kernels = {"node-forwarding", "direct-sends"}
    assert set(balanced) == {"capacity", "hierarchical", "dropless", "allgather", *kernels}  # 16 ranks: 2 nodes
    # capacity buffers move the same bytes whatever the routing, and drop what overflows them
    assert hot["capacity"]["exchange_ms"] == pytest.approx(balanced["capacity"]["exchange_ms"])
    assert balanced["capacity"]["dropped_fraction"] == 0 < hot["capacity"]["dropped_fraction"]
    # dropless pays for the hot rank (twice its share in); neither it nor the all-gather drops a token
    assert hot["dropless"]["exchange_ms"] > 1.3 * balanced["dropless"]["exchange_ms"]
    assert hot["dropless"]["dropped_fraction"] == hot["allgather"]["dropped_fraction"] == 0
    # balanced routing: dropless moves exactly the routed rows, less than buffers with 25% headroom
    assert balanced["dropless"]["exchange_ms"] < balanced["capacity"]["exchange_ms"]
    # within one node there is no two-phase exchange to rank
    assert "hierarchical" not in ranking("balanced", ranks=8, experts=8)


def test_the_command_names_the_winners_and_its_assumptions(capsys):
    assert run_entry_point(["advise", "--hardware", "monta-a800-2x8", *LAYER, "--workload", "hot_rank", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = result["ranking"]
    assert result["fastest"] == rows[0]["dispatcher"]
    assert result["fastest_without_drops"] == next(r["dispatcher"] for r in rows if r["dropped_fraction"] == 0)
    assert result["inputs"]["hardware"] == "monta-a800-2x8" and len(result["assumptions"]) >= 4
    # none of the ranked exchanges overlaps compute: all of it is exposed, and the assumptions say so
    assert all(r["exposed_ms"] == r["exchange_ms"] and r["bytes_moved"] > 0 for r in rows)
    assert any("exposed" in item for item in result["assumptions"])
    assert run_entry_point(["advise", "--hardware", "monta-a800-2x8", *LAYER, "--workload", "hot_rank"]) == 0
    text = capsys.readouterr().out
    lossless_line = "Fastest that drops nothing" in text or rows[0]["dropped_fraction"] == 0
    assert f"Fastest: {rows[0]['dispatcher']}" in text and lossless_line and "Assumptions" in text


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--hardware", "monta-a800-2x8", *LAYER[:2], "--experts", "24", *LAYER[4:]], "multiple of --ranks"),
        (["--hardware", "monta-a800-2x8", *LAYER, "--workload", "pareto:1"], "--workload"),
        (["--hardware", "monta-a800-2x8", *LAYER, "--workload", "lognormal:500"], "overflows"),
        (["--hardware", "monta-a800-2x8", *LAYER, "--capacity-factor", "0"], "--capacity-factor"),
        (["--hardware", "monta-a800-2x8", *LAYER[:4], "--top-k", "33", *LAYER[6:]], "--top-k"),
        # every option checked at parse, the message naming it
        (["--hardware", "monta-a800-2x8", *LAYER, "--capacity-factor", "inf"], "argument --capacity-factor"),
        (["--hardware", "monta-a800-2x8", *LAYER, "--capacity-factor", "nan"], "argument --capacity-factor"),
        (["--hardware", "monta-a800-2x8", *LAYER, "--seed", "-1"], "argument --seed"),
        (["--hardware", "monta-a800-2x8", *LAYER[:6], "--tokens", "1000000000000", *LAYER[8:]], "--tokens"),
        (["--hardware", "monta-a800-2x8", *LAYER[:8], "--d-model", "10000000"], "argument --d-model"),
        (["--hardware", "monta-a800-2x8", "--ranks", "10000000", "--experts", "10000000", *LAYER[4:]], "4096"),
        (["--hardware", "monta-a800-2x8", *LAYER, "--workload", "zipf:inf"], "--workload"),
        (["--hardware", "monta-a800-2x8", *LAYER[:6], *LAYER[8:]], "give --tokens N or --shape decode|prefill"),
        (["--hardware", "monta-a800-2x8", *LAYER, "--shape", "serving"], "argument --shape"),
        (["--hardware", "monta-a800-2x8", *LAYER, "--workload", "trace:no-such-trace"], "--workload"),
        (
            ["--hardware", "monta-a800-2x8", *LAYER[:4], "--top-k", "32", *LAYER[6:], "--workload", "zero_expert_rank"],
            "--workload",
        ),
    ],
)
def test_bad_options_exit_2_naming_the_option(args, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_entry_point(["advise", *args])
    assert exit_.value.code == 2 and needle in capsys.readouterr().err


PROFILE = "devices_per_node: 8\nintra_node_GBps: 100\nnic_GBps: {nic}\nnodes: {nodes}\n"


@pytest.mark.parametrize(
    "hardware, needle",
    [
        ("no-such-cluster", "--hardware no-such-cluster: config key 'hardware_profile'"),
        ("local-cpu", "--hardware local-cpu: hardware 'local-cpu': intra_node_GBps is unknown"),
        ("gshard-tpuv3-torus", "--hardware gshard-tpuv3-torus: a torus2d profile"),
        ("aurora-bigswitch-hetero", "--ranks 16: 16 exceeds the 8 devices"),
        (PROFILE.format(nic=1e308, nodes=2), "config key 'hardware.nic_GBps': 1e+308 is not a plausible value"),
        (PROFILE.format(nic=1e-300, nodes=2), "config key 'hardware.nic_GBps': 1e-300 is not a plausible value"),
        (PROFILE.format(nic=50, nodes=10**7), "hardware.nodes x devices_per_node: 80000000 ranks, over the bound"),
    ],
)
def test_a_profile_it_cannot_read_or_price_exits_2_saying_why(hardware, needle, capsys, tmp_path):
    if hardware.startswith("devices_per_node"):  # a profile of the user's own
        (tmp_path / "mine.yaml").write_text(f"name: mine\n{hardware}")
        hardware = str(tmp_path / "mine.yaml")
    assert run_entry_point(["advise", "--hardware", hardware, *LAYER]) == 2
    assert needle in capsys.readouterr().err


DEEPSEEK = ["--ranks", "64", "--experts", "256", "--top-k", "8", "--d-model", "7168"]


def test_decode_and_prefill_shapes_rank_the_kernel_dispatchers_and_say_how_sure(capsys, tmp_path):
    """On the profile with measured kernel shares, --shape sets the tokens per rank (128 decoding, 4,096
    prefill); both kernel dispatchers are ranked, the bandwidths say which kind they are, and a runner-up
    within 1.3x is called within the model's error. On a user's profile without kernel shares, advise says
    the kernel rows are priced at borrowed shares."""
    for shape, tokens in (("decode", 128), ("prefill", 4096)):
        assert run_entry_point(["advise", "--hardware", "h800-cx7-cluster", *DEEPSEEK, "--shape", shape, "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        rows = {r["dispatcher"]: r for r in result["ranking"]}
        assert result["inputs"]["tokens"] == tokens and {"node-forwarding", "direct-sends"} <= rows.keys()
        assert set(result["bandwidth_kinds"]) == {"useful_GBps", "busbw_GBps"}
        assert result["bandwidth_kinds"]["useful_GBps"].startswith("logical")
        close = [r["dispatcher"] for r in result["ranking"][1:] if r["vs_fastest"] < 1.3]
        assert bool(close) == any("run an A/B" in note for note in result["uncertainty"])
        assert not any("states no expert-parallel kernel shares" in note for note in result["uncertainty"])
        unchecked = {note.split(":")[0] for note in result["uncertainty"] if "kernel model was checked at" in note}
        # DeepEP's tables: its normal kernels at 4,096 tokens per rank, its low-latency ones at 128
        assert unchecked == {"decode": {"node-forwarding"}, "prefill": {"direct-sends"}}[shape]
    profile = tmp_path / "mine.yaml"
    profile.write_text("name: mine\ndevices_per_node: 8\nintra_node_GBps: 150\nnic_GBps: 25\nnodes: 8\n")
    assert run_entry_point(["advise", "--hardware", str(profile), *DEEPSEEK, "--shape", "decode"]) == 0
    text = capsys.readouterr().out
    assert "'mine' states no expert-parallel kernel shares" in text and "logical(GB/s)" in text
    assert "wire/rank(GB/s)" in text and "Uncertainty:" in text
