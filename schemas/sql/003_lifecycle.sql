-- Job lifecycle events (start, announced long phases, end with its reason); one row
-- per event id, so a replay or a retried publish is stored once.
CREATE TABLE IF NOT EXISTS {db}.job_events
(
    event_id String,
    job_id String,
    kind String,
    step Int64,
    phase String,
    expected_s Float64,
    reason String,
    run String,
    source String,
    detail String,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (job_id, event_id);
