"""The telemetry proof helpers: HKDF node keys, HMAC proofs in headers, the job
controller's signature, and how settings provide them."""

from __future__ import annotations

import base64
import hmac
from hashlib import sha256

import pytest
from pydantic import SecretStr

from pipeline.io.errors import ConfigError
from pipeline.io.settings import load_client_settings, load_settings
from pipeline.io.telemetry_auth import (
    MAC_BYTES,
    PROOF_HEADER,
    NodeKeys,
    TelemetryProver,
    TelemetryVerifier,
    derive_node_key,
    message_nodes,
    telemetry_prover,
    telemetry_verifier,
)
from schemas import JobEvent, JobEventKind, encode
from tests.factories import T0, TELEMETRY_SECRET, job_controller_key, node_settings, step_telemetry

SECRET = base64.b64decode(TELEMETRY_SECRET)


def test_node_keys_are_hkdf_sha256_of_the_secret_with_the_node_in_info():
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    want = HKDF(hashes.SHA256(), 32, None, b"stepguard telemetry node:n7").derive(SECRET)
    assert derive_node_key(SECRET, "n7") == want
    assert derive_node_key(SECRET, "n7") != derive_node_key(SECRET, "n8")
    assert derive_node_key(SECRET, "n7") != derive_node_key(bytes(32), "n7")


def test_a_proof_is_a_truncated_hmac_of_the_exact_bytes():
    keys = NodeKeys(keys={"n1": derive_node_key(SECRET, "n1")})
    [(name, proof)] = keys.proofs(b"value", ["n1", "n2"])  # n2 not held: no proof
    assert name == PROOF_HEADER
    digest = sha256(b"value").digest()  # the bytes hashed once, then one HMAC per node
    mac = hmac.new(derive_node_key(SECRET, "n1"), digest, sha256).digest()[:MAC_BYTES]
    assert proof == b"node:n1:" + mac.hex().encode()


def test_the_worker_derives_what_a_node_signed_and_nothing_else_verifies():
    node = NodeKeys(keys={"n1": derive_node_key(SECRET, "n1")})
    check = TelemetryVerifier(NodeKeys(secret=SECRET))
    headers = node.proofs(b"v", ["n1"])
    assert check.nodes_problem(headers, b"v", ["n1"]) is None
    assert check.nodes_problem(headers, b"v2", ["n1"]) is not None  # other bytes
    assert check.nodes_problem(headers, b"v", ["n2"]) is not None  # other node
    other = TelemetryVerifier(NodeKeys(secret=bytes(32)))  # another cluster's secret
    assert other.nodes_problem(headers, b"v", ["n1"]) is not None
    assert check.proven(headers, b"v") == {"n1"}


def test_a_rack_needs_a_proof_per_node_and_message_nodes_lists_them():
    msg = step_telemetry()
    assert message_nodes(msg) == [msg.node]
    rack = msg.model_copy(update={
        "schema_version": 2, "node": "rack-0",
        "samples": tuple(s.model_copy(update={"node": f"n{i % 2}"})
                         for i, s in enumerate(msg.samples)),
    })  # fmt: skip
    assert message_nodes(rack) == ["rack-0", "n0", "n1"]
    held = NodeKeys(keys={n: derive_node_key(SECRET, n) for n in ("rack-0", "n0")})
    value = encode(rack)
    check = TelemetryVerifier(NodeKeys(secret=SECRET))
    problem = check.nodes_problem(held.proofs(value, message_nodes(rack)), value,
                                  message_nodes(rack))  # fmt: skip
    assert problem == "no proof of node 'n1'"


@pytest.mark.parametrize("small", [16, 0])  # the worker's view of a small and a large message
def test_a_signed_columnar_rack_message_passes_the_workers_check_on_its_view(small, monkeypatch):
    from pipeline.agents.rack import merge_nodes
    from pipeline.io import fastcolumns
    from pipeline.io.fastdecode import decode_step

    monkeypatch.setattr(fastcolumns, "SMALL", small)
    base = step_telemetry()
    nodes = [
        base.model_copy(update={"node": f"n{i}", "samples": tuple(
            s.model_copy(update={"rank": 100 * i + s.rank}) for s in base.samples)})
        for i in range(2)
    ]  # fmt: skip
    rack = merge_nodes(nodes, "rack-0")  # version 3: the senders' default
    assert rack.schema_version == 3
    value = encode(rack)
    prover = TelemetryProver(NodeKeys(keys={n: derive_node_key(SECRET, n)
                                            for n in ("rack-0", "n0", "n1")}))  # fmt: skip
    headers = prover.headers("steps", rack, value)  # what the rack aggregator's sink sends
    view = decode_step(value)  # what the worker checks the proofs against
    assert view is not None and message_nodes(view) == message_nodes(rack) == ["rack-0", "n0", "n1"]
    check = TelemetryVerifier(NodeKeys(secret=SECRET))
    assert check.nodes_problem(headers, value, message_nodes(view)) is None
    short = [h for h in headers if not h[1].startswith(b"node:n1:")]
    assert check.nodes_problem(short, value, message_nodes(view)) == "no proof of node 'n1'"


