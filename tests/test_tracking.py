"""The W&B mirror of the records (moe_core.records.tracking), offline into a temporary folder: every
measured record a run with its samples as history, a write's simulated records one run with a table
of its points, nothing at all when disabled, and the records written when W&B cannot start."""

import json
import struct

import pytest
import wandb
from wandb.proto import wandb_internal_pb2

from moe_core.records.results import make_record, write_records

# The offline run file (.wandb) is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of
# chunks (crc32c 4, length 2, type 1: full, first, middle, last), each record a protobuf Record.
HEADER, BLOCK, CHUNK = 7, 32768, 7
FULL, LAST = 1, 4


def run_records(path) -> list:
    """The protobuf records of an offline run file."""
    data, records, pos, parts = path.read_bytes(), [], HEADER, []
    while pos + CHUNK <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + CHUNK])
        if kind == 0:  # zero padding
            break
        parts.append(data[pos + CHUNK : pos + CHUNK + length])
        pos += CHUNK + length
        if kind in (FULL, LAST):
            records.append(wandb_internal_pb2.Record.FromString(b"".join(parts)))
            parts = []
    return records


def offline_runs(results_dir) -> dict[str, dict]:
    """Run name -> its group, job type, history steps and items (key -> value; a nested key's parts
    joined by ``/``), summary (every update merged) and defined metrics (name or glob -> its step
    metric), from the run files (once W&B's service, which writes them, has stopped)."""
    wandb.teardown()
    runs = {}
    for path in sorted((results_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        records = run_records(path)
        kinds = {}
        for r in records:
            kinds.setdefault(r.WhichOneof("record_type"), []).append(r)
        (run,) = [r.run for r in kinds["run"]]
        history = [r.history for r in kinds.get("history", [])]
        summary = {
            _key(item): json.loads(item.value_json) for r in kinds.get("summary", []) for item in r.summary.update
        }
        runs[run.display_name] = {
            "group": run.run_group,
            "job_type": run.job_type,
            "steps": [h.step.num for h in history],
            "items": [{_key(item): json.loads(item.value_json) for item in h.item} for h in history],
            "summary": summary,
            "metrics": {r.metric.name or r.metric.glob_name: r.metric.step_metric for r in kinds.get("metric", [])},
        }
    return runs


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def record(mode: str, point: str, samples: dict, params: dict, wandb_mode: str = "offline", group: str = "") -> dict:
    config = {
        "wandb": {"mode": wandb_mode, "project": "tests", "entity": None, "group": group},
        "sweep": {"name": "small"},
    }
    return make_record(
        paper="common",
        experiment="bench" if mode == "measured" else "bench_sim",
        point=point,
        mode=mode,
        backend="gloo" if mode == "measured" else "sim",
        hardware="local-cpu",
        params=params,
        samples=samples,
        config=config,
    )


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")


def test_every_measured_record_is_a_run_with_its_samples_as_history(tmp_path, offline):
    records = [
        record("measured", f"p{n}", {"step_ms": [1.0 + i for i in range(n)], "loss": [2.0] * n}, {"n": n})
        for n in (3, 5)
    ]
    write_records(records, tmp_path)
    runs = offline_runs(tmp_path)
    assert set(runs) == {"bench/p3", "bench/p5"}
    for n in (3, 5):
        run = runs[f"bench/p{n}"]
        assert run["group"] == "small" and run["steps"] == list(range(n))
        assert [step["step_ms"] for step in run["items"]] == [1.0 + i for i in range(n)]
        assert [step["iteration"] for step in run["items"]] == list(range(n))
        assert run["metrics"] == {"iteration": "", "*": "iteration"}  # every sample charted against its iteration


def test_a_records_runs_are_in_its_configs_group(tmp_path, offline):
    """The group the config names (the workflow run's: sweep, digest, hardware), not the sweep alone."""
    group = "small-0123456789ab@local-cpu"
    write_records([record("measured", "p", {"step_ms": [1.0]}, {}, group=group)], tmp_path)
    write_records([record("simulated", "s", {"step_ms": [2.0]}, {}, group=group)], tmp_path)
    runs = offline_runs(tmp_path)
    assert {name: run["group"] for name, run in runs.items()} == {"bench/p": group, "common/bench_sim": group}


def test_the_simulated_records_of_a_write_are_one_run_with_a_table_of_its_points(tmp_path, offline):
    records = [record("simulated", f"ws{w}", {"step_ms": [float(w)]}, {"world_size": w}) for w in (8, 16, 64)]
    write_records(records, tmp_path)
    runs = offline_runs(tmp_path)
    assert list(runs) == ["common/bench_sim"] and runs["common/bench_sim"]["group"] == "small"
    (logged,) = runs["common/bench_sim"]["items"]
    assert logged["points/_type"] == "table-file" and logged["points/nrows"] == 3
    (table,) = (tmp_path / "wandb").glob(f"offline-run-*/files/{logged['points/path']}")
    table = json.loads(table.read_text())
    assert table["columns"] == ["point", "world_size", "step_ms"]
    assert table["data"] == [["ws8", 8, 8.0], ["ws16", 16, 16.0], ["ws64", 64, 64.0]]
    summary = runs["common/bench_sim"]["summary"]  # the headline metric's span, to chart across runs
    assert {key: summary[key] for key in ("points_count", "step_ms/min", "step_ms/median", "step_ms/max")} == {
        "points_count": 3,
        "step_ms/min": 8.0,
        "step_ms/median": 16.0,
        "step_ms/max": 64.0,
    }


@pytest.mark.parametrize("where", ["environment", "config"])
def test_disabled_writes_nothing(tmp_path, monkeypatch, where):
    monkeypatch.setenv("WANDB_MODE", "disabled" if where == "environment" else "")
    write_records([record("measured", "p", {"step_ms": [1.0]}, {}, wandb_mode="disabled")], tmp_path)
    assert (tmp_path / "raw" / "common" / "bench" / "p.json").exists()
    assert not (tmp_path / "wandb").exists()


def test_the_records_are_written_when_wandb_cannot_start(tmp_path, offline, capsys):
    (tmp_path / "wandb").write_text("a file where W&B wants its folder")
    write_records([record("measured", "p", {"step_ms": [1.0]}, {})], tmp_path)
    assert (tmp_path / "raw" / "common" / "bench" / "p.json").exists()
    assert "warning: W&B could not mirror 1 records" in capsys.readouterr().err


def analysis_inputs(tmp_path, wandb_mode: str = "offline") -> list[str]:
    """analysis.tracking's command line over a two-paper verdict table, a comparison and two figures."""
    from PIL import Image

    config = {"results_dir": str(tmp_path), "sweep": {"name": "ci"}, "wandb": {"mode": wandb_mode, "project": "tests"}}
    config["wandb"]["group"] = "ci-0123456789ab@local-cpu"
    (tmp_path / "resolved.yaml").write_text(json.dumps(config))  # JSON is YAML
    (tmp_path / "summary.csv").write_text("paper,consistent,differs,total\naurora,2,1,3\nall,2,1,3\n")
    (tmp_path / "comparison.csv").write_text(
        "id,verdict,published,reproduced\naurora-1,consistent,1.5,1.4\naurora-2,differs,2.0,\n"
    )
    figures = [tmp_path / "figures" / paper / f"{paper}_speedup.png" for paper in ("aurora", "common")]
    for path in figures:
        path.parent.mkdir(parents=True)
        Image.new("RGB", (8, 8), "white").save(path)
    files = ["--config", tmp_path / "resolved.yaml", "--summary", tmp_path / "summary.csv"]
    files += ["--comparison", tmp_path / "comparison.csv", "--out", tmp_path / "analysis.json", *figures]
    return [str(f) for f in files]


def test_the_analysis_is_one_run_with_the_verdicts_the_comparison_and_every_figure(tmp_path, offline):
    from analysis.tracking import main

    assert main(analysis_inputs(tmp_path)) == 0
    run = offline_runs(tmp_path)["analysis"]
    assert run["group"] == "ci-0123456789ab@local-cpu" and run["job_type"] == "analysis"
    (logged,) = run["items"]
    assert logged["verdicts/_type"] == logged["comparison/_type"] == "table-file"
    assert (logged["verdicts/nrows"], logged["comparison/nrows"]) == (2, 2)
    assert (
        logged["figures/aurora/aurora_speedup/_type"] == logged["figures/common/common_speedup/_type"] == "image-file"
    )
    (table,) = (tmp_path / "wandb").glob(f"offline-run-*/files/{logged['comparison/path']}")
    assert json.loads(table.read_text())["data"][1] == ["aurora-2", "differs", 2.0, None]  # an empty cell: missing
    assert {k: v for k, v in run["summary"].items() if k.startswith("verdict_counts/")} == {
        "verdict_counts/aurora/consistent": 2.0,
        "verdict_counts/aurora/differs": 1.0,
        "verdict_counts/aurora/total": 3.0,
        "verdict_counts/all/consistent": 2.0,
        "verdict_counts/all/differs": 1.0,
        "verdict_counts/all/total": 3.0,
    }
    said = json.loads((tmp_path / "analysis.json").read_text())
    assert said["group"] == run["group"] and said["mode"] == "offline" and len(said["logged"]) == 4


def test_the_analysis_run_logs_nothing_when_disabled(tmp_path, monkeypatch):
    from analysis.tracking import main

    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert main(analysis_inputs(tmp_path, wandb_mode="disabled")) == 0
    assert json.loads((tmp_path / "analysis.json").read_text()) == {"mode": "disabled", "logged": []}
    assert not (tmp_path / "wandb").exists()


def test_the_analysis_run_refuses_a_missing_figure_before_wandb_starts(tmp_path, offline, capsys):
    from analysis.tracking import main

    args = analysis_inputs(tmp_path)
    (tmp_path / "figures" / "common" / "common_speedup.png").unlink()
    assert main(args) == 2
    assert "no such figure: " in capsys.readouterr().err and "common_speedup.png" in args[-1]
    assert not (tmp_path / "wandb").exists() and not (tmp_path / "analysis.json").exists()
