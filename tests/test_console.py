"""The console's tables (moe_core.records.console): rows printed one by one stay under their header,
and a study's summary counts its records and spans its headline metric."""

from pathlib import Path

from moe_core.records.console import RowPrinter, records_summary, table


def test_rows_printed_one_at_a_time_line_up_under_their_header():
    printer = RowPrinter({"collective": 23, "size(B)": 10, "time(us)": 9, "#wrong": 6}, floatfmt=("", "", ".1f", ""))
    header, rule = printer.header().splitlines()
    rows = [printer.row(["all_reduce", 1024, 12.34, 0]), printer.row(["all_to_all_v+all_reduce", 2**26, None, 3])]
    ends = [i + 1 for i, (a, b) in enumerate(zip(rule, rule[1:] + " ")) if a == "-" and b == " "]
    for line in (header, *rows):
        assert len(line) == len(rule)
        assert all(line[end - 1] != " " for end in ends), line  # every column right-aligned at its rule's end
    assert rows[0].split() == ["all_reduce", "1024", "12.3", "0"]
    assert rows[1].split() == ["all_to_all_v+all_reduce", str(2**26), "-", "3"]  # None: "-"


def test_a_table_shows_a_missing_value_as_a_dash():
    text = table([{"dispatcher": "capacity", "useful(GB/s)": 1.5}, {"dispatcher": "echo", "useful(GB/s)": None}])
    lines = text.splitlines()
    assert lines[0].split() == ["dispatcher", "useful(GB/s)"]
    assert lines[2].split() == ["capacity", "1.500"] and lines[3].split() == ["echo", "-"]


def record(experiment: str, metrics: dict) -> dict:
    return {"experiment": experiment, "metrics": metrics}


def test_a_summary_counts_records_per_folder_and_spans_the_first_metric():
    records = [
        record("scaling", {"step_ms": {"median": 3.0}, "a2a_ms": {"median": 1.0}}),
        record("scaling", {"step_ms": {"median": 1.0}, "a2a_ms": {"median": 9.0}}),
        record("scaling", {"step_ms": {"median": 2.0}, "a2a_ms": {"median": 9.0}}),
        record("memory", {"memory_GB": {"value": 40.0}}),
    ]
    paths = [Path("r/raw/p/scaling/a.json"), Path("r/raw/p/scaling/b.json"), Path("r/raw/p/scaling/c.json")]
    text = records_summary(records, [*paths, Path("r/raw/p/memory/m.json")])
    lines = text.splitlines()
    assert lines[0] == "wrote 4 records:"
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
    assert rows["scaling"] == ["3", "r/raw/p/scaling", "step_ms", "1", "2", "3"]  # min, median, max
    assert rows["memory"] == ["1", "r/raw/p/memory", "memory_GB", "40", "40", "40"]
