"""``detectors._stats.median`` gives np.median's bits along the last axis: odd and even
lengths, ties, infinities, NaNs anywhere (a row with one is NaN), 1-D and 2-D."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from detectors._stats import median

values = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.sampled_from([0.0, 1.0])
arrays = hnp.arrays(
    np.float64, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=40), elements=values
)


@settings(max_examples=500, deadline=None)
@given(arrays)
def test_median_equals_numpys(a: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf - inf, overflow: in both
        want, got = np.median(a, axis=-1), median(a)
        kept, want_kept = median(a, keepdims=True), np.median(a, axis=-1, keepdims=True)
    assert type(got) is type(want) and np.shape(got) == np.shape(want)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(kept, want_kept)
