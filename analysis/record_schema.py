"""What a raw record must hold to be analysed: its format and its content, in one place.

moe_core/records/results.py writes records; analysis.collect reads them and checks each one here before any
table is written, and the writers' tests check what they write the same way. A record that breaks a
rule stops the analysis with one line naming the file, the field, its value and the rule::

    results/raw/lina/sim_train_step/x.json: metrics.step_ms.median = -3.2: a time must be >= 0

* Format (pydantic, :class:`Record`): the keys of moe_core/records/results.py's schema, every metric a single
  ``{"value": x}`` or a summary ``{median, p95, mean, min, max, n}``, every number finite, ``n`` a
  positive integer, every parameter a scalar, and the optional ``noise`` section of measured runs.
* Content (:data:`CONTENT_RULES`, one function each): the metrics the analysis reads from every
  record of an experiment (:data:`REQUIRED_METRICS`), units by name (times, shares, bandwidths,
  counts), summaries equal to the samples they summarise, a training-step record's params
  matching its point name and its resolved config (records that carry one, as every writer's do),
  and its testbed matching what it ran on (:func:`provenance`).
* Integrity (:func:`digest_problem`, not a content rule: a record is digested when it is written):
  its content still matches the digest its writer gave it.

Rules over several records (one record per point, one type per parameter) are analysis.collect's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

from omegaconf import OmegaConf
from pydantic import AfterValidator, AllowInfNan, BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from moe_core.config import load as _registry  # noqa: F401  (registers the papers' policies, which point names spell)
from moe_core.dispatch import AUTO, configured_name
from moe_core.records.results import DIGEST_KEY, MODES, SCHEMA_VERSION, record_digest, summarize
from moe_core.schema.derive import hardware_profile
from moe_core.schema.points import point_name, point_overrides
from moe_core.schema.sections import hardware_profiles

STAT_FIELDS = ("median", "p95", "mean", "min", "max")
FiniteNumber = Annotated[float, AllowInfNan(False)]


class RecordSchemaError(ValueError):
    """A record breaks a format or content rule; the message names the field, its value and the rule."""


def _scalar(value: Any) -> Any:
    """A parameter value as the tables hold one (a column cell), or ValueError."""
    if value is None or isinstance(value, (str, bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise ValueError("a parameter must be a string, a finite number, a boolean or null")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Summary(_Strict):
    """A per-iteration metric: the summary of its samples (moe_core.records.results.summarize)."""

    median: FiniteNumber
    p95: FiniteNumber
    mean: FiniteNumber
    min: FiniteNumber
    max: FiniteNumber
    n: Annotated[int, Field(ge=1)]


class Single(_Strict):
    """A single-value metric (a final loss, a model's prediction)."""

    value: FiniteNumber


METRIC_KINDS = ("single", "summary")  # pydantic's tags of the two kinds, left out of the field names
Metric = Annotated[
    Annotated[Single, Tag("single")] | Annotated[Summary, Tag("summary")],
    Discriminator(lambda stats: "single" if isinstance(stats, dict) and "value" in stats else "summary"),
]


class Noise(_Strict):
    """How busy the machine was during a measured run (optional)."""

    load_avg: Annotated[list[Annotated[FiniteNumber, Field(ge=0)]], Field(min_length=3, max_length=3)]
    cpus: Annotated[int, Field(ge=1)]
    contention: Annotated[FiniteNumber, Field(ge=0, le=1)] | None
    cv: dict[str, Annotated[FiniteNumber, Field(ge=0)]]


class Record(BaseModel):
    """The format of a record (moe_core/records/results.py's docstring); unknown top-level keys are kept."""

    model_config = ConfigDict(strict=True, extra="allow")

    schema_version: Literal[SCHEMA_VERSION]  # type: ignore[valid-type]
    paper: str
    experiment: str
    point: str
    mode: Literal[MODES]  # type: ignore[valid-type]
    backend: str
    hardware: str
    params: dict[str, Annotated[Any, AfterValidator(_scalar)]]
    metrics: dict[str, Metric]
    samples: dict[str, list[FiniteNumber]] = {}
    environment: dict[str, Any] = {}
    config: dict[str, Any] = {}
    noise: Noise | None = None
    digest: str | None = None  # moe_core.records.results.record_digest, added when the record is written


# ---- content -------------------------------------------------------------------------------------

# The metrics the reproducers and figures (analysis/papers/*.py) read from every record of an
# experiment; a record without one would drop out of a mean, or a figure, unseen.
# Metrics only some records of an experiment carry (a policy's own, a newer writer's) are checked by
# the reproducers that read them (analysis.compare.complete_points).
REQUIRED_METRICS: dict[str, tuple[str, ...]] = {
    "train_step": ("step_ms", "a2a_ms", "a2a_share", *(f"{p}_ms" for p in ("gate", "dispatch_a2a", "expert"))),
    "sim_train_step": ("step_ms",),
    "collectives": ("time_ms", "busbw_GBps"),
    "gshard_collectives": ("time_ms", "line_rate_ms"),
    "gshard_memory": ("memory_GB", "memory_share_of_device"),
    "gshard_scaling": ("step_ms", "steps_per_s", "a2a_share"),
    "inference": ("forward_ms", "moe_layer_ms"),
    "aurora_order": ("a2a_over_lower_bound",),
    "aurora_deployment": ("inference_ms", "gpu_utilisation"),
    "aurora_imprecision": ("aurora_speedup",),
    "aurora_gap": ("gap_to_optimum",),
    "axonn_scaling": ("batch_s", "pflops", "peak_share"),
    "axonn_ablation": ("step_ms", "grid_comm_ms"),
    "axonn_ranking": ("predicted_comm_s", "model_rank"),
    "axonn_grid_predictions": ("predicted_comm_ms",),
    "dispatchers": ("exchange_ms", "dropped_fraction", "imbalance", "wrong_rows"),
    "dispatchers_sim": ("exchange_ms", "dropped_fraction", "imbalance"),
    "dispatchers_predictions": ("predicted_exchange_ms",),
    "external_validation": ("published", "predicted", "rel_error"),
    "external_dispatch": ("published", "predicted", "rel_error", "loo_rel_error"),
    "external_steps": ("published", "predicted", "step_error"),
    "monta_a2a": ("exchange_ms",),
    "monta_chunk_model": ("model_exchange_ms", "chosen"),
    "monta_strategy": ("model_exchange_ms", "model_rank"),
}
TRAIN_STEP_EXPERIMENTS = ("train_step", "sim_train_step")  # named by moe_core.schema.points.point_name

ONE_DAY_S = 86400.0  # no step, collective or batch the suite times lasts a day: a larger time is corrupt
TIME_UNITS = {"_ms": 1e-3, "_s": 1.0, "_us": 1e-6}  # metric name suffix -> seconds per unit
SHARE = re.compile(r"(share|fraction|utilisation)(_of_moe|_k\d+)?$")  # a part of a whole, in [0, 1]
BANDWIDTH = re.compile(r"_GBps$")
COUNT = re.compile(r"(_bytes|^links|^operations|^rounds|^repacks)$")  # whole numbers
SUMMARY_RTOL = 1e-9  # summaries are recomputed with the writer's own summarize(): equal up to rounding

Problem = tuple[str, Any, str]  # (field, its value, the rule it breaks)
MISSING = object()  # the value of a field that is not there


def _numbers(record: dict[str, Any], name: str) -> Iterator[tuple[str, float]]:
    """(field, value) of every number of metric ``name``: its statistics (not ``n``) and samples."""
    for stat, value in record["metrics"][name].items():
        if stat != "n":
            yield f"metrics.{name}.{stat}", value
    for i, value in enumerate(record.get("samples", {}).get(name, [])):
        yield f"samples.{name}[{i}]", value


def required_metrics(record: dict[str, Any]) -> Iterator[Problem]:
    """Every metric the analysis reads from each record of the experiment is there."""
    for name in REQUIRED_METRICS.get(record["experiment"], ()):
        if name not in record["metrics"]:
            yield f"metrics.{name}", MISSING, f"every {record['experiment']} record has it (the analysis reads it)"


def times(record: dict[str, Any]) -> Iterator[Problem]:
    """A time (``*_ms``, ``*_s``, ``*_us``) is >= 0 and below one day."""
    for name in record["metrics"]:
        unit = next((scale for suffix, scale in TIME_UNITS.items() if name.endswith(suffix)), None)
        for field, value in _numbers(record, name) if unit else ():
            if value < 0:
                yield field, value, "a time must be >= 0"
            elif value * unit > ONE_DAY_S:
                yield field, value, "a time above one day is no measurement of this suite"


def shares(record: dict[str, Any]) -> Iterator[Problem]:
    """A share, fraction or utilisation is in [0, 1]."""
    for name in filter(SHARE.search, record["metrics"]):
        for field, value in _numbers(record, name):
            if not 0 <= value <= 1:
                yield field, value, "a share must be in [0, 1]"


def bandwidths(record: dict[str, Any]) -> Iterator[Problem]:
    """A bandwidth (``*_GBps``) is > 0."""
    for name in filter(BANDWIDTH.search, record["metrics"]):
        for field, value in _numbers(record, name):
            if not value > 0:
                yield field, value, "a bandwidth must be > 0"


def counts(record: dict[str, Any]) -> Iterator[Problem]:
    """A count (``*_bytes``, links, operations, rounds) is a whole number >= 0."""
    for name in filter(COUNT.search, record["metrics"]):
        for field, value in _numbers(record, name):
            if value < 0 or not float(value).is_integer():
                yield field, value, "a count must be a whole number >= 0"


def summaries(record: dict[str, Any]) -> Iterator[Problem]:
    """A summary equals moe_core.records.results.summarize of the record's own samples of that metric."""
    for name, samples in record.get("samples", {}).items():
        stats = record["metrics"].get(name)
        if stats is None or "median" not in stats:
            yield f"samples.{name}", f"{len(samples)} samples", "samples need their summary in metrics"
            continue
        if not samples:
            yield f"samples.{name}", "[]", "a summarised metric needs its samples"
            continue
        expected = summarize(samples)
        for stat, value in expected.items():
            if not math.isclose(stats[stat], value, rel_tol=SUMMARY_RTOL):
                yield f"metrics.{name}.{stat}", stats[stat], f"the record's own samples give {value:.6g}"


def named_point(record: dict[str, Any]) -> Iterator[Problem]:
    """A training-step record's point name holds the name its params give (moe_core.schema.points.point_name)."""
    params = record["params"]
    if record["experiment"] not in TRAIN_STEP_EXPERIMENTS or not record.get("config"):
        return
    try:
        expected = point_name(params)
    except (KeyError, ValueError, TypeError) as err:
        yield "params", "…", f"a training-step record's params must name its point ({err})"
        return
    if not re.search(rf"(^|_){re.escape(expected)}($|_)", record["point"]):
        yield "point", record["point"], f"its params name the point {expected!r}"


def params_match_config(record: dict[str, Any]) -> Iterator[Problem]:
    """A training-step record's swept params equal the values of its resolved config."""
    if record["experiment"] not in TRAIN_STEP_EXPERIMENTS or not record.get("config"):
        return
    for name, value in record["params"].items():
        overrides = _override(name, value)
        if overrides is None:
            continue
        key = overrides.split("=", 1)[0]
        configured = _lookup(record["config"], key)
        if key == "moe.dispatcher" and configured == AUTO:  # the param names the one "auto" resolved to
            configured = configured_name(OmegaConf.create(record["config"]))
        if configured is not MISSING and not _same(value, configured):
            yield f"params.{name}", value, f"the record's config has {key} = {configured!r}"


def _override(name: str, value: Any) -> str | None:
    """The ``key=value`` override of param ``name`` (moe_core.schema.points.point_overrides), None if unswept."""
    try:
        return point_overrides({name: value})[0]
    except KeyError:
        return None


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` ("comm.policy") in a resolved config, or MISSING."""
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return MISSING
        config = config[part]
    return config


def _same(param: Any, configured: Any) -> bool:
    """Equal as the config holds it: a number equals the same number, whatever its JSON type."""
    if isinstance(param, bool) or isinstance(configured, bool):
        return param is configured
    if isinstance(param, (int, float)) and isinstance(configured, (int, float)):
        return math.isclose(param, configured)
    return param == configured


# A measured record's backend -> the device it runs on; a simulated record's backends (the simulator, a paper's model).
BACKEND_DEVICE = {"gloo": "cpu", "nccl": "cuda"}
MODEL_BACKENDS = ("sim", "model")


def provenance(record: dict[str, Any]) -> Iterator[Problem]:
    """A record's testbed (backend, hardware) is the one it ran on, so that no record moves a verdict by
    the testbed it claims: a simulated record's backend is a model's; a measured record's backend runs
    on the device its environment names (a CUDA run also names its GPU), the hardware profile it names
    runs that backend (where configs/hardware/ has the profile), and its resolved config ran on it."""
    backend, name = record["backend"], record["hardware"]
    if record["mode"] != "measured":
        if backend not in MODEL_BACKENDS:
            yield "backend", backend, f"a simulated record's backend is one of {list(MODEL_BACKENDS)}"
        return
    device = BACKEND_DEVICE.get(backend)
    if device is None:
        yield "backend", backend, f"a measured record's backend is one of {list(BACKEND_DEVICE)}"
        return
    if name in hardware_profiles():
        profile = hardware_profile(name)
        if (profile.backend, profile.device) != (backend, device):
            ran = f"{profile.backend} on {profile.device}, but this measured record ran {backend} on {device}"
            yield "hardware", name, f"hardware profile {name} runs {ran}"
    environment = record.get("environment", {})
    if environment.get("device", MISSING) != device:
        yield "environment.device", environment.get("device", MISSING), f"a {backend} run runs on {device}"
    elif device == "cuda" and "gpu" not in environment:
        yield "environment.gpu", MISSING, "a CUDA run records the GPU it ran on"
    configured = record.get("config", {}).get("hardware", {})
    for key, value in (("name", name), ("backend", backend), ("device", device)):
        if key in configured and configured[key] != value:
            yield (
                "hardware" if key == "name" else key,
                value,
                f"its resolved config ran on hardware.{key} = {configured[key]!r}",
            )


CONTENT_RULES: tuple[Callable[[dict[str, Any]], Iterator[Problem]], ...] = (
    required_metrics,
    times,
    shares,
    bandwidths,
    counts,
    summaries,
    named_point,
    params_match_config,
    provenance,
)


def record_problem(record: Any) -> str | None:
    """The first rule ``record`` breaks, as ``field = value: rule``, or None for a valid record."""
    try:
        Record.model_validate(record)
    except ValidationError as err:
        return _format_error(err.errors()[0])
    for rule in CONTENT_RULES:
        for field, value, why in rule(record):
            return f"{field} is missing: {why}" if value is MISSING else f"{field} = {value!r}: {why}"
    return None


def digest_problem(record: dict[str, Any]) -> str | None:
    """Why ``record`` is not as its run wrote it (moe_core.records.results.write_record digests every
    record), or None: it has no digest, or its content no longer matches it (it was edited)."""
    digest = record.get(DIGEST_KEY)
    if digest is None:
        return "digest is missing: the record was not written by moe_core.records.results.write_record"
    if digest != record_digest(record):
        return f"digest = {digest[:19]!r}…: the record has changed since its run wrote it (records are never edited)"
    return None


def check_record(record: Any, where: str) -> dict[str, Any]:
    """``record`` if it breaks no rule, else RecordSchemaError ``<where>: <field> = <value>: <rule>``."""
    problem = record_problem(record)
    if problem:
        raise RecordSchemaError(f"{where}: {problem}")
    return record


def _format_error(error: dict[str, Any]) -> str:
    """A pydantic error as ``field = value: what is wrong``, the field dotted as in the record."""
    field = ""
    for i, part in enumerate(error["loc"]):
        if i == 2 and error["loc"][0] == "metrics" and part in METRIC_KINDS:
            continue
        field += f"[{part}]" if isinstance(part, int) else f".{part}" if field else str(part)
    field = field or "the record"
    if error["type"] == "missing":
        return f"{field} is missing: a record must have it (moe_core/records/results.py)"
    message = error["msg"].removeprefix("Value error, ")
    return f"{field} = {error['input']!r}: {message}"
