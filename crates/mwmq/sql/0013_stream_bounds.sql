-- mwmq schema version 13.
--
-- Migration 15. It runs with `search_path = mwmq`.
--
-- (The Rust side: crates/mwmq/src/streambounds.rs.)

-- A stream's bytes as MAXBYTES counts them from now on.
UPDATE mwmq_streams st
SET bytes = coalesce((SELECT sum(e.bytes + 16 * e.items) FROM mwmq_stream_entries e WHERE e.stream_id = st.id), 0);

-- The refusal of a range whose entries would weigh more than maxb.
CREATE FUNCTION mwmq_reply_too_large(maxb bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mwmq_rerr(format('ERR the reply would exceed max_reply_bytes (%s bytes): ask for fewer entries with COUNT',
                             maxb));
END $$;

-- Trims a locked stream: kind 1 MAXLEN, 2 MINID; lim NULL: no limit.
CREATE OR REPLACE FUNCTION mwmq_trim(sid bigint, kind int, maxlen bigint, t_ms bigint, t_seq bigint, lim bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint := 0;
    b bigint := 0;
    len bigint;
BEGIN
    IF kind = 1 THEN
        SELECT st.length INTO len FROM mwmq_streams st WHERE st.id = sid;
        n := greatest(len - maxlen, 0);
        IF lim IS NOT NULL THEN n := least(n, lim); END IF;
        IF n = 0 THEN RETURN 0; END IF;
        WITH d AS (
            DELETE FROM mwmq_stream_entries e
            USING (SELECT x.ms, x.seq FROM mwmq_stream_entries x WHERE x.stream_id = sid ORDER BY x.ms, x.seq LIMIT n) d
            WHERE e.stream_id = sid AND e.ms = d.ms AND e.seq = d.seq RETURNING e.bytes + 16 * e.items AS w)
        SELECT count(*), coalesce(sum(d.w), 0) INTO n, b FROM d;
    ELSE
        WITH d AS (
            DELETE FROM mwmq_stream_entries e
            USING (SELECT x.ms, x.seq FROM mwmq_stream_entries x
                   WHERE x.stream_id = sid AND (x.ms, x.seq) < (t_ms, t_seq) ORDER BY x.ms, x.seq LIMIT lim) d
            WHERE e.stream_id = sid AND e.ms = d.ms AND e.seq = d.seq RETURNING e.bytes + 16 * e.items AS w)
        SELECT count(*), coalesce(sum(d.w), 0) INTO n, b FROM d;
    END IF;
    UPDATE mwmq_streams st SET length = st.length - n, bytes = st.bytes - b WHERE st.id = sid;
    RETURN n;
END $$;

-- XADD: mode 0 '*', 1 'ms-*', 2 an exact id. No row: NOMKSTREAM and no stream.
-- A stream it creates is who's (at most cap); past MAXMESSAGES or MAXBYTES
-- (after its own trimming) it is refused and nothing is stored.
CREATE OR REPLACE FUNCTION mwmq_xadd(sname text, mode int, i_ms bigint, i_seq bigint, f bytea[], mk boolean,
                                     kind int, maxlen bigint, t_ms bigint, t_seq bigint, lim bigint, who text, cap bigint)
RETURNS TABLE (o_ms bigint, o_seq bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname, true);
    now_ms bigint;
    n_ms bigint;
    n_seq bigint;
    b bigint := (SELECT coalesce(sum(octet_length(x)), 0) FROM unnest(f) AS x);
    w bigint;
    held mwmq_streams;
BEGIN
    w := b + 16 * coalesce(cardinality(f), 0);
    IF s.id IS NULL THEN
        IF NOT mk THEN RETURN; END IF;
        s := mwmq_stream_made(sname, who, cap);
    END IF;
    IF kind = 0 AND (s.length + 1 > coalesce(s.max_entries, s.length + 1) OR s.bytes + w > coalesce(s.max_bytes, s.bytes + w)) THEN
        PERFORM mwmq_rerr(mwmq_rfull(s));
    END IF;
    IF mode = 0 THEN
        now_ms := mwmq_ms();
        IF now_ms > s.last_ms THEN
            n_ms := now_ms; n_seq := 0;
        ELSIF s.last_seq < 9223372036854775807 THEN
            n_ms := s.last_ms; n_seq := s.last_seq + 1;
        ELSIF s.last_ms < 9223372036854775807 THEN
            n_ms := s.last_ms + 1; n_seq := 0;
        ELSE
            PERFORM mwmq_rerr('ERR The stream has exhausted the last possible ID, unable to add more items');
        END IF;
    ELSIF mode = 1 THEN
        IF i_ms > s.last_ms THEN
            n_ms := i_ms; n_seq := 0;
        ELSIF i_ms = s.last_ms AND s.last_seq < 9223372036854775807 THEN
            n_ms := i_ms; n_seq := s.last_seq + 1;
        ELSE
            PERFORM mwmq_rerr('ERR The ID specified in XADD is equal or smaller than the target stream top item');
        END IF;
    ELSE
        IF (i_ms, i_seq) <= (s.last_ms, s.last_seq) THEN
            PERFORM mwmq_rerr('ERR The ID specified in XADD is equal or smaller than the target stream top item');
        END IF;
        n_ms := i_ms; n_seq := i_seq;
    END IF;
    INSERT INTO mwmq_stream_entries (stream_id, ms, seq, fields, bytes, items)
    VALUES (s.id, n_ms, n_seq, f, b, coalesce(cardinality(f), 0));
    UPDATE mwmq_streams st SET last_ms = n_ms, last_seq = n_seq, added = st.added + 1, length = st.length + 1,
        bytes = st.bytes + w
    WHERE st.id = s.id;
    IF kind > 0 THEN
        PERFORM mwmq_trim(s.id, kind, maxlen, t_ms, t_seq, lim);
        IF s.max_entries IS NOT NULL OR s.max_bytes IS NOT NULL THEN
            SELECT * INTO held FROM mwmq_streams st WHERE st.id = s.id;
            IF held.length > coalesce(s.max_entries, held.length) OR held.bytes > coalesce(s.max_bytes, held.bytes) THEN
                PERFORM mwmq_rerr(mwmq_rfull(s));
            END IF;
        END IF;
    END IF;
    o_ms := n_ms; o_seq := n_seq;
    RETURN NEXT;
END $$;

-- XADDs with '*' to one stream, as one statement: one lock, one commit.
-- counts[i] fields of f are entry i's. As many as fit the stream's
-- MAXMESSAGES and MAXBYTES are added, in order (a row each); when some did
-- not fit, a last row carries the refusal (o_ms NULL).
CREATE OR REPLACE FUNCTION mwmq_xadd_many(sname text, counts int[], f bytea[], who text, cap bigint)
RETURNS TABLE (o_ms bigint, o_seq bigint, o_full text) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
    now_ms bigint := mwmq_ms();
    b_ms bigint;
    b_seq bigint;
    n int := coalesce(array_length(counts, 1), 0);
    k int := n;
    more bigint;
BEGIN
    SELECT * INTO s FROM mwmq_streams st WHERE st.name = sname FOR UPDATE;
    IF s.id IS NULL THEN s := mwmq_stream_made(sname, who, cap); END IF;
    IF s.max_entries IS NOT NULL OR s.max_bytes IS NOT NULL THEN
        SELECT count(*) INTO k FROM (
            SELECT u.i, sum(u.b) OVER (ORDER BY u.i) AS run
            FROM (SELECT c.i, (SELECT coalesce(sum(octet_length(v)), 0) FROM unnest(f[c.at : c.at + c.n - 1]) AS v) + 16 * c.n AS b
                  FROM (SELECT x.n, x.i, sum(x.n) OVER (ORDER BY x.i) - x.n + 1 AS at
                        FROM unnest(counts) WITH ORDINALITY AS x(n, i)) c) u) r
        WHERE r.i <= coalesce(s.max_entries - s.length, n) AND r.run <= coalesce(s.max_bytes - s.bytes, r.run);
    END IF;
    IF k > 0 THEN
        IF now_ms > s.last_ms THEN
            b_ms := now_ms; b_seq := 0;
        ELSIF s.last_seq <= 9223372036854775807 - k THEN
            b_ms := s.last_ms; b_seq := s.last_seq + 1;
        ELSE
            b_ms := s.last_ms + 1; b_seq := 0;
        END IF;
        WITH ins AS (
            INSERT INTO mwmq_stream_entries (stream_id, ms, seq, fields, bytes, items)
            SELECT s.id, b_ms, b_seq + c.i - 1, c.fl, (SELECT coalesce(sum(octet_length(v)), 0) FROM unnest(c.fl) AS v), c.n
            FROM (SELECT x.n, x.i, f[x.at : x.at + x.n - 1] AS fl
                  FROM (SELECT u.n, u.i, sum(u.n) OVER (ORDER BY u.i) - u.n + 1 AS at
                        FROM unnest(counts) WITH ORDINALITY AS u(n, i)) x
                  WHERE x.i <= k) c
            RETURNING bytes + 16 * items AS w)
        SELECT coalesce(sum(ins.w), 0) INTO more FROM ins;
        UPDATE mwmq_streams st SET last_ms = b_ms, last_seq = b_seq + k - 1, added = st.added + k, length = st.length + k,
            bytes = st.bytes + more
        WHERE st.id = s.id;
        RETURN QUERY SELECT b_ms, b_seq + g - 1, NULL::text FROM generate_series(1, k) AS g;
    END IF;
    IF k < n THEN
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, mwmq_rfull(s);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION mwmq_xdel(sname text, mss bigint[], seqs bigint[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname, true);
    n bigint;
    b bigint;
    t_ms bigint;
    t_seq bigint;
BEGIN
    IF s.id IS NULL THEN RETURN 0; END IF;
    WITH d AS (
        DELETE FROM mwmq_stream_entries e USING (SELECT DISTINCT * FROM unnest(mss, seqs)) AS u(ms, seq)
        WHERE e.stream_id = s.id AND e.ms = u.ms AND e.seq = u.seq RETURNING e.ms, e.seq, e.bytes + 16 * e.items AS w)
    SELECT count(*), coalesce(sum(d.w), 0),
           (array_agg(d.ms ORDER BY d.ms DESC, d.seq DESC))[1], (array_agg(d.seq ORDER BY d.ms DESC, d.seq DESC))[1]
    INTO n, b, t_ms, t_seq FROM d;
    IF n > 0 THEN
        UPDATE mwmq_streams st SET length = st.length - n, bytes = st.bytes - b,
            del_ms = CASE WHEN (t_ms, t_seq) > (st.del_ms, st.del_seq) THEN t_ms ELSE st.del_ms END,
            del_seq = CASE WHEN (t_ms, t_seq) > (st.del_ms, st.del_seq) THEN t_seq ELSE st.del_seq END
        WHERE st.id = s.id;
    END IF;
    RETURN n;
END $$;

-- XRANGE / XREVRANGE: at most cnt entries. When more than the first of
-- them would weigh more than maxb, the reply is refused (the client asks for
-- fewer with COUNT): a range returns everything asked for or nothing, so a
-- client's paging loop never takes a short reply for the end.
CREATE OR REPLACE FUNCTION mwmq_xrange(sname text, a_ms bigint, a_seq bigint, b_ms bigint, b_seq bigint, cnt bigint,
                                       rev boolean, maxb bigint)
RETURNS TABLE (o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
    r record;
    used bigint := 0;
BEGIN
    IF s.id IS NULL THEN RETURN; END IF;
    IF rev THEN
        FOR r IN SELECT e.ms, e.seq, e.fields, e.bytes + 16 * e.items + 64 AS w FROM mwmq_stream_entries e
                 WHERE e.stream_id = s.id AND (e.ms, e.seq) >= (a_ms, a_seq) AND (e.ms, e.seq) <= (b_ms, b_seq)
                 ORDER BY e.ms DESC, e.seq DESC LIMIT cnt LOOP
            IF used > 0 AND used + r.w > maxb THEN PERFORM mwmq_reply_too_large(maxb); END IF;
            used := used + r.w;
            o_ms := r.ms; o_seq := r.seq; o_fields := r.fields;
            RETURN NEXT;
        END LOOP;
    ELSE
        FOR r IN SELECT e.ms, e.seq, e.fields, e.bytes + 16 * e.items + 64 AS w FROM mwmq_stream_entries e
                 WHERE e.stream_id = s.id AND (e.ms, e.seq) >= (a_ms, a_seq) AND (e.ms, e.seq) <= (b_ms, b_seq)
                 ORDER BY e.ms, e.seq LIMIT cnt LOOP
            IF used > 0 AND used + r.w > maxb THEN PERFORM mwmq_reply_too_large(maxb); END IF;
            used := used + r.w;
            o_ms := r.ms; o_seq := r.seq; o_fields := r.fields;
            RETURN NEXT;
        END LOOP;
    END IF;
END $$;

-- XREAD over several streams: entries after (a_ms, a_seq) of each; o_i is
-- the stream's index (from 1). All of them weigh at most maxb (the first
-- always), taken round by round (each stream's first entry, then each one's
-- second, ...) so that a stream of large entries does not crowd the others
-- out; each stream's part is still a prefix of what it has after its id.
-- A reply cut by maxb says so with a row of index -1 (the first entry left
-- out, without its fields). bad[i]: the refusal of stream i's id, given
-- once its type was checked.
CREATE OR REPLACE FUNCTION mwmq_xread(snames text[], a_ms bigint[], a_seq bigint[], cnt bigint, bad text[], maxb bigint)
RETURNS TABLE (o_i int, o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
    sids bigint[] := '{}';
BEGIN
    FOR i IN 1 .. coalesce(array_length(snames, 1), 0) LOOP
        s := mwmq_stream(snames[i]);
        IF bad[i] IS NOT NULL THEN PERFORM mwmq_rerr(bad[i]); END IF;
        sids := sids || s.id;
    END LOOP;
    RETURN QUERY
    SELECT CASE WHEN x.n = 1 OR x.run <= maxb THEN x.i::int ELSE -1 END, x.ms, x.seq,
           CASE WHEN x.n = 1 OR x.run <= maxb THEN x.fields END FROM (
        SELECT c.i, c.ms, c.seq, c.fields, c.w,
               sum(c.w) OVER (ORDER BY c.k, c.i ROWS UNBOUNDED PRECEDING) AS run,
               row_number() OVER (ORDER BY c.k, c.i) AS n
        FROM (SELECT u.i, e.ms, e.seq, e.fields, e.w, row_number() OVER (PARTITION BY u.i ORDER BY e.ms, e.seq) AS k
              FROM unnest(sids, a_ms, a_seq) WITH ORDINALITY AS u(sid, ms, seq, i),
              LATERAL (SELECT y.ms, y.seq, y.fields, y.bytes + 16 * y.items + 64 AS w FROM mwmq_stream_entries y
                       WHERE y.stream_id = u.sid AND (y.ms, y.seq) > (u.ms, u.seq)
                       ORDER BY y.ms, y.seq LIMIT cnt) e) c) x
    -- (Weights are positive, so the entries cut are the last ones: the first
    -- of them is the one whose predecessors fit, or the second of all.)
    WHERE x.n = 1 OR x.run <= maxb OR x.n = 2 OR x.run - x.w <= maxb
    ORDER BY 1, 2, 3;
END $$;

-- XREADGROUP ... COUNT cnt STREAMS s '>' of several consumers of one group,
-- as one statement: each consumer in turn takes the next new entries, up to
-- cnt and up to maxb bytes (its first entry always; the first consumer's
-- reply already holds `spent`). o_i: the consumer's index (from 1); o_w: the
-- entry's weight. A consumer whose reply was cut by maxb (fewer than cnt
-- entries while there were more) is named by a row of index -1 (o_ms: its
-- index).
CREATE OR REPLACE FUNCTION mwmq_xreadgroup_many(sname text, gname text, cnames text[], cnt bigint, noack boolean,
                                                maxb bigint, spent bigint)
RETURNS TABLE (o_i int, o_ms bigint, o_seq bigint, o_fields bytea[], o_w bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
    g mwmq_stream_groups;
    r record;
    now_ms bigint := mwmq_ms();
    m int := coalesce(array_length(cnames, 1), 0);
    who int := 1;
    taken bigint := 0;
    used bigint := spent;
    k bigint := 0;
    clean boolean;
BEGIN
    SELECT * INTO s FROM mwmq_streams st WHERE st.name = sname;
    IF s.id IS NULL THEN s := mwmq_stream(sname); END IF;
    IF s.id IS NULL THEN PERFORM mwmq_nogroup(sname, gname, ' in XREADGROUP with GROUP option'); END IF;
    SELECT * INTO g FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname FOR UPDATE;
    IF NOT FOUND THEN PERFORM mwmq_nogroup(sname, gname, ' in XREADGROUP with GROUP option'); END IF;
    -- (No tombstone at all: the common case, without a call per entry.)
    clean := s.length = 0 OR (s.del_ms = 0 AND s.del_seq = 0);
    FOR r IN SELECT e.ms, e.seq, e.fields, e.bytes + 16 * e.items + 64 AS w FROM mwmq_stream_entries e
             WHERE e.stream_id = s.id AND (e.ms, e.seq) > (g.last_ms, g.last_seq)
             ORDER BY e.ms, e.seq LIMIT cnt * m LOOP
        -- The next consumer once this one has cnt entries or its reply is full.
        IF taken = cnt OR (used > 0 AND used + r.w > maxb) THEN
            IF taken < cnt THEN
                o_i := -1; o_ms := who; o_seq := NULL; o_fields := NULL; o_w := 0;
                RETURN NEXT;
            END IF;
            who := who + 1;
            taken := 0;
            used := 0;
            EXIT WHEN who > m;
        END IF;
        IF taken = 0 THEN
            PERFORM mwmq_seen(s.id, gname, cnames[who], now_ms);
        END IF;
        taken := taken + 1;
        used := used + r.w;
        k := k + 1;
        IF g.entries_read IS NOT NULL AND (clean OR NOT mwmq_tombstones(s, r.ms, r.seq)) THEN
            g.entries_read := g.entries_read + 1;
        ELSIF s.added > 0 THEN
            g.entries_read := mwmq_estimate(s, r.ms, r.seq);
        END IF;
        g.last_ms := r.ms;
        g.last_seq := r.seq;
        IF NOT noack THEN
            INSERT INTO mwmq_stream_pending AS p (stream_id, grp, ms, seq, consumer, delivered_ms, deliveries)
            VALUES (s.id, gname, r.ms, r.seq, cnames[who], now_ms, 1)
            ON CONFLICT (stream_id, grp, ms, seq)
            DO UPDATE SET consumer = EXCLUDED.consumer, delivered_ms = EXCLUDED.delivered_ms, deliveries = 1;
        END IF;
        o_i := who; o_ms := r.ms; o_seq := r.seq; o_fields := r.fields; o_w := r.w;
        RETURN NEXT;
    END LOOP;
    IF k > 0 THEN
        UPDATE mwmq_stream_groups x SET last_ms = g.last_ms, last_seq = g.last_seq, entries_read = g.entries_read
        WHERE x.stream_id = s.id AND x.name = gname;
    END IF;
END $$;

-- XREADGROUP over several streams: hist[i] false reads new entries ('>'),
-- true the consumer's pending entries after (a_ms, a_seq). o_fields NULL:
-- a pending entry that was deleted. All of them weigh at most maxb (the
-- first always), stream after stream: a stream whose next entry does not
-- fit gives no more, the later ones what still fits. A reply cut so ends
-- with a row of index -1.
CREATE OR REPLACE FUNCTION mwmq_xreadgroup(snames text[], gname text, cname text, hist boolean[], a_ms bigint[],
                                           a_seq bigint[], cnt bigint, noack boolean, bad text[], maxb bigint)
RETURNS TABLE (o_i int, o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
    r record;
    now_ms bigint := mwmq_ms();
    used bigint := 0;
    cut boolean := false;
BEGIN
    FOR i IN 1 .. coalesce(array_length(snames, 1), 0) LOOP
        s := mwmq_stream(snames[i]);
        IF s.id IS NULL OR NOT EXISTS (SELECT 1 FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname) THEN
            PERFORM mwmq_nogroup(snames[i], gname, ' in XREADGROUP with GROUP option');
        END IF;
        IF bad[i] IS NOT NULL THEN PERFORM mwmq_rerr(bad[i]); END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(snames, 1), 0) LOOP
        s := mwmq_stream(snames[i]);
        IF hist[i] THEN
            PERFORM mwmq_seen(s.id, gname, cname, now_ms);
            FOR r IN SELECT p.ms, p.seq, e.fields, coalesce(e.bytes + 16 * e.items + 64, 64) AS w
                     FROM mwmq_stream_pending p
                     LEFT JOIN mwmq_stream_entries e ON e.stream_id = p.stream_id AND e.ms = p.ms AND e.seq = p.seq
                     WHERE p.stream_id = s.id AND p.grp = gname AND p.consumer = cname AND (p.ms, p.seq) > (a_ms[i], a_seq[i])
                     ORDER BY p.ms, p.seq LIMIT cnt LOOP
                IF used > 0 AND used + r.w > maxb THEN
                    cut := true;
                    EXIT;
                END IF;
                used := used + r.w;
                IF r.fields IS NOT NULL THEN
                    UPDATE mwmq_stream_pending p SET delivered_ms = now_ms, deliveries = p.deliveries + 1
                    WHERE p.stream_id = s.id AND p.grp = gname AND p.ms = r.ms AND p.seq = r.seq;
                END IF;
                o_i := i; o_ms := r.ms; o_seq := r.seq; o_fields := r.fields;
                RETURN NEXT;
            END LOOP;
        ELSE
            -- New entries: as a batch of one consumer, with what the reply holds already.
            FOR r IN SELECT m.o_i, m.o_ms, m.o_seq, m.o_fields, m.o_w
                     FROM mwmq_xreadgroup_many(snames[i], gname, ARRAY[cname], coalesce(cnt, 9007199254740991), noack,
                                               maxb, used) m LOOP
                IF r.o_i < 0 THEN
                    cut := true;
                    CONTINUE;
                END IF;
                used := used + r.o_w;
                o_i := i; o_ms := r.o_ms; o_seq := r.o_seq; o_fields := r.o_fields;
                RETURN NEXT;
            END LOOP;
        END IF;
    END LOOP;
    IF cut THEN
        o_i := -1; o_ms := NULL; o_seq := NULL; o_fields := NULL;
        RETURN NEXT;
    END IF;
END $$;

-- XCLAIM: the entries claimed (o_fields NULL with JUSTID). Entries weigh at
-- most maxb (the first always): the ids after the one that does not fit
-- are not claimed, and a last row without an id (o_ms NULL) says so.
CREATE OR REPLACE FUNCTION mwmq_xclaim(sname text, gname text, cname text, min_idle bigint, mss bigint[], seqs bigint[],
                                       idle bigint, at_ms bigint, retry bigint, force boolean, justid boolean,
                                       l_ms bigint, l_seq bigint, bad text, maxb bigint)
RETURNS TABLE (o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_group(sname, gname, true);
    now_ms bigint := mwmq_ms();
    delivery bigint := now_ms;
    p mwmq_stream_pending;
    f bytea[];
    w bigint;
    used bigint := 0;
    seen boolean := false;
    cut boolean := false;
BEGIN
    IF bad IS NOT NULL THEN PERFORM mwmq_rerr(bad); END IF;
    IF idle IS NOT NULL THEN delivery := now_ms - idle; END IF;
    IF at_ms IS NOT NULL THEN delivery := at_ms; END IF;
    IF delivery < 0 OR delivery > now_ms THEN delivery := now_ms; END IF;
    IF l_ms IS NOT NULL THEN
        UPDATE mwmq_stream_groups x SET last_ms = l_ms, last_seq = l_seq
        WHERE x.stream_id = s.id AND x.name = gname AND (l_ms, l_seq) > (x.last_ms, x.last_seq);
    END IF;
    FOR i IN 1 .. coalesce(array_length(mss, 1), 0) LOOP
        SELECT * INTO p FROM mwmq_stream_pending x
        WHERE x.stream_id = s.id AND x.grp = gname AND x.ms = mss[i] AND x.seq = seqs[i] FOR UPDATE;
        SELECT e.fields, CASE WHEN justid THEN 64 ELSE e.bytes + 16 * e.items + 64 END INTO f, w
        FROM mwmq_stream_entries e WHERE e.stream_id = s.id AND e.ms = mss[i] AND e.seq = seqs[i];
        IF NOT FOUND THEN
            IF p.stream_id IS NOT NULL THEN
                DELETE FROM mwmq_stream_pending x WHERE x.stream_id = s.id AND x.grp = gname AND x.ms = mss[i] AND x.seq = seqs[i];
            END IF;
            CONTINUE;
        END IF;
        IF p.stream_id IS NULL THEN
            IF NOT force THEN CONTINUE; END IF;
            IF used > 0 AND used + w > maxb THEN
                cut := true;
                EXIT;
            END IF;
            INSERT INTO mwmq_stream_pending (stream_id, grp, ms, seq, consumer, delivered_ms, deliveries)
            VALUES (s.id, gname, mss[i], seqs[i], cname, delivery, CASE WHEN retry IS NOT NULL THEN retry WHEN justid THEN 1 ELSE 2 END);
        ELSE
            IF min_idle > 0 AND now_ms - p.delivered_ms < min_idle THEN CONTINUE; END IF;
            IF used > 0 AND used + w > maxb THEN
                cut := true;
                EXIT;
            END IF;
            IF mwmq_dead(s, gname, mss[i], seqs[i], f, p.deliveries) THEN CONTINUE; END IF;
            UPDATE mwmq_stream_pending x SET consumer = cname, delivered_ms = delivery,
                deliveries = CASE WHEN retry IS NOT NULL THEN retry WHEN justid THEN x.deliveries ELSE x.deliveries + 1 END
            WHERE x.stream_id = s.id AND x.grp = gname AND x.ms = mss[i] AND x.seq = seqs[i];
        END IF;
        IF NOT seen THEN
            PERFORM mwmq_seen(s.id, gname, cname, now_ms);
            seen := true;
        END IF;
        used := used + w;
        o_ms := mss[i]; o_seq := seqs[i]; o_fields := CASE WHEN justid THEN NULL ELSE f END;
        RETURN NEXT;
    END LOOP;
    IF cut THEN
        o_ms := NULL; o_seq := NULL; o_fields := NULL;
        RETURN NEXT;
    END IF;
END $$;

-- XAUTOCLAIM: o_kind 0 an entry claimed, 1 a deleted id, 2 the cursor. The
-- entries claimed weigh at most maxb (the first always): the cursor is the
-- one that did not fit, and a row of kind 3 says the reply was cut.
CREATE OR REPLACE FUNCTION mwmq_xautoclaim(sname text, gname text, cname text, min_idle bigint, a_ms bigint, a_seq bigint,
                                           cnt bigint, justid boolean, maxb bigint)
RETURNS TABLE (o_kind int, o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_group(sname, gname, true);
    now_ms bigint := mwmq_ms();
    attempts bigint := cnt * 10;
    left_ bigint := cnt;
    r record;
    seen boolean := false;
    used bigint := 0;
    c_ms bigint := 0;
    c_seq bigint := 0;
    cut boolean := false;
BEGIN
    FOR r IN SELECT p.ms, p.seq, p.delivered_ms, p.deliveries, e.fields,
                    CASE WHEN justid THEN 64 ELSE e.bytes + 16 * e.items + 64 END AS w
             FROM mwmq_stream_pending p
             LEFT JOIN mwmq_stream_entries e ON e.stream_id = p.stream_id AND e.ms = p.ms AND e.seq = p.seq
             WHERE p.stream_id = s.id AND p.grp = gname AND (p.ms, p.seq) >= (a_ms, a_seq)
             ORDER BY p.ms, p.seq LIMIT attempts + 1 LOOP
        IF attempts = 0 OR left_ = 0 THEN
            c_ms := r.ms; c_seq := r.seq;
            EXIT;
        END IF;
        attempts := attempts - 1;
        IF r.fields IS NULL THEN
            DELETE FROM mwmq_stream_pending x WHERE x.stream_id = s.id AND x.grp = gname AND x.ms = r.ms AND x.seq = r.seq;
            o_kind := 1; o_ms := r.ms; o_seq := r.seq; o_fields := NULL;
            RETURN NEXT;
            left_ := left_ - 1;
            CONTINUE;
        END IF;
        IF min_idle > 0 AND now_ms - r.delivered_ms < min_idle THEN CONTINUE; END IF;
        IF used > 0 AND used + r.w > maxb THEN
            c_ms := r.ms; c_seq := r.seq;
            cut := true;
            EXIT;
        END IF;
        IF mwmq_dead(s, gname, r.ms, r.seq, r.fields, r.deliveries) THEN
            -- (The claimer sees it as gone: among the deleted ids.)
            o_kind := 1; o_ms := r.ms; o_seq := r.seq; o_fields := NULL;
            RETURN NEXT;
            left_ := left_ - 1;
            CONTINUE;
        END IF;
        UPDATE mwmq_stream_pending x SET consumer = cname, delivered_ms = now_ms,
            deliveries = CASE WHEN justid THEN x.deliveries ELSE x.deliveries + 1 END
        WHERE x.stream_id = s.id AND x.grp = gname AND x.ms = r.ms AND x.seq = r.seq;
        IF NOT seen THEN
            PERFORM mwmq_seen(s.id, gname, cname, now_ms);
            seen := true;
        END IF;
        used := used + r.w;
        o_kind := 0; o_ms := r.ms; o_seq := r.seq; o_fields := CASE WHEN justid THEN NULL ELSE r.fields END;
        RETURN NEXT;
        left_ := left_ - 1;
    END LOOP;
    IF cut THEN
        o_kind := 3; o_ms := NULL; o_seq := NULL; o_fields := NULL;
        RETURN NEXT;
    END IF;
    o_kind := 2; o_ms := c_ms; o_seq := c_seq; o_fields := NULL;
    RETURN NEXT;
END $$;

-- mwmq.send's refusal of a full queue, with the queue's figures (what is
-- committed and what this transaction sent), as RESP's and the check at
-- COMMIT give them. The one statement is replaced in the body the earlier
-- versions left.
DO $patch$
DECLARE
    f regprocedure := 'mwmq.send(text, bytea, text, bigint, text, text)'::regprocedure;
    was text := $old$RAISE EXCEPTION 'mwmq.send: queue % is full', send.queue USING ERRCODE = 'program_limit_exceeded';$old$;
    now_ text := $new$RAISE EXCEPTION 'mwmq.send: queue % is full: % messages, % bytes with this transaction''s (MAXMESSAGES %, MAXBYTES %; 0 is no limit)',
            send.queue,
            (SELECT COALESCE(pg_catalog.sum(c.messages), 0) FROM mwmq.mwmq_queue_counts AS c
             WHERE c.queue_id OPERATOR(pg_catalog.=) q.id),
            (SELECT COALESCE(pg_catalog.sum(c.bytes), 0) FROM mwmq.mwmq_queue_counts AS c
             WHERE c.queue_id OPERATOR(pg_catalog.=) q.id),
            COALESCE(q.max_messages, 0), COALESCE(q.max_bytes, 0)
            USING ERRCODE = 'program_limit_exceeded';$new$;
    def text := pg_get_functiondef(f);
BEGIN
    IF position(was IN def) = 0 THEN
        RAISE EXCEPTION 'mwmq.send no longer refuses a full queue as schema version 11 wrote it: give its refusal the figures where it is now';
    END IF;
    EXECUTE replace(def, was, now_);
END $patch$;
