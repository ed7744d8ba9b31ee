"""The noisy-neighbour benchmark's physics bound: the steps a chat's first token needs beside noise."""

import pytest

from loadtest.noisy import chunks, physics_ratio


def test_a_prompt_takes_threshold_sized_steps_beside_others():
    assert chunks(512, 128) == 4
    assert chunks(513, 128) == 5
    assert chunks(100, 128) == 1
    assert chunks(512, 0) == 1  # no threshold: the whole prompt in one step


def test_bound_swaps_the_alone_step_for_the_flooded_steps():
    # alone: 20 ms of path + one 10 ms step; beside noise: the step in flight + 4 prefill steps of 40 ms
    assert physics_ratio(0.030, 0.010, 0.040, 4) == pytest.approx((0.020 + 5 * 0.040) / 0.030)


def test_bound_is_never_below_alone():
    assert physics_ratio(0.030, 0.010, 0.001, 1) == 1.0
    assert physics_ratio(0.0, 0.010, 0.040, 4) == 1.0
