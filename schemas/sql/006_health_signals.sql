-- NodeHealth version 2 (issue 16 item 2): the silent-slowdown readings per GPU.
-- PCIe link generation and width with their maximums (NULL: unknown, as in every row
-- archived before), NVLink CRC and replay counters and links down, row remap pending
-- and failed (0/1). Rows archived before this migration read 0 / NULL.
ALTER TABLE {db}.health ADD COLUMN nvlink_crc_errors UInt64 DEFAULT 0;
ALTER TABLE {db}.health ADD COLUMN nvlink_replay_errors UInt64 DEFAULT 0;
ALTER TABLE {db}.health ADD COLUMN nvlink_links_down UInt8 DEFAULT 0;
ALTER TABLE {db}.health ADD COLUMN pcie_gen Nullable(UInt8);
ALTER TABLE {db}.health ADD COLUMN pcie_gen_max Nullable(UInt8);
ALTER TABLE {db}.health ADD COLUMN pcie_width Nullable(UInt8);
ALTER TABLE {db}.health ADD COLUMN pcie_width_max Nullable(UInt8);
ALTER TABLE {db}.health ADD COLUMN remap_pending UInt8 DEFAULT 0;
ALTER TABLE {db}.health ADD COLUMN remap_failed UInt8 DEFAULT 0;
