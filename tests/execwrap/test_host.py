"""execwrap.cost.host: steal time, and the samples the host did not interrupt."""

from __future__ import annotations

import pytest

from execwrap.cost.host import CLEAN_SHARE_MIN, StealMeter, clean_median, clean_samples


def test_clean_samples_keep_the_uninterrupted_ones_when_they_are_enough() -> None:
    steals = [0.0, 0.01, 0.0, 0.0, 0.02, 0.0]
    assert clean_samples([1.0, 9.0, 2.0, 3.0, 8.0, 4.0], steals) == [1.0, 2.0, 3.0, 4.0]
    assert clean_median([1.0, 9.0, 2.0, 3.0, 8.0, 4.0], steals) == 2.5
    # exactly half clean is enough (CLEAN_SHARE_MIN); fewer is not: then every sample counts
    assert CLEAN_SHARE_MIN == 0.5
    assert clean_samples([5.0, 7.0], [0.0, 0.01]) == [5.0]
    assert clean_samples([5.0, 7.0, 9.0], [0.0, 0.01, 0.01]) == [5.0, 7.0, 9.0]
    assert clean_median([5.0, 7.0, 9.0], [0.0, 0.01, 0.01]) == 7.0
    # a machine that reports no steal (bare metal, not Linux): every sample is clean
    assert clean_samples([3.0, 1.0], [0.0, 0.0]) == [3.0, 1.0]


def test_clean_samples_refuse_mismatched_readings() -> None:
    with pytest.raises(ValueError, match=r"2 sample\(s\) and 1 steal reading\(s\)"):
        clean_samples([1.0, 2.0], [0.0])
    with pytest.raises(ValueError, match="clean_median: no samples"):
        clean_median([], [])


def test_steal_meter_adds_up_its_stretches() -> None:
    meter = StealMeter()
    for _ in range(2):
        with meter:
            sum(range(10_000))
    assert meter.wall_s > 0.0 and meter.steal_s >= 0.0
    assert 0.0 <= meter.share() <= 1.0
    assert StealMeter().share() == 0.0  # nothing measured yet
