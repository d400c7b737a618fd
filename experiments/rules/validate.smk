# Simulator calibration on this run's measured records, then validation on the held-out ones
# (moe_core.sim.calibrate.calibration_split decides which is which).


rule calibrate:
    """Fit the measured testbed's profile (link bandwidths, collective terms, compute rate)."""
    input:
        config=RESOLVED_CONFIG,
        records=[*TRAIN_RECORDS, *COLLECTIVE_RECORDS],
    output:
        f"{RESULTS}/calibration/{CFG.hardware.name}-calibrated.yaml",
    log:
        f"{RESULTS}/logs/calibrate.log",
    conda:
        "../../environment.yml"
    localrule: True
    shell:
        "python -m experiments.calibrate --config {input.config} --out {output} {input.records} > {log} 2>&1"


rule validate:
    """Predict every held-out measured point with the calibrated simulator."""
    input:
        calibrated=rules.calibrate.output[0],
        records=[*TRAIN_RECORDS, *COLLECTIVE_RECORDS],
    output:
        report(
            f"{RESULTS}/tables/sim_validation.csv",
            caption="../../analysis/captions/sim_validation_table.rst",
            category="Simulator validation",
        ),
    log:
        f"{RESULTS}/logs/validate.log",
    conda:
        "../../environment.yml"
    localrule: True
    shell:
        "python -m experiments.validate --calibrated {input.calibrated} --out {output} {input.records} > {log} 2>&1"
