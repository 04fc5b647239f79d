"""The gradient all-reduce's reduce-scatter + all-gather on real gloo (threads of one process):
every owner ends with the fixed-order sum bit for bit, sending about 2(dp-1)/dp of the gradient."""

from __future__ import annotations

import pytest

from bench.grad_traffic import measure


@pytest.mark.parametrize("dp", [2, 3, 5])  # 3, 5: chunks of unequal size that cut layers mid-way
def test_reduce_scatter_all_gather_is_bit_identical_and_sends_about_twice_the_gradient(dp: int) -> None:
    result = measure(dp)
    assert result["bit_identical_to_fixed_order_fold"]
    bound = result["ring_bound_over_gradient_bytes"]
    assert bound <= result["max_sent_over_gradient_bytes"] <= bound * 1.001
    assert result["max_sent_over_gradient_bytes"] < result["previous_all_to_all_over_gradient_bytes"] or dp == 2
