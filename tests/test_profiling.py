"""The kernel profile's arithmetic and what its summary counts (the profiled run itself:
tests/test_train_step.py)."""

from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from moe_core.runtime.profiling import TIMED_STEP, busy_ms, summarise_profile


def event(name, start, end, device=DeviceType.CPU, parent=None, self_us=None, annotation=False):
    return SimpleNamespace(
        name=name,
        is_user_annotation=annotation,
        device_type=device,
        time_range=SimpleNamespace(start=start, end=end),
        cpu_parent=parent,
        self_cpu_time_total=end - start if self_us is None else self_us,
    )


def two_steps():
    """Two steps: data made on the host between them, the timed range with its ops, kernels behind."""
    events = []
    for offset in (0.0, 1000.0):
        events.append(event("aten::multinomial", offset, offset + 300))  # the next batch: not the step
        events.append(event(TIMED_STEP, offset + 400, offset + 900, annotation=True))
        events.append(event(TIMED_STEP, offset + 440, offset + 700, DeviceType.CUDA, annotation=True))  # on a GPU
        linear = event("aten::linear", offset + 410, offset + 500)
        events += [linear, event("aten::addmm", offset + 420, offset + 490, parent=linear)]
        events.append(event("aten::add", offset + 600, offset + 610))
        events.append(event("gemm_kernel", offset + 450, offset + 650, DeviceType.CUDA))
        events.append(event("add_kernel", offset + 640, offset + 700, DeviceType.CUDA))  # overlaps the gemm
    return SimpleNamespace(events=lambda: events)


def test_the_summary_counts_the_timed_ranges_and_the_kernels_behind_them():
    summary = summarise_profile(two_steps(), steps=2, step_wall_ms=[0.5, 0.5])
    per_step = summary["per_step"]
    assert per_step["host_ops"] == 2  # linear (its addmm is its own work) and add; never the data's multinomial
    assert per_step["kernels"] == 2
    assert per_step["device_busy_ms"] == pytest.approx(0.25)  # 450..700, overlapping kernels once
    assert per_step["host_window_ms"] == pytest.approx(0.5)
    assert per_step["wall_us_per_host_op"] == pytest.approx(250.0)
    names = [op["name"] for op in summary["top_host_ops"]]
    assert "aten::multinomial" not in names and TIMED_STEP not in names
    assert summary["top_kernels"][0] == {"name": "gemm_kernel", "calls_per_step": 1.0, "us_per_step": 200.0}


def test_a_profile_without_one_range_per_step_is_refused():
    with pytest.raises(ValueError, match="2 'timed_step' ranges for 3 profiled steps"):
        summarise_profile(two_steps(), steps=3, step_wall_ms=[])


@pytest.mark.parametrize(
    "intervals, expected_ms",
    [
        ([], 0.0),
        ([(0, 1000)], 1.0),
        ([(0, 1000), (500, 1500)], 1.5),  # overlapping kernels count once
        ([(2000, 3000), (0, 1000)], 2.0),  # unsorted, with a gap
        ([(0, 3000), (1000, 2000)], 3.0),  # one inside another
    ],
)
def test_device_busy_time_is_the_union_of_kernel_intervals(intervals, expected_ms):
    assert busy_ms(intervals) == pytest.approx(expected_ms)
