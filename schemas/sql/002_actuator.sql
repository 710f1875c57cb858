-- Actuator runtime changes and action records (held, approved, rejected, ...).
CREATE TABLE IF NOT EXISTS {db}.control_changes
(
    change_id String,
    scope String,
    mode String,
    change String,
    by String,
    reason String,
    signed UInt8,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (change_id, ts_ms);

-- one row per state change of an action: ORDER BY includes the state
CREATE TABLE IF NOT EXISTS {db}.actions
(
    action_id String,
    state String,
    job_id String,
    mode String,
    kinds Array(String),
    targets Array(String),
    reason Array(String),
    summary String,
    detail String,
    by String,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (action_id, state, ts_ms);
