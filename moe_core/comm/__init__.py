"""Communication: ``all_to_all`` (differentiable, pipelined, ordered and tensor-parallel
drop/all-gather all-to-alls), ``hierarchical_a2a`` (the two-phase all-to-all), ``transmission``
(all-to-all transmission schedules and their time models), ``ordered_a2a`` (a schedule run as
point-to-point rounds), ``workloads`` (traffic matrices)."""
