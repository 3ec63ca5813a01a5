-- mwmq schema version 17.
--
-- Schema version 17: priorities (`SEND q body PRIORITY n`, `mwmq.send(...,
-- priority => n)`) and retry backoff (`QALTER q BACKOFF base_ms max_ms
-- [JITTER pct]`). The Rust side, and why it is built so:
-- crates/mwmq/src/policies.rs.
--
-- - `mwmq_messages.priority` (0 to 9, higher first; 0 for every message
--   sent before) and the `ready` index ordered by it:
--   (queue_id, priority DESC, visible_at, id). Every statement that hands
--   messages out walks the priorities from the highest (`mwmq_walk`: an
--   index range each), and within each the visible messages in the order
--   they became visible, as before. A queue that
--   never held a message of another priority than 0 (`mwmq_queues.prioritized`,
--   set by the statements that store messages) walks priority 0 only: the walk it had.
-- - `mwmq_messages.lease_until`: when a lease handed out by a queue with a
--   backoff ends; `visible_at` is then the end of the lease and the backoff
--   after it (NULL: the lease ends at `visible_at`, as before).
-- - `mwmq_queues.backoff_base_ms`, `backoff_max_ms`, `backoff_jitter`
--   (NULL: no backoff) and `mwmq_backoff`, the delay before delivery n+1.
-- - `mwmq_recv_ranked`: `mwmq_recv` (schema 15) with the priorities and the
--   backoff, and the priority of each message leased (RECV's plain
--   statements give the backoff too: a backoff keeps a queue plain). `mwmq_recv` stays for
--   an older mwmq still running.
-- - `mwmq.send` takes `priority integer DEFAULT 0` (the old signatures are
--   replaced: a seventh argument with a default beside the old functions
--   would make every call without it ambiguous); the roles granted EXECUTE
--   on the old functions are granted the new ones.
--
-- Building the new index locks the messages table against writes for the
-- time it takes (about a second per million messages).
--
-- Schema version 17 (runs with `search_path = mwmq`).

ALTER TABLE mwmq_messages ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN lease_until timestamptz;
ALTER TABLE mwmq_queues ADD COLUMN backoff_base_ms bigint, ADD COLUMN backoff_max_ms bigint,
    ADD COLUMN backoff_jitter smallint, ADD COLUMN prioritized boolean NOT NULL DEFAULT false;
DROP INDEX mwmq_messages_ready;
CREATE INDEX mwmq_messages_ready ON mwmq_messages (queue_id, priority DESC, visible_at, id);

-- The priorities to walk in queue qid, highest first: 0 alone for a queue
-- that never held a message of another priority (the walk a queue had
-- before schema 17), else all ten (an index range each, of which those
-- without a message cost a descent; inlined into the statement, so a walk
-- that found enough at the first priorities stops there).
CREATE FUNCTION mwmq_walk(qid bigint, prioritized boolean) RETURNS SETOF smallint LANGUAGE sql IMMUTABLE AS $$
    SELECT 0::smallint WHERE NOT prioritized
    UNION ALL
    SELECT g::smallint FROM generate_series(9, 0, -1) AS g WHERE prioritized
$$;

-- A message of a priority other than 0 marks its queue `prioritized`: each
-- statement that stores messages sets the mark in the same transaction
-- (statements.sql, schedules.sql, rebalance.rs, mwmq_recv_ranked's dead
-- letters and mwmq.send below), so that a statement that sees the message
-- sees the mark. A trigger on every insert did it in a first version of
-- this schema: it took a quarter of a SEND's time in the database
-- (tests/delivery/priorities.rs sends by every way there is and checks the
-- mark).

-- The wait before a message delivered `deliveries` times is handed out
-- again: min(cap, base * 2^(deliveries - 1)), then +- jitter percent of it.
CREATE FUNCTION mwmq_backoff(base bigint, cap bigint, jitter smallint, deliveries integer) RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT interval '1 millisecond'
           * (least(cap::float8, base::float8 * power(2::float8, least(greatest(deliveries, 1) - 1, 62)))
              * (1 + coalesce(jitter, 0)::float8 / 100 * (2 * random() - 1)))
$$;

