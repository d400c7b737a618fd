"""How fast the simulator is: wall time to simulate one training step of a 32-MoE-layer model.

    python -m experiments.sim_bench [--gpus 64 256 1024 4096] [--hardware h100-ndr-cluster]

Prints, side by side, the GPU count, the operations in the step DAG, the links of the topology,
the seconds to build the DAG (including the meta-device model that fixes the gradient buckets) and
the seconds to simulate it. Targets on a 2-core machine: 1024 GPUs <= 1 s, 4096 GPUs <= 5 s.
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--hardware", default="h100-ndr-cluster")
    args = parser.parse_args(argv)
    from experiments.impl.sim_bench import run  # the simulator: once the command line is parsed

    run(args)


if __name__ == "__main__":
    main()
