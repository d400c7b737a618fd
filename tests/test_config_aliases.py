"""Megatron's names for two decisions: moe.dispatcher and parallel.expert_parallel expand into the
keys the code reads, the latest statement wins, and a contradiction is refused naming both keys."""

import pytest

from moe_core.config.load import ConfigError, load_config
from moe_core.dispatch import DISPATCHERS
from moe_core.schema.derive import derive_config


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["moe.dispatcher=dropless"], {"moe.dropless": True, "comm.a2a_algorithm": "flat"}),
        (["moe.dispatcher=hierarchical"], {"moe.dropless": False, "comm.a2a_algorithm": "hierarchical"}),
        (["moe.dispatcher=capacity"], {"moe.dropless": False, "comm.a2a_algorithm": "flat"}),
        (
            ["moe.dispatcher=duplicate", "parallel.tensor_parallel=2", "moe.experts_per_rank=2"],
            {"comm.tp_dispatch": "duplicate"},
        ),
        (["parallel.expert_parallel=2", "moe.num_experts=8"], {"moe.experts_per_rank": 4}),
    ],
)
def test_an_alias_sets_the_keys_that_run_it(overrides, expected):
    cfg = load_config(overrides=overrides)
    for key, value in expected.items():
        assert cfg[key.split(".")[0]][key.split(".")[1]] == value, key


def test_every_training_step_dispatcher_names_keys_the_config_has():
    cfg = load_config()
    for name, dispatcher in DISPATCHERS.items():
        for key in dispatcher.step_keys or {}:
            section, field = key.split(".")
            assert field in cfg[section], (name, key)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["moe.dispatcher=allgather"], "'allgather' is timed by the dispatcher study"),
        (["moe.dispatcher=all-to-all"], "unknown dispatcher 'all-to-all'; allowed: .*'capacity'"),
        (["moe.dispatcher=duplicate"], "not split over \"tp\".*\\['capacity', 'dropless', 'hierarchical'\\]"),
        (["moe.dispatcher=dropless", "moe.dropless=false"], "sets moe.dropless=True, but moe.dropless=False"),
        (["parallel.expert_parallel=3"], "3 must divide moe.num_experts=4"),
        (["parallel.expert_parallel=2", "moe.experts_per_rank=1"], "sets moe.experts_per_rank=2, but .*=1"),
    ],
)
def test_a_contradiction_or_a_dispatcher_a_step_cannot_run_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_the_latest_layer_that_states_the_decision_wins():
    # a saved config stated the dispatcher; a later override states dropless itself: the alias clears
    cfg = load_config(data={"moe": {"dispatcher": "dropless"}}, overrides=["moe.dropless=false"])
    assert cfg.moe.dispatcher == "" and cfg.moe.dropless is False
    # a point that sets experts per rank itself (a paper's model) leaves the run's expert parallelism
    run = load_config(overrides=["parallel.expert_parallel=2", "moe.num_experts=8"])
    point = derive_config(run, ["moe.num_experts=2", "moe.experts_per_rank=1"])
    assert (point.parallel.expert_parallel, point.moe.experts_per_rank) == (0, 1)
    # one that changes the experts keeps it: experts per rank follow
    assert derive_config(run, ["moe.num_experts=16"]).moe.experts_per_rank == 8
