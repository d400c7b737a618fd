"""Test session settings: W&B off unless a test turns it on.

Every entry point mirrors the records it writes to W&B (moe_core.records.tracking), offline by
default; most tests write records, and a run directory each would only cost seconds and files.
Set before any test, so the processes the tests start inherit it; tests/test_tracking.py sets
``WANDB_MODE=offline`` itself, and a ``WANDB_MODE`` set outside the tests is kept. And the tidy tables
the analysis tests share.
"""

import os

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")


def pytest_collection_modifyitems(items):
    """The SLURM tests first: each takes minutes (a cluster started in namespaces), and two workers
    given whole files (pyproject's ``--dist loadfile``) finish together when the longest files start
    first; collected last, they kept one worker busy for minutes after the other had run out of work."""
    items.sort(key=lambda item: item.get_closest_marker("slurm") is None)  # stable: the rest keep their order


# ---- the analysis tests' tables (tests/test_analysis_*.py) ---------------------------------------
# Made once per test file that asks for them. The records' writers (tests/analysis_records.py) are
# imported when a fixture is made, so a session without an analysis test imports neither them nor torch.


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The tidy tables (records, samples) of a measured run on this machine: training steps and collectives."""
    from analysis_records import write_collectives, write_train_step

    from analysis.collect import collect

    root = tmp_path_factory.mktemp("results")
    return collect(write_train_step(root) + write_collectives(root))


@pytest.fixture(scope="module")
def figure_tables(tmp_path_factory):
    """The tidy tables of every experiment a figure, table or paper's reproducer reads, measured and simulated."""
    from analysis_records import (
        write_aurora,
        write_axonn,
        write_collectives,
        write_dispatchers,
        write_external_dispatch,
        write_external_steps,
        write_external_validation,
        write_gshard,
        write_lina,
        write_monta,
        write_sim_train_step,
        write_train_step,
    )

    from analysis.collect import collect

    root = tmp_path_factory.mktemp("figures")
    return collect(
        write_train_step(root)
        + write_collectives(root)
        + write_sim_train_step(root)
        + write_aurora(root)
        + write_lina(root)
        + write_monta(root)
        + write_axonn(root)
        + write_gshard(root)
        + write_dispatchers(root)
        + write_external_validation(root)
        + write_external_dispatch(root)
        + write_external_steps(root)
    )
