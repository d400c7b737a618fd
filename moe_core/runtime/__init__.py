"""Running measured jobs: ``distributed`` (process-group start-up, failing ranks), ``processes``
(exit codes and process facts the launcher shares with the ranks), ``timing`` (phase timers),
``noise`` (how much of the host others used), ``benchmark`` (the measured microbenchmarks'
skeleton), ``profiling`` (kernel-level profiles of training steps), ``testbed`` (an emulated
multi-node cluster), ``time_slicing`` (how the host's scheduler delays ranks that outnumber its cores)."""
