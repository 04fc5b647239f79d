"""The contract keeps a job's samples count (step * global_batch) within a signed 64-bit integer
for every step a job can report, so no store of it overflows."""

from __future__ import annotations

import pytest

from runtime.config import MAX_GLOBAL_BATCH, JobConfig, LayoutError

LAST_STEP = 2**31 - 1  # the control plane's step columns (target_steps, metric samples) are 32-bit


def test_the_bound_keeps_every_reachable_samples_count_in_64_bits():
    assert MAX_GLOBAL_BATCH * LAST_STEP <= 2**63 - 1
    assert MAX_GLOBAL_BATCH >= 2**30  # far beyond any batch trained (millions of samples at most)


def test_a_global_batch_at_the_bound_is_accepted():
    JobConfig(global_batch=MAX_GLOBAL_BATCH, dp=1, pp=1, microbatches=4, steps=LAST_STEP).validate()


@pytest.mark.parametrize("global_batch", [MAX_GLOBAL_BATCH + 4, 2**52, 2**80])
def test_a_global_batch_past_the_bound_is_refused_naming_the_field(global_batch):
    with pytest.raises(LayoutError) as refused:
        JobConfig(global_batch=global_batch, dp=1, pp=1, microbatches=4).validate()
    assert refused.value.field == "global_batch"
    assert f"{MAX_GLOBAL_BATCH}" in refused.value.message


def test_steps_whose_samples_would_not_fit_are_refused_naming_steps():
    with pytest.raises(LayoutError) as refused:
        JobConfig(global_batch=MAX_GLOBAL_BATCH, dp=1, pp=1, microbatches=4, steps=2**40).validate()
    assert refused.value.field == "steps"
