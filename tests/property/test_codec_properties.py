"""Any valid message survives encode/decode unchanged; no input crashes the decoder."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import MESSAGE_MODELS, Rejected, decode, encode
from tests.factories import ANY_MESSAGE


def _same(a, b) -> bool:
    # NaN != NaN, so compare the canonical encodings.
    return encode(a) == encode(b)


@settings(max_examples=150, deadline=None)
@given(ANY_MESSAGE)
def test_encode_decode_round_trip(msg):
    back = decode(type(msg), encode(msg))
    assert not isinstance(back, Rejected), back
    assert type(back) is type(msg)
    assert _same(back, msg)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512), st.sampled_from(MESSAGE_MODELS))
def test_arbitrary_bytes_never_crash_the_decoder(raw, model):
    out = decode(model, raw, topic="t", partition=0, offset=1)
    assert isinstance(out, model | Rejected)
    if isinstance(out, Rejected):
        assert out.letter.raw == raw and out.letter.offset == 1 and out.error


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=20,
    ),
    st.sampled_from(MESSAGE_MODELS),
)
def test_arbitrary_json_never_crashes_the_decoder(value, model):
    import json

    raw = json.dumps(value).encode()
    assert isinstance(decode(model, raw), model | Rejected)
