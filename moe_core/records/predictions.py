"""What a paper's model or simulation study predicts for one point, before it is a record.

The studies in moe_core/papers return these; their entry points write each as a record
(experiments.benchmark.prediction_record), so a study never imports the measured run's skeleton.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Prediction:
    """One record to write: its experiment, point name, the hardware profile it models, its
    parameters (a sensitivity run's with its setting, ``unstated``) and predicted metrics;
    ``backend``: the step simulator's (``sim``) or a closed-form model's (``model``)."""

    experiment: str
    name: str
    hardware: str
    params: dict[str, Any]
    metrics: dict[str, float]
    backend: str = "sim"
