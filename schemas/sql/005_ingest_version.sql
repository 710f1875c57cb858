-- Replacing version = ingest position (issue 14 item 6), and steps keyed by run.
--
-- From now on the archiver writes ver = 2^63 - 1 - (the record's offset in its
-- partition): the first record stored under a key wins, a replay ties with itself,
-- and no time a writer puts in a message decides what stays. Rows archived before
-- this migration had ver = their message's own ts_ms; each table is rebuilt so that
-- they carry ver = 2^63 (they stay: nothing ingested later replaces them), one row
-- per key as FINAL read them. The steps table also gets the column run (the
-- exporter's run or attempt id, '' before) in its key, so a relaunched run never
-- replaces the abandoned run's rows.
--
-- ClickHouse 18.16 cannot change ORDER BY of an existing table, nor UPDATE a version
-- column, and has no SELECT * REPLACE: each table is copied into a new one with its
-- columns named, then swapped in with RENAME (works the same on 18.16 and chDB). The
-- copy reads with FINAL: on a very large archive this takes a while, run it with the
-- archiver stopped. Should it stop half way, run it again; if it stops after a RENAME
-- and before the DROP that follows, drop the leftover <table>__004 by hand first.

-- steps
DROP TABLE IF EXISTS {db}.steps__005;
CREATE TABLE {db}.steps__005
(
    job_id String,
    run String,
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
ORDER BY (job_id, run, step, rank);
INSERT INTO {db}.steps__005 (job_id, step, node, rank, local_rank, dp_group, pp_stage, tp_group, phase, step_time_s, compute_s, comm_wait_s, data_wait_s, loss, grad_norm, ts, ts_ms, ver)
SELECT job_id, step, node, rank, local_rank, dp_group, pp_stage, tp_group, phase, step_time_s, compute_s, comm_wait_s, data_wait_s, loss, grad_norm, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.steps FINAL;
RENAME TABLE {db}.steps TO {db}.steps__004, {db}.steps__005 TO {db}.steps;
DROP TABLE {db}.steps__004;

-- health
DROP TABLE IF EXISTS {db}.health__005;
CREATE TABLE {db}.health__005 AS {db}.health;
INSERT INTO {db}.health__005 (job_id, node, gpu, temperature_c, power_w, sm_clock_mhz, utilization_pct, ecc_corrected, ecc_uncorrected, xid_codes, throttle_reasons, nvlink_errors, nic_errors, nic_retransmits, interval_s, ts, ts_ms, ver)
SELECT job_id, node, gpu, temperature_c, power_w, sm_clock_mhz, utilization_pct, ecc_corrected, ecc_uncorrected, xid_codes, throttle_reasons, nvlink_errors, nic_errors, nic_retransmits, interval_s, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.health FINAL;
RENAME TABLE {db}.health TO {db}.health__004, {db}.health__005 TO {db}.health;
DROP TABLE {db}.health__004;

-- alerts
DROP TABLE IF EXISTS {db}.alerts__005;
CREATE TABLE {db}.alerts__005 AS {db}.alerts;
INSERT INTO {db}.alerts__005 (fingerprint, seq, kind, grade, state, job_id, node, rank, step, metric, value, peer_median, baseline, deviation, trend, detail, recommended_action, summary, started_at, ts, ts_ms, incident, ver)
SELECT fingerprint, seq, kind, grade, state, job_id, node, rank, step, metric, value, peer_median, baseline, deviation, trend, detail, recommended_action, summary, started_at, ts, ts_ms, incident, toUInt64('9223372036854775808')
FROM {db}.alerts FINAL;
RENAME TABLE {db}.alerts TO {db}.alerts__004, {db}.alerts__005 TO {db}.alerts;
DROP TABLE {db}.alerts__004;

-- commands
DROP TABLE IF EXISTS {db}.commands__005;
CREATE TABLE {db}.commands__005 AS {db}.commands;
INSERT INTO {db}.commands__005 (command_id, kind, job_id, targets, replacements, checkpoint_step, reason, mode, summary, signed, ts, ts_ms, ver)
SELECT command_id, kind, job_id, targets, replacements, checkpoint_step, reason, mode, summary, signed, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.commands FINAL;
RENAME TABLE {db}.commands TO {db}.commands__004, {db}.commands__005 TO {db}.commands;
DROP TABLE {db}.commands__004;

-- command_results
DROP TABLE IF EXISTS {db}.command_results__005;
CREATE TABLE {db}.command_results__005 AS {db}.command_results;
INSERT INTO {db}.command_results__005 (command_id, job_id, executor, status, detail, ts, ts_ms, ver)
SELECT command_id, job_id, executor, status, detail, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.command_results FINAL;
RENAME TABLE {db}.command_results TO {db}.command_results__004, {db}.command_results__005 TO {db}.command_results;
DROP TABLE {db}.command_results__004;

-- approvals
DROP TABLE IF EXISTS {db}.approvals__005;
CREATE TABLE {db}.approvals__005 AS {db}.approvals;
INSERT INTO {db}.approvals__005 (command_id, decision, by, reason, ts, ts_ms, ver)
SELECT command_id, decision, by, reason, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.approvals FINAL;
RENAME TABLE {db}.approvals TO {db}.approvals__004, {db}.approvals__005 TO {db}.approvals;
DROP TABLE {db}.approvals__004;

-- dead_letters
DROP TABLE IF EXISTS {db}.dead_letters__005;
CREATE TABLE {db}.dead_letters__005 AS {db}.dead_letters;
INSERT INTO {db}.dead_letters__005 (source_topic, partition, offset, stage, error, raw, ts, ts_ms, ver)
SELECT source_topic, partition, offset, stage, error, raw, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.dead_letters FINAL;
RENAME TABLE {db}.dead_letters TO {db}.dead_letters__004, {db}.dead_letters__005 TO {db}.dead_letters;
DROP TABLE {db}.dead_letters__004;

-- fault_truth
DROP TABLE IF EXISTS {db}.fault_truth__005;
CREATE TABLE {db}.fault_truth__005 AS {db}.fault_truth;
INSERT INTO {db}.fault_truth__005 (scenario, job_id, fault_id, kind, is_trap, node, rank, onset_step, end_step, magnitude, detail, ts, ts_ms, ver)
SELECT scenario, job_id, fault_id, kind, is_trap, node, rank, onset_step, end_step, magnitude, detail, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.fault_truth FINAL;
RENAME TABLE {db}.fault_truth TO {db}.fault_truth__004, {db}.fault_truth__005 TO {db}.fault_truth;
DROP TABLE {db}.fault_truth__004;

-- control_changes
DROP TABLE IF EXISTS {db}.control_changes__005;
CREATE TABLE {db}.control_changes__005 AS {db}.control_changes;
INSERT INTO {db}.control_changes__005 (change_id, scope, mode, change, by, reason, signed, ts, ts_ms, ver)
SELECT change_id, scope, mode, change, by, reason, signed, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.control_changes FINAL;
RENAME TABLE {db}.control_changes TO {db}.control_changes__004, {db}.control_changes__005 TO {db}.control_changes;
DROP TABLE {db}.control_changes__004;

-- actions
DROP TABLE IF EXISTS {db}.actions__005;
CREATE TABLE {db}.actions__005 AS {db}.actions;
INSERT INTO {db}.actions__005 (action_id, state, job_id, mode, kinds, targets, reason, summary, detail, by, ts, ts_ms, ver)
SELECT action_id, state, job_id, mode, kinds, targets, reason, summary, detail, by, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.actions FINAL;
RENAME TABLE {db}.actions TO {db}.actions__004, {db}.actions__005 TO {db}.actions;
DROP TABLE {db}.actions__004;

-- job_events
DROP TABLE IF EXISTS {db}.job_events__005;
CREATE TABLE {db}.job_events__005 AS {db}.job_events;
INSERT INTO {db}.job_events__005 (event_id, job_id, kind, step, phase, expected_s, reason, run, source, detail, ts, ts_ms, ver)
SELECT event_id, job_id, kind, step, phase, expected_s, reason, run, source, detail, ts, ts_ms, toUInt64('9223372036854775808')
FROM {db}.job_events FINAL;
RENAME TABLE {db}.job_events TO {db}.job_events__004, {db}.job_events__005 TO {db}.job_events;
DROP TABLE {db}.job_events__004;
