"""A decode process gets a batch packed into one buffer (``pack_values``) and must find
exactly the rows, refusals and leftovers it would have found from the list itself."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.services.archive.rows import StepRows, pack_values, step_rows, step_rows_packed
from schemas import encode
from tests.factories import step_telemetry_st

_value = st.one_of(
    step_telemetry_st().map(encode),
    st.none(),
    st.binary(max_size=40),
    # valid JSON the table refuses: a local rank beyond UInt16
    step_telemetry_st().map(lambda m: encode(m).replace(b'"local_rank":0', b'"local_rank":70000')),
)


def _same(a: StepRows, b: StepRows) -> None:
    assert (a.stored, a.rejected, a.slow) == (b.stored, b.rejected, b.slow)
    assert a.row_value.tolist() == b.row_value.tolist()
    assert a.columns.keys() == b.columns.keys()
    for name, values in a.columns.items():
        other = b.columns[name]
        assert np.ma.getmaskarray(values).tolist() == np.ma.getmaskarray(other).tolist(), name
        plain, plain_other = np.asarray(values), np.asarray(other)
        assert plain.dtype == plain_other.dtype, name
        assert np.array_equal(plain, plain_other, equal_nan=plain.dtype.kind == "f"), name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_value, max_size=12))
def test_packed_values_decode_to_the_same_rows(values: list[bytes | None]) -> None:
    packed = step_rows_packed(*pack_values(values))
    _same(step_rows(values), packed)
    # every input is accounted for exactly once
    every = sorted([*packed.stored, *packed.rejected, *packed.slow])
    assert every == list(range(len(values)))
    assert set(packed.row_value.tolist()) == set(packed.stored)
