"""Byte units, one definition for the core, the experiments and the analysis: ``GB`` is the decimal
gigabyte of link rates and spec sheets (GB/s), ``KiB``/``MiB``/``GiB`` the binary sizes of buffers
and messages."""

GB = 1e9
KiB = 2**10
MiB = 2**20
GiB = 2**30
