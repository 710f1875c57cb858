"""Authenticated telemetry: a record speaks only for its own node.

Every steps, health and lifecycle record carries a proof of its writer in a Kafka
record header (:data:`PROOF_HEADER`), computed over the record's exact value bytes, so
the proof costs one HMAC per node and message and needs no canonical JSON:

- ``node:<node>:<hex>``: HMAC-SHA256 (first :data:`MAC_BYTES` bytes) with ``<node>``'s
  key of the SHA-256 digest of the value (hashed once however many nodes sign it).
  A node's key is derived from one cluster telemetry secret with HKDF-SHA256
  (:func:`derive_node_key`, info ``b"stepguard telemetry node:" + node``), so
  provisioning is one secret per node: a node's agent and the training processes on
  it hold that node's key (``stepguard keys node``), a rack aggregator the keys of
  the nodes it serves (one proof per node, over the same bytes), and only the worker
  holds the cluster secret (or the list of node keys).
- ``jc:<key_id>:<hex>``: an Ed25519 signature by the job controller's key
  (:mod:`pipeline.io.trust`; its key id binds it to one job), for the lifecycle events
  that speak for the whole job (:data:`JOB_LEVEL`).

The worker (:class:`TelemetryVerifier`) accepts a steps record only when a proof covers
its node (a rack's message: its sender and every sample's node), a health record only
with its node's proof, a lifecycle event that ends the job, announces a phase or
declares its nodes only with its own job controller's signature, and any other
lifecycle event with its job controller's signature or the proof of its ``source``
node. Everything else is refused: a copy of another node's record is not raced, since
the copy carries no proof of that node.

Examples
--------
>>> secret = bytes(32)
>>> keys = NodeKeys(keys={"n1": derive_node_key(secret, "n1")})
>>> headers = keys.proofs(b'{"node":"n1"}', ["n1"])
>>> headers[0][0], headers[0][1][:8]
('sg-proof', b'node:n1:')
>>> check = TelemetryVerifier(NodeKeys(secret=secret))
>>> check.nodes_problem(headers, b'{"node":"n1"}', ["n1"]) is None
True
>>> check.nodes_problem(headers, b'{"node":"n2"}', ["n2"])
"no proof of node 'n2'"
>>> check.nodes_problem(headers, b'{"node":"n1","x":1}', ["n1"])
"no proof of node 'n1'"
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from hashlib import sha256
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature

from pipeline.io.errors import ConfigError
from pipeline.io.settings import parse_node_keys
from pipeline.io.trust import PublicKeys, SigningKey, job_controller_key_id

__all__ = [
    "JOB_LEVEL",
    "MAC_BYTES",
    "PROOF_HEADER",
    "Headers",
    "NodeKeys",
    "TelemetryProver",
    "TelemetryVerifier",
    "derive_node_key",
    "message_nodes",
    "parse_node_keys",
]

log = logging.getLogger(__name__)

#: the Kafka record header that carries a writer's proof (one per node or controller)
PROOF_HEADER = "sg-proof"
#: HMAC-SHA256 truncated to 128 bits (RFC 2104 section 5 allows it; forging one takes
#: 2**128 tries on average and the worker counts every failure)
MAC_BYTES = 16
_INFO = b"stepguard telemetry node:"
_NO_SALT = bytes(32)  #: HKDF's salt when none is given: HashLen zeros (RFC 5869 2.2)
#: the length of the MAC's hex that ends a node's proof (after its prefix, ``node:<node>:``)
_HEX = 2 * MAC_BYTES
#: byte maps XOR 0x36 / 0x5C (HMAC's inner and outer pads, RFC 2104)
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))
_NODE = b"node:"
_JC = b"jc:"
#: lifecycle kinds that speak for the whole job: only its controller's signature counts
#: (a START counts as one when it declares the job's nodes)
JOB_LEVEL = frozenset({"end", "phase"})

#: what a Kafka record carries: (name, value) pairs (kafka-python, aiokafka)
Headers = Sequence[tuple[str, bytes]]


def derive_node_key(secret: bytes, node: str) -> bytes:
    """The 32-byte key of ``node``: HKDF-SHA256 of the cluster ``secret``.

    >>> k = derive_node_key(b"s" * 32, "node-1")
    >>> len(k), k == derive_node_key(b"s" * 32, "node-1"), k == derive_node_key(b"s" * 32, "node-2")
    (32, True, False)
    """
    return _expand(_extract(secret), node)


def _extract(secret: bytes) -> bytes:
    """HKDF-Extract (RFC 5869 section 2.2) with no salt: HashLen zero bytes as the key.
    The pseudorandom key depends on the secret alone, so it is computed once per secret."""
    return hmac.digest(_NO_SALT, secret, "sha256")


def _expand(prk: bytes, node: str) -> bytes:
    """HKDF-Expand (RFC 5869 section 2.3) of 32 bytes, one hash long: T(1) =
    HMAC(PRK, info | 0x01), one HMAC per node (``cryptography``'s HKDF object takes
    several times that; a test holds the two byte for byte)."""
    return hmac.digest(prk, _INFO + node.encode() + b"\x01", "sha256")


def parse_secret(text: str) -> bytes:
    """The cluster telemetry secret from its base64 text (at least 32 bytes).

    >>> len(parse_secret(base64.b64encode(bytes(32)).decode()))
    32
    >>> parse_secret("short")
    Traceback (most recent call last):
    ...
    ValueError: expected at least 32 bytes of standard base64 (`stepguard keys telemetry`)
    """
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) < 32:
        raise ValueError(
            "expected at least 32 bytes of standard base64 (`stepguard keys telemetry`)"
        )
    return raw


def node_key_text(node: str, key: bytes) -> str:
    """``node=base64``: how one node's key travels (``STEPGUARD_TELEMETRY_NODE_KEYS``)."""
    return f"{node}={base64.b64encode(key).decode('ascii')}"


