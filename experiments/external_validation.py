"""External validation: the simulator against published hardware measurements that no one on this project made.

    python -m experiments.external_validation --config configs/default.yaml

analysis/external_hardware.yaml lists each published number with its source and setting. For every entry the
simulator (moe_core.sim; no processes, no tensors) predicts the same quantity on the entry's hardware profile as
the profile is. Nothing here is fitted to these numbers: they are the held-out check, and tuning a profile to them
would make it circular. The prediction is computed the way the source computes its number:

* ``busbw_GBps`` (nccl-tests): size / time, times the collective's nccl-tests bus factor;
* ``nic_GBps``: the bytes one NIC carries in a uniform all-to-all, over the time;
* ``deepep_nvl_GBps`` / ``deepep_rdma_GBps`` (DeepEP's normal kernels, its tests/test_intranode.py and
  test_internode.py): the bytes DeepEP counts for a rank over the time: every token the rank receives, its own
  included ("NVL"), or one copy per (token, destination node), its own node included ("RDMA").

Records: ``results/raw/common/external_validation/<id>.json`` (mode simulated, backend sim, hardware: the
profile) with metrics ``predicted``, ``published``, ``published_low``, ``published_high``,
``rel_error = predicted / published - 1`` and ``predicted_ms`` (the simulated time of the operation).
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.external_validation import (
        run,  # the models and the simulator: once the command line is parsed
    )

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
