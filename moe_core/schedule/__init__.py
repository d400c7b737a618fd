"""The communication plan and who runs it: ``plan`` (the plan both executors follow), ``policies``
(the policy registry and the baselines' decisions; no torch), ``executor`` (the measured executor of
a plan; the simulated one is ``moe_core.sim``)."""
