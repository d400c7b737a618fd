"""Keys that state a decision another way: parallel.expert_parallel (Megatron's name) expands into the
key the code reads, and the retired dispatcher keys become moe.dispatcher values with a warning
naming what to write instead. The latest statement wins; a contradiction is refused naming both."""

import pytest

from moe_core.config.load import ConfigError, load_config
from moe_core.dispatch import configured
from moe_core.schema.derive import derive_config

TP2 = ["parallel.tensor_parallel=2", "moe.experts_per_rank=2"]


@pytest.mark.parametrize(
    "overrides, dispatcher",
    [
        (["moe.dropless=true"], "dropless"),
        (["comm.a2a_algorithm=hierarchical"], "hierarchical"),
        ([*TP2, "comm.tp_dispatch=duplicate"], "duplicate"),
        (["comm.tp_dispatch=duplicate"], "auto"),  # no "tp": the key never applied
    ],
)
def test_a_retired_key_becomes_the_dispatcher_it_meant_and_says_so(overrides, dispatcher):
    with pytest.warns(FutureWarning, match="is retired: write "):
        cfg = load_config(overrides=overrides)
    assert cfg.moe.dispatcher == dispatcher
    assert (cfg.moe.dropless, cfg.comm.a2a_algorithm, cfg.comm.tp_dispatch) == (None, "", "")  # stated once


def test_auto_is_the_layouts_default_and_expert_parallel_sets_experts_per_rank():
    assert configured(load_config()).name == "capacity"
    assert configured(load_config(overrides=TP2)).name == "drop-gather"
    assert load_config(overrides=["parallel.expert_parallel=2", "moe.num_experts=8"]).moe.experts_per_rank == 4


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["moe.dispatcher=allgather"], "'moe.dispatcher': it is timed by the dispatcher study"),
        (["moe.dispatcher=all-to-all"], "unknown dispatcher 'all-to-all'; allowed: .*'capacity'"),
        (["moe.dispatcher=duplicate"], "not split over \"tp\".*\\['allgather', 'capacity', 'direct-sends', 'drople"),
        ([*TP2, "moe.dispatcher=dropless"], "split over \"tp\".*\\['drop-gather', 'duplicate', 'monta'\\]"),
        (["moe.dispatcher=capacity", "moe.dropless=true"], "sets moe.dispatcher=dropless, but moe.dispatcher=capa"),
        (["comm.a2a_algorithm=ring"], "'comm.a2a_algorithm': invalid value 'ring'; write moe.dispatcher"),
        (["parallel.expert_parallel=3"], "3 must divide moe.num_experts=4"),
        (["parallel.expert_parallel=2", "moe.experts_per_rank=1"], "sets moe.experts_per_rank=2, but .*=1"),
    ],
)
def test_a_contradiction_or_a_dispatcher_a_step_cannot_run_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


@pytest.mark.filterwarnings("ignore:config key:FutureWarning")
def test_the_latest_layer_that_states_the_decision_wins():
    # a saved config used a retired key; a later override names the dispatcher: the retired key clears
    cfg = load_config(data={"moe": {"dropless": True}}, overrides=["moe.dispatcher=hierarchical"])
    assert (cfg.moe.dispatcher, cfg.moe.dropless) == ("hierarchical", None)
    # a later retired key that undoes the saved dispatcher leaves the layout's default
    for saved, later in (("hierarchical", "comm.a2a_algorithm=flat"), ("dropless", "moe.dropless=false")):
        assert load_config(data={"moe": {"dispatcher": saved}}, overrides=[later]).moe.dispatcher == "auto"
    # a point that sets experts per rank itself (a paper's model) leaves the run's expert parallelism
    run = load_config(overrides=["parallel.expert_parallel=2", "moe.num_experts=8"])
    point = derive_config(run, ["moe.num_experts=2", "moe.experts_per_rank=1"])
    assert (point.parallel.expert_parallel, point.moe.experts_per_rank) == (0, 1)
    # one that changes the experts keeps it: experts per rank follow
    assert derive_config(run, ["moe.num_experts=16"]).moe.experts_per_rank == 8
