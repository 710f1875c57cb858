-- Alerts carry the group key of their incident (Alert.incident): every episode of one
-- culprit and one kind while any is open. Rows archived before it read ''.
ALTER TABLE {db}.alerts ADD COLUMN incident String DEFAULT '';
