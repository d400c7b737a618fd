"""Which dispatcher when: the skew models, the capacity bookkeeping, the simulated round trips and
the measured experiment on two gloo ranks."""

import subprocess
import sys

import numpy as np
import pytest

from analysis.collect import collect, read_valid_record
from analysis.papers.common import dispatcher_choice
from experiments import dispatchers, dispatchers_sim
from moe_core.config.load import ConfigError, load_config
from moe_core.dispatch import DISPATCHERS, register_dispatcher
from moe_core.dispatch.exchanges import Capacity
from moe_core.dispatch.study import (
    capacity_slots,
    dropped_fraction,
    imbalance,
    measured_paths,
    popularity,
    simulated_paths,
    simulated_round_trip_s,
    token_counts,
)
from moe_core.dispatch.tensor_parallel import DropGather
from moe_core.schedule.policies import tp_exchange_chunks


def test_popularity_is_a_distribution_whose_skew_grows_with_its_parameter():
    uniform = popularity(16, "uniform", seed=0)
    assert np.allclose(uniform, 1 / 16)
    tops = [popularity(16, f"zipf:{s}", seed=0).max() for s in (0.0, 0.5, 1.0, 2.0)]
    assert tops[0] == pytest.approx(1 / 16) and tops == sorted(tops) and tops[-1] > 0.5
    for skew in ("zipf:1.0", "lognormal:1.0"):
        p = popularity(16, skew, seed=3)
        assert p.sum() == pytest.approx(1.0) and (p > 0).all()
        assert np.array_equal(p, popularity(16, skew, seed=3))  # every rank draws the same


def test_counts_imbalance_capacity_and_drops():
    counts = token_counts(4, 1000, popularity(4, "uniform", 0), seed=0)
    assert counts.shape == (4, 4) and (counts.sum(axis=1) == 1000).all()
    assert 1.0 <= imbalance(counts) < 1.1
    skewed = token_counts(4, 1000, popularity(4, "zipf:2.0", 0), seed=0)
    assert imbalance(skewed) > 2
    assert capacity_slots(1000, 4, 1.25) == 313 and capacity_slots(1000, 4, 1.25, multiple=8) == 320
    assert dropped_fraction(np.array([[10, 0], [0, 10]]), capacity=10) == 0
    assert dropped_fraction(np.array([[20, 0], [0, 0]]), capacity=5) == pytest.approx(0.75)


@pytest.mark.parametrize("skew", ["zipf", "zipf:x", "lognormal:-1", "pareto:1"])
def test_bad_skews_name_the_key(skew):
    with pytest.raises(ConfigError, match=r"dispatch_study\.skews"):
        load_config(overrides=[f"dispatch_study.skews=[{skew}]"])


def test_simulated_round_trips_react_to_skew_as_their_mechanisms_do():
    """Capacity buffers and the all-gather move the same bytes under any skew; dropless pays for
    the hot expert's rank."""
    hw = load_config(overrides=["hardware_profile=monta-a800-2x8"]).hardware
    capacity = capacity_slots(4096, 16, 1.25)
    times = {}
    for skew in ("uniform", "zipf:1.5"):
        counts = token_counts(16, 4096, popularity(16, skew, 0), seed=0)
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
    assert dispatchers_sim.main(["--config", "configs/default.yaml", *overrides]) == 0
    cfg = load_config(["configs/default.yaml"], overrides)
    files = list((tmp_path / "raw" / "common" / "dispatchers_sim").glob("*.json"))
    assert {f.stem for f in files} == set(dispatchers_sim.sim_points(cfg))
    table = dispatcher_choice(collect(files)[0])
    assert set(table["skew"]) == set(cfg.dispatch_study.skews)
    for _, rows in table.groupby("skew"):
        assert rows["fastest"].nunique() == 1 and rows["fastest"].iloc[0] == rows.iloc[0]["path"]
        assert rows["fastest_without_drops"].iloc[0] in ("dropless", "allgather")


def test_measured_study_on_two_ranks_checks_and_writes_every_path(tmp_path):
    overrides = [f"results_dir={tmp_path}", "dispatch_study.world_size=2", "dispatch_study.tokens_per_rank=256"]
    overrides += ["dispatch_study.d_model=32", "dispatch_study.iters=2", "dispatch_study.warmup_iters=0"]
    overrides += ["dispatch_study.skews=[uniform,zipf:2.0]"]
    cmd = [sys.executable, "-m", "experiments.launch", "--config", "configs/default.yaml", *overrides, "--nproc", "2"]
    result = subprocess.run([*cmd, "--", "-m", "experiments.dispatchers"], capture_output=True, text=True)
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
    }
    for record in found.values():
        lossless = record["params"]["path"] in ("dropless", "allgather")
        assert (record["metrics"]["dropped_fraction"]["value"] == 0) or not lossless
    skewed = [r for r in found.values() if r["params"]["skew"] == "zipf:2.0" and r["params"]["path"] == "capacity"]
    assert skewed[0]["metrics"]["dropped_fraction"]["value"] > 0


def test_a_registered_dispatcher_joins_both_studies_and_the_config():
    """The studies and comm.tp_dispatch enumerate the registry: one register_dispatcher line adds a
    dispatcher to the measured and simulated paths (or, tensor-parallel, to the config's values)."""

    class Echo(Capacity):
        name = "echo"

    class Halves(DropGather):
        name = "halves"

        def exchange_chunks(self, cfg):
            return 2

    registered = dict(DISPATCHERS)
    try:
        register_dispatcher(Echo())
        register_dispatcher(Halves())
        cfg = load_config()
        assert "echo" in measured_paths(cfg) and "echo" in simulated_paths()
        assert "halves" in measured_paths(cfg) and "halves" not in simulated_paths()
        tp = ["parallel.world_size=4", "parallel.tensor_parallel=2", "moe.num_experts=2"]
        assert tp_exchange_chunks(load_config(overrides=[*tp, "comm.tp_dispatch=halves"])) == 2
        with pytest.raises(ConfigError, match="comm.tp_dispatch.*halves"):
            load_config(overrides=[*tp, "comm.tp_dispatch=echo"])
        with pytest.raises(ValueError, match="registered twice"):
            register_dispatcher(Echo())
    finally:
        DISPATCHERS.clear()
        DISPATCHERS.update(registered)
