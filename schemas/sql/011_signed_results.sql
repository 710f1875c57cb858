-- Command results are signed (by an executor's or a job controller's key) and the
-- archiver verifies them with those roles' public keys, as it verifies alerts,
-- commands, action records and approvals (migrations 008, 010): issue 22 item 11.
--
-- command_results.signed: 1 a result writer's key made its signature, 0 not (or the
-- archiver held no such key); rows archived before this migration read -1 (not
-- known). Readers of outcomes (`stepguard calibrate --actions`, the outcome labels,
-- the timeline) keep `signed != 0`.
--
-- command_results.at_ms: when the result counts as given, which is what "the latest
-- result of a command" is judged by: its own ts_ms, but never later than the
-- archiver's receive time (pipeline.services.archive.rows.result_at_ms), so one result dated
-- ten years ahead does not win for ever. Rows archived before this migration read
-- their ts_ms. Additive: runs unchanged on 18.16 and chDB, no rewrite.
ALTER TABLE {db}.command_results ADD COLUMN signed Int8 DEFAULT -1;
ALTER TABLE {db}.command_results ADD COLUMN at_ms UInt64 DEFAULT ts_ms;