class NodeKeys:
    """The node keys a process holds: derived on demand from the cluster ``secret``
    (the worker, the simulator), or a fixed map (a node's agent, a rack aggregator).

    Derived keys are cached (at most ``max_cached`` nodes, the oldest half dropped when
    full), each as its HMAC states and its proof header's prefix (:meth:`entry`). A
    proof is the HMAC-SHA256 of the SHA-256 digest of the value's bytes: the bytes are
    hashed once per message however many nodes it speaks for (a rack's), and each
    node's proof costs one HMAC of 32 bytes (~1 us).
    """

    def __init__(
        self,
        *,
        secret: bytes | None = None,
        keys: Mapping[str, bytes] | None = None,
        max_cached: int = 65_536,
    ) -> None:
        if secret is None and not keys:
            raise ValueError("NodeKeys needs a secret or at least one node key")
        if secret is not None and len(secret) < 32:
            raise ValueError("the cluster telemetry secret must be at least 32 bytes")
        if max_cached < 1:
            raise ValueError("max_cached must be >= 1")
        self.secret = secret
        self.max_cached = max_cached
        self._prk = None if secret is None else _extract(secret)  # HKDF's, once per secret
        self._fixed = dict(keys or {})
        self._cache: dict[str, tuple[Any, Any, bytes]] = {}

    def holds(self, node: str) -> bool:
        """Whether a proof of ``node`` can be made (or checked) here."""
        return self.secret is not None or node in self._fixed

    def entry(self, node: str) -> tuple[Any, Any, bytes] | None:
        """``node``'s SHA-256 states after HMAC's inner and outer key blocks, and the
        prefix of its proof header (``node:<node>:``); None when its key is not held."""
        got = self._cache.get(node)
        if got is not None:
            return got
        key = self._fixed.get(node)
        if key is None:
            if self._prk is None:
                return None
            key = _expand(self._prk, node)
        if len(self._cache) >= self.max_cached:  # bounded: drop the oldest half
            for old in list(self._cache)[: self.max_cached // 2 + 1]:
                del self._cache[old]
        inner, outer = _hmac_pads(key)
        got = self._cache[node] = (inner, outer, _NODE + node.encode() + b":")
        return got

    def all_proven(self, given: Mapping[bytes, bytes], digest: bytes, nodes: Iterable[str]) -> bool:
        """Whether ``given`` (a proof header's prefix -> the MAC hex after it) holds a
        valid proof of each of ``nodes`` for the value whose SHA-256 is ``digest`` (each
        MAC compared in constant time; a name that does not encode raises
        UnicodeEncodeError). The hot path of :meth:`TelemetryVerifier.nodes_problem`,
        written out: a rack's message takes one pass per node it speaks for."""
        cache, compare = self._cache, hmac.compare_digest
        for node in nodes:
            got = cache.get(node) or (self.entry(node) if node else None)
            mac = None if got is None else given.get(got[2])
            if mac is None:
                return False
            inner = got[0].copy()  # type: ignore[index]
            inner.update(digest)
            outer = got[1].copy()  # type: ignore[index]
            outer.update(inner.digest())
            if not compare(mac, outer.digest()[:MAC_BYTES].hex().encode()):
                return False
        return True

    def mac_of_digest(self, node: str, digest: bytes) -> bytes | None:
        """The MAC of a value whose SHA-256 is ``digest`` under ``node``'s key, or None
        when not held (HMAC-SHA256 from the key's precomputed inner and outer states:
        a third of ``hmac.digest``'s cost, which sets its state up on every call)."""
        got = self.entry(node)
        return None if got is None else _mac(got, digest)

    def mac(self, node: str, value: bytes) -> bytes | None:
        """The MAC of ``value`` under ``node``'s key, or None when not held."""
        return self.mac_of_digest(node, sha256(value).digest())

    def proofs(self, value: bytes, nodes: Iterable[str]) -> list[tuple[str, bytes]]:
        """The proof headers of ``value`` for each of ``nodes`` held here."""
        digest = sha256(value).digest()
        out = []
        for node in nodes:
            got = self.entry(node)
            if got is not None:
                out.append((PROOF_HEADER, got[2] + _mac(got, digest).hex().encode()))
        return out


def _mac(entry: tuple[Any, Any, bytes], digest: bytes) -> bytes:
    inner = entry[0].copy()
    inner.update(digest)
    outer = entry[1].copy()
    outer.update(inner.digest())
    return outer.digest()[:MAC_BYTES]


def _hmac_pads(key: bytes) -> tuple[Any, Any]:
    """SHA-256 states after HMAC's inner and outer key blocks (RFC 2104, a key of at
    most one block)."""
    block = key.ljust(64, b"\0")
    return sha256(block.translate(_IPAD)), sha256(block.translate(_OPAD))


def message_nodes(msg: Any) -> list[str]:
    """The nodes a telemetry message speaks for: a health report's node; a steps
    message's node and, in a rack's message (version 2, or 3), every sample's node."""
    table = getattr(msg, "nodes", None)  # a columnar view's (version 3): its nodes table
    if isinstance(table, tuple):
        return list(dict.fromkeys((msg.node, *table)))
    nodes = [msg.node]
    samples = getattr(msg, "samples", None)
    if samples and getattr(samples[0], "node", None) is not None:
        seen = {msg.node}
        for s in samples:
            n = s.node
            if n is not None and n not in seen:
                seen.add(n)
                nodes.append(n)
    return nodes


class TelemetryProver:
    """What a producer of telemetry signs with: the node keys it holds and, for a
    training job's own lifecycle, its job controller's key (:data:`JOB_LEVEL`)."""

    def __init__(self, nodes: NodeKeys | None, controller: SigningKey | None = None) -> None:
        self.nodes = nodes
        self.controller = controller

    def headers(self, logical: str, msg: Any, value: bytes) -> list[tuple[str, bytes]]:
        """The proof headers of ``msg`` (encoded as ``value``) on topic ``logical``."""
        if logical == "lifecycle":
            out: list[tuple[str, bytes]] = []
            key = self.controller
            if key is not None and key.key_id.split(".", 1)[0] == job_controller_key_id(msg.job_id):
                sig = key.private.sign(value).hex()
                out.append((PROOF_HEADER, f"jc:{key.key_id}:{sig}".encode()))
            if self.nodes is not None and msg.source:
                out += self.nodes.proofs(value, [msg.source])
            return out
        if logical in ("steps", "health") and self.nodes is not None:
            return self.nodes.proofs(value, message_nodes(msg))
        return []


def _proofs(headers: Headers | Mapping[str, bytes] | None) -> list[bytes]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    try:
        return [v for k, v in items if k == PROOF_HEADER and isinstance(v, bytes)]
    except (TypeError, ValueError):  # not (name, value) pairs
        return []


class TelemetryVerifier:
    """The worker's check of a telemetry record's proofs; every ``*_problem`` returns
    why a record is refused, or None, and never raises on what a header holds."""

    def __init__(
        self,
        nodes: NodeKeys,
        controller_keys: PublicKeys | None = None,
        max_remembered: int = 65_536,
    ) -> None:
        if max_remembered < 1:
            raise ValueError("max_remembered must be >= 1")
        self.nodes = nodes
        self.controller_keys: PublicKeys = controller_keys or {}
        self.max_remembered = max_remembered
        #: digest of a proven health or lifecycle record -> where it was first read
        self._seen: OrderedDict[bytes, tuple[str, int, int]] = OrderedDict()

    def replay_problem(self, topic: str, partition: int, offset: int, value: bytes) -> str | None:
        """Why a proven record is a replay of one read before at another place (its
        exact bytes, proofs and all, written again), or None; the same record read
        again at its own offset (a redelivery) is not one. The last ``max_remembered``
        records are remembered (oldest first out).

        >>> v = TelemetryVerifier(NodeKeys(secret=bytes(32)))
        >>> v.replay_problem("h", 0, 5, b"x"), v.replay_problem("h", 0, 5, b"x")
        (None, None)
        >>> v.replay_problem("h", 1, 9, b"x")
        'a replay of h[0]@5'
        """
        digest = sha256(value).digest()
        first = self._seen.get(digest)
        here = (topic, partition, offset)
        if first is not None and first != here:
            return f"a replay of {first[0]}[{first[1]}]@{first[2]}"
        self._seen[digest] = here
        self._seen.move_to_end(digest)
        while len(self._seen) > self.max_remembered:
            self._seen.popitem(last=False)
        return None

    def proven(
        self, headers: Headers | None, value: bytes, wanted: Iterable[str] | None = None
    ) -> set[str]:
        """The nodes (of ``wanted``, when given: a proof of any other node is not even
        looked at) whose valid proof of ``value`` the headers carry."""
        want = None if wanted is None else set(wanted)
        digest = sha256(value).digest()
        out: set[str] = set()
        tail = 2 * MAC_BYTES + 1  # ":" and the MAC's hex
        for proof in _proofs(headers):
            if len(proof) <= 5 + tail or not proof.startswith(_NODE) or proof[-tail] != 58:
                continue
            try:
                node = proof[5:-tail].decode()
            except UnicodeDecodeError:
                continue
            if node in out or (want is not None and node not in want):
                continue
            expect = self.nodes.mac_of_digest(node, digest)
            if expect is not None and hmac.compare_digest(proof[1 - tail :], expect.hex().encode()):
                out.add(node)
        return out

    def nodes_problem(
        self, headers: Headers | None, value: bytes | None, nodes: Sequence[str]
    ) -> str | None:
        """Why ``value`` does not speak for every one of ``nodes``, or None.

        Each node's proof is found by its header's prefix (``node:<node>:``, kept with
        its key) and its MAC compared in constant time; what this does not accept at
        once (a proof missing or wrong, a node's proof sent twice, a name that does not
        encode) is decided by :meth:`proven`, proof by proof."""
        raw = value or b""
        given: dict[bytes, bytes] = {}
        for proof in _proofs(headers):
            given.setdefault(proof[:-_HEX], proof[-_HEX:])
        if given:
            try:
                if self.nodes.all_proven(given, sha256(raw).digest(), nodes):
                    return None
            except UnicodeEncodeError:  # a name no proof can carry: decided below
                pass
        proven = self.proven(headers, raw, nodes)
        missing = [n for n in nodes if n not in proven]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            return f"no proof of node {missing[0][:100]!r}{more}"
        return None

    def controller_problem(self, headers: Headers | None, value: bytes, job_id: str) -> str | None:
        """Why ``value`` is not signed by ``job_id``'s own controller key, or None."""
        bound = job_controller_key_id(job_id)
        seen = False
        for proof in _proofs(headers):
            if not proof.startswith(_JC):
                continue
            seen = True
            kid_b, sep, sig_hex = proof[3:].rpartition(b":")
            try:
                kid, sig = kid_b.decode("ascii"), bytes.fromhex(sig_hex.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                continue
            if not sep or kid.split(".", 1)[0] != bound:
                continue
            public = self.controller_keys.get(kid)
            if public is None:
                continue
            try:
                public.verify(sig, value)
            except InvalidSignature:
                continue
            return None
        if seen:
            return f"no valid signature of job {job_id[:100]!r}'s controller"
        return f"not signed by job {job_id[:100]!r}'s controller"

    def lifecycle_problem(
        self, headers: Headers | None, value: bytes | None, event: Any
    ) -> str | None:
        """Why a lifecycle event is refused: an end, a phase or a start that declares
        the job's nodes needs the job's controller; any other event the controller or
        its ``source`` node."""
        raw = value or b""
        job_level = event.kind.value in JOB_LEVEL or bool(getattr(event, "nodes", ()))
        problem = self.controller_problem(headers, raw, event.job_id)
        if problem is None or job_level:
            return problem
        if event.source and self.nodes_problem(headers, raw, [event.source]) is None:
            return None
        return f"{problem}, nor proven by its source node {event.source[:100]!r}"


def telemetry_prover(settings: Any, needed_by: str) -> TelemetryProver | None:
    """What a producer of ``settings`` signs telemetry with; None when telemetry is
    not authenticated (``STEPGUARD_TELEMETRY_AUTH=off``, logged as a warning). Neither
    a node key nor the cluster secret is a :class:`ConfigError` naming the variable."""
    if settings.telemetry_auth == "off":
        _warn_off(needed_by)
        return None
    nodes = _node_keys(settings)
    if nodes is None:
        # on a stack `stepguard up` started, the job's file holds the stack's secret
        env = Path(getattr(settings, "state_dir", ".stepguard")) / "job-controller.env"
        hint = f"; `stepguard up` wrote the secret of its stack to {env}" if env.is_file() else ""
        raise ConfigError(
            f"STEPGUARD_TELEMETRY_NODE_KEYS is required by {needed_by}: telemetry is "
            "authenticated (`stepguard keys node --node NODE` derives a node's key from the "
            "cluster secret; STEPGUARD_TELEMETRY_AUTH=off turns authentication off, logged"
            f"{hint})"
        )
    controller = None
    pair = settings.private_key("job_controller")
    if pair is not None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        controller = SigningKey(pair[0], Ed25519PrivateKey.from_private_bytes(pair[1]))
    return TelemetryProver(nodes, controller)


def telemetry_verifier(
    settings: Any, controller_keys: PublicKeys, needed_by: str
) -> TelemetryVerifier | None:
    """The worker's check of telemetry; None when it is not authenticated (logged)."""
    if settings.telemetry_auth == "off":
        _warn_off(needed_by)
        return None
    nodes = _node_keys(settings)
    if nodes is None:
        raise ConfigError(
            f"STEPGUARD_TELEMETRY_SECRET is required by {needed_by}: it accepts a record "
            "about a node only with that node's proof (`stepguard keys telemetry` makes "
            "the cluster secret; STEPGUARD_TELEMETRY_AUTH=off turns authentication off, "
            "logged)"
        )
    return TelemetryVerifier(nodes, controller_keys)


def _node_keys(settings: Any) -> NodeKeys | None:
    secret = settings.telemetry_secret
    listed = settings.telemetry_node_keys
    keys = parse_node_keys(listed.get_secret_value()) if listed is not None else {}
    raw = parse_secret(secret.get_secret_value()) if secret is not None else None
    if raw is None and not keys:
        return None
    return NodeKeys(secret=raw, keys=keys)


_warned: set[str] = set()


def _warn_off(needed_by: str) -> None:
    if needed_by not in _warned:
        _warned.add(needed_by)
        log.warning(
            "STEPGUARD_TELEMETRY_AUTH=off: %s sends or accepts telemetry without proof "
            "(any writer of the topics can speak for any node and job)", needed_by,
        )  # fmt: skip
