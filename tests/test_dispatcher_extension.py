"""A new token dispatcher is one class and one registry line: it joins the config (its own refusals
included), a simulated training step, both dispatcher studies, ``advise``'s ranking and the
figures' colours with no other file touched. Two test dispatchers show it: one that forwards its
rows through the sender's local-index peer on the destination node (DeepEP's route, a value of its
traffic, which a measured run refuses by the dispatcher's own rule) and a drop-gather in two chunks.
A dispatcher's measured step is its class's methods (the base class's all-to-all, DropGather's
chunks), which the measured tests of the registered ones run (test_expert_parallel.py,
test_tensor_parallel.py, test_hierarchical_a2a.py)."""

import numpy as np
import pytest

from experiments.advise import sized_hardware
from moe_core.config.load import ConfigError, load_config
from moe_core.dispatch import DISPATCHERS, configured, exchange_chunks, register_dispatcher
from moe_core.dispatch.exchanges import Capacity
from moe_core.dispatch.tensor_parallel import DropGather
from moe_core.dispatch_study import measured_paths, rank_dispatchers, simulated_paths
from moe_core.schema.validation import validate_measured
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

TWO_NODES = [
    "hardware_profile=monta-a800-2x8",
    "parallel.world_size=16",
    "moe.num_experts=16",
    "moe.experts_per_rank=1",
]
TP2 = ["parallel.world_size=4", "parallel.tensor_parallel=2", "moe.num_experts=2"]


class Relayed(Capacity):
    """Capacity buffers over the network once per destination node, then forwarded inside it."""

    name = "relayed"
    route = "forwarded"


class Halves(DropGather):
    name = "halves"

    def step_chunks(self, cfg) -> int:
        return 2


@pytest.fixture(scope="module")
def registered():
    before = dict(DISPATCHERS)
    register_dispatcher(Relayed())
    register_dispatcher(Halves())
    yield
    DISPATCHERS.clear()
    DISPATCHERS.update(before)


def a2a_ops(overrides):
    cfg = load_config(whole_run=False, overrides=overrides)
    ops = StepModel(cfg, build_topology(cfg.hardware)).run().ops
    return [op for op in ops if op.name.startswith("L1.dispatch0")]


def test_the_config_selects_it_and_its_own_refusals_apply(registered):
    assert (
        configured(load_config(whole_run=False, overrides=[*TWO_NODES, "moe.dispatcher=relayed"])).route == "forwarded"
    )
    assert exchange_chunks(load_config(whole_run=False, overrides=[*TP2, "moe.dispatcher=halves"])) == 2
    with pytest.raises(ConfigError, match="moe.dispatcher': experts are split over .*'halves'"):
        load_config(whole_run=False, overrides=[*TP2, "moe.dispatcher=relayed"])
    with pytest.raises(ConfigError, match="'moe.dispatcher': a forwarded all-to-all is simulated only"):
        validate_measured(load_config(whole_run=False, overrides=[*TWO_NODES, "moe.dispatcher=relayed"]))
    with pytest.raises(ConfigError, match="policy 'lina': .*schedules the flat all-to-all; moe.dispatcher=rel"):
        load_config(whole_run=False, overrides=[*TWO_NODES, "moe.dispatcher=relayed", "comm.policy=lina"])


def test_a_simulated_step_prices_its_route(registered):
    """Across two nodes the forwarded route is one op of both legs: the network leg carries what
    the flat all-to-all sends between nodes, the forwarding adds intra-node bytes, so it moves more
    than the flat exchange and its transfer both crosses nodes and loads the node's fabric."""
    flat, relayed = a2a_ops(TWO_NODES), a2a_ops([*TWO_NODES, "moe.dispatcher=relayed"])
    assert [op.name for op in relayed] == [op.name for op in flat]  # one op each way, as the flat one
    moved = [op.transfer.nbytes.sum() for op in (flat[0], relayed[0])]
    assert relayed[0].transfer.crosses_nodes and moved[1] > moved[0]
    halves = a2a_ops([*TP2, "hardware_profile=lina-a100-4x4", "moe.dispatcher=halves"])
    chunks = {op.name for op in halves if op.name.endswith(".fwd")}  # two chunks, each all-gathered
    assert chunks == {"L1.dispatch0c0.fwd", "L1.dispatch0c1.fwd", "L1.dispatch0ag0.fwd", "L1.dispatch0ag1.fwd"}


def test_both_studies_and_advise_take_it(registered):
    cfg = load_config()
    assert {"relayed", "halves"} <= set(measured_paths(cfg))
    assert "relayed" in simulated_paths() and "halves" not in simulated_paths()  # tp ones: in steps
    hw = sized_hardware(load_config(overrides=TWO_NODES[:2], whole_run=False))
    shape = {"ranks": 16, "experts": 16, "top_k": 1, "tokens_per_rank": 2048, "row_bytes": 2048}
    rows = {r["dispatcher"]: r for r in rank_dispatchers(hw, capacity_factor=1.25, workload="balanced", **shape)}
    assert {"relayed", "capacity"} <= rows.keys()
    assert rows["relayed"]["bytes_moved"] > rows["capacity"]["bytes_moved"]  # forwarded rows cross twice
    assert np.isfinite(rows["relayed"]["exchange_ms"]) and rows["relayed"]["exchange_ms"] > 0


def test_the_figures_colour_it_by_its_registry_line(registered):
    from analysis import style

    colours = style._dispatcher_colours()
    assert list(colours)[: len(DISPATCHERS)] == list(DISPATCHERS)
    assert len({colours[name] for name in DISPATCHERS}) == len(DISPATCHERS)  # every one its own hue
