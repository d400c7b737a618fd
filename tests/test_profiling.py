"""The kernel profile's arithmetic (the profiled run itself: tests/test_train_step.py)."""

import pytest

from moe_core.runtime.profiling import busy_ms


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
