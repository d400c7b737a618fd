"""Which dispatcher when: the skew models, the capacity bookkeeping, the simulated round trips and
the measured experiment on two gloo ranks."""

import subprocess
import sys

import numpy as np
import pytest

from analysis.collect import collect, read_valid_record
from analysis.papers.common import dispatcher_choice
from analysis.registry import TABLE_REGISTRY
from experiments import dispatchers, dispatchers_sim
from experiments.__main__ import main as run_entry_point
from experiments.benchmark import confidence_interval
from moe_core.config.load import ConfigError, load_config
from moe_core.dispatch import dispatcher, register_dispatcher
from moe_core.dispatch.exchanges import Capacity
from moe_core.dispatch_study import (
    capacity_slots,
    dropped_fraction,
    imbalance,
    measured_paths,
    routing_metrics,
    simulated_round_trip_s,
    token_counts,
    useful_bytes,
)

NEW_PATHS = ("node-forwarding", "direct-sends")  # the kernel libraries' exchanges, measured and priced alone


def test_counts_imbalance_capacity_and_drops():
    counts = token_counts("uniform", 4, 1000, seed=0)
    assert counts.shape == (4, 4) and (counts.sum(axis=1) == 1000).all()
    assert 1.0 <= imbalance(counts) < 1.1
    skewed = token_counts("zipf:2.0", 4, 1000, seed=0)
    assert imbalance(skewed) > 2
    assert capacity_slots(1000, 4, 1.25) == 313 and capacity_slots(1000, 4, 1.25, multiple=8) == 320
    assert dropped_fraction(np.array([[10, 0], [0, 10]]), capacity=10) == 0
    assert dropped_fraction(np.array([[20, 0], [0, 0]]), capacity=5) == pytest.approx(0.75)
    empty = token_counts("zero_expert_rank", 1, 1000, seed=0)  # one rank: an empty step
    assert empty.sum() == 0 and imbalance(empty) == 1.0 and dropped_fraction(empty, capacity=5) == 0


def test_a_cell_of_several_steps_reports_its_worst_imbalance_and_its_mean_drops():
    steps = [token_counts("burst", 4, 1000, seed=0, step=step) for step in range(4)]
    assert [imbalance(c) > 1.5 for c in steps] == [False, False, False, True]
    metrics = routing_metrics(steps, capacity=300, drops=True, row_bytes=8)
    assert metrics["imbalance"] == max(imbalance(c) for c in steps)
    assert metrics["dropped_fraction"] == pytest.approx(np.mean([dropped_fraction(c, 300) for c in steps]))
    assert metrics["useful_bytes"] == pytest.approx(np.mean([useful_bytes(c, 8) for c in steps]))
    assert routing_metrics(steps, capacity=300, drops=False, row_bytes=8)["dropped_fraction"] == 0
    # useful bytes: what crosses between ranks, there and back; a token kept on its rank moves nothing
    assert useful_bytes(np.array([[5, 2], [3, 7]]), row_bytes=10) == 2 * (2 + 3) * 10


@pytest.mark.parametrize("skew", ["zipf", "zipf:x", "lognormal:-1", "pareto:1", "hot_rank:1", "hot rank"])
def test_bad_skews_name_the_key(skew):
    with pytest.raises(ConfigError, match=r"dispatch_study\.skews"):
        load_config(overrides=[f"dispatch_study.skews=[{skew}]"])


def test_a_torus_profile_is_refused_and_the_two_phase_exchange_never_claims_one():
    """A torus prices ring collectives over the whole torus only, and has no nodes to go between."""
    with pytest.raises(ConfigError, match=r"dispatch_study\.hardware.*torus2d profile"):
        load_config(overrides=["dispatch_study.hardware=[gshard-tpuv3-torus]"])
    torus = load_config(overrides=["hardware_profile=gshard-tpuv3-torus"]).hardware
    assert not dispatcher("hierarchical").runs_on(64, torus)
    assert dispatcher("hierarchical").runs_on(16, load_config(overrides=["hardware_profile=monta-a800-2x8"]).hardware)


