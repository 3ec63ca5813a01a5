-- mwmq schema version 7.
--
-- SQL functions an application calls in its own transaction, on the
-- database a queue lives in: `mwmq.send` writes a message that exists if and
-- only if the caller's transaction commits, `mwmq.ack` acknowledges one in
-- the same transaction as the work it finished. Installed by mwmq's own
-- migrations (schema version 7) in the schema `mwmq`; nobody may call them
-- until granted (`GRANT USAGE ON SCHEMA mwmq TO app; GRANT EXECUTE ON ALL
-- FUNCTIONS IN SCHEMA mwmq TO app;`).
--
-- They run with the rights of the role that installed them (SECURITY
-- DEFINER), so the caller needs no right on the tables. What they do is
-- what SEND and ACK do: the same rows, the same quota check, the same
-- deduplication keys, and a NOTIFY on mwmq's channel with the queue's name,
-- which PostgreSQL delivers when (and only if) the transaction commits, so
-- long polls waiting on the queue wake then. docs/mwmq.md says what this
-- contract freezes in the schema.
--
-- This is the version 7 they were installed as, kept as it ran; schema
-- version 11 (`sqlguard.rs`) replaced them: every name qualified, the
-- search path `pg_catalog, mwmq, pg_temp`, the users' rights, `max_body`
-- and a quota that holds at COMMIT.
--
-- Schema version 7: the `mwmq` schema and its functions (their bodies go
-- through `format()`, which fills in the schema of mwmq's tables: a `%` of
-- a message is written `%%`).

CREATE SCHEMA IF NOT EXISTS mwmq;
DO $install$
BEGIN
EXECUTE format($f$
CREATE FUNCTION mwmq.send(queue text, body bytea, key text DEFAULT NULL, delay_ms bigint DEFAULT 0,
                          receiver text DEFAULT NULL, message_group text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, %1$I, pg_temp AS $body$
#variable_conflict use_column
DECLARE
    q record;
    new_id bigint;
BEGIN
    IF send.queue IS NULL OR send.body IS NULL THEN
        RAISE EXCEPTION 'mwmq.send: the queue and the body must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF send.delay_ms IS NULL OR send.delay_ms < 0 THEN
        RAISE EXCEPTION 'mwmq.send: delay_ms must be 0 or more, not %%', send.delay_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT id, max_messages, max_bytes INTO q FROM mwmq_queues WHERE name = send.queue AND dropped_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'mwmq.send: no queue %%', send.queue USING ERRCODE = 'undefined_object';
    END IF;
    IF send.key IS NOT NULL THEN
        SELECT message_id INTO new_id FROM mwmq_keys WHERE queue_id = q.id AND key = send.key;
        IF FOUND THEN
            RETURN new_id;
        END IF;
    END IF;
    IF (q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL)
       AND NOT mwmq_room(q.id, q.max_messages, q.max_bytes, octet_length(send.body)) THEN
        RAISE EXCEPTION 'mwmq.send: queue %% is full', send.queue USING ERRCODE = 'program_limit_exceeded';
    END IF;
    new_id := nextval('mwmq_message_ids');
    IF send.key IS NOT NULL THEN
        -- A transaction holding the same key waits here until it ends.
        INSERT INTO mwmq_keys (queue_id, key, message_id) VALUES (q.id, send.key, new_id) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            SELECT message_id INTO new_id FROM mwmq_keys WHERE queue_id = q.id AND key = send.key;
            RETURN new_id;
        END IF;
    END IF;
    INSERT INTO mwmq_messages (queue_id, id, sender, receiver, body, visible_at, counted, grp)
    VALUES (q.id, new_id, session_user, send.receiver, send.body,
            clock_timestamp() + interval '1 millisecond' * send.delay_ms,
            q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL, send.message_group);
    PERFORM pg_notify('mwmq', send.queue);
    RETURN new_id;
END
$body$
$f$, current_schema());
EXECUTE format($f$
CREATE FUNCTION mwmq.ack(queue text, id bigint, lease bigint)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, %1$I, pg_temp AS $body$
    WITH gone AS (
        DELETE FROM mwmq_messages m
        WHERE m.queue_id = (SELECT q.id FROM mwmq_queues q WHERE q.name = $1 AND q.dropped_at IS NULL)
          AND m.id = $2 AND m.lease = $3
        RETURNING 1)
    SELECT count(*) > 0 FROM gone
$body$
$f$, current_schema());
END
$install$;
CREATE FUNCTION mwmq.send(queue text, body text, key text DEFAULT NULL, delay_ms bigint DEFAULT 0,
                          receiver text DEFAULT NULL, message_group text DEFAULT NULL)
RETURNS bigint LANGUAGE sql AS $$
    SELECT mwmq.send(queue, convert_to(body, 'UTF8'), key, delay_ms, receiver, message_group)
$$;
REVOKE ALL ON FUNCTION mwmq.send(text, bytea, text, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION mwmq.send(text, text, text, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION mwmq.ack(text, bigint, bigint) FROM PUBLIC;
