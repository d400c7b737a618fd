"""What one host does and measures, below everything else (torch and psutil only): ``timing``
(phase timers), ``noise`` (how much of the host others used), ``processes`` (exit codes and process
facts the launcher shares with the ranks), ``testbed`` (an emulated multi-node cluster on one
host), ``time_slicing`` (how the host's scheduler delays ranks that outnumber its cores)."""
