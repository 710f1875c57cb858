-- The actuator's answers to operators (topic acks): one row per approval or control
-- message it consumed (applied or refused, and why; the commands an approval issued)
-- and one per start (its mode). `stepguard approve/reject/control` wait for theirs.
CREATE TABLE IF NOT EXISTS {db}.acks
(
    subject String,
    request String,
    source_topic String,
    source_partition UInt32,
    source_offset Int64,
    outcome String,
    state String,
    detail String,
    by String,
    commands Array(String),
    mode String,
    signed Int8,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (subject, source_topic, source_partition, source_offset, ts_ms);