@pytest.mark.parametrize("size", [32, 33, 64, 65, 200])
def test_the_derived_key_is_rfc5869_hkdf_byte_for_byte(size):
    """One HMAC per node from the secret's pseudorandom key (computed once) is HKDF."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    secret = bytes(range(size % 256)) * (size // 256) + bytes(range(size % 256))
    keys = NodeKeys(secret=secret)
    for node in ("n7", "rack-00001", "nöde-ü", "x" * 256):
        want = HKDF(hashes.SHA256(), 32, None, b"stepguard telemetry node:" + node.encode())
        assert derive_node_key(secret, node) == want.derive(secret)
        mac = hmac.new(derive_node_key(secret, node), sha256(b"v").digest(), sha256).digest()
        assert keys.mac(node, b"v") == mac[:MAC_BYTES]


def _reference_problem(check, headers, value, nodes):
    """The check as it was before proofs were found by their prefix (a node's own
    message: a header equal to the one expected; else :meth:`proven` proof by proof)."""
    raw = value or b""
    if len(nodes) == 1 and headers:
        want = check.nodes.mac(nodes[0], raw)
        if want is not None:
            expect = b"node:" + nodes[0].encode() + b":" + want.hex().encode()
            if any(v == expect for k, v in headers if k == PROOF_HEADER):
                return None
        return f"no proof of node {nodes[0][:100]!r}"
    missing = [n for n in nodes if n not in check.proven(headers, raw, nodes)]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return f"no proof of node {missing[0][:100]!r}{more}"
    return None


def test_finding_proofs_by_prefix_decides_as_checking_each_proof_did():
    """Every node still needs its own valid proof of the exact bytes: the same verdict
    and reason as before, for good, missing, wrong, doubled and odd proofs."""
    held = NodeKeys(keys={n: derive_node_key(SECRET, n) for n in ("r", "a", "b", "c")})
    check = TelemetryVerifier(NodeKeys(secret=SECRET))
    value = b'{"node":"r"}'
    good = {p[5:-33].decode(): p for _, p in held.proofs(value, ["r", "a", "b", "c"])}
    bad = {n: p[:-1] + (b"0" if p[-1:] != b"0" else b"1") for n, p in good.items()}
    upper = {n: p[:-32] + p[-32:].upper() for n, p in good.items()}
    other = {"a": held.proofs(value + b" ", ["a"])[0][1]}
    cases = [
        [good["r"], good["a"], good["b"], good["c"]],
        [good["c"], good["b"], good["a"], good["r"]],  # any order
        [good["r"], good["a"], good["b"]],  # c missing
        [good["r"], bad["a"], good["b"], good["c"]],  # a wrong
        [good["r"], bad["a"], good["a"], good["b"], good["c"]],  # a wrong, then right
        [good["r"], good["a"], bad["a"], good["b"], good["c"]],  # a right, then wrong
        [good["r"], upper["a"], good["b"], good["c"]],  # hex in capitals: not the MAC's
        [good["r"], other["a"], good["b"], good["c"]],  # a's proof of other bytes
        [good["r"], good["a"][:-1], good["b"], good["c"]],  # truncated
        [b"node:" + good["a"], good["r"], good["b"], good["c"]],
        [good["r"] + b"0", good["a"], good["b"], good["c"]],
        [b"", b"node:", b":" * 40, good["a"]],
    ]
    for proofs_ in cases:
        headers = [(PROOF_HEADER, p) for p in proofs_] + [("other", good["b"])]
        for nodes in (["r", "a", "b", "c"], ["a"], ["r"], ["a", "a"], [], ["a", "zz"]):
            for v in (value, value + b" ", None):
                want = _reference_problem(check, headers, v, nodes)
                assert check.nodes_problem(headers, v, nodes) == want, (proofs_, nodes, v)
    fixed = TelemetryVerifier(NodeKeys(keys={"a": derive_node_key(SECRET, "a")}))
    headers = [(PROOF_HEADER, good["a"]), (PROOF_HEADER, good["b"])]
    assert fixed.nodes_problem(headers, value, ["a"]) is None
    assert fixed.nodes_problem(headers, value, ["a", "b"]) == "no proof of node 'b'"
    assert check.nodes_problem({PROOF_HEADER: good["a"]}, value, ["a"]) is None  # a mapping
    assert check.nodes_problem([(PROOF_HEADER, "text")], value, ["a"]) == "no proof of node 'a'"
    assert check.nodes_problem(headers, value, ["a\ud800"]) == "no proof of node 'a\\ud800'"


def test_the_derived_key_cache_is_bounded():
    keys = NodeKeys(secret=SECRET, max_cached=4)
    for i in range(20):
        assert keys.mac(f"n{i}", b"x") is not None
    assert len(keys._cache) <= 4
    assert keys.mac("n0", b"x") == NodeKeys(secret=SECRET).mac("n0", b"x")


def test_a_job_level_event_carries_its_controllers_signature_only_for_its_own_job():
    key = job_controller_key("job-a")
    prover = TelemetryProver(None, key)
    end = JobEvent(job_id="job-a", kind=JobEventKind.END, reason="completed", ts=T0)
    value = encode(end)
    [(_, proof)] = prover.headers("lifecycle", end, value)
    assert proof.startswith(f"jc:{key.key_id}:".encode())
    other = end.model_copy(update={"job_id": "job-b"})
    assert prover.headers("lifecycle", other, encode(other)) == []  # not its job
    check = TelemetryVerifier(NodeKeys(secret=SECRET), key.verifier())
    assert check.lifecycle_problem([(PROOF_HEADER, proof)], value, end) is None
    assert check.lifecycle_problem([(PROOF_HEADER, proof)], value + b" ", end) is not None


def test_settings_fail_fast_naming_the_variable():
    with pytest.raises(ConfigError, match="STEPGUARD_TELEMETRY_SECRET"):
        load_settings({"STEPGUARD_TELEMETRY_SECRET": "dG9vIHNob3J0"})
    with pytest.raises(ConfigError, match="STEPGUARD_TELEMETRY_NODE_KEYS"):
        load_settings({"STEPGUARD_TELEMETRY_NODE_KEYS": "n1=bad"})
    with pytest.raises(ConfigError, match="STEPGUARD_TELEMETRY_AUTH"):
        load_settings({"STEPGUARD_TELEMETRY_AUTH": "maybe"})
    bare = load_settings({})
    with pytest.raises(ConfigError, match="STEPGUARD_TELEMETRY_SECRET is required by the worker"):
        telemetry_verifier(bare, {}, "the worker")
    with pytest.raises(ConfigError, match="STEPGUARD_TELEMETRY_NODE_KEYS is required"):
        telemetry_prover(load_client_settings({}), "the exporter")


def test_a_secret_never_appears_in_repr_or_errors():
    s = load_settings({}, telemetry_secret=SecretStr(TELEMETRY_SECRET))
    assert TELEMETRY_SECRET not in repr(s)
    with pytest.raises(ConfigError) as err:
        load_settings({"STEPGUARD_TELEMETRY_SECRET": TELEMETRY_SECRET[:20]})
    assert TELEMETRY_SECRET[:20] not in str(err.value)


def test_auth_off_is_explicit_and_logged(caplog):
    off = load_settings({"STEPGUARD_TELEMETRY_AUTH": "off"})
    with caplog.at_level("WARNING"):
        assert telemetry_verifier(off, {}, "a test worker") is None
        assert telemetry_prover(off, "a test exporter") is None
    assert "STEPGUARD_TELEMETRY_AUTH=off" in caplog.text


def test_a_node_holding_only_its_key_signs_only_its_own_records():
    prover = telemetry_prover(load_client_settings({}, **node_settings("n1")), "test")
    assert prover is not None
    mine, theirs = step_telemetry(), step_telemetry().model_copy(update={"node": "n2"})
    mine = mine.model_copy(update={"node": "n1"})
    assert len(prover.headers("steps", mine, encode(mine))) == 1
    assert prover.headers("steps", theirs, encode(theirs)) == []
