-- Incident labels (issue 17): an operator's verdict on an incident, written by
-- `stepguard label INCIDENT --true|--false [--note TEXT]` and read by `stepguard
-- calibrate` as ground truth. Every verdict is kept (who, when, why); the latest one
-- per incident counts (argMax(verdict, ts_ms)). Runs unchanged on 18.16 and chDB.
CREATE TABLE IF NOT EXISTS {db}.labels
(
    incident String,
    job_id String,
    verdict UInt8,
    by String,
    note String,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (incident, ts_ms);
