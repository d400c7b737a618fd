"""Every entry point's command line: ``--help`` exits 0 without importing torch, scipy or pandas (so it
answers at once on any machine), and names config keys the schema has."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from moe_core.config.load import load_config

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (ROOT / "experiments").glob("*.py")
ENTRY_POINTS = sorted(p.stem for p in COMMANDS if 'if __name__ == "__main__":' in p.read_text())
HEAVY = ("torch", "scipy", "pandas")


def test_the_entry_points_are_found():
    assert {"collectives", "simulate", "train_step", "launch", "gpu_check", "dispatchers"} <= set(ENTRY_POINTS)
    assert "rank_watch" not in ENTRY_POINTS  # the launcher's helper, no command


def imported_at_top(importtime: str) -> set[str]:
    """The top-level packages a ``python -X importtime`` run imported (its stderr)."""
    names = (line.rsplit("|", 1)[-1].strip() for line in importtime.splitlines() if line.startswith("import time:"))
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help_exits_0_before_torch_scipy_or_pandas_are_imported(name):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", f"experiments.{name}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:")
    assert imported_at_top(proc.stderr).isdisjoint(HEAVY), sorted(imported_at_top(proc.stderr) & set(HEAVY))
    keys = getattr(importlib.import_module(f"experiments.{name}"), "CONFIG_KEYS", ())
    assert f"reads: {', '.join(keys)}" in proc.stdout if keys else "reads:" not in proc.stdout


def test_the_config_keys_an_entry_point_names_are_the_schemas():
    cfg = load_config()
    named = {
        name: importlib.import_module(f"experiments.{name}").CONFIG_KEYS
        for name in ENTRY_POINTS
        if hasattr(importlib.import_module(f"experiments.{name}"), "CONFIG_KEYS")
    }
    assert {"collectives", "simulate", "train_step", "gshard", "launch"} <= set(named)
    for name, keys in named.items():
        missing = [key for key in keys if OmegaConf.select(cfg, key, default=KeyError) is KeyError]
        assert not missing, (name, missing)


def test_the_launchers_help_shows_what_follows_the_double_dash():
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.launch", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert "--nproc N -- -m MODULE" in proc.stdout and "after `--`" in proc.stdout
