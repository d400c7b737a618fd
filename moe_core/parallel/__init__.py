"""Parallelism: ``layout`` (named mesh axes), ``parallelize`` (DeviceMesh, process groups, expert
and tensor sharding applied to a model from outside), ``tensor_parallel`` (Megatron's
column/row-parallel split of the dense layers and experts), ``grid`` (3D tensor parallelism on a data
x depth x row x col grid: each linear's split and its collectives; no torch), ``grid_parallel``
(the grid's linear layers, their collectives and overlaps)."""
