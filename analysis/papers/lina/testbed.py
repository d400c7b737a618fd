"""Lina's testbed and the expert counts that several of its figures share, for every module of
analysis.papers.lina."""

LINA_GPUS = 16  # Lina's testbed: 4 nodes x 4 A100
LINA_TESTBED = "lina-a100-4x4"  # configs/hardware: Lina's 4 x 4 A100, 100 Gb/s IB per node
LINA_XL_EXPERTS = (4, 16)  # the Transformer-XL variants of Table 1 and Fig 6
