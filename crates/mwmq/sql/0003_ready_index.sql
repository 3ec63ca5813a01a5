-- mwmq schema version 3.
--
-- receivers take messages in the order they became visible, from an
-- index that has the leased ones (visible later) at its far end: a RECV
-- no longer steps over every message under lease to find a ready one.

CREATE INDEX mwmq_messages_ready ON mwmq_messages (queue_id, visible_at, id);