def test_simulated_round_trips_react_to_skew_as_their_mechanisms_do():
    """Capacity buffers and the all-gather move the same bytes under any skew; dropless pays for
    the hot expert's rank."""
    hw = load_config(overrides=["hardware_profile=monta-a800-2x8"]).hardware
    capacity = capacity_slots(4096, 16, 1.25)
    times = {}
    for skew in ("uniform", "zipf:1.5"):
        counts = token_counts(skew, 16, 4096, seed=0)
        times[skew] = {
            path: simulated_round_trip_s(hw, counts, capacity, 8192, path)
            for path in ("capacity", "hierarchical", "dropless", "allgather")
        }
    assert times["zipf:1.5"]["capacity"] == times["uniform"]["capacity"]
    assert times["zipf:1.5"]["allgather"] == pytest.approx(times["uniform"]["allgather"], rel=0.01)
    assert times["zipf:1.5"]["dropless"] > 3 * times["uniform"]["dropless"]
    # balanced routing: dropless moves fewer bytes than capacity buffers with 25% headroom
    assert times["uniform"]["dropless"] < times["uniform"]["capacity"]
    with pytest.raises(ValueError, match="monta"):
        simulated_round_trip_s(hw, counts, capacity, 8192, "monta")


def test_simulated_study_writes_every_declared_point_and_the_winners_table(tmp_path):
    overrides = [f"results_dir={tmp_path}", "dispatch_study.hardware=[monta-a800-2x8]"]
    assert run_entry_point(["dispatchers_sim", "--config", "configs/default.yaml", *overrides]) == 0
    cfg = load_config(["configs/default.yaml"], overrides)
    files = list((tmp_path / "raw" / "common" / "dispatchers_sim").glob("*.json"))
    assert {f.stem for f in files} == set(dispatchers_sim.sim_points(cfg))
    for record in map(read_valid_record, files):
        m = {k: v["value"] for k, v in record["metrics"].items()}
        assert m["useful_bytes"] > 0 and m["useful_GBps"] == pytest.approx(
            m["useful_bytes"] / (m["exchange_ms"] * 1e-3) / 1e9
        )
    table = dispatcher_choice(collect(files)[0])
    assert set(table["skew"]) == set(cfg.dispatch_study.skews)
    cells = {(size, skew, path) for _, size, skew, path in dispatchers_sim.sim_cells(cfg)}
    assert {(8, "uniform", "capacity"), (64, "uniform", "hierarchical")} <= cells
    assert (16, "trace:markov-e16-top2", "dropless") in cells
    assert (8, "uniform", "hierarchical") not in cells  # 8 GPUs are one node: no second phase
    assert not any(skew.startswith("trace:") and size == 64 for size, skew, _ in cells)  # a 16-expert trace
    for _, rows in table.groupby(["world_size", "skew"]):
        assert rows["fastest"].nunique() == 1 and rows["fastest"].iloc[0] == rows.iloc[0]["path"]
        assert rows["fastest_without_drops"].iloc[0] in ("dropless", "allgather", *NEW_PATHS)


