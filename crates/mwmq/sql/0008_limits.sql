-- mwmq schema version 8.
--
-- Schema version 8: the settings, the buckets, and the RECV for queues
-- that are not plain.
--
-- (The Rust side: crates/mwmq/src/limits.rs.)

ALTER TABLE mwmq_queues ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN concurrency integer, ADD COLUMN rate double precision;
ALTER TABLE mwmq_messages ADD COLUMN grp text;
CREATE INDEX mwmq_messages_group ON mwmq_messages (queue_id, grp, id) WHERE grp IS NOT NULL;
CREATE TABLE mwmq_queue_limits (
    queue_id bigint PRIMARY KEY,
    tokens double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    held_concurrency bigint NOT NULL DEFAULT 0,
    held_rate bigint NOT NULL DEFAULT 0
);
CREATE FUNCTION mwmq_recv(qname text, me text, sender_from text, want bigint, vt double precision)
RETURNS TABLE (r_queue_id bigint, r_id bigint, r_lease bigint, r_sender text, r_body bytea)
LANGUAGE plpgsql AS $$
DECLARE
    q record;
    allowed bigint := want;
    busy bigint;
    burst double precision;
    tokens double precision;
    got bigint;
    held_c boolean := false;
    held_r boolean := false;
BEGIN
    SELECT id, max_deliveries, dead_letter, paused, concurrency, rate INTO q
    FROM mwmq_queues WHERE name = qname AND dropped_at IS NULL;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, 0::bigint, 0::bigint, NULL::text, NULL::bytea;
        RETURN;
    END IF;
    IF q.paused THEN
        RETURN QUERY SELECT q.id, 0::bigint, 0::bigint, NULL::text, NULL::bytea;
        RETURN;
    END IF;
    IF q.concurrency IS NOT NULL OR q.rate IS NOT NULL THEN
        -- One RECV of a limited queue at a time, until its transaction ends;
        -- which is not held up by the flush of its WAL (see limits.rs).
        PERFORM pg_advisory_xact_lock(1836543345, (q.id % 2147483647)::integer);
        PERFORM set_config('synchronous_commit', 'off', true);
        IF q.concurrency IS NOT NULL THEN
            SELECT count(*) INTO busy FROM mwmq_messages m
            WHERE m.queue_id = q.id AND m.visible_at > now() AND m.lease IS NOT NULL;
            IF busy + allowed > q.concurrency THEN
                allowed := greatest(q.concurrency - busy, 0);
                held_c := true;
            END IF;
        END IF;
        IF q.rate IS NOT NULL THEN
            burst := greatest(q.rate, 1);
            SELECT least(burst, l.tokens + extract(epoch FROM clock_timestamp() - l.refilled_at) * q.rate)
            INTO tokens FROM mwmq_queue_limits l WHERE l.queue_id = q.id;
            IF NOT FOUND THEN
                tokens := burst;
            END IF;
            IF floor(tokens) < allowed THEN
                allowed := floor(tokens)::bigint;
                held_r := true;
            END IF;
        END IF;
    END IF;
    IF allowed > 0 THEN
        -- Of the first eligible messages, those delivered max_deliveries
        -- times already move to the dead-letter queue (or are dropped when
        -- there is none); the others are leased. The last row counts them:
        -- (the queue's id, moved out, moved in, NULL, NULL).
        RETURN QUERY
        WITH c AS (SELECT m.queue_id, m.id, coalesce(m.deliveries >= q.max_deliveries, false) AS dead
                   FROM mwmq_messages m
                   WHERE m.queue_id = q.id AND m.visible_at <= now()
                     AND (m.receiver IS NULL OR m.receiver = me) AND (sender_from IS NULL OR m.sender = sender_from)
                     AND (m.grp IS NULL OR NOT EXISTS (SELECT 1 FROM mwmq_messages o
                                                       WHERE o.queue_id = m.queue_id AND o.grp = m.grp AND o.id < m.id))
                   ORDER BY m.visible_at, m.id LIMIT allowed FOR UPDATE OF m SKIP LOCKED),
             gone AS (DELETE FROM mwmq_messages m USING c
                      WHERE c.dead AND m.queue_id = c.queue_id AND m.id = c.id
                      RETURNING m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries, m.grp),
             moved AS (INSERT INTO mwmq_messages
                         (queue_id, id, sender, receiver, body, sent_at, visible_at, deliveries, dead_from, dead_reason,
                          counted, grp)
                       SELECT dq.id, g.id, g.sender, g.receiver, g.body, g.sent_at, now(), g.deliveries, qname,
                              'max_deliveries', (dq.max_messages IS NOT NULL OR dq.max_bytes IS NOT NULL), g.grp
                       FROM gone g JOIN mwmq_queues dq ON dq.name = q.dead_letter AND dq.dropped_at IS NULL
                       RETURNING 1),
             leased AS (UPDATE mwmq_messages m
                        SET lease = mwmq_lease_token(), leased_to = me,
                            visible_at = now() + interval '1 millisecond' * vt,
                            deliveries = m.deliveries + 1
                        FROM c WHERE NOT c.dead AND m.queue_id = c.queue_id AND m.id = c.id
                        RETURNING m.queue_id, m.id, m.lease, m.sender, m.body)
        SELECT l.queue_id, l.id, l.lease, l.sender, l.body FROM leased l
        UNION ALL
        SELECT q.id, (SELECT count(*) FROM gone), (SELECT count(*) FROM moved), NULL::text, NULL::bytea;
        GET DIAGNOSTICS got = ROW_COUNT;
    ELSE
        RETURN QUERY SELECT q.id, 0::bigint, 0::bigint, NULL::text, NULL::bytea;
        got := 1;
    END IF;
    IF q.rate IS NOT NULL THEN
        INSERT INTO mwmq_queue_limits AS l (queue_id, tokens, refilled_at, held_concurrency, held_rate)
        VALUES (q.id, tokens - (got - 1), clock_timestamp(), held_c::integer, held_r::integer)
        ON CONFLICT (queue_id) DO UPDATE
        SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at,
            held_concurrency = l.held_concurrency + EXCLUDED.held_concurrency,
            held_rate = l.held_rate + EXCLUDED.held_rate;
    ELSIF held_c THEN
        INSERT INTO mwmq_queue_limits AS l (queue_id, held_concurrency) VALUES (q.id, 1)
        ON CONFLICT (queue_id) DO UPDATE SET held_concurrency = l.held_concurrency + 1;
    END IF;
END
$$;
