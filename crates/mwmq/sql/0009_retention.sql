-- mwmq schema version 9.
--
-- Schema version 9: the setting, the archive, and `mwmq.ack` archiving too.
--
-- (The Rust side: crates/mwmq/src/retention.rs.)

ALTER TABLE mwmq_queues ADD COLUMN retain_ms bigint;
CREATE TABLE mwmq_archive (
    queue_id bigint NOT NULL,
    id bigint NOT NULL,
    sender text NOT NULL,
    receiver text,
    body bytea NOT NULL,
    sent_at timestamptz NOT NULL,
    deliveries integer NOT NULL,
    acked_at timestamptz NOT NULL DEFAULT now(),
    acked_by text,
    PRIMARY KEY (queue_id, id)
);
CREATE INDEX mwmq_archive_age ON mwmq_archive (queue_id, acked_at);
DO $install$
BEGIN
EXECUTE format($f$
CREATE OR REPLACE FUNCTION mwmq.ack(queue text, id bigint, lease bigint)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, %1$I, pg_temp AS $body$
    WITH q AS (SELECT q.id, q.retain_ms FROM mwmq_queues q WHERE q.name = $1 AND q.dropped_at IS NULL),
         gone AS (
            DELETE FROM mwmq_messages m USING q
            WHERE m.queue_id = q.id AND m.id = $2 AND m.lease = $3
            RETURNING m.queue_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries, m.leased_to,
                      q.retain_ms),
         kept AS (
            INSERT INTO mwmq_archive (queue_id, id, sender, receiver, body, sent_at, deliveries, acked_by)
            SELECT g.queue_id, g.id, g.sender, g.receiver, g.body, g.sent_at, g.deliveries, g.leased_to
            FROM gone g WHERE g.retain_ms IS NOT NULL
            ON CONFLICT DO NOTHING)
    SELECT count(*) > 0 FROM gone
$body$
$f$, current_schema());
END
$install$;
REVOKE ALL ON FUNCTION mwmq.ack(text, bigint, bigint) FROM PUBLIC;
