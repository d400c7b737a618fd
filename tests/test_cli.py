"""Every entry point's command line, through the runner (``python -m experiments NAME``): ``--help``
exits 0 without importing torch, scipy or pandas (so it answers at once on any machine) and names
config keys the schema has; the registry (experiments.entry_points) and the modules agree."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments import launch
from experiments.entry_points import ENTRY_POINTS
from moe_core.config.load import load_config

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "scipy", "pandas")


def defines_run(path: Path) -> bool:
    """Whether the module at ``path`` defines ``run`` at its top level: the work of an entry point."""
    return any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in ast.parse(path.read_text()).body)


def imported_at_top(importtime: str) -> set[str]:
    """The top-level packages a ``python -X importtime`` run imported (its stderr)."""
    names = (line.rsplit("|", 1)[-1].strip() for line in importtime.splitlines() if line.startswith("import time:"))
    return {name.split(".")[0] for name in names}


def light_help(*module_args: str) -> str:
    """The stdout of ``python -m <module_args> --help``, checked to exit 0 with a usage and to import
    none of HEAVY."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", *module_args, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:")
    assert imported_at_top(proc.stderr).isdisjoint(HEAVY), sorted(imported_at_top(proc.stderr) & set(HEAVY))
    return proc.stdout


def test_the_registry_names_every_module_that_defines_run():
    """A module without a line in the registry, or a line without a module, fails here."""
    modules = sorted(path.stem for path in (ROOT / "experiments").glob("*.py") if defines_run(path))
    assert sorted(ENTRY_POINTS) == modules
    assert {"collectives", "simulate", "train_step", "gpu_check", "dispatchers"} <= set(ENTRY_POINTS)
    assert not {"launch", "rank_watch"} & set(ENTRY_POINTS)  # the launcher and its helper: modules of their own


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_help_exits_0_before_torch_scipy_or_pandas_are_imported(name):
    out = light_help("experiments", name)
    assert out.startswith(f"usage: python -m experiments {name} ")
    keys = ENTRY_POINTS[name].config_keys
    assert f"reads: {', '.join(keys)}" in out if keys else "reads:" not in out


def test_the_runners_help_lists_every_entry_point():
    out = light_help("experiments")
    assert all(f"\n  {name} " in out for name in ENTRY_POINTS)


@pytest.mark.parametrize("argv", [["no_such_entry"], []])
def test_an_unknown_or_missing_name_exits_2_listing_the_entry_points(argv):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"the entry points: {', '.join(ENTRY_POINTS)}" in proc.stderr
    assert ("unknown entry point 'no_such_entry'" in proc.stderr) == bool(argv)


def test_the_config_keys_an_entry_point_names_are_the_schemas():
    cfg = load_config()
    named = {name: entry.config_keys for name, entry in ENTRY_POINTS.items() if entry.config_keys}
    assert {"collectives", "simulate", "train_step", "gshard"} <= set(named)
    for name, keys in {**named, "launch": launch.CONFIG_KEYS}.items():
        missing = [key for key in keys if OmegaConf.select(cfg, key, default=KeyError) is KeyError]
        assert not missing, (name, missing)


def test_the_launchers_help_is_light_and_shows_what_follows_the_double_dash():
    out = light_help("experiments.launch")
    assert "--nproc N -- -m experiments NAME" in out and "after `--`" in out


def test_an_entry_points_module_run_alone_exits_2_naming_the_runner():
    """``python -m experiments.NAME`` (the spelling before the runner) would run nothing and exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train_step", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "python -m experiments train_step" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "module",
    [
        "analysis.collect",
        "analysis.compare",
        "analysis.figures",
        "analysis.tables",
        "analysis.report",
        "analysis.tracking",
        "analysis.summary",
        "moe_core.config.load",
    ],
)
def test_every_other_commands_help_shows_how_to_run_it(module, capsys):
    """A module run with ``python -m`` names itself so in its usage line, not as its file (``collect.py``,
    ``__main__.py``)."""
    main = __import__(module, fromlist=["main"]).main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    command = module.removesuffix(".load")  # moe_core.config runs moe_core.config.load's main
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith(f"usage: python -m {command} ")
