-- mwmq schema version 15.
--
-- Schema version 15 (after streambounds', `streambounds.rs`, 13, and the
-- SQL quota's, `sqlquota.rs`, 14): the replies that were not
-- bounded by their bytes yet, and consumers per group capped.
--
-- - **RECV ... COUNT n** (`mwmq_recv`, the statement of queues that are
--   not plain; the plain statement in `db/statements.rs` does the same): the messages
--   leased weigh at most `maxb` (`max_reply_bytes`), a message counting
--   its body, its sender and 64 bytes (its id, lease and RESP's framing);
--   the first is always leased, and the cut falls between messages, so
--   what is not returned is not leased either (a consumer's read, like
--   XREADGROUP's: fewer than COUNT is normal). Dead letters met on the way
--   are moved as before and weigh nothing.
-- - **XPENDING**'s extended form is a range a client pages through with
--   COUNT, so it is answered whole or refused, as XRANGE is
--   (`mwmq_reply_too_large`, `streambounds.rs`): a pending entry weighs its
--   consumer's name and 96 bytes, the first is never refused.
-- - **XINFO CONSUMERS** and **XINFO STREAM FULL**'s groups (after its
--   entries, which are whole or refused) stop at `maxb`: a consumer weighs
--   its name and 96 bytes (128 in FULL), the first row always goes; FULL's
--   `pel-count` still says how many there are. FULL's group part is one
--   statement per group (it was one per consumer: 90,000 consumers made
--   90,000 statements).
-- - **Consumers per group**: a consumer is made by XREADGROUP, XCLAIM,
--   XAUTOCLAIM (`mwmq_seen`) and XGROUP CREATECONSUMER; one more than
--   `mwmq.max_consumers` (a setting of mwmq's connections:
--   `[server] max_consumers_per_group`; unset or 0, no limit) is refused
--   with `-OVERQUOTA`, counted under a lock per group held to the commit,
--   so concurrent new consumers cannot pass the limit together. A name
--   that exists is never refused.
--
-- Nothing here redefines what streambounds' migration or the SQL quota's
-- define (`mwmq_seen` and `mwmq_xgroup_consumer` are the only functions
-- replaced; the others are new names or, for `mwmq_recv`, a new
-- overload). Every name is unqualified: mwmq's connections run with
-- `search_path = mwmq` (`db/migrations.rs`). The functions of earlier versions
-- stay beside the new ones (an older mwmq still calls them until it is
-- stopped).
--
-- Schema version 15. It runs with `search_path = mwmq`.

-- Whether group gname of stream sid may have consumer cname: it has it, or
-- fewer than mwmq.max_consumers; OVERQUOTA otherwise.
CREATE FUNCTION mwmq_consumer_room(sid bigint, gname text, cname text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    cap bigint := nullif(current_setting('mwmq.max_consumers', true), '')::bigint;
    n bigint;
BEGIN
    IF cap IS NULL OR cap <= 0 THEN RETURN true; END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('mwmq consumers ' || sid || ' ' || gname, 0));
    -- (Counted after the lock: what the previous holder made has committed.)
    PERFORM 1 FROM mwmq_stream_consumers c WHERE c.stream_id = sid AND c.grp = gname AND c.name = cname;
    IF FOUND THEN RETURN true; END IF;
    SELECT count(*) INTO n FROM mwmq_stream_consumers c WHERE c.stream_id = sid AND c.grp = gname;
    IF n >= cap THEN
        PERFORM mwmq_rerr(format('OVERQUOTA consumer group ''%s'' of stream ''%s'' has %s consumers, the most a group '
                                 || 'may have (max_consumers_per_group); XGROUP DELCONSUMER removes idle ones',
                                 gname, (SELECT st.name FROM mwmq_streams st WHERE st.id = sid), n));
    END IF;
    RETURN true;
END $$;

-- Refreshes (or creates, if the group has room) a consumer; a consumer seen
-- in the last 100 ms is left as it is.
CREATE OR REPLACE FUNCTION mwmq_seen(sid bigint, gname text, cname text, now_ms bigint) RETURNS void LANGUAGE sql AS $$
    INSERT INTO mwmq_stream_consumers AS c (stream_id, grp, name, seen_ms)
    SELECT sid, gname, cname, now_ms
    WHERE CASE WHEN EXISTS (SELECT 1 FROM mwmq_stream_consumers x
                            WHERE x.stream_id = sid AND x.grp = gname AND x.name = cname) THEN true
               ELSE mwmq_consumer_room(sid, gname, cname) END
    ON CONFLICT (stream_id, grp, name) DO UPDATE SET seen_ms = EXCLUDED.seen_ms
    WHERE c.seen_ms < EXCLUDED.seen_ms - 100
$$;

-- CREATECONSUMER (del false: 1 if created) and DELCONSUMER (del true: its pending entries).
CREATE OR REPLACE FUNCTION mwmq_xgroup_consumer(sname text, gname text, cname text, del boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_xgroup_stream(sname, false);
    n bigint;
BEGIN
    PERFORM 1 FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname;
    IF NOT FOUND THEN PERFORM mwmq_nogroup_for(sname, gname); END IF;
    IF del THEN
        DELETE FROM mwmq_stream_pending p WHERE p.stream_id = s.id AND p.grp = gname AND p.consumer = cname;
        GET DIAGNOSTICS n = ROW_COUNT;
        DELETE FROM mwmq_stream_consumers c WHERE c.stream_id = s.id AND c.grp = gname AND c.name = cname;
        RETURN n;
    END IF;
    PERFORM mwmq_consumer_room(s.id, gname, cname);
    INSERT INTO mwmq_stream_consumers (stream_id, grp, name, seen_ms) VALUES (s.id, gname, cname, mwmq_ms())
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- XINFO CONSUMERS, weighing at most maxb (the first always).
CREATE FUNCTION mwmq_xinfo_consumers(sname text, gname text, maxb bigint)
RETURNS TABLE (o_name text, o_pending bigint, o_idle bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
    now_ms bigint := mwmq_ms();
    r record;
    used bigint := 0;
BEGIN
    IF s.id IS NULL THEN PERFORM mwmq_rerr('ERR no such key'); END IF;
    PERFORM 1 FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname;
    IF NOT FOUND THEN PERFORM mwmq_nogroup_for(sname, gname); END IF;
    FOR r IN SELECT c.name, c.seen_ms, octet_length(c.name) + 96 AS w FROM mwmq_stream_consumers c
             WHERE c.stream_id = s.id AND c.grp = gname ORDER BY c.name COLLATE "C" LOOP
        EXIT WHEN used > 0 AND used + r.w > maxb;
        used := used + r.w;
        o_name := r.name;
        SELECT count(*) INTO o_pending FROM mwmq_stream_pending p
        WHERE p.stream_id = s.id AND p.grp = gname AND p.consumer = r.name;
        o_idle := now_ms - r.seen_ms;
        RETURN NEXT;
    END LOOP;
END $$;

-- XPENDING's extended form: a range, whole or refused as mwmq_xrange's
-- (`streambounds.rs`) when more than its first row would weigh more than maxb.
CREATE FUNCTION mwmq_xpending_range(sname text, gname text, min_idle bigint, a_ms bigint, a_seq bigint,
                                    b_ms bigint, b_seq bigint, cnt bigint, cname text, maxb bigint)
RETURNS TABLE (o_ms bigint, o_seq bigint, o_consumer text, o_idle bigint, o_deliveries bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_group(sname, gname, false);
    now_ms bigint := mwmq_ms();
    r record;
    used bigint := 0;
BEGIN
    FOR r IN SELECT p.ms, p.seq, p.consumer, now_ms - p.delivered_ms AS idle, p.deliveries,
                    octet_length(p.consumer) + 96 AS w
             FROM mwmq_stream_pending p
             WHERE p.stream_id = s.id AND p.grp = gname AND (p.ms, p.seq) >= (a_ms, a_seq)
               AND (p.ms, p.seq) <= (b_ms, b_seq) AND (cname IS NULL OR p.consumer = cname)
               AND (min_idle IS NULL OR now_ms - p.delivered_ms >= min_idle)
             ORDER BY p.ms, p.seq LIMIT cnt LOOP
        IF used > 0 AND used + r.w > maxb THEN PERFORM mwmq_reply_too_large(maxb); END IF;
        used := used + r.w;
        o_ms := r.ms; o_seq := r.seq; o_consumer := r.consumer; o_idle := r.idle; o_deliveries := r.deliveries;
        RETURN NEXT;
    END LOOP;
END $$;

-- XINFO STREAM FULL, one group: o_kind 0 the group's pending entries (the
-- first cnt: id, consumer, delivery time, deliveries), 1 a consumer (name,
-- seen time, its pending count), each followed by 2, its own pending
-- entries (the first cnt). All of them weigh at most maxb (o_w: each
-- one's weight; the first always): what does not fit is left out.
CREATE FUNCTION mwmq_xinfo_full_group(sname text, gname text, cnt bigint, maxb bigint)
RETURNS TABLE (o_kind int, o_ms bigint, o_seq bigint, o_name text, o_a bigint, o_b bigint, o_w bigint)
LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
    r record;
    p record;
    used bigint := 0;
BEGIN
    FOR p IN SELECT x.ms, x.seq, x.consumer, x.delivered_ms, x.deliveries, octet_length(x.consumer) + 96 AS w
             FROM mwmq_stream_pending x WHERE x.stream_id = s.id AND x.grp = gname
             ORDER BY x.ms, x.seq LIMIT cnt LOOP
        IF used > 0 AND used + p.w > maxb THEN RETURN; END IF;
        used := used + p.w;
        o_kind := 0; o_ms := p.ms; o_seq := p.seq; o_name := p.consumer; o_a := p.delivered_ms; o_b := p.deliveries;
        o_w := p.w;
        RETURN NEXT;
    END LOOP;
    FOR r IN SELECT c.name, c.seen_ms, octet_length(c.name) + 128 AS w FROM mwmq_stream_consumers c
             WHERE c.stream_id = s.id AND c.grp = gname ORDER BY c.name COLLATE "C" LOOP
        IF used > 0 AND used + r.w > maxb THEN RETURN; END IF;
        used := used + r.w;
        o_kind := 1; o_ms := NULL; o_seq := NULL; o_name := r.name; o_a := r.seen_ms;
        SELECT count(*) INTO o_b FROM mwmq_stream_pending x
        WHERE x.stream_id = s.id AND x.grp = gname AND x.consumer = r.name;
        o_w := r.w;
        RETURN NEXT;
        FOR p IN SELECT x.ms, x.seq, x.delivered_ms, x.deliveries FROM mwmq_stream_pending x
                 WHERE x.stream_id = s.id AND x.grp = gname AND x.consumer = r.name
                 ORDER BY x.ms, x.seq LIMIT cnt LOOP
            IF used + 96 > maxb THEN RETURN; END IF;
            used := used + 96;
            o_kind := 2; o_ms := p.ms; o_seq := p.seq; o_name := NULL; o_a := p.delivered_ms; o_b := p.deliveries;
            o_w := 96;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END $$;

-- RECV of a queue that is not plain (schema 8's, `limits.rs`), the
-- messages leased weighing at most maxb (body, sender and 64 each; the
-- first always): the messages past the cut are not leased.
CREATE FUNCTION mwmq_recv(qname text, me text, sender_from text, want bigint, vt double precision, maxb bigint)
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
        RETURN QUERY
        WITH l AS (SELECT m.queue_id, m.id, m.visible_at, coalesce(m.deliveries >= q.max_deliveries, false) AS dead,
                          octet_length(m.body) + octet_length(m.sender) + 64 AS w
                   FROM mwmq_messages m
                   WHERE m.queue_id = q.id AND m.visible_at <= now()
                     AND (m.receiver IS NULL OR m.receiver = me) AND (sender_from IS NULL OR m.sender = sender_from)
                     AND (m.grp IS NULL OR NOT EXISTS (SELECT 1 FROM mwmq_messages o
                                                       WHERE o.queue_id = m.queue_id AND o.grp = m.grp AND o.id < m.id))
                   ORDER BY m.visible_at, m.id LIMIT allowed FOR UPDATE OF m SKIP LOCKED),
             c AS (SELECT x.queue_id, x.id, x.dead FROM (
                       SELECT l.queue_id, l.id, l.dead,
                              sum(CASE WHEN l.dead THEN 0 ELSE l.w END) OVER (ORDER BY l.visible_at, l.id) AS run,
                              count(*) FILTER (WHERE NOT l.dead) OVER (ORDER BY l.visible_at, l.id) AS k
                       FROM l) x
                   WHERE x.dead OR x.k = 1 OR x.run <= maxb),
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
