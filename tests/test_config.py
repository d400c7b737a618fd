"""Configuration: schema checks, layouts, sweep expansion, and bad input at the command line."""

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, replace

import pytest

from moe_core.config.load import MAX_CONFIG_BYTES, ConfigError, load_config
from moe_core.dispatch.scheduled import Scheduled
from moe_core.parallel.layout import layout_error
from moe_core.schedule.policies import POLICIES, PolicySpec, register_policy, sequential_plan
from moe_core.schema.points import point_name, sweep_points


def test_defaults_and_files_merge_with_overrides():
    cfg = load_config(["configs/default.yaml", "configs/ci.yaml"], ["moe.num_experts=8", "moe.experts_per_rank=2"])
    assert cfg.moe.num_experts == 8 and cfg.sweep.name == "ci" and cfg.hardware.name == "local-cpu"


# Bad input, one kind per row: (overrides, the full key the message must name). Every row fails in
# load_config, i.e. before any process or job starts (the Snakefile and every entry point call it).
# A valid PCIe tree on Lina's 4-GPU nodes (2 sockets, a GPU per root port), for the bad values below.
PCIE_TREE = [
    "hardware_profile=lina-a100-4x4",
    "hardware.intra_node=pcie_tree",
    "hardware.pcie.gpus_per_switch=1",
    "hardware.pcie.switch_uplink_GBps=25",
    "hardware.pcie.sockets=2",
    "hardware.pcie.socket_link_GBps=40",
    "hardware.pcie.nic_switches=[0]",
]
BAD_INPUTS = [
    # types and unknown keys
    (["moe.num_experts=abc"], "moe.num_experts"),
    (["moe.bogus=1"], "moe.bogus"),
    (["sweep={polcy: [overlap]}"], "sweep.polcy"),
    (["sweep=[1, 2]"], "sweep"),
    (["noequals"], "noequals"),
    (["sweep.world_size=[[4]]"], "sweep.world_size"),  # OmegaConf merges a nested list into list[int]
    (["dispatch_study.skews=[{a: 1}]"], "dispatch_study.skews"),
    # names that become paths or shell words
    (["paper=../../escaped"], "paper"),
    (["paper=a$(touch PWNED)"], "paper"),
    (["experiment=a/b"], "experiment"),
    (["sweep.name=x y"], "sweep.name"),
    (["hardware_profile=nowhere"], "hardware_profile"),
    (["hardware.name=../../x"], "hardware.name"),
    # the model and its routing
    (["model.n_heads=3"], "model.n_heads"),
    (["model.moe_every=100"], "model.moe_every"),
    (["model.vocab_size=1000000000000"], "model.vocab_size"),
    (["model.d_model=0"], "model.d_model"),
    (["moe.top_k=0"], "moe.top_k"),
    (["moe.top_k=5"], "moe.num_experts"),  # more experts per token than the 4 there are
    (["moe.num_experts=1"], "moe.num_experts"),
    (["moe.capacity_factor=0"], "moe.capacity_factor"),
    (["moe.capacity_factor=nan"], "moe.capacity_factor"),
    (["moe.group_size=7"], "moe.group_size"),
    (["parallel.world_size=3"], "parallel.world_size"),
    (["moe.experts_per_rank=3"], "moe.experts_per_rank"),
    # training and communication
    (["train.iters=-1"], "train.iters"),
    (["train.warmup_iters=-1"], "train.warmup_iters"),
    (["train.lr=nan"], "train.lr"),
    (["train.lr=0"], "train.lr"),
    (["train.data_zipf=nan"], "train.data_zipf"),
    (["train.data_branching=0"], "train.data_branching"),
    (["parallel.timeout_s=1e308"], "parallel.timeout_s"),
    (["parallel.timeout_s=0.001"], "parallel.timeout_s"),
    (["comm.policy=lifo"], "comm.policy"),
    (["comm.bucket_mb=0"], "comm.bucket_mb"),
    (["comm.partition_mb=-1"], "comm.partition_mb"),
    (["comm.packing_interval_iters=0"], "comm.packing_interval_iters"),
    (["hardware.phase_efficiency={bogus: 0.5}"], "hardware.phase_efficiency.bogus"),
    (["collectives.step_factor=1"], "collectives.step_factor"),
    (["collectives.world_size=1"], "collectives.world_size"),
    (["collectives.min_bytes=0"], "collectives.min_bytes"),
    # sweeps
    (["sweep.world_size=[0]"], "sweep.world_size"),
    (["sweep.policy=[]"], "sweep.policy"),
    (["sweep.policy=[sequential,fifo]"], "sweep.policy"),
    (["sweep.world_size=[2]", "sweep.num_experts=[3]"], "sweep"),
    (["sim_sweep.hardware=[nowhere]"], "sim_sweep.hardware"),
    (["sim_sweep.policy=[fifo]"], "sim_sweep.policy"),
    (["sim_sweep.paper=nobody"], "sim_sweep.paper"),
    # Lina's sections
    (["lina.policy=[fifo]"], "lina.policy"),
    (["lina.measured_policy=[fifo]"], "lina.measured_policy"),
    (["lina.hardware=nowhere"], "lina.hardware"),
    (["lina.partition_mb=[0]"], "lina.partition_mb"),
    (["lina.experts=[]"], "lina.experts"),
    (["inference.policies=[fifo]"], "inference.policies"),
    (["inference.a2a_policy=fifo"], "inference.a2a_policy"),
    (["inference.top_k=3"], "inference.top_k"),
    (["inference.batches=0"], "inference.batches"),
    (["inference.world_size=0"], "inference.world_size"),
    # Aurora's section
    (["aurora.world_size=0"], "aurora.world_size"),
    (["aurora.homogeneous_hardware=nowhere"], "aurora.homogeneous_hardware"),
    (["aurora.gap_gpus=9"], "aurora.gap_gpus"),
    (["aurora.imprecision=[1.5]"], "aurora.imprecision"),
    (["aurora.moe_layers=1"], "aurora.moe_layers"),
    (["aurora.num_experts=7"], "aurora.num_experts"),
    (["aurora.gating_zipf=[-1]"], "aurora.gating_zipf"),
    (["aurora.traffic_zipf=[inf]"], "aurora.traffic_zipf"),
    # the hardware's shape and rates
    (["hardware.devices_per_node=0"], "hardware.devices_per_node"),
    (["hardware.nodes=0"], "hardware.nodes"),
    (["hardware.nics_per_node=0"], "hardware.nics_per_node"),
    (["hardware.oversubscription=0"], "hardware.oversubscription"),
    (["hardware.nic_GBps=-50"], "hardware.nic_GBps"),
    (["hardware.intra_node_GBps=inf"], "hardware.intra_node_GBps"),
    (["hardware.inter_node_latency_us=nan"], "hardware.inter_node_latency_us"),
    (["hardware.host_cores=-1"], "hardware.host_cores"),
    (["hardware.topology=torus2d", "hardware.torus_dims=[4]"], "hardware.torus_dims"),
    (["hardware.intra_node=pcie"], "hardware.intra_node"),
    ([*PCIE_TREE, "hardware.pcie.gpus_per_switch=3"], "hardware.pcie.gpus_per_switch"),
    ([*PCIE_TREE, "hardware.pcie.sockets=3"], "hardware.pcie.sockets"),
    ([*PCIE_TREE, "hardware.pcie.switch_uplink_GBps=0"], "hardware.pcie.switch_uplink_GBps"),
    ([*PCIE_TREE, "hardware.pcie.socket_link_GBps=0"], "hardware.pcie.socket_link_GBps"),
    ([*PCIE_TREE, "hardware.pcie.nic_switches=[4]"], "hardware.pcie.nic_switches"),
    ([*PCIE_TREE, "hardware.pcie.nic_switches=[]"], "hardware.pcie.nic_switches"),
    ([*PCIE_TREE, "hardware.topology=torus2d", "hardware.torus_dims=[4,4]"], "hardware.intra_node"),
    # seeds every generator accepts
    (["train.seed=100000000000000000000"], "train.seed"),
    (["sweep.seed=[-1]"], "sweep.seed"),
    (["collectives.seed=-1"], "collectives.seed"),
    (["dispatch_study.seed=-1"], "dispatch_study.seed"),
    # names that become arguments or paths
    (['paper="lina "'], "paper"),
    (['experiment="train_step\n"'], "experiment"),
    (["wandb.project=a/b"], "wandb.project"),
    (["wandb.entity=x y"], "wandb.entity"),
    (["wandb.group=a/b"], "wandb.group"),
    ([f"wandb.group={'g' * 129}"], "wandb.group"),
    (["unstated=x y"], "unstated"),
    (['dispatch_study.skews=["zipf: 1.0"]'], "dispatch_study.skews"),
    (['dispatch_study.skews=["zipf:1.0\n"]'], "dispatch_study.skews"),
    (["axonn.model_profile=/etc/passwd"], "axonn.model_profile"),
    # values that overflow later
    (["dispatch_study.capacity_factor=inf"], "dispatch_study.capacity_factor"),
    (["dispatch_study.skews=[lognormal:1e308]"], "dispatch_study.skews"),
    (["monta.device_memory_GB=inf"], "monta.device_memory_GB"),
    (["gshard.device_memory_GB=inf"], "gshard.device_memory_GB"),
    (["gshard.capacity_factor=inf"], "gshard.capacity_factor"),
    (["axonn.device_memory_GB=inf"], "axonn.device_memory_GB"),
    (["lina.inference_drift=inf"], "lina.inference_drift"),
    (["monta.chunk_overhead_us=nan"], "monta.chunk_overhead_us"),
    # checks a job would otherwise make after it started
    (["sweep.tensor_parallel=[0]"], "sweep.tensor_parallel"),
    (["sweep.num_experts=[1]"], "sweep.num_experts"),
    (["sweep.tensor_parallel=[2]", "sweep.policy=[lina]"], "sweep.policy"),
    (["axonn.cached_layers=100"], "axonn.cached_layers"),
    # settings a run would silently drop
    (["monta.measured_tensor_parallel=3"], "monta.measured_tensor_parallel"),
    (["monta.measured_tensor_parallel=64"], "monta.measured_tensor_parallel"),
    (["monta.chunks=[3]"], "monta.chunks"),
    (["dispatch_study.hardware=[]"], "dispatch_study.hardware"),
    (["comm.tp_chunks=4"], "comm.tp_chunks"),
    (["comm.grid_overlap.cached_layers=100"], "comm.grid_overlap.cached_layers"),
    # override lists: the same checks as the top level, and no key that decides where records go
    (["sim_sweep.overrides=[results_dir=/tmp/elsewhere]"], "sim_sweep.overrides[0]"),
    (["lina.overrides=[paper=../../x]"], "lina.overrides[0]"),
    (["monta.overrides=[model.d_model=64, experiment=x]"], "monta.overrides[1]"),
    (["inference.overrides=[results_dir.x=1]"], "inference.overrides[0]"),
    (["axonn.measured_overrides=[paper=gshard]"], "axonn.measured_overrides[0]"),
    (["monta.overrides=[moe.bogus=1]"], "monta.overrides[0]"),
    (["lina.overrides=[model.d_model=abc]"], "lina.overrides[0]"),
    (["sim_sweep.overrides=[noequals]"], "sim_sweep.overrides[0]"),
    (["inference.overrides=[model.n_layers=2, model.n_heads=3]"], "inference.overrides[1]"),
    (["axonn.measured_overrides=[model.n_heads=3]"], "axonn.measured_overrides[0]"),
    # sizes: memory on this host, simulated ranks, point counts (unless force=true)
    (["model.d_model=1000000"], "model.d_model"),
    (["train.batch_size=1000000000"], "train.batch_size"),
    (["collectives.max_bytes=1000000000000"], "collectives.max_bytes"),
    (["sim_sweep.world_size=[10000]"], "sim_sweep.world_size"),
    # every section's rank counts through the same bound, every measured job's through this host's memory
    (["dispatch_study.world_size=100000"], "dispatch_study.world_size"),
    (["dispatch_study.world_size=64"], "dispatch_study.world_size"),
    (["dispatch_study.sim_world_sizes=[10000000]"], "dispatch_study.sim_world_sizes"),
    (["dispatch_study.sim_tokens_per_rank=1000000000"], "dispatch_study.sim_tokens_per_rank"),
    (["lina.experts=[8192]"], "lina.experts"),
    (["monta.hierarchical_nodes=[1024]"], "monta.hierarchical_nodes"),
    (["gshard.collective_partitions=[8192]"], "gshard.collective_partitions"),
    (["inference.world_size=8192"], "inference.world_size"),
    (["hardware.nodes=100000"], "hardware.nodes"),
    # a profile's rates and times within a plausible range, whatever loads the profile
    (["hardware.nic_GBps=1e308"], "hardware.nic_GBps"),
    (["hardware.intra_node_GBps=1e-300"], "hardware.intra_node_GBps"),
    (["hardware.peak_tflops=1e-300"], "hardware.peak_tflops"),
    (["hardware.inter_node_latency_us=1e300"], "hardware.inter_node_latency_us"),
    (["hardware.pcie.switch_uplink_GBps=1e308"], "hardware.pcie.switch_uplink_GBps"),
    ([f"sweep.seed=[{','.join(map(str, range(100)))}]"], "sweep"),
    # the key the user set, not the one a check derives
    (["moe.num_experts=3"], "moe.num_experts"),
    (["moe.num_experts=1000000"], "moe.num_experts"),
]


