"""What a run writes: ``results`` (records, written atomically), ``record_schema`` (their schema),
``step_metrics`` (the step's terms, one definition for both executors), ``tracking`` (W&B),
``units`` (byte units), ``console`` (every table printed on the console)."""
