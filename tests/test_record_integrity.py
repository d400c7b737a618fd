"""A damaged results folder stops the analysis, naming the file and field, and leaves comparison.csv as it was.

One real run (Lina's simulated training steps of configs/ci.yaml, written by experiments.simulate's own
record function) is collected and compared once; each test then damages one of its records the way a
user's results folder gets damaged, reruns collect and compare through their command lines, and checks
the error and that the tables are byte for byte the ones before. A record edited so that every rule
still holds (rescaled samples, a relabelled testbed) is refused by its digest or its provenance.
"""

from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

import analysis.collect as collect_mod
import analysis.compare as compare_mod
from analysis.published import load_registry
from analysis.record_schema import check_record, params_match_config, provenance, record_problem
from experiments.benchmark import measured_record
from experiments.simulate import EXPERIMENT, simulated_record
from moe_core.config.load import load_config
from moe_core.records.results import atomic_outputs, record_digest, record_path, summarize, write_record
from moe_core.schema.points import sim_points

CONFIGS = ["configs/default.yaml", "configs/ci.yaml"]
TARGET = "lina-a100-4x4_ws4_e4_epr1_overlap_s0"  # the record the issue damaged
OTHER = "lina-a100-4x4_ws16_e16_epr1_overlap_s0"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Lina's simulated points of the CI config, collected and compared: the run's folder."""
    root = tmp_path_factory.mktemp("run")
    base = load_config(CONFIGS, [f"results_dir={root}"])
    for name, (paper, overrides) in sim_points(base).items():
        if paper == "lina":
            cfg = load_config(CONFIGS, [f"results_dir={root}", *overrides])
            write_record(simulated_record(cfg, name), record_path(root, paper, EXPERIMENT, name))
    assert _analyse(root) is None
    return root


def _raw(root: Path, point: str = TARGET) -> Path:
    return record_path(root, "lina", EXPERIMENT, point)


def _tables(root: Path) -> dict[str, bytes]:
    return {name: (root / "tables" / name).read_bytes() for name in ("records.csv", "samples.csv", "comparison.csv")}


def _analyse(root: Path) -> str | None:
    """collect then compare, as the workflow runs them; the error of the first that fails, or None."""
    tables = root / "tables"
    records, samples = tables / "records.csv", tables / "samples.csv"
    files = [str(p) for p in sorted((root / "raw").glob("*/*/*.json"))]
    try:
        collect_mod.main(["--out-records", str(records), "--out-samples", str(samples), *files])
        compare_mod.main(
            ["--records", str(records), "--samples", str(samples), "--out", str(tables / "comparison.csv")]
        )
    except SystemExit as failed:
        assert failed.code not in (0, None)
        return str(failed.code)
    return None


@contextmanager
def _damaged(root: Path, damage):
    """The target record changed by ``damage(record, root)``, or as bytes by ``damage(bytes)`` for a
    damage marked ``raw``; restored afterwards."""
    path = _raw(root)
    original = path.read_bytes()
    try:
        if getattr(damage, "raw", False):
            path.write_bytes(damage(original))
        else:
            record = json.loads(original)
            damage(record, root)
            path.write_text(json.dumps(record))  # NaN and inf are written as JSON's NaN and Infinity
        yield path
    finally:
        path.write_bytes(original)


def _on_bytes(damage):
    damage.raw = True
    return damage


def _drop_metric(name):
    def drop(record, root):
        record["metrics"].pop(name)
        record["samples"].pop(name, None)

    return drop


def _set(section, name, field, value):
    def edit(record, root):
        record[section][name][field] = value

    return edit


def _param(name, value):
    def edit(record, root):
        record["params"][name] = value

    return edit


def _scale_median(record, root):
    record["metrics"]["step_ms"]["median"] *= 1.1


def _params_of_other_point(record, root):
    record["params"] = json.loads(_raw(root, OTHER).read_text())["params"]


def _rescaled(record, root):
    """Every sample of the step time and its summary scaled by 1000: every content rule still holds."""
    record["samples"]["step_ms"] = [1000 * v for v in record["samples"]["step_ms"]]
    record["metrics"]["step_ms"] = summarize(record["samples"]["step_ms"])


def _digested(damage):
    """``damage``, then the record digested again: as if its writer had written it so."""

    def digested(record, root):
        damage(record, root)
        record["digest"] = record_digest(record)

    return digested


# The table, and the format cases: case -> (damage, what the one-line error must say)
CASES = {
    "one metric removed": (_drop_metric("step_ms"), r"metrics\.step_ms is missing: every sim_train_step record"),
    "every metric removed": (lambda r, _: r.update(metrics={}, samples={}), r"metrics\.step_ms is missing"),
    "negative time": (
        _set("metrics", "step_ms", "median", -3.2),
        r"metrics\.step_ms\.median = -3\.2: a time must be >= 0",
    ),
    "negative share": (
        _set("metrics", "a2a_share", "median", -0.1),
        r"a2a_share\.median = -0\.1: a share must be in \[0, 1\]",
    ),
    "share above 1": (
        _set("metrics", "a2a_share", "p95", 1.5),
        r"metrics\.a2a_share\.p95 = 1\.5: a share must be in \[0, 1\]",
    ),
    "huge time": (_set("metrics", "step_ms", "max", 1e30), r"metrics\.step_ms\.max = 1e\+30: a time above one day"),
    "params removed": (lambda r, _: r.pop("params"), r"params is missing"),
    "params of another point": (_params_of_other_point, rf"point = '{TARGET}': its params name the point 'ws16_e16_"),
    "median off its samples": (
        _scale_median,
        r"metrics\.step_ms\.median = [\d.]+: the record's own samples give [\d.]+",
    ),
    "text for a swept number": (_param("partition_mb", "30"), r"params\.partition_mb = '30': the record's config"),
    "text for an unswept number": (_digested(_param("top_k", "2")), r"params\.top_k = '2': a text, but a number in"),
    "rescaled samples": (
        _rescaled,
        r"digest = 'sha256:[0-9a-f]{12}'…: the record has changed since its run wrote it \(records are never "
        r"edited\); delete it and rerun its point",
    ),
    "relabelled testbed": (
        lambda r, _: r.update(hardware="h100-ndr-cluster"),
        r"digest = 'sha256:[0-9a-f]{12}'…: the record has changed since its run wrote it",
    ),
    "digest removed": (lambda r, _: r.pop("digest"), r"digest is missing: the record was not written by"),
    "truncated file": (_on_bytes(lambda b: b[: len(b) // 2]), "cannot read a JSON record"),
    "empty file": (_on_bytes(lambda b: b""), "cannot read a JSON record"),
    "NaN": (
        _set("metrics", "step_ms", "median", math.nan),
        r"metrics\.step_ms\.median = nan: Input should be a finite",
    ),
    "infinity": (_set("samples", "step_ms", 0, math.inf), r"samples\.step_ms\[0\] = inf"),
    "text metric": (
        _set("metrics", "step_ms", "p95", "12.5"),
        r"metrics\.step_ms\.p95 = '12\.5': Input should be a valid",
    ),
    "boolean metric": (_set("metrics", "operations", "value", True), r"metrics\.operations\.value = True"),
    "another schema version": (lambda r, _: r.update(schema_version=2), r"schema_version = 2: Input should be 1"),
}


@pytest.mark.parametrize("case", CASES)
def test_damaged_record_stops_the_analysis_naming_file_and_field(run, case):
    damage, expected = CASES[case]
    before = _tables(run)
    with _damaged(run, damage) as path:
        error = _analyse(run)
    assert error is not None, f"{case}: the analysis accepted the damaged record"
    assert "\n" not in error and error.startswith(f"analysis.collect: error: {path}: "), error
    assert re.search(expected, error), error
    assert _tables(run) == before  # nothing written: every table as it was, byte for byte


def test_a_duplicate_record_of_a_point_stops_collect(run):
    before = _tables(run)
    copied = _raw(run).with_name("copy.json")
    copied.write_bytes(_raw(run).read_bytes())
    try:
        error = _analyse(run)
    finally:
        copied.unlink()
    assert error is not None and "the same point name as" in error and "copy.json" in error and TARGET in error
    assert _tables(run) == before


def test_a_point_without_a_metric_its_reproducer_reads_stops_compare(run):
    """A record can lack a metric only some records have; the reproducer that reads it then fails naming
    the entry and the point, rather than averaging the other points."""
    before = _tables(run)
    with _damaged(run, _digested(_drop_metric("a2a_share"))):
        error = _analyse(run)
    assert _analyse(run) is None  # collect wrote the damaged record's tables: the intact run's again
    assert error is not None and re.search(r"registry entry 'lina-table1-a2a-share-of-step[a-z-]*'", error)
    assert f"points ['{TARGET}'] lack one of ['a2a_share']" in error
    assert _tables(run)["comparison.csv"] == before["comparison.csv"]


def test_comparison_rows_name_the_points_they_used(run):
    rows = pd.read_csv(run / "tables" / "comparison.csv").set_index("id")
    assert rows.loc["lina-table1-a2a-share-of-step-secondary", "points"] == f"2: {OTHER};{TARGET}"
    speedup = rows.loc["lina-fig10-step-speedup-4e", "points"]
    assert speedup == f"2: lina-a100-4x4_ws4_e4_epr1_lina_s0_part30;{TARGET}"  # the policy's and its baseline's


def test_a_failing_reproducer_is_named(run):
    """A reproducer that cannot use the tables (text where it formats a number) names its entry."""
    records = pd.read_csv(run / "tables" / "records.csv").astype({"partition_mb": str})
    samples = pd.read_csv(run / "tables" / "samples.csv")
    with pytest.raises(ValueError, match=r"registry entry '[a-z0-9-]+' \(reproducer lina_fig10_step_speedup_4e\)"):
        compare_mod.compare(load_registry(), records, samples)


def test_generated_records_pass_every_rule(run):
    paths = sorted((run / "raw").glob("*/*/*.json"))
    lina_points = [name for name, (paper, _) in sim_points(load_config(CONFIGS)).items() if paper == "lina"]
    assert len(paths) == len(lina_points) > 0
    for path in paths:
        check_record(json.loads(path.read_text()), str(path))


@pytest.fixture(scope="module")
def measured_cpu_record():
    """A measured record of this CPU (gloo, local-cpu), as experiments.collectives writes one."""
    samples = {"time_ms": [1.0, 1.2, 1.1], "busbw_GBps": [0.5, 0.4, 0.45]}
    params = {"collective": "all_reduce", "world_size": 2, "size_bytes": 1024, "concurrent": None}
    cfg = load_config(CONFIGS)
    return measured_record(
        cfg, paper="common", experiment="collectives", point="all_reduce_ws2_1KiB", params=params, samples=samples
    )


def _relabelled(record, **changes):
    """``record`` with ``changes`` (dotted keys: "environment.device"), digested again as a writer would."""
    record = json.loads(json.dumps(record))
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        section = record
        for part in parents:
            section = section[part]
        section[key] = value
    return {**record, "digest": record_digest(record)}


# An edit that keeps the digest (a writer that claims a testbed) -> the first problem provenance names
PROVENANCE_CASES = {
    "CPU record claiming Lina's A100s": (
        {"hardware": "lina-a100-4x4"},
        "hardware = 'lina-a100-4x4': hardware profile lina-a100-4x4 runs nccl on cuda, "
        "but this measured record ran gloo on cpu",
    ),
    "CPU record and its config claiming a GPU": (
        {"hardware": "h200-single", "config.hardware.name": "h200-single"},
        "hardware = 'h200-single': hardware profile h200-single runs nccl on cuda",
    ),
    "nccl on this CPU": (
        {"backend": "nccl", "hardware": "my-gpus", "config.hardware.name": "my-gpus"},
        "environment.device = 'cpu': a nccl run runs on cuda",
    ),
    "a GPU run without its GPU": (
        {"backend": "nccl", "environment.device": "cuda", "hardware": "gpus", "config.hardware.name": "gpus"},
        "environment.gpu is missing: a CUDA run records the GPU it ran on",
    ),
    "hardware other than its config's": (
        {"hardware": "my-cluster"},
        "hardware = 'my-cluster': its resolved config ran on hardware.name = 'local-cpu'",
    ),
    "a measured record of a model": ({"backend": "sim"}, "backend = 'sim': a measured record's backend is one of"),
    "a simulated record on gloo": ({"mode": "simulated"}, "backend = 'gloo': a simulated record's backend is one of"),
}


@pytest.mark.parametrize("case", PROVENANCE_CASES)
def test_a_record_claiming_a_testbed_it_did_not_run_on_is_refused(measured_cpu_record, case, tmp_path):
    """Relabelling this CPU's record as Lina's testbed would turn its not-comparable rows into verdicts."""
    changes, expected = PROVENANCE_CASES[case]
    assert record_problem(measured_cpu_record) is None
    path = tmp_path / "record.json"
    path.write_text(json.dumps(_relabelled(measured_cpu_record, **changes)))
    with pytest.raises(collect_mod.RecordError) as refused:
        collect_mod.collect([path])
    assert str(refused.value).startswith(f"{path}: {expected}"), refused.value


def test_a_gpu_record_of_a_gpu_profile_has_its_provenance():
    """A dated H200 record (results/reference/) names the profile, backend, device and GPU it ran on."""
    record = json.loads(Path("results/reference/2026-12-04-h200/train_step_h200_sequential.json").read_text())
    assert list(provenance(record)) == []


def test_written_records_carry_the_digest_of_their_content(run):
    record = json.loads(_raw(run).read_text())
    assert record["digest"] == record_digest(record) and record["digest"].startswith("sha256:")
    reformatted = _raw(run).with_name("reformatted.json")
    reformatted.write_text(json.dumps(record, indent=4, sort_keys=True))  # the same content, other layout
    try:
        assert collect_mod.read_valid_record(reformatted) == record
    finally:
        reformatted.unlink()


def test_noise_section_is_optional_and_checked(run):
    record = json.loads(_raw(run).read_text())
    noise = {"load_avg": [0.5, 0.4, 0.3], "cpus": 2, "contention": None, "cv": {"step_ms": 0.02}}
    assert record_problem({**record, "noise": noise}) is None
    assert record_problem({**record, "noise": noise | {"contention": 1.5}}).startswith("noise.contention = 1.5")
    assert record_problem({**record, "noise": noise | {"cv": {"step_ms": -1.0}}}).startswith("noise.cv.step_ms = -1.0")


def test_atomic_outputs_keep_every_old_file_when_one_write_fails(tmp_path):
    png, pdf = tmp_path / "f.png", tmp_path / "f.pdf"
    png.write_text("old png")
    pdf.write_text("old pdf")
    with pytest.raises(RuntimeError), atomic_outputs(png, pdf) as (new_png, _):
        new_png.write_text("new png")
        raise RuntimeError("the PDF backend failed")
    assert (png.read_text(), pdf.read_text()) == ("old png", "old pdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf", "f.png"]


def test_a_records_dispatcher_is_the_one_its_config_resolves_to(run):
    """``moe.dispatcher=auto`` resolves per layout; the record names the dispatcher it ran, so the
    check resolves the config before it compares (and still refuses another dispatcher)."""
    record = json.loads(sorted((run / "raw").glob("*/*/*.json"))[0].read_text())
    resolved = _relabelled(record, **{"config.moe.dispatcher": "auto", "params.dispatcher": "capacity"})
    assert record_problem(resolved) is None
    other = _relabelled(resolved, **{"params.dispatcher": "dropless"})
    problems = list(params_match_config(other))
    assert problems == [("params.dispatcher", "dropless", "the record's config has moe.dispatcher = 'capacity'")]