@pytest.mark.parametrize("overrides,key", BAD_INPUTS, ids=[" ".join(o) for o, _ in BAD_INPUTS])
def test_bad_values_name_the_full_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(["configs/default.yaml"], overrides)
    message = str(err.value)
    assert f"'{key}'" in message or f"{key}=" in message, message


def test_the_bad_input_table_covers_at_least_100_kinds():
    assert len(BAD_INPUTS) >= 100 and len({" ".join(o) for o, _ in BAD_INPUTS}) == len(BAD_INPUTS)


# The key a message leads with is the one the user set: a list's entry, a sweep axis, the section's
# own key rather than a key derived from it.
BLAMED = [
    (["monta.overrides=[moe.bogus=1]"], "monta.overrides[0]"),
    (["lina.overrides=[model.d_model=64, model.n_heads=3]"], "lina.overrides[1]"),
    (["sweep.num_experts=[1]"], "sweep.num_experts"),
    (["gshard.capacity_factor=inf"], "gshard.capacity_factor"),
    (["moe.num_experts=3"], "moe.num_experts"),
    (["parallel.world_size=3"], "parallel.world_size"),
]


@pytest.mark.parametrize("overrides,key", BLAMED, ids=[" ".join(o) for o, _ in BLAMED])
def test_messages_lead_with_the_key_the_user_set(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(["configs/default.yaml"], overrides)
    assert str(err.value).startswith(f"config key '{key}': "), str(err.value)


def test_force_runs_what_only_a_size_check_refuses():
    cfg = load_config(["configs/default.yaml"], ["model.d_model=1000000", "force=true"])
    assert cfg.model.d_model == 1000000
    cfg = load_config(["configs/default.yaml"], ["dispatch_study.sim_world_sizes=[10000000]", "force=true"])
    assert list(cfg.dispatch_study.sim_world_sizes) == [10000000]
    with pytest.raises(ConfigError, match="train.seed"):  # a wrong value stays wrong
        load_config(["configs/default.yaml"], ["train.seed=-1", "force=true"])


@pytest.mark.parametrize(
    "overrides",
    [["moe.dispatcher=hierarchical"], ["moe.dispatcher=dropless"], ["parallel.grid.row=2", "moe.num_experts=2"]],
)
def test_base_keys_valid_for_the_run_leave_the_papers_points_valid(overrides):
    """Each paper's points set the base keys their layout needs (flat all-to-all, capacity buffers,
    no grid), so the load, which checks every point, passes."""
    assert load_config(["configs/default.yaml"], overrides)


def test_a_valid_base_grid_leaves_every_point_valid():
    """The run's grid is its own: every point (measured, simulated, MoNTA's model) sets a 1D layout,
    so a grid valid for the run cannot break the sweeps at load."""
    from moe_core.papers.monta.study import model_points
    from moe_core.schema.points import measured_points, point_overrides, sim_points

    cfg = load_config(["configs/default.yaml", "configs/ci.yaml"], ["parallel.grid.row=2", "moe.num_experts=2"])
    assert cfg.parallel.grid.row == 2 and model_points(cfg)
    for point in measured_points(cfg).values():
        assert "parallel.grid.row=1" in point_overrides(point)
    assert all("parallel.grid.row=1" in overrides for _, overrides in sim_points(cfg).values())
    # and the papers' simulated experiments state their own layout too
    from experiments.lina_inference_sim import inference_config
    from moe_core.config.load import derive_config
    from moe_core.papers.gshard.models import MODELS
    from moe_core.papers.gshard.study import step_overrides

    assert inference_config(cfg, 4).parallel.grid.row == 1
    assert derive_config(cfg, step_overrides(cfg, MODELS[min(MODELS)])).parallel.grid.row == 1


def test_unknown_keys_list_the_valid_ones():
    with pytest.raises(ConfigError, match=r"valid keys of 'moe': \[.*'num_experts'"):
        load_config(overrides=["moe.bogus=1"])


def test_policy_names_come_from_the_registry():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["comm.policy=lifo"])
    assert all(name in str(err.value) for name in POLICIES) and "lina-pipeline" in POLICIES


