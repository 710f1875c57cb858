-- Analyst queries and `stepguard calibrate --actions` ignore unsigned action records
-- and approvals, as they ignore unsigned alerts and commands (migration 008): whoever
-- can write the actions or approvals topic could invent a hold, an approval or a
-- rejection and so move a kind towards (or away from) auto.
--
-- actions.signed: the actuator's key made its signature; approvals.signed: an
-- operator's key did (verified by the archiver where it holds those public keys, else
-- a signature's presence). 1 signed, 0 unsigned; rows archived before this migration
-- read -1 (not known) and the readers keep them (`signed != 0`), so an existing
-- archive loses nothing from its reports. Additive: runs unchanged on 18.16 and chDB.
ALTER TABLE {db}.actions ADD COLUMN signed Int8 DEFAULT -1;
ALTER TABLE {db}.approvals ADD COLUMN signed Int8 DEFAULT -1;