-- RECV of a queue that is not plain (`mwmq_recv` of schema 15, `limits.rs`),
-- highest priority first, and with the queue's backoff: a lease that is not
-- the message's last (MAXDELIVERIES) is followed by the backoff before the
-- message is visible again (`lease_until` is the lease's end). Leases whose
-- time is over count against CONCURRENCY no longer, backoff or not. The
-- last row's r_priority says whether the queue is prioritized (1).
CREATE FUNCTION mwmq_recv_ranked(qname text, me text, sender_from text, want bigint, vt double precision, maxb bigint)
RETURNS TABLE (r_queue_id bigint, r_id bigint, r_lease bigint, r_sender text, r_body bytea, r_priority smallint)
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
    SELECT id, max_deliveries, dead_letter, paused, concurrency, rate, backoff_base_ms, backoff_max_ms, backoff_jitter
    INTO q FROM mwmq_queues WHERE name = qname AND dropped_at IS NULL;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, 0::bigint, 0::bigint, NULL::text, NULL::bytea, NULL::smallint;
        RETURN;
    END IF;
    IF q.paused THEN
        RETURN QUERY SELECT q.id, 0::bigint, 0::bigint, NULL::text, NULL::bytea, NULL::smallint;
        RETURN;
    END IF;
    IF q.concurrency IS NOT NULL OR q.rate IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(1836543345, (q.id % 2147483647)::integer);
        PERFORM set_config('synchronous_commit', 'off', true);
        IF q.concurrency IS NOT NULL THEN
            SELECT count(*) INTO busy
            FROM mwmq_walk(q.id, (SELECT x.prioritized FROM mwmq_queues x WHERE x.id = q.id)) AS v(pr)
            JOIN mwmq_messages m ON m.queue_id = q.id AND m.priority = v.pr
            WHERE m.visible_at > now() AND m.lease IS NOT NULL AND coalesce(m.lease_until, m.visible_at) > now();
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
        RETURN QUERY
        WITH l AS (SELECT c.queue_id, c.id, c.dead, c.w, row_number() OVER () AS o FROM (
                       SELECT m.queue_id, m.id, coalesce(m.deliveries >= q.max_deliveries, false) AS dead,
                              octet_length(m.body) + octet_length(m.sender) + 64 AS w
                       FROM mwmq_walk(q.id, (SELECT x.prioritized FROM mwmq_queues x WHERE x.id = q.id)) AS v(pr)
                       CROSS JOIN LATERAL (
                           SELECT m.queue_id, m.id, m.deliveries, m.body, m.sender FROM mwmq_messages m
                           WHERE m.queue_id = q.id AND m.priority = v.pr AND m.visible_at <= now()
                             AND (m.receiver IS NULL OR m.receiver = me)
                             AND (sender_from IS NULL OR m.sender = sender_from)
                             AND (m.grp IS NULL OR NOT EXISTS (SELECT 1 FROM mwmq_messages o
                                                               WHERE o.queue_id = m.queue_id AND o.grp = m.grp
                                                                 AND o.id < m.id))
                           ORDER BY m.visible_at, m.id LIMIT allowed FOR UPDATE OF m SKIP LOCKED) m
                       LIMIT allowed) c),
             c AS (SELECT x.queue_id, x.id, x.dead FROM (
                       SELECT l.queue_id, l.id, l.dead,
                              sum(CASE WHEN l.dead THEN 0 ELSE l.w END) OVER (ORDER BY l.o) AS run,
                              count(*) FILTER (WHERE NOT l.dead) OVER (ORDER BY l.o) AS k
                       FROM l) x
                   WHERE x.dead OR x.k = 1 OR x.run <= maxb),
             gone AS (DELETE FROM mwmq_messages m USING c
                      WHERE c.dead AND m.queue_id = c.queue_id AND m.id = c.id
                      RETURNING m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries, m.grp, m.priority),
             moved AS (INSERT INTO mwmq_messages
                         (queue_id, id, sender, receiver, body, sent_at, visible_at, deliveries, dead_from, dead_reason,
                          counted, grp, priority)
                       SELECT dq.id, g.id, g.sender, g.receiver, g.body, g.sent_at, now(), g.deliveries, qname,
                              'max_deliveries', (dq.max_messages IS NOT NULL OR dq.max_bytes IS NOT NULL), g.grp,
                              g.priority
                       FROM gone g JOIN mwmq_queues dq ON dq.name = q.dead_letter AND dq.dropped_at IS NULL
                       RETURNING 1),
             marked AS (UPDATE mwmq_queues dq SET prioritized = true
                        WHERE dq.name = q.dead_letter AND dq.dropped_at IS NULL AND NOT dq.prioritized
                          AND EXISTS (SELECT 1 FROM gone g WHERE g.priority <> 0)),
             leased AS (UPDATE mwmq_messages m
                        SET lease = mwmq_lease_token(), leased_to = me,
                            visible_at = now() + interval '1 millisecond' * vt
                                + CASE WHEN q.backoff_base_ms IS NOT NULL
                                            AND (q.max_deliveries IS NULL OR m.deliveries + 1 < q.max_deliveries)
                                       THEN mwmq_backoff(q.backoff_base_ms, q.backoff_max_ms, q.backoff_jitter,
                                                         m.deliveries + 1)
                                       ELSE interval '0' END,
                            lease_until = CASE WHEN q.backoff_base_ms IS NOT NULL
                                                    AND (q.max_deliveries IS NULL OR m.deliveries + 1 < q.max_deliveries)
                                               THEN now() + interval '1 millisecond' * vt END,
                            deliveries = m.deliveries + 1
                        FROM c WHERE NOT c.dead AND m.queue_id = c.queue_id AND m.id = c.id
                        RETURNING m.queue_id, m.id, m.lease, m.sender, m.body, m.priority)
        SELECT l.queue_id, l.id, l.lease, l.sender, l.body, l.priority FROM leased l
        UNION ALL
        SELECT q.id, (SELECT count(*) FROM gone), (SELECT count(*) FROM moved), NULL::text, NULL::bytea,
               (SELECT x.prioritized::int FROM mwmq_queues x WHERE x.id = q.id)::smallint;
        GET DIAGNOSTICS got = ROW_COUNT;
    ELSE
        RETURN QUERY SELECT q.id, 0::bigint, 0::bigint, NULL::text, NULL::bytea, NULL::smallint;
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

-- mwmq.send with a priority: the body of the function the earlier versions
-- left, patched (the range checked with the other arguments, the priority
-- stored with the row), under the new signature; the old ones dropped, and
-- whoever could EXECUTE them may EXECUTE the new ones.
DO $patch$
DECLARE
    f regprocedure := 'mwmq.send(text, bytea, text, bigint, text, text)'::regprocedure;
    t regprocedure := 'mwmq.send(text, text, text, bigint, text, text)'::regprocedure;
    def text := pg_catalog.pg_get_functiondef(f);
    grantees text[];
    r text;
    sig text := $s$message_group text DEFAULT NULL::text)$s$;
    names text := $n$    PERFORM mwmq.mwmq_sql_name(send.message_group, 'message_group');$n$;
    range text := $r$    IF send.priority IS NULL OR send.priority OPERATOR(pg_catalog.<) 0 OR send.priority OPERATOR(pg_catalog.>) 9 THEN
        RAISE EXCEPTION 'mwmq.send: priority must be between 0 and 9 (higher is handed out first), not %', send.priority
            USING ERRCODE = 'invalid_parameter_value';
    END IF;$r$;
    store text := $c$    INSERT INTO mwmq.mwmq_messages (queue_id, id, sender, receiver, body, visible_at, counted, grp)$c$;
    value text := $v$q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL, send.message_group);$v$;