def test_malformed_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_model: 64\n  d_ff: [128\n")
    with pytest.raises(ConfigError, match=r"bad.yaml' line \d+, column \d+: not valid YAML"):
        load_config([bad])
    proc = subprocess.run(
        [sys.executable, "-m", "moe_core.config", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: config file '{bad}' line 4")


def test_a_config_file_over_the_size_limit_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("train: {iters: 3}\n#" + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"big.yaml' is 1.0 MiB, over the 1 MiB a config file may hold"):
        load_config([big])


def test_a_deeply_nested_config_file_is_refused_before_anything_recurses(tmp_path):
    """Nested far past Python's recursion limit, which libyaml's composer overflows the C stack of."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("train: " + "[" * 200_000 + "]" * 200_000 + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "moe_core.config", "--config", str(deep)], capture_output=True, text=True, timeout=120
    )
    message = f"error: config file '{deep}' line 1: nests lists and mappings deeper than 32 levels"
    assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr[-2000:]


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([tmp_path / "missing.yaml"])


def test_impossible_layouts():
    assert layout_error(4, 4, 1) is None and layout_error(4, 8, 2) is None and layout_error(4, 4, 2) is None
    assert "must divide moe.num_experts" in layout_error(4, 6, 4)
    assert "must divide world_size=4" in layout_error(4, 8, 1)
    with pytest.raises(ConfigError, match="parallel.world_size"):
        load_config(overrides=["parallel.world_size=3", "moe.num_experts=4", "moe.experts_per_rank=1"])


@pytest.mark.parametrize("world, experts", [(3, 8), (4, 8), (6, 8), (12, 16), (6, 9)])
def test_a_layout_error_suggests_experts_per_rank_that_fits(world, experts):
    """The suggested experts_per_rank is itself a valid layout: the most expert parallelism that fits."""
    message = layout_error(world, experts, 1)
    suggested = int(re.search(r"use experts_per_rank=(\d+)", message).group(1))
    assert layout_error(world, experts, suggested) is None
    assert all(layout_error(world, experts, fewer) is not None for fewer in range(1, suggested))


def test_sweep_expansion_derives_experts_per_rank_and_skips_impossible_points_on_request():
    cfg = load_config(overrides=["sweep.world_size=[4]", "sweep.num_experts=[4,8]", "sweep.policy=[overlap]"])
    points, skipped = sweep_points(cfg)
    assert [p["experts_per_rank"] for p in points] == [1, 2] and not skipped
    impossible = ["sweep.world_size=[4]", "sweep.num_experts=[8]", "sweep.experts_per_rank=[1,2]"]
    with pytest.raises(ConfigError, match="sweep.skip_impossible"):
        load_config(overrides=impossible)
    cfg = load_config(overrides=[*impossible, "sweep.skip_impossible=true"])
    points, skipped = sweep_points(cfg)
    assert len(points) == 2 and len(skipped) == 2  # experts_per_rank=1 needs 8 ranks
    assert point_name(points[0]) == "ws4_e8_epr2_sequential_s0"


def test_config_is_read_only():
    cfg = load_config()
    with pytest.raises(Exception, match="read-only"):
        cfg.moe.num_experts = 2


@pytest.mark.parametrize(
    "args", [["moe.num_experts=abc"], ["--config", "configs/none.yaml"], ["parallel.world_size=3"]]
)
def test_train_step_cli_rejects_bad_input_before_starting(tmp_path, args):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "train_step", f"results_dir={out}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: config")
    assert not out.exists()


def test_switching_profile_drops_a_saved_hardware_section(tmp_path):
    from moe_core.config.load import save_config

    save_config(load_config(["configs/default.yaml"], ["hardware.devices_per_node=2"]), tmp_path / "resolved.yaml")
    same = load_config([tmp_path / "resolved.yaml"])
    assert same.hardware.name == "local-cpu" and same.hardware.devices_per_node == 2
    other = load_config([tmp_path / "resolved.yaml"], ["hardware_profile=lina-a100-4x4"])
    assert other.hardware.name == "lina-a100-4x4" and other.hardware.nic_GBps == 12.5


def test_saving_the_same_config_leaves_the_file_alone(tmp_path):
    """The workflow reruns what is older than the resolved config: an unchanged config must not
    move its modification time, a changed one must."""
    from moe_core.config.load import save_config

    path = tmp_path / "config" / "resolved.yaml"
    assert save_config(load_config(["configs/default.yaml"]), path)
    os.utime(path, (1.0, 1.0))
    assert not save_config(load_config(["configs/default.yaml"]), path) and path.stat().st_mtime == 1.0
    assert save_config(load_config(["configs/default.yaml"], ["train.iters=11"]), path)
    assert path.stat().st_mtime > 1.0 and load_config([path]).train.iters == 11


@pytest.mark.parametrize("entry", ["train_step", "simulate"])
def test_no_record_resolves_outside_results_dir(tmp_path, entry):
    """``paper`` becomes a path component of every record: a value that climbs out of results_dir
    is refused before anything starts, and nothing is written anywhere."""
    results = tmp_path / "a" / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments",
            entry,
            "--config",
            "configs/default.yaml",
            f"results_dir={results}",
            "paper=../../escaped",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "config key 'paper'" in proc.stderr
    assert not any(tmp_path.rglob("*.json")) and not (tmp_path / "escaped").exists()


def test_hardware_overrides_apply_even_when_they_rename_the_profile():
    """The launcher's loopback fallback renames the profile and turns emulation off on the command
    line; both must reach the record (a saved file's section of another profile is dropped)."""
    cfg = load_config(
        ["configs/default.yaml"],
        [
            "hardware_profile=emulated-2x2",
            "hardware.emulation.enabled=false",
            "hardware.name=emulated-2x2-loopback-fallback",
            "parallel.world_size=4",
        ],
    )
    assert cfg.hardware.name == "emulated-2x2-loopback-fallback" and not cfg.hardware.emulation.enabled


# A few bad inputs through the workflow and an entry point: refused at parse, naming the key, with no
# record (nor any file of the run) written under the run's results_dir.
WORKFLOW_BAD_INPUTS = [
    ("sweep={seed: [-1]}", "sweep.seed"),
    ("monta={overrides: [results_dir=elsewhere]}", "monta.overrides[0]"),
    ("dispatch_study={skews: ['zipf:1 .0']}", "dispatch_study.skews"),
    ("axonn={model_profile: /etc/passwd}", "axonn.model_profile"),
]


@pytest.mark.slow
@pytest.mark.parametrize("config,key", WORKFLOW_BAD_INPUTS, ids=[c for c, _ in WORKFLOW_BAD_INPUTS])
def test_workflow_refuses_bad_input_at_parse(tmp_path, config, key):
    results = tmp_path / "results"
    proc = subprocess.run(
        ["snakemake", "-n", "--cores", "1", "--configfile", "configs/ci.yaml"]
        + ["--config", f"results_dir={results}", config],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and f"config key '{key}'" in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert not results.exists()


SIMULATE_BAD_INPUTS = [
    ("sim_sweep.overrides=[paper=../../x]", "sim_sweep.overrides[0]"),
    ("sim_sweep.world_size=[10000]", "sim_sweep.world_size"),
    ("hardware.nics_per_node=0", "hardware.nics_per_node"),
]


@pytest.mark.parametrize("override,key", SIMULATE_BAD_INPUTS, ids=[o for o, _ in SIMULATE_BAD_INPUTS])
def test_simulate_refuses_bad_input_before_writing(tmp_path, override, key):
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "simulate", "--sweep", "--config", "configs/ci.yaml"]
        + [f"results_dir={results}", override],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and f"config key '{key}'" in proc.stderr, proc.stderr
    assert not any(tmp_path.rglob("*"))


def test_config_check_names_an_override_list_entry():
    """``python -m moe_core.config`` (its module imported twice) checks lists whose uses switch profile."""
    proc = subprocess.run(
        [sys.executable, "-m", "moe_core.config", "--config", "configs/default.yaml"]
        + ["sim_sweep.overrides=[model.n_heads=3]"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: config key 'sim_sweep.overrides[0]'"), proc.stderr


def test_a_passed_runs_checks_are_inherited_by_child_processes_on_the_same_host(monkeypatch):
    """A launcher's ranks and a workflow's jobs skip what their parent checked; another config, or the
    same config on another host, is checked."""
    from moe_core.schema import run_checks

    monkeypatch.delenv(run_checks.PASSED_ENV, raising=False)
    cfg = load_config(["configs/ci.yaml"])
    (key,) = os.environ[run_checks.PASSED_ENV].split(",")
    assert key.endswith("@" + socket.gethostname())
    calls = []
    monkeypatch.setattr(run_checks, "_check_run", calls.append)
    run_checks.check_run(cfg)
    assert calls == []  # inherited: not checked again
    monkeypatch.setenv(run_checks.PASSED_ENV, key.split("@")[0] + "@another-host")
    run_checks.check_run(cfg)
    assert calls == [cfg]


@dataclass(frozen=True)
class _TopOneExchange(Scheduled):
    """A new schedule of the all-to-all that states one need of its own."""

    def refusal(self, cfg):
        if cfg.moe.top_k != 1:
            return "this exchange sends each token once; set moe.top_k=1"
        return super().refusal(cfg)


def test_a_new_exchange_checks_the_config_itself_with_no_schema_change():
    """Compatibility is each exchange's own check: a new policy's schedule refuses what it cannot run,
    and the error names the policy's key; it schedules the flat all-to-all, so a dispatcher that runs
    another is refused beside it."""
    register_policy(PolicySpec("top-one", lambda inputs: replace(sequential_plan(inputs), exchange=_TopOneExchange())))
    try:
        assert load_config(overrides=["comm.policy=top-one", "moe.top_k=1"]).comm.policy == "top-one"
        with pytest.raises(ConfigError, match="config key 'comm.policy': policy 'top-one': this exchange sends"):
            load_config(overrides=["comm.policy=top-one", "moe.top_k=2"])
        with pytest.raises(ConfigError, match="config key 'comm.policy': policy 'top-one': .*moe.dispatcher=hierarch"):
            load_config(overrides=["comm.policy=top-one", "moe.top_k=1", "moe.dispatcher=hierarchical"])
    finally:
        del POLICIES["top-one"]


def test_the_resolved_configs_keys_keep_their_order_and_so_its_digest():
    """The resolved config's name is the digest of its YAML, keys in order (moe_core.schema.derive):
    a reordered schema would rename every run's snapshot and re-measure every point of an existing
    results directory. The order: the core's sections, the dispatcher study's, the papers', W&B."""
    keys = list(load_config().keys())
    core = ["hardware", "model", "moe", "parallel", "comm", "train", "collectives", "sweep", "sim_sweep"]
    assert keys[keys.index("hardware") : keys.index("calibration")] == core
    assert keys[keys.index("calibration") :] == [
        "calibration",
        "dispatch_study",
        "aurora",
        "axonn",
        "gshard",
        "lina",
        "inference",
        "monta",
        "wandb",
    ]


def test_the_config_command_prints_the_resolved_config_or_one_section(capsys):
    from omegaconf import OmegaConf

    from moe_core.config.load import main

    assert main(["--print", "moe", "moe.top_k=1", "moe.num_experts=8", "moe.experts_per_rank=2"]) == 0
    moe = OmegaConf.create(capsys.readouterr().out)
    assert moe.top_k == 1 and moe.num_experts == 8 and "capacity_factor" in moe
    assert main(["--print", "hardware_profile=emulated-2x2"]) == 0
    whole = OmegaConf.create(capsys.readouterr().out)
    assert whole.hardware.name == "emulated-2x2" and "dispatch_study" in whole
    assert main(["--print", "nope"]) == 2
    assert "no such section" in capsys.readouterr().err


def test_every_key_of_the_megatron_name_map_exists():
    """moe_core/README.md maps Megatron-Core's and DeepSpeed's names to ours: each key it names is one."""
    import re
    from pathlib import Path

    from omegaconf import OmegaConf

    readme = (Path(__file__).parents[1] / "moe_core/README.md").read_text()
    table = readme.split("## From Megatron-Core and DeepSpeed names", 1)[1].split("\n## ", 1)[0]
    keys = set(re.findall(r"`((?:moe|model|parallel|train|comm)\.[a-z_0-9]+)", table))
    assert len(keys) >= 20
    cfg = load_config()
    missing = [key for key in keys if OmegaConf.select(cfg, key, default=None) is None]
    assert not missing, f"moe_core/README.md names keys the config lacks: {missing}"


def test_the_sections_order_does_not_depend_on_what_was_imported_first():
    """Importing the papers' registry before the config loader (analysis does, to colour the
    dispatchers) gives the same sections in the same order, so the same digest."""
    code = "import moe_core.papers; from moe_core.config.load import load_config; print(list(load_config()))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert first.stdout.strip() == str(list(load_config()))


def test_a_configs_wandb_group_names_its_sweep_digest_and_hardware():
    """Runs of another config or on other hardware never share a W&B group; the group's digest is the
    resolved config's (its snapshot's name), which the group itself does not change; a set group stays."""
    from moe_core.config.load import config_digest

    cfg = load_config(["configs/default.yaml", "configs/ci.yaml"])
    assert cfg.wandb.group == f"ci-{config_digest(cfg)}@local-cpu"
    other = load_config(["configs/default.yaml", "configs/ci.yaml"], ["train.iters=5"])
    assert other.wandb.group.startswith("ci-") and other.wandb.group != cfg.wandb.group
    assert load_config(["configs/default.yaml"], ["hardware_profile=lina-a100-4x4"]).wandb.group.endswith(
        "@lina-a100-4x4"
    )
    named = load_config(["configs/default.yaml", "configs/ci.yaml"], ["wandb.group=mine"])
    assert named.wandb.group == "mine" and config_digest(named) == config_digest(cfg)
