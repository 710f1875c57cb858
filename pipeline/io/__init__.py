"""The io floor: plumbing every other floor stands on.

Owns settings (:mod:`~pipeline.io.settings`), Kafka clients (:mod:`~pipeline.io.kafka`),
the embedded broker (:mod:`~pipeline.io.embedded`), codecs (:mod:`~pipeline.io.fastdecode`,
:mod:`~pipeline.io.statecodec`), trust (:mod:`~pipeline.io.trust`: signing and command
admission), clock skew, redaction, metrics and the exception tree
(:mod:`~pipeline.io.errors`). Imports only :mod:`schemas`, :mod:`detectors` (the state
codec reads detector state) and third-party libraries: no other floor of ``pipeline``.
"""
