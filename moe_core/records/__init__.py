"""What a run writes: ``results`` (records, written atomically), ``step_metrics`` (the step's
terms, one definition for both executors), ``tracking`` (W&B), ``console`` (every table printed on
the console). What a record must hold to be analysed is checked by analysis.record_schema."""
