-- Analyst queries ignore unsigned alerts and commands (issue 14 item 6): whoever can
-- write the decisions or commands topic could invent them. The archive keeps every
-- row; the named queries (`stepguard query`, `stepguard report`) read only signed ones.
--
-- commands.signed exists since 001 (1: the command carried a signature). Alerts get
-- the same column: 1 signed, 0 unsigned; rows archived before this migration read -1
-- (not known) and the queries keep them (`signed != 0`), so an existing archive loses
-- nothing from its reports. Additive: runs unchanged on 18.16 and chDB, no rewrite.
ALTER TABLE {db}.alerts ADD COLUMN signed Int8 DEFAULT -1;
