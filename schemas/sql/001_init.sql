-- stepguard archive, version 1.
-- Runs unchanged on ClickHouse 18.16 (Debian), chDB and current servers:
-- DateTime('UTC') plus ts_ms, no LowCardinality/Map/DateTime64/TTL/CODEC.
-- Every table is a ReplacingMergeTree keyed by the message identity, so a replay
-- collapses to one row; read with FINAL (or argMax) for exact answers.
-- Daily partitions: retention drops whole partitions.

CREATE TABLE IF NOT EXISTS {db}.steps
(
    job_id String,
    step UInt64,
    node String,
    rank UInt32,
    local_rank UInt16,
    dp_group UInt32,
    pp_stage UInt32,
    tp_group UInt32,
    phase Enum8('warmup' = 0, 'train' = 1, 'eval' = 2, 'checkpoint' = 3),
    step_time_s Float64,
    compute_s Float64,
    comm_wait_s Float64,
    data_wait_s Float64,
    loss Nullable(Float64),
    grad_norm Nullable(Float64),
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (job_id, step, rank);

CREATE TABLE IF NOT EXISTS {db}.health
(
    job_id String,
    node String,
    gpu UInt16,
    temperature_c Float64,
    power_w Float64,
    sm_clock_mhz Float64,
    utilization_pct Float64,
    ecc_corrected UInt64,
    ecc_uncorrected UInt64,
    xid_codes Array(UInt32),
    throttle_reasons Array(String),
    nvlink_errors UInt64,
    nic_errors UInt64,
    nic_retransmits UInt64,
    interval_s Float64,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (node, ts_ms, gpu);

CREATE TABLE IF NOT EXISTS {db}.alerts
(
    fingerprint String,
    seq UInt32,
    kind String,
    grade Enum8('info' = 0, 'warning' = 1, 'critical' = 2),
    state Enum8('firing' = 0, 'resolved' = 1),
    job_id String,
    node String,
    rank Int64,
    step Int64,
    metric String,
    value Float64,
    peer_median Nullable(Float64),
    baseline Nullable(Float64),
    deviation Float64,
    trend Nullable(Float64),
    detail String,
    recommended_action String,
    summary String,
    started_at DateTime('UTC'),
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (job_id, fingerprint, seq);

CREATE TABLE IF NOT EXISTS {db}.commands
(
    command_id String,
    kind String,
    job_id String,
    targets Array(String),
    replacements Array(String),
    checkpoint_step Int64,
    reason Array(String),
    mode String,
    summary String,
    signed UInt8,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (job_id, command_id);

CREATE TABLE IF NOT EXISTS {db}.command_results
(
    command_id String,
    job_id String,
    executor String,
    status String,
    detail String,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (job_id, command_id, executor, status);

CREATE TABLE IF NOT EXISTS {db}.approvals
(
    command_id String,
    decision String,
    by String,
    reason String,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (command_id, ts_ms);

CREATE TABLE IF NOT EXISTS {db}.dead_letters
(
    source_topic String,
    partition Int32,
    offset Int64,
    stage String,
    error String,
    raw String,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (source_topic, partition, offset, stage);

CREATE TABLE IF NOT EXISTS {db}.fault_truth
(
    scenario String,
    job_id String,
    fault_id String,
    kind String,
    is_trap UInt8,
    node String,
    rank Int64,
    onset_step UInt64,
    end_step Int64,
    magnitude Float64,
    detail String,
    ts DateTime('UTC'),
    ts_ms UInt64,
    ver UInt64
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (job_id, fault_id);
