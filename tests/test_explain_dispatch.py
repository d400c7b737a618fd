"""python -m experiments explain_dispatch: a measured kernel converted to wire bandwidth, against the
link ceilings and the kernel model, with the likely cause of a gap."""

import pytest

from experiments import explain_dispatch as ex
from experiments import external_dispatch as ed
from experiments.__main__ import main as run_entry_point
from experiments.__main__ import parse_entry_args
from experiments.entry_points import ENTRY_POINTS

NORMAL = ["--dispatcher", "node-forwarding", "--tokens", "4096", "--hidden", "7168", "--format", "fp8"]


def explain(*argv: str) -> dict:
    args = parse_entry_args(ENTRY_POINTS["explain_dispatch"], list(argv))
    return ex.explanation(args, ex.explained_profile(args))


def published_args(entry: dict) -> list[str]:
    w = entry["workload"]
    measured = ["--latency-us" if entry["metric"] == "latency_us" else "--gbps", str(entry["published"])]
    shape = ["--tokens", str(w["tokens_per_rank"]), "--hidden", str(w["hidden"]), "--format", w["format"]]
    kernel = {"node_forwarding": "node-forwarding", "direct_sends": "direct-sends"}[entry["kernel"]]
    return [
        "--hardware",
        entry["profile"],
        "--dispatcher",
        kernel,
        "--ranks",
        str(entry["world_size"]),
        *shape,
        "--phase",
        w["phase"],
        "--topk-groups",
        str(w["topk_groups"]),
        *measured,
    ]


def test_every_published_row_has_no_gap_to_explain():
    """DeepEP's own numbers on the profile fitted to them: within the model's error, and the wire rates
    they imply stay under the kernels' ceilings' reach (within the same error)."""
    for entry in ed.load_entries():
        result = explain(*published_args(entry))
        assert abs(result["measured_over_predicted"] - 1) <= ex.WITHIN_MODEL, entry["id"]
        assert any("no gap to explain" in note for note in result["causes"]), entry["id"]
        view = result["wire"][result["bottleneck"]]
        assert view["wire_GBps"] <= (1 + ex.WITHIN_MODEL) * view["kernel_ceiling_GBps"], entry["id"]


def test_a_slow_cluster_is_blamed_on_the_nic_share_with_the_share_it_implies():
    """DeepEP's EP64 dispatch at 30 GB/s instead of 51: NIC-bound, the wire bytes are its count less its
    own node's share (its RDMA count includes its own node: 3.98 nodes a token, 3.48 remote), and the
    NIC share implied is 0.87 x 30/51 less the fixed costs' part."""
    result = explain("--hardware", "h800-cx7-cluster", "--ranks", "64", *NORMAL, "--gbps", "30")
    assert result["bottleneck"] == "nic" and result["measured_over_predicted"] > 1.5
    assert result["wire"]["nic"]["wire_GBps"] == pytest.approx(30 * 3.477 / 3.984, rel=0.01)
    share = next(note for note in result["causes"] if note.startswith("NIC share"))
    assert "reaches 53% of the NIC line rate" in share and "not the 87%" in share
    assert not any(note.startswith("congestion") for note in result["causes"])  # EP64 was checked


def test_decode_gaps_point_at_per_message_latency_and_big_scales_at_congestion():
    result = explain(
        "--hardware",
        "h800-cx7-cluster",
        "--dispatcher",
        "direct-sends",
        "--ranks",
        "8",
        "--tokens",
        "128",
        "--hidden",
        "7168",
        "--format",
        "fp8",
        "--latency-us",
        "150",
    )
    latency = next(note for note in result["causes"] if note.startswith("per-message latency"))
    assert "(likely: a decode-sized exchange)" in latency and "costs 101 us, not the 27 us" in latency
    result = explain("--hardware", "h800-cx7-cluster", "--ranks", "512", *NORMAL, "--experts", "512", "--gbps", "20")
    assert any("congestion at that scale: EP512" in note and "(EP64)" in note for note in result["causes"])


def test_a_deliberately_slowed_profile_is_called_slower_than_the_cluster(tmp_path):
    """The profile with its NICs at half speed predicts twice DeepEP's EP64 time: the measurement is
    faster than the model, which names the profile's rates."""
    profile = (ed.CONFIG_DIR / "hardware" / "h800-cx7-cluster.yaml").read_text()
    slowed = tmp_path / "slowed.yaml"
    slowed.write_text(
        profile.replace("nic_GBps: 50.0", "nic_GBps: 25.0").replace("name: h800-cx7-cluster", "name: slow")
    )
    result = explain("--hardware", str(slowed), "--ranks", "64", *NORMAL, "--gbps", "51")
    assert result["measured_over_predicted"] == pytest.approx(0.5, abs=0.05)
    assert any(note.startswith("faster than the model") for note in result["causes"])
    # a profile that states no kernel shares: priced as the collective library's all-to-all, and said so
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\ndevices_per_node: 8\nintra_node_GBps: 200\nnic_GBps: 50\nnodes: 8\n")
    result = explain("--hardware", str(bare), "--ranks", "64", *NORMAL, "--gbps", "51")
    assert any(note.startswith("'bare' states no kernel shares") for note in result["causes"])


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--ranks", "64", *NORMAL], "one of the arguments --gbps --latency-us is required"),
        (["--ranks", "64", *NORMAL, "--gbps", "5", "--latency-us", "3"], "not allowed with argument"),
        (["--ranks", "64", *NORMAL, "--gbps", "-5"], "argument --gbps: must be a finite number > 0"),
        (["--ranks", "64", *NORMAL[:-1], "fp4", "--gbps", "5"], "argument --format: invalid choice"),
        (["--ranks", "64", "--dispatcher", "dropless", *NORMAL[2:], "--gbps", "5"], "argument --dispatcher"),
        (["--ranks", "60", *NORMAL, "--experts", "240", "--gbps", "5"], "--ranks 60: must fill whole nodes of 8"),
        (["--ranks", "64", *NORMAL, "--experts", "100", "--gbps", "5"], "multiple of --ranks"),
    ],
)
def test_bad_input_exits_2_naming_the_option(args, needle, capsys):
    try:
        code = run_entry_point(["explain_dispatch", "--hardware", "h800-cx7-cluster", *args])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2 and needle in capsys.readouterr().err


def test_the_text_shows_every_kind_of_bandwidth(capsys):
    assert (
        run_entry_point(
            ["explain_dispatch", "--hardware", "h800-cx7-cluster", "--ranks", "16", *NORMAL, "--gbps", "43"]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "logical bandwidth (as the library counts it): 43.0 GB/s" in text
    assert "wire, busiest NVLINK link" in text and "wire, busiest NIC link" in text and "Bottleneck" in text