BEGIN
    FOREACH r IN ARRAY ARRAY[sig, names, store, value] LOOP
        IF pg_catalog.strpos(def, r) OPERATOR(pg_catalog.=) 0 THEN
            RAISE EXCEPTION 'mwmq.send is no longer as schema version 16 left it (missing: %)', r;
        END IF;
    END LOOP;
    def := pg_catalog.replace(def, sig, $s$message_group text DEFAULT NULL::text, priority integer DEFAULT 0)$s$);
    def := pg_catalog.replace(def, names, names OPERATOR(pg_catalog.||) pg_catalog.chr(10) OPERATOR(pg_catalog.||) range);
    def := pg_catalog.replace(def, store,
        $m$    IF send.priority OPERATOR(pg_catalog.<>) 0 THEN
        UPDATE mwmq.mwmq_queues AS x SET prioritized = true
        WHERE x.id OPERATOR(pg_catalog.=) q.id AND NOT x.prioritized;
    END IF;
$m$ OPERATOR(pg_catalog.||) pg_catalog.replace(store, 'counted, grp)', 'counted, grp, priority)'));
    def := pg_catalog.replace(def, value,
        $v$q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL, send.message_group,
             CAST(send.priority AS pg_catalog.int2));$v$);
    SELECT pg_catalog.array_agg(DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)))
    INTO grantees
    FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
    WHERE p.oid IN (f, t) AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
      AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.grantee OPERATOR(pg_catalog.<>) 0;
    DROP FUNCTION mwmq.send(text, bytea, text, bigint, text, text);
    DROP FUNCTION mwmq.send(text, text, text, bigint, text, text);
    EXECUTE def;
    CREATE FUNCTION mwmq.send(queue text, body text, key text DEFAULT NULL, delay_ms bigint DEFAULT 0,
                              receiver text DEFAULT NULL, message_group text DEFAULT NULL,
                              priority integer DEFAULT 0)
    RETURNS bigint LANGUAGE sql SET search_path = pg_catalog, mwmq, pg_temp AS $body$
        SELECT mwmq.send(queue, pg_catalog.convert_to(body, CAST('UTF8' AS pg_catalog.name)), key, delay_ms, receiver,
                         message_group, priority)
    $body$;
    REVOKE ALL ON FUNCTION mwmq.send(text, bytea, text, bigint, text, text, integer) FROM PUBLIC;
    REVOKE ALL ON FUNCTION mwmq.send(text, text, text, bigint, text, text, integer) FROM PUBLIC;
    FOREACH r IN ARRAY coalesce(grantees, '{}') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION mwmq.send(text, bytea, text, bigint, text, text, integer), '
                                  'mwmq.send(text, text, text, bigint, text, text, integer) TO %s', r);
    END LOOP;
END $patch$;
