"""analysis.collect: the tidy tables of synthetic records, and the damaged records it refuses."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from analysis_records import SLOWDOWNS, write_collectives, write_train_step

from analysis import collect as collect_mod
from analysis.collect import RecordError, collect
from moe_core.units import MiB


def test_collect_is_tidy(tables):
    records, samples = tables
    assert len(records["point"].unique()) == 8 + 20
    # one row per point × metric; params are columns, NA where a record lacks them
    assert not records.duplicated(["experiment", "point", "metric"]).any()
    assert {"world_size", "num_experts", "policy", "collective", "size_bytes", "concurrent"} <= set(records)
    assert records.loc[records["experiment"] == "collectives", "num_experts"].isna().all()
    step = records[(records["point"] == "ws4_e8_overlap_s0") & (records["metric"] == "step_ms")].iloc[0]
    assert step["n"] == 3 and step["value"] == step["median"] == pytest.approx(13.9)
    data = records[(records["point"] == "ws4_e8_overlap_s0") & (records["metric"] == "a2a_bytes")].iloc[0]
    assert data["value"] == 8e5 and data[["median", "p95", "n"]].isna().all()
    # one sample row per iteration
    slow = samples[(samples["point"] == "all_to_all_all_reduce_ws4_1048576") & (samples["metric"] == "slowdown")]
    assert list(slow["iteration"]) == [0, 1, 2, 3, 4] and list(slow["value"]) == SLOWDOWNS
    assert (slow["concurrent"] == "all_reduce").all() and (slow["size_bytes"] == MiB).all()


def test_collect_does_not_depend_on_the_order_of_its_files(tmp_path):
    """The workflow hands collect the records in the order its rules files declare them; the tables
    (and so every verdict) must not change when rules files are added or reordered."""
    paths = write_train_step(tmp_path) + write_collectives(tmp_path)
    forward, backward = collect(paths), collect(paths[::-1])
    for ours, theirs in zip(forward, backward):
        pd.testing.assert_frame_equal(ours, theirs, check_exact=True)


def test_collect_rejects_bad_json(tmp_path):
    good = write_train_step(tmp_path)[0]
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(RecordError, match="broken.json"):
        collect([good, bad])
    not_record = tmp_path / "list.json"
    not_record.write_text(json.dumps([1, 2]))
    with pytest.raises(RecordError, match="list.json"):
        collect([not_record])
    with pytest.raises(ValueError, match="no record files"):
        collect([])


def _edited_record(tmp_path, edit):
    """A valid train_step record file, changed by ``edit(record)`` and written back as JSON."""
    path = write_train_step(tmp_path)[0]
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))  # NaN and inf are written as JSON's NaN and Infinity
    return path


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda r: r["metrics"]["step_ms"].update(median=math.nan), "metrics.step_ms.median"),
        (lambda r: r["metrics"]["a2a_bytes"].update(value=math.inf), "metrics.a2a_bytes.value"),
        (lambda r: r["metrics"]["a2a_bytes"].update(value="4e5"), "metrics.a2a_bytes.value"),
        (lambda r: r["metrics"]["step_ms"].update(p95=None), "metrics.step_ms.p95"),
        (lambda r: r["samples"]["step_ms"].__setitem__(1, math.nan), r"samples.step_ms\[1\]"),
        (lambda r: r["samples"]["a2a_ms"].__setitem__(0, "fast"), r"samples.a2a_ms\[0\]"),
        (lambda r: r.pop("hardware"), "hardware is missing"),
        (lambda r: r.update(mode="guessed"), "mode = 'guessed'"),
    ],
)
def test_collect_names_the_file_and_field_of_a_bad_metric(tmp_path, edit, field):
    """A NaN, infinite or text metric would drop out of a mean, and its point count, unnoticed."""
    path = _edited_record(tmp_path, edit)
    with pytest.raises(RecordError, match=rf"{path.name}: {field}"):
        collect([path])


def test_collect_cli_writes_nothing_on_error(tmp_path, capsys):
    good = write_train_step(tmp_path)[0]
    bad = tmp_path / "broken.json"
    bad.write_text("{}")
    out = tmp_path / "tables"
    args = ["--out-records", str(out / "records.csv"), "--out-samples", str(out / "samples.csv")]
    with pytest.raises(SystemExit) as exit_info:
        collect_mod.main([*args, str(good), str(bad)])
    assert exit_info.value.code != 0 and "broken.json" in str(exit_info.value.code)
    assert not out.exists()
    collect_mod.main([*args, str(good)])
    assert (out / "records.csv").is_file() and (out / "samples.csv").is_file()


def test_as_judged_takes_each_point_its_fit_covers_from_the_run_at_the_fit():
    """Figures and tables read the rows the verdicts score: a point of a paper's at-fit runs replaces
    the chosen values' row of the same point and testbed; the sensitivity runs are dropped; points the
    fit does not cover (another testbed, a measured one of the same name) keep the chosen values."""

    def rows(*points):
        keys = ["paper", "experiment", "mode", "backend", "hardware", "point", "unstated", "value"]
        return pd.DataFrame([dict(zip(keys, p)) for p in points])

    sim = ("lina", "sim_train_step", "simulated", "sim", "lina-a100-4x4")
    chosen = rows(
        (*sim, "e4", None, 1.0),
        (*sim, "e4", "train.batch_size=8", 9.0),  # a sensitivity run: never drawn
        (*sim, "e16", None, 2.0),
        ("lina", "sim_train_step", "measured", "gloo", "local-cpu", "e4", None, 3.0),
        ("gshard", "gshard_scaling", "simulated", "sim", "gshard-tpuv3-torus", "e4", None, 4.0),
    )
    fitted = rows((*sim, "e4", "train.batch_size=37", 5.0), (*sim, "e16", "train.batch_size=37", 6.0))
    judged = collect_mod.as_judged(chosen, fitted).set_index(["mode", "paper", "point"])
    assert judged["value"].to_dict() == {
        ("simulated", "lina", "e4"): 5.0,
        ("simulated", "lina", "e16"): 6.0,
        ("measured", "lina", "e4"): 3.0,
        ("simulated", "gshard", "e4"): 4.0,
    }
    assert judged[collect_mod.UNSTATED].isna().all()  # at one setting: what at_setting keeps
    assert judged.loc[("simulated", "lina"), collect_mod.FITTED].eq("train.batch_size=37").all()
    assert pd.isna(judged.loc[("measured", "lina", "e4"), collect_mod.FITTED])
    assert collect_mod.FITTED not in collect_mod.param_columns(judged)  # not a swept parameter
    assert collect_mod.as_judged(chosen, None).equals(collect_mod.at_setting(chosen))
