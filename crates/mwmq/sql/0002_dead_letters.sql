-- mwmq schema version 2.
--
-- dead letters: a queue's limit of deliveries and where what exceeds
-- it goes; a dead-lettered message remembers its queue and why.

ALTER TABLE mwmq_queues ADD COLUMN max_deliveries integer, ADD COLUMN dead_letter text;
    ALTER TABLE mwmq_messages ADD COLUMN dead_from text, ADD COLUMN dead_reason text;
