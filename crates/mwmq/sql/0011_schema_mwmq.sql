-- mwmq schema version 11.
--
-- Schema version 11. It runs with `search_path = mwmq`, after
-- `db::migrate` moved the objects of an older database into `mwmq`.
--
-- (The Rust side: crates/mwmq/src/sqlguard.rs.)

REVOKE CREATE ON SCHEMA mwmq FROM PUBLIC;
-- Only mwmq.send and mwmq.ack run with their owner's rights; the rest are
-- mwmq's own and nobody else's to call.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA mwmq FROM PUBLIC;

CREATE TABLE mwmq_sql_policy (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),
    open boolean NOT NULL DEFAULT false,
    max_body bigint NOT NULL DEFAULT 4194304
);
INSERT INTO mwmq_sql_policy DEFAULT VALUES;
CREATE TABLE mwmq_sql_roles (
    role text PRIMARY KEY,
    user_name text NOT NULL,
    send_like text[] NOT NULL,
    receive_like text[] NOT NULL,
    admin_like text[] NOT NULL,
    max_body bigint
);
CREATE TABLE mwmq_sql_gates (
    queue_id bigint PRIMARY KEY,
    checks bigint NOT NULL DEFAULT 0
);

-- Who the calling role is to mwmq, and whether it may `action` ('send' or
-- 'receive') on `queue`: its user's name, body limit (and what sets it),
-- and the holder an ACK must match (NULL: any, for an admin or without users).
CREATE FUNCTION mwmq.mwmq_sql_caller(queue text, action text,
                                     OUT user_name text, OUT max_body bigint, OUT limit_of text, OUT holder text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, mwmq, pg_temp AS $$
DECLARE
    policy record;
    r record;
    allowed text[];
    verb text := CASE WHEN action OPERATOR(pg_catalog.=) 'send' THEN 'send to' ELSE 'receive from' END;
    called text := CASE WHEN action OPERATOR(pg_catalog.=) 'send' THEN 'mwmq.send' ELSE 'mwmq.ack' END;
BEGIN
    SELECT p.open, p.max_body INTO policy FROM mwmq.mwmq_sql_policy AS p;
    IF policy.open THEN
        user_name := CAST(session_user AS pg_catalog.text);
        max_body := policy.max_body;
        limit_of := 'the server''s max_body';
        RETURN;
    END IF;
    SELECT u.user_name, u.send_like, u.receive_like, u.admin_like, u.max_body INTO r
    FROM mwmq.mwmq_sql_roles AS u WHERE u.role OPERATOR(pg_catalog.=) CAST(session_user AS pg_catalog.text);
    IF NOT FOUND THEN
        RAISE EXCEPTION '%: the role % is not one of any mwmq user''s database_roles', called, session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    allowed := CASE WHEN action OPERATOR(pg_catalog.=) 'send' THEN r.send_like ELSE r.receive_like END;
    IF queue IS NULL OR NOT EXISTS (SELECT FROM pg_catalog.unnest(allowed) AS a(p)
                                    WHERE queue OPERATOR(pg_catalog.~~) a.p) THEN
        RAISE EXCEPTION '%: the role % (mwmq user %) has no permissions to % queue ''%''',
            called, session_user, r.user_name, verb, queue
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    user_name := r.user_name;
    max_body := COALESCE(r.max_body, policy.max_body);
    limit_of := CASE WHEN r.max_body IS NULL THEN 'the server''s max_body'
                     ELSE pg_catalog.concat('max_body of mwmq user ', r.user_name) END;
    holder := CASE WHEN EXISTS (SELECT FROM pg_catalog.unnest(r.admin_like) AS a(p)
                                WHERE queue OPERATOR(pg_catalog.~~) a.p)
                   THEN NULL ELSE r.user_name END;
END $$;

CREATE OR REPLACE FUNCTION mwmq.send(queue text, body bytea, key text DEFAULT NULL, delay_ms bigint DEFAULT 0,
                                     receiver text DEFAULT NULL, message_group text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, mwmq, pg_temp AS $body$
#variable_conflict use_column
DECLARE
    q record;
    who record;
    size bigint;
    new_id bigint;
BEGIN
    IF send.queue IS NULL OR send.body IS NULL THEN
        RAISE EXCEPTION 'mwmq.send: the queue and the body must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF send.delay_ms IS NULL OR send.delay_ms OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'mwmq.send: delay_ms must be 0 or more, not %', send.delay_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO who FROM mwmq.mwmq_sql_caller(send.queue, 'send');
    size := pg_catalog.octet_length(send.body);
    IF size OPERATOR(pg_catalog.>) who.max_body THEN
        RAISE EXCEPTION 'mwmq.send: a body of % bytes is over the limit of % bytes (%)', size, who.max_body, who.limit_of
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    SELECT mq.id, mq.max_messages, mq.max_bytes INTO q FROM mwmq.mwmq_queues AS mq
    WHERE mq.name OPERATOR(pg_catalog.=) send.queue AND mq.dropped_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'mwmq.send: no queue %', send.queue USING ERRCODE = 'undefined_object';
    END IF;
    IF send.key IS NOT NULL THEN
        SELECT k.message_id INTO new_id FROM mwmq.mwmq_keys AS k
        WHERE k.queue_id OPERATOR(pg_catalog.=) q.id AND k.key OPERATOR(pg_catalog.=) send.key;
        IF FOUND THEN
            RETURN new_id;
        END IF;
    END IF;
    IF (q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL)
       AND NOT mwmq.mwmq_room(q.id, q.max_messages, q.max_bytes, size) THEN
        RAISE EXCEPTION 'mwmq.send: queue % is full', send.queue USING ERRCODE = 'program_limit_exceeded';
    END IF;
    new_id := pg_catalog.nextval(CAST('mwmq.mwmq_message_ids' AS pg_catalog.regclass));
    IF send.key IS NOT NULL THEN
        -- A transaction holding the same key waits here until it ends.
        INSERT INTO mwmq.mwmq_keys (queue_id, key, message_id) VALUES (q.id, send.key, new_id) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.message_id INTO new_id FROM mwmq.mwmq_keys AS k
            WHERE k.queue_id OPERATOR(pg_catalog.=) q.id AND k.key OPERATOR(pg_catalog.=) send.key;
            RETURN new_id;
        END IF;
    END IF;
    IF q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL THEN
        -- The quota is checked again at COMMIT (mwmq_quota_at_commit).
        PERFORM pg_catalog.set_config('mwmq.sql_send', 'on', true);
    END IF;
    INSERT INTO mwmq.mwmq_messages (queue_id, id, sender, receiver, body, visible_at, counted, grp)
    VALUES (q.id, new_id, who.user_name, send.receiver, send.body,
            pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
                (CAST('1 millisecond' AS pg_catalog.interval)
                 OPERATOR(pg_catalog.*) CAST(send.delay_ms AS pg_catalog.float8)),
            q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL, send.message_group);
    PERFORM pg_catalog.pg_notify('mwmq', send.queue);
    RETURN new_id;
END
$body$;

CREATE OR REPLACE FUNCTION mwmq.send(queue text, body text, key text DEFAULT NULL, delay_ms bigint DEFAULT 0,
                                     receiver text DEFAULT NULL, message_group text DEFAULT NULL)
RETURNS bigint LANGUAGE sql SET search_path = pg_catalog, mwmq, pg_temp AS $$
    SELECT mwmq.send(queue, pg_catalog.convert_to(body, CAST('UTF8' AS pg_catalog.name)), key, delay_ms, receiver,
                     message_group)
$$;

CREATE OR REPLACE FUNCTION mwmq.ack(queue text, id bigint, lease bigint)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, mwmq, pg_temp AS $body$
DECLARE
    who record;
    acked bigint;
BEGIN
    SELECT * INTO who FROM mwmq.mwmq_sql_caller(ack.queue, 'receive');
    WITH q AS (SELECT mq.id, mq.retain_ms FROM mwmq.mwmq_queues AS mq
               WHERE mq.name OPERATOR(pg_catalog.=) ack.queue AND mq.dropped_at IS NULL),
         gone AS (
            DELETE FROM mwmq.mwmq_messages AS m USING q
            WHERE m.queue_id OPERATOR(pg_catalog.=) q.id AND m.id OPERATOR(pg_catalog.=) ack.id
              AND m.lease OPERATOR(pg_catalog.=) ack.lease
              AND (who.holder IS NULL OR m.leased_to OPERATOR(pg_catalog.=) who.holder)
            RETURNING m.queue_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries, m.leased_to,
                      q.retain_ms),
         kept AS (
            INSERT INTO mwmq.mwmq_archive (queue_id, id, sender, receiver, body, sent_at, deliveries, acked_by)
            SELECT g.queue_id, g.id, g.sender, g.receiver, g.body, g.sent_at, g.deliveries, g.leased_to
            FROM gone AS g WHERE g.retain_ms IS NOT NULL
            ON CONFLICT DO NOTHING)
    SELECT pg_catalog.count(*) INTO acked FROM gone;
    RETURN acked OPERATOR(pg_catalog.>) 0;
END
$body$;

-- What mwmq.send calls and sets off, qualified as it is (RESP's statements
-- call them too, with mwmq's own search_path).
CREATE OR REPLACE FUNCTION mwmq.mwmq_room(q_id bigint, max_messages bigint, max_bytes bigint, size bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN max_messages IS NULL AND max_bytes IS NULL THEN true ELSE (
        SELECT (COALESCE(pg_catalog.sum(c.messages), 0) OPERATOR(pg_catalog.+) 1)
                   OPERATOR(pg_catalog.<=) COALESCE(max_messages, 9223372036854775807)
           AND (COALESCE(pg_catalog.sum(c.bytes), 0) OPERATOR(pg_catalog.+) size)
                   OPERATOR(pg_catalog.<=) COALESCE(max_bytes, 9223372036854775807)
        FROM mwmq.mwmq_queue_counts AS c WHERE c.queue_id OPERATOR(pg_catalog.=) q_id) END
$$;
CREATE OR REPLACE FUNCTION mwmq.mwmq_count_in() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mwmq.mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
    VALUES (NEW.queue_id, pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.%) 16, 1, pg_catalog.octet_length(NEW.body))
    ON CONFLICT (queue_id, stripe) DO UPDATE
    SET messages = c.messages OPERATOR(pg_catalog.+) 1, bytes = c.bytes OPERATOR(pg_catalog.+) EXCLUDED.bytes;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION mwmq.mwmq_count_out() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mwmq.mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
    VALUES (OLD.queue_id, pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.%) 16, -1,
            0 OPERATOR(pg_catalog.-) pg_catalog.octet_length(OLD.body))
    ON CONFLICT (queue_id, stripe) DO UPDATE
    SET messages = c.messages OPERATOR(pg_catalog.-) 1, bytes = c.bytes OPERATOR(pg_catalog.+) EXCLUDED.bytes;
    RETURN NULL;
END $$;

-- At COMMIT, for each message mwmq.send stored in a queue with a quota: the
-- queue's gate (one committing sender at a time), then what is committed
-- plus this transaction's own against the quota. It runs when the caller
-- commits, outside mwmq.send, hence its own rights and search_path.
CREATE FUNCTION mwmq.mwmq_quota_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, mwmq, pg_temp AS $$
DECLARE
    q record;
    held record;
BEGIN
    INSERT INTO mwmq.mwmq_sql_gates AS g (queue_id, checks) VALUES (NEW.queue_id, 1)
    ON CONFLICT (queue_id) DO UPDATE SET checks = g.checks OPERATOR(pg_catalog.+) 1;
    SELECT mq.name, mq.max_messages, mq.max_bytes INTO q FROM mwmq.mwmq_queues AS mq
    WHERE mq.id OPERATOR(pg_catalog.=) NEW.queue_id AND mq.dropped_at IS NULL;
    IF NOT FOUND OR (q.max_messages IS NULL AND q.max_bytes IS NULL) THEN
        RETURN NULL;
    END IF;
    SELECT CAST(COALESCE(pg_catalog.sum(c.messages), 0) AS pg_catalog.int8) AS messages,
           CAST(COALESCE(pg_catalog.sum(c.bytes), 0) AS pg_catalog.int8) AS bytes
    INTO held FROM mwmq.mwmq_queue_counts AS c WHERE c.queue_id OPERATOR(pg_catalog.=) NEW.queue_id;
    IF held.messages OPERATOR(pg_catalog.>) COALESCE(q.max_messages, held.messages)
       OR held.bytes OPERATOR(pg_catalog.>) COALESCE(q.max_bytes, held.bytes) THEN
        RAISE EXCEPTION 'mwmq.send: queue % is full at commit: % messages, % bytes with this transaction''s (MAXMESSAGES %, MAXBYTES %; 0 is no limit): the transaction is rolled back',
            q.name, held.messages, held.bytes, COALESCE(q.max_messages, 0), COALESCE(q.max_bytes, 0)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER mwmq_messages_quota AFTER INSERT ON mwmq_messages
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.counted AND pg_catalog.current_setting('mwmq.sql_send', true) OPERATOR(pg_catalog.=) 'on')
    EXECUTE FUNCTION mwmq.mwmq_quota_at_commit();

REVOKE ALL ON FUNCTION mwmq.send(text, bytea, text, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION mwmq.send(text, text, text, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION mwmq.ack(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION mwmq.mwmq_sql_caller(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION mwmq.mwmq_quota_at_commit() FROM PUBLIC;