def test_measured_study_on_two_ranks_checks_and_writes_every_path(tmp_path):
    overrides = [f"results_dir={tmp_path}", "dispatch_study.world_size=2", "dispatch_study.tokens_per_rank=256"]
    overrides += ["dispatch_study.d_model=32", "dispatch_study.iters=2", "dispatch_study.warmup_iters=0"]
    overrides += ["dispatch_study.skews=[uniform,zipf:2.0,zero_expert_rank,rotating_hotspot]"]
    cmd = [sys.executable, "-m", "experiments.launch", "--config", "configs/default.yaml", *overrides, "--nproc", "2"]
    result = subprocess.run([*cmd, "--", "-m", "experiments", "dispatchers"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    cfg = load_config(["configs/default.yaml"], overrides)
    found = {p.stem: read_valid_record(p) for p in (tmp_path / "raw" / "common" / "dispatchers").glob("*.json")}
    assert set(found) == set(dispatchers.measured_points(cfg))
    assert {r["params"]["path"] for r in found.values()} == {
        "capacity",
        "dropless",
        "allgather",
        "duplicate",
        "drop-gather",
        "monta",
        *NEW_PATHS,
    }
    for record in found.values():
        lossless = record["params"]["path"] in ("dropless", "allgather")
        assert (record["metrics"]["dropped_fraction"]["value"] == 0) or not lossless
    skewed = [r for r in found.values() if r["params"]["skew"] == "zipf:2.0" and r["params"]["path"] == "capacity"]
    assert skewed[0]["metrics"]["dropped_fraction"]["value"] > 0
    uniform = token_counts("uniform", 2, 256, seed=0)
    for record in found.values():
        m = record["metrics"]
        assert m["exchange_ms"]["n"] == 3 * 2 and m["repeats"]["value"] == 3  # three repeats of 2 iterations
        assert m["wrong_rows"]["value"] == 0  # checked against the single-process reference before timing
        assert 0 <= m["exchange_ms_ci95_low"]["value"] <= m["exchange_ms_ci95_high"]["value"]
        if record["params"]["tensor_parallel"] > 1:  # one expert-parallel rank of two: nothing crosses
            assert m["useful_bytes"]["value"] == 0 and "useful_GBps" not in m
        elif record["params"]["skew"] == "uniform":
            assert m["useful_bytes"]["value"] == useful_bytes(uniform, 32 * 4) > 0
            assert m["useful_GBps"]["value"] == pytest.approx(
                m["useful_bytes"]["value"] / (m["exchange_ms"]["median"] * 1e-3) / 1e9
            )
            # busbw: the bytes the path moved, per rank (moe_core.dispatch_study.bandwidths)
            assert m["busbw_GBps"]["value"] == pytest.approx(
                m["bytes_moved"]["value"] / 2 / (m["exchange_ms"]["median"] * 1e-3) / 1e9
            )
            if record["params"]["path"] == "capacity":  # both ways, every slot to the other rank
                assert m["bytes_moved"]["value"] == 2 * record["params"]["capacity"] * 32 * 4 * 2
    # each measured cell the simulator prices, predicted on a profile and set beside its measurement
    profile = "dispatch_study.model_profile=monta-a800-2x8"
    assert run_entry_point(["dispatchers_predictions", "--config", "configs/default.yaml", *overrides, profile]) == 0
    predicted = {p.stem: read_valid_record(p) for p in (tmp_path / "raw" / "common").glob("dispatchers_pr*/*.json")}
    assert set(predicted) == set(dispatchers.measured_points(cfg, simulated_only=True)) < set(found)
    assert {r["params"]["path"] for r in predicted.values()} == {"capacity", "dropless", "allgather", *NEW_PATHS}
    for name, record in predicted.items():
        assert record["params"] == found[name]["params"] and record["hardware"] == found[name]["hardware"]
    files = list((tmp_path / "raw" / "common").glob("*/*.json"))
    table = TABLE_REGISTRY["dispatchers_against_the_model"].build(collect(files)[0])
    assert len(table) == len(predicted)
    for row in table.itertuples():
        point = f"ws2_{row.skew.replace(':', '')}_{row.path}"
        assert row.exchange_ms == found[point]["metrics"]["exchange_ms"]["median"]
        assert row.measured_over_predicted == row.exchange_ms / row.predicted_exchange_ms
    # the nccl-tests-style table on the console: a line per cell
    lines = [line for line in result.stdout.splitlines() if line.split()[:1] in (["uniform"], ["zero_expert_rank"])]
    assert all(column in result.stdout for column in ("useful(GB/s)", "busbw(GB/s)", "moved(B)", "#wrong"))
    assert len(lines) == 2 * (6 + len(NEW_PATHS))
    # and which kind of bandwidth each rate is
    assert "useful, algbw: logical GB/s" in result.stdout and "busbw: wire GB/s" in result.stdout


def test_the_repeats_interval_is_students_t_and_needs_two_repeats():
    low, high = confidence_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / np.sqrt(3)  # t(0.975, 2) x sd 1 / sqrt(3)
    assert (low, high) == pytest.approx((2 - half, 2 + half))
    with pytest.raises(ValueError, match="two repeats"):
        confidence_interval([1.0])
    with pytest.raises(ConfigError, match=r"dispatch_study\.repeats"):
        load_config(overrides=["dispatch_study.repeats=1"])


def test_predictions_refuse_a_profile_they_cannot_price_or_read(tmp_path, capsys):
    # the run's own profile, local-cpu, states no link rate until calibrated
    assert (
        run_entry_point(["dispatchers_predictions", "--config", "configs/default.yaml", f"results_dir={tmp_path}"]) == 2
    )
    assert "dispatch_study.model_profile" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"dispatch_study\.model_profile"):
        load_config(overrides=["dispatch_study.model_profile=no-such-profile"])
    assert not list(tmp_path.rglob("*.json"))


class LosesARow(Capacity):
    """A broken exchange for the gate to catch: the first row comes back as the expert received it."""

    name = "loses-a-row"

    def round_trip(self, groups, workload, expert=None):
        came_back = super().round_trip(groups, workload, expert).clone()
        came_back[0] = workload["buffer"][0]
        return came_back


class SwapsExperts(Capacity):
    """Another: it sends every block to the next rank's expert and back, so rows return scaled wrongly."""

    name = "swaps-experts"

    def round_trip(self, groups, workload, expert=None):
        import torch

        buffer = workload["buffer"]
        rolled = torch.roll(buffer, workload["capacity"], dims=0)
        back = super().round_trip(groups, {**workload, "buffer": rolled}, expert)
        return torch.roll(back, -workload["capacity"], dims=0)


class DoublesGradients(Capacity):
    """A third: every row comes back right, but its gradient goes back twice as large."""

    name = "doubles-gradients"

    def round_trip(self, groups, workload, expert=None):
        came_back = super().round_trip(groups, workload, expert)
        return came_back.detach() + 2 * (came_back - came_back.detach())


def _gate_worker(rank, world, init_file, out_dir):
    import torch
    import torch.distributed as dist

    from moe_core.runtime.distributed import Env

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    for broken in (LosesARow(), SwapsExperts(), DoublesGradients()):
        register_dispatcher(broken)
    overrides = ["dispatch_study.world_size=4", "dispatch_study.tensor_parallel=2", "dispatch_study.d_model=8"]
    cfg = load_config(overrides=[*overrides, "dispatch_study.tokens_per_rank=64"])
    env = Env(rank, world, rank, torch.device("cpu"), "gloo", None, 60.0)
    paths = dispatchers.Paths(cfg, env)
    wrong = {}
    for skew in ("uniform", "zipf:2.0", "zero_expert_rank"):
        w = paths.workload(skew, 0)
        wrong.update({(skew, name): paths.wrong_rows(name, w) for name in measured_paths(cfg)})
    torch.save((wrong, w["capacity"]), f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def test_the_gate_passes_every_registered_dispatcher_and_counts_a_broken_ones_rows(tmp_path):
    """Every shipped dispatcher brings every row back as its expert left it, and its exact gradient
    back to it, under skew too; a row returned unprocessed, rows sent to the wrong experts, or
    gradients scaled wrongly, are counted on every rank alike."""
    import torch
    import torch.multiprocessing as mp

    mp.spawn(_gate_worker, args=(4, str(tmp_path / "init"), str(tmp_path)), nprocs=4, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    assert all(r == ranks[0] for r in ranks)  # summed over the ranks: every rank agrees
    wrong, capacity = ranks[0]
    assert {name for _, name in wrong} >= {"capacity", "dropless", "allgather", "duplicate", "drop-gather", "monta"}
    for (skew, name), count in wrong.items():
        if name == "loses-a-row":
            assert count == 4, skew  # one row on each of the four ranks
        elif name in ("swaps-experts", "doubles-gradients"):
            assert count == 4 * 4 * capacity, skew  # every row of every rank's four expert blocks
        else:
            assert count == 0, (skew, name)
