-- The work a step did (issue 43): per rank, the tokens it processed, its floating-point
-- operations and the longest sequence of its batch, when the exporter said them (all
-- optional in StepTelemetry). NULL: not said, as in every row archived before.
ALTER TABLE {db}.steps ADD COLUMN tokens Nullable(UInt64);
ALTER TABLE {db}.steps ADD COLUMN flops Nullable(Float64);
ALTER TABLE {db}.steps ADD COLUMN max_seq_len Nullable(UInt64);
