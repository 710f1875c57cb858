-- Partition by a time no writer controls (issue 39, "the archiver never stops on data").
--
-- Every table was partitioned by toYYYYMMDD(ts), the writer's own event time. One burst
-- of records dated on many days (300 lifecycle events on 300 past days, or far ahead)
-- made one INSERT block span more than max_partitions_per_insert_block (100) days:
-- ClickHouse refused the whole insert (code 252), whatever the other rows were.
--
-- received: when the archive stored the row, by the server's clock (DEFAULT now(); the
-- archiver never sends it), and the partition key. A batch now lands in one daily
-- partition (two across midnight), however its rows are dated, and retention
-- (DROP PARTITION) counts from when a row was stored. `ts` keeps the event time every
-- query reads. Rows archived before this migration read the migration's time.
--
-- ReplacingMergeTree collapses a key within a partition when it merges; readers use
-- FINAL, which collapses across partitions (do_not_merge_across_partitions_select_final
-- is off by default, and `received` is not in any sorting key), so a batch replayed
-- after midnight still reads once.
--
-- 18.16 cannot change a table's partition key: each table is copied (received fixed to
-- the migration's now(): one partition, so the copy itself stays one partition per
-- block) and swapped in. Runs unchanged on 18.16 and chDB.

ALTER TABLE {db}.steps ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.steps__013;
CREATE TABLE {db}.steps__013 AS {db}.steps
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (job_id, run, step, rank);
INSERT INTO {db}.steps__013 SELECT * FROM {db}.steps;
RENAME TABLE {db}.steps TO {db}.steps__old, {db}.steps__013 TO {db}.steps;
DROP TABLE {db}.steps__old;

ALTER TABLE {db}.health ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.health__013;
CREATE TABLE {db}.health__013 AS {db}.health
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (node, ts_ms, gpu);
INSERT INTO {db}.health__013 SELECT * FROM {db}.health;
RENAME TABLE {db}.health TO {db}.health__old, {db}.health__013 TO {db}.health;
DROP TABLE {db}.health__old;

ALTER TABLE {db}.alerts ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.alerts__013;
CREATE TABLE {db}.alerts__013 AS {db}.alerts
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (job_id, fingerprint, seq);
INSERT INTO {db}.alerts__013 SELECT * FROM {db}.alerts;
RENAME TABLE {db}.alerts TO {db}.alerts__old, {db}.alerts__013 TO {db}.alerts;
DROP TABLE {db}.alerts__old;

ALTER TABLE {db}.commands ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.commands__013;
CREATE TABLE {db}.commands__013 AS {db}.commands
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (job_id, command_id);
INSERT INTO {db}.commands__013 SELECT * FROM {db}.commands;
RENAME TABLE {db}.commands TO {db}.commands__old, {db}.commands__013 TO {db}.commands;
DROP TABLE {db}.commands__old;

ALTER TABLE {db}.command_results ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.command_results__013;
CREATE TABLE {db}.command_results__013 AS {db}.command_results
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (job_id, command_id, executor, status);
INSERT INTO {db}.command_results__013 SELECT * FROM {db}.command_results;
RENAME TABLE {db}.command_results TO {db}.command_results__old, {db}.command_results__013 TO {db}.command_results;
DROP TABLE {db}.command_results__old;

ALTER TABLE {db}.approvals ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.approvals__013;
CREATE TABLE {db}.approvals__013 AS {db}.approvals
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (command_id, ts_ms);
INSERT INTO {db}.approvals__013 SELECT * FROM {db}.approvals;
RENAME TABLE {db}.approvals TO {db}.approvals__old, {db}.approvals__013 TO {db}.approvals;
DROP TABLE {db}.approvals__old;

ALTER TABLE {db}.dead_letters ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.dead_letters__013;
CREATE TABLE {db}.dead_letters__013 AS {db}.dead_letters
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (source_topic, partition, offset, stage);
INSERT INTO {db}.dead_letters__013 SELECT * FROM {db}.dead_letters;
RENAME TABLE {db}.dead_letters TO {db}.dead_letters__old, {db}.dead_letters__013 TO {db}.dead_letters;
DROP TABLE {db}.dead_letters__old;

ALTER TABLE {db}.fault_truth ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.fault_truth__013;
CREATE TABLE {db}.fault_truth__013 AS {db}.fault_truth
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (job_id, fault_id);
INSERT INTO {db}.fault_truth__013 SELECT * FROM {db}.fault_truth;
RENAME TABLE {db}.fault_truth TO {db}.fault_truth__old, {db}.fault_truth__013 TO {db}.fault_truth;
DROP TABLE {db}.fault_truth__old;

ALTER TABLE {db}.control_changes ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.control_changes__013;
CREATE TABLE {db}.control_changes__013 AS {db}.control_changes
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (change_id, ts_ms);
INSERT INTO {db}.control_changes__013 SELECT * FROM {db}.control_changes;
RENAME TABLE {db}.control_changes TO {db}.control_changes__old, {db}.control_changes__013 TO {db}.control_changes;
DROP TABLE {db}.control_changes__old;

ALTER TABLE {db}.actions ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.actions__013;
CREATE TABLE {db}.actions__013 AS {db}.actions
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (action_id, state, ts_ms);
INSERT INTO {db}.actions__013 SELECT * FROM {db}.actions;
RENAME TABLE {db}.actions TO {db}.actions__old, {db}.actions__013 TO {db}.actions;
DROP TABLE {db}.actions__old;

ALTER TABLE {db}.job_events ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.job_events__013;
CREATE TABLE {db}.job_events__013 AS {db}.job_events
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (job_id, event_id);
INSERT INTO {db}.job_events__013 SELECT * FROM {db}.job_events;
RENAME TABLE {db}.job_events TO {db}.job_events__old, {db}.job_events__013 TO {db}.job_events;
DROP TABLE {db}.job_events__old;

ALTER TABLE {db}.labels ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.labels__013;
CREATE TABLE {db}.labels__013 AS {db}.labels
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (incident, ts_ms);
INSERT INTO {db}.labels__013 SELECT * FROM {db}.labels;
RENAME TABLE {db}.labels TO {db}.labels__old, {db}.labels__013 TO {db}.labels;
DROP TABLE {db}.labels__old;

ALTER TABLE {db}.acks ADD COLUMN received DateTime('UTC') DEFAULT now();
DROP TABLE IF EXISTS {db}.acks__013;
CREATE TABLE {db}.acks__013 AS {db}.acks
ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(received) ORDER BY (subject, source_topic, source_partition, source_offset, ts_ms);
INSERT INTO {db}.acks__013 SELECT * FROM {db}.acks;
RENAME TABLE {db}.acks TO {db}.acks__old, {db}.acks__013 TO {db}.acks;
DROP TABLE {db}.acks__old;
