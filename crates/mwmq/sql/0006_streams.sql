-- mwmq schema version 6.
--
-- Migration 6: the streams' schema and functions.
--
-- (The Rust side: crates/mwmq/src/db/streams.rs.)

CREATE TABLE mwmq_streams (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    last_ms bigint NOT NULL DEFAULT 0,
    last_seq bigint NOT NULL DEFAULT 0,
    del_ms bigint NOT NULL DEFAULT 0,
    del_seq bigint NOT NULL DEFAULT 0,
    added bigint NOT NULL DEFAULT 0,
    length bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);
CREATE TABLE mwmq_stream_entries (
    stream_id bigint NOT NULL,
    ms bigint NOT NULL,
    seq bigint NOT NULL,
    fields bytea[] NOT NULL,
    PRIMARY KEY (stream_id, ms, seq)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.05);
CREATE TABLE mwmq_stream_groups (
    stream_id bigint NOT NULL,
    name text NOT NULL,
    last_ms bigint NOT NULL,
    last_seq bigint NOT NULL,
    entries_read bigint,
    max_deliveries bigint,
    dead_letter text,
    PRIMARY KEY (stream_id, name)
) WITH (fillfactor = 50);
CREATE TABLE mwmq_stream_consumers (
    stream_id bigint NOT NULL,
    grp text NOT NULL,
    name text NOT NULL,
    seen_ms bigint NOT NULL,
    PRIMARY KEY (stream_id, grp, name)
) WITH (fillfactor = 50);
CREATE TABLE mwmq_stream_pending (
    stream_id bigint NOT NULL,
    grp text NOT NULL,
    ms bigint NOT NULL,
    seq bigint NOT NULL,
    consumer text NOT NULL,
    delivered_ms bigint NOT NULL,
    deliveries bigint NOT NULL,
    PRIMARY KEY (stream_id, grp, ms, seq)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.05);
CREATE INDEX mwmq_stream_pending_owner ON mwmq_stream_pending (stream_id, grp, consumer, ms, seq);

CREATE FUNCTION mwmq_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

CREATE FUNCTION mwmq_rerr(msg text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'MWR01', MESSAGE = msg;
END $$;

-- The stream named (all NULL if none); WRONGTYPE if the name is a queue's.
CREATE FUNCTION mwmq_stream(sname text, locked boolean DEFAULT false) RETURNS mwmq_streams LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
BEGIN
    IF locked THEN
        SELECT * INTO s FROM mwmq_streams st WHERE st.name = sname FOR UPDATE;
    ELSE
        SELECT * INTO s FROM mwmq_streams st WHERE st.name = sname;
    END IF;
    IF s.id IS NULL AND EXISTS (SELECT 1 FROM mwmq_queues q WHERE q.name = sname AND q.dropped_at IS NULL) THEN
        PERFORM mwmq_rerr('WRONGTYPE Operation against a key holding the wrong kind of value');
    END IF;
    RETURN s;
END $$;

-- The stream named, created if missing (locked).
CREATE FUNCTION mwmq_stream_made(sname text) RETURNS mwmq_streams LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname, true);
BEGIN
    IF s.id IS NULL THEN
        INSERT INTO mwmq_streams (name) VALUES (sname) ON CONFLICT (name) DO NOTHING;
        SELECT * INTO s FROM mwmq_streams st WHERE st.name = sname FOR UPDATE;
    END IF;
    RETURN s;
END $$;

CREATE FUNCTION mwmq_first(s mwmq_streams, OUT f_ms bigint, OUT f_seq bigint) LANGUAGE plpgsql AS $$
BEGIN
    SELECT e.ms, e.seq INTO f_ms, f_seq FROM mwmq_stream_entries e WHERE e.stream_id = s.id ORDER BY e.ms, e.seq LIMIT 1;
    IF f_ms IS NULL THEN
        f_ms := 0;
        f_seq := 0;
    END IF;
END $$;

-- Redis's streamRangeHasTombstones(s, id, NULL).
CREATE FUNCTION mwmq_tombstones(s mwmq_streams, i_ms bigint, i_seq bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    f record;
BEGIN
    IF s.length = 0 OR (s.del_ms = 0 AND s.del_seq = 0) THEN RETURN false; END IF;
    f := mwmq_first(s);
    IF (f.f_ms, f.f_seq) > (s.del_ms, s.del_seq) THEN RETURN false; END IF;
    RETURN (i_ms, i_seq) <= (s.del_ms, s.del_seq);
END $$;

-- Redis's streamEstimateDistanceFromFirstEverEntry (NULL: unknown).
CREATE FUNCTION mwmq_estimate(s mwmq_streams, i_ms bigint, i_seq bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    f record;
BEGIN
    IF s.added = 0 THEN RETURN 0; END IF;
    IF s.length = 0 AND (i_ms, i_seq) <= (s.last_ms, s.last_seq) THEN RETURN s.added; END IF;
    IF (i_ms, i_seq) = (s.last_ms, s.last_seq) THEN RETURN s.added; END IF;
    IF (i_ms, i_seq) > (s.last_ms, s.last_seq) THEN RETURN NULL; END IF;
    f := mwmq_first(s);
    IF (s.del_ms = 0 AND s.del_seq = 0) OR (s.del_ms, s.del_seq) < (f.f_ms, f.f_seq) THEN
        IF (i_ms, i_seq) < (f.f_ms, f.f_seq) THEN RETURN s.added - s.length; END IF;
        IF (i_ms, i_seq) = (f.f_ms, f.f_seq) THEN RETURN s.added - s.length + 1; END IF;
    END IF;
    RETURN NULL;
END $$;

-- A group's lag, as XINFO GROUPS reports it (NULL: unknown).
CREATE FUNCTION mwmq_lag(s mwmq_streams, g mwmq_stream_groups) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF s.added = 0 THEN RETURN 0; END IF;
    IF g.entries_read IS NOT NULL AND NOT mwmq_tombstones(s, g.last_ms, g.last_seq) THEN
        RETURN s.added - g.entries_read;
    END IF;
    n := mwmq_estimate(s, g.last_ms, g.last_seq);
    RETURN s.added - n;
END $$;

-- Trims a locked stream: kind 1 MAXLEN, 2 MINID; lim NULL: no limit.
CREATE FUNCTION mwmq_trim(sid bigint, kind int, maxlen bigint, t_ms bigint, t_seq bigint, lim bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint := 0;
    len bigint;
BEGIN
    IF kind = 1 THEN
        SELECT st.length INTO len FROM mwmq_streams st WHERE st.id = sid;
        n := greatest(len - maxlen, 0);
        IF lim IS NOT NULL THEN n := least(n, lim); END IF;
        IF n = 0 THEN RETURN 0; END IF;
        DELETE FROM mwmq_stream_entries e
        USING (SELECT x.ms, x.seq FROM mwmq_stream_entries x WHERE x.stream_id = sid ORDER BY x.ms, x.seq LIMIT n) d
        WHERE e.stream_id = sid AND e.ms = d.ms AND e.seq = d.seq;
    ELSE
        DELETE FROM mwmq_stream_entries e
        USING (SELECT x.ms, x.seq FROM mwmq_stream_entries x
               WHERE x.stream_id = sid AND (x.ms, x.seq) < (t_ms, t_seq) ORDER BY x.ms, x.seq LIMIT lim) d
        WHERE e.stream_id = sid AND e.ms = d.ms AND e.seq = d.seq;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE mwmq_streams st SET length = st.length - n WHERE st.id = sid;
    RETURN n;
END $$;

-- XADD: mode 0 '*', 1 'ms-*', 2 an exact id. No row: NOMKSTREAM and no stream.
CREATE FUNCTION mwmq_xadd(sname text, mode int, i_ms bigint, i_seq bigint, f bytea[], mk boolean,
                          kind int, maxlen bigint, t_ms bigint, t_seq bigint, lim bigint)
RETURNS TABLE (o_ms bigint, o_seq bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname, true);
    now_ms bigint;
    n_ms bigint;
    n_seq bigint;
BEGIN
    IF s.id IS NULL THEN
        IF NOT mk THEN RETURN; END IF;
        s := mwmq_stream_made(sname);
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
    INSERT INTO mwmq_stream_entries (stream_id, ms, seq, fields) VALUES (s.id, n_ms, n_seq, f);
    UPDATE mwmq_streams st SET last_ms = n_ms, last_seq = n_seq, added = st.added + 1, length = st.length + 1
    WHERE st.id = s.id;
    IF kind > 0 THEN PERFORM mwmq_trim(s.id, kind, maxlen, t_ms, t_seq, lim); END IF;
    o_ms := n_ms; o_seq := n_seq;
    RETURN NEXT;
END $$;

-- XADDs with '*' to one stream, as one statement: one lock, one commit.
-- counts[i] fields of f are entry i's.
CREATE FUNCTION mwmq_xadd_many(sname text, counts int[], f bytea[]) RETURNS TABLE (o_ms bigint, o_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
    now_ms bigint := mwmq_ms();
    b_ms bigint;
    b_seq bigint;
    n int := coalesce(array_length(counts, 1), 0);
BEGIN
    SELECT * INTO s FROM mwmq_streams st WHERE st.name = sname FOR UPDATE;
    IF s.id IS NULL THEN s := mwmq_stream_made(sname); END IF;
    IF now_ms > s.last_ms THEN
        b_ms := now_ms; b_seq := 0;
    ELSIF s.last_seq <= 9223372036854775807 - n THEN
        b_ms := s.last_ms; b_seq := s.last_seq + 1;
    ELSE
        b_ms := s.last_ms + 1; b_seq := 0;
    END IF;
    INSERT INTO mwmq_stream_entries (stream_id, ms, seq, fields)
    SELECT s.id, b_ms, b_seq + c.i - 1, f[c.at : c.at + c.n - 1]
    FROM (SELECT u.n, u.i, sum(u.n) OVER (ORDER BY u.i) - u.n + 1 AS at
          FROM unnest(counts) WITH ORDINALITY AS u(n, i)) c;
    UPDATE mwmq_streams st SET last_ms = b_ms, last_seq = b_seq + n - 1, added = st.added + n, length = st.length + n
    WHERE st.id = s.id;
    RETURN QUERY SELECT b_ms, b_seq + g - 1 FROM generate_series(1, n) AS g;
END $$;

CREATE FUNCTION mwmq_xtrim(sname text, kind int, maxlen bigint, t_ms bigint, t_seq bigint, lim bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname, true);
BEGIN
    IF s.id IS NULL THEN RETURN 0; END IF;
    RETURN mwmq_trim(s.id, kind, maxlen, t_ms, t_seq, lim);
END $$;

CREATE FUNCTION mwmq_xdel(sname text, mss bigint[], seqs bigint[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname, true);
    n bigint;
    t_ms bigint;
    t_seq bigint;
BEGIN
    IF s.id IS NULL THEN RETURN 0; END IF;
    WITH d AS (
        DELETE FROM mwmq_stream_entries e USING (SELECT DISTINCT * FROM unnest(mss, seqs)) AS u(ms, seq)
        WHERE e.stream_id = s.id AND e.ms = u.ms AND e.seq = u.seq RETURNING e.ms, e.seq)
    SELECT count(*), (array_agg(d.ms ORDER BY d.ms DESC, d.seq DESC))[1], (array_agg(d.seq ORDER BY d.ms DESC, d.seq DESC))[1]
    INTO n, t_ms, t_seq FROM d;
    IF n > 0 THEN
        UPDATE mwmq_streams st SET length = st.length - n,
            del_ms = CASE WHEN (t_ms, t_seq) > (st.del_ms, st.del_seq) THEN t_ms ELSE st.del_ms END,
            del_seq = CASE WHEN (t_ms, t_seq) > (st.del_ms, st.del_seq) THEN t_seq ELSE st.del_seq END
        WHERE st.id = s.id;
    END IF;
    RETURN n;
END $$;

CREATE FUNCTION mwmq_xrange(sname text, a_ms bigint, a_seq bigint, b_ms bigint, b_seq bigint, cnt bigint, rev boolean)
RETURNS TABLE (o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
BEGIN
    IF s.id IS NULL THEN RETURN; END IF;
    IF rev THEN
        RETURN QUERY SELECT e.ms, e.seq, e.fields FROM mwmq_stream_entries e
            WHERE e.stream_id = s.id AND (e.ms, e.seq) >= (a_ms, a_seq) AND (e.ms, e.seq) <= (b_ms, b_seq)
            ORDER BY e.ms DESC, e.seq DESC LIMIT cnt;
    ELSE
        RETURN QUERY SELECT e.ms, e.seq, e.fields FROM mwmq_stream_entries e
            WHERE e.stream_id = s.id AND (e.ms, e.seq) >= (a_ms, a_seq) AND (e.ms, e.seq) <= (b_ms, b_seq)
            ORDER BY e.ms, e.seq LIMIT cnt;
    END IF;
END $$;

-- XREAD over several streams: entries after (a_ms, a_seq) of each; o_i is the stream's index (from 1).
-- bad[i]: the refusal of stream i's id, given once its type was checked.
CREATE FUNCTION mwmq_xread(snames text[], a_ms bigint[], a_seq bigint[], cnt bigint, bad text[])
RETURNS TABLE (o_i int, o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
BEGIN
    FOR i IN 1 .. coalesce(array_length(snames, 1), 0) LOOP
        s := mwmq_stream(snames[i]);
        IF bad[i] IS NOT NULL THEN PERFORM mwmq_rerr(bad[i]); END IF;
        IF s.id IS NOT NULL THEN
            RETURN QUERY SELECT i, e.ms, e.seq, e.fields FROM mwmq_stream_entries e
                WHERE e.stream_id = s.id AND (e.ms, e.seq) > (a_ms[i], a_seq[i])
                ORDER BY e.ms, e.seq LIMIT cnt;
        END IF;
    END LOOP;
END $$;

-- The last ids of streams (XREAD's '$'); 0-0 for a missing stream.
CREATE FUNCTION mwmq_xlast(snames text[], bad text[]) RETURNS TABLE (o_ms bigint, o_seq bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
BEGIN
    FOR i IN 1 .. coalesce(array_length(snames, 1), 0) LOOP
        s := mwmq_stream(snames[i]);
        IF bad[i] IS NOT NULL THEN PERFORM mwmq_rerr(bad[i]); END IF;
        o_ms := coalesce(s.last_ms, 0);
        o_seq := coalesce(s.last_seq, 0);
        RETURN NEXT;
    END LOOP;
END $$;

CREATE FUNCTION mwmq_nogroup(sname text, gname text, suffix text) RETURNS void LANGUAGE sql AS $$
    SELECT mwmq_rerr(format('NOGROUP No such key ''%s'' or consumer group ''%s''%s', sname, gname, suffix))
$$;

-- Refreshes (or creates) a consumer. A consumer seen in the last 100 ms is
-- left as it is (its idle time is that exact; a busy consumer costs no row update per read).
CREATE FUNCTION mwmq_seen(sid bigint, gname text, cname text, now_ms bigint) RETURNS void LANGUAGE sql AS $$
    INSERT INTO mwmq_stream_consumers AS c (stream_id, grp, name, seen_ms) VALUES (sid, gname, cname, now_ms)
    ON CONFLICT (stream_id, grp, name) DO UPDATE SET seen_ms = EXCLUDED.seen_ms
    WHERE c.seen_ms < EXCLUDED.seen_ms - 100
$$;

-- XREADGROUP over several streams: hist[i] false reads new entries ('>'),
-- true the consumer's pending entries after (a_ms, a_seq). o_fields NULL:
-- a pending entry that was deleted.
CREATE FUNCTION mwmq_xreadgroup(snames text[], gname text, cname text, hist boolean[], a_ms bigint[], a_seq bigint[],
                                cnt bigint, noack boolean, bad text[])
RETURNS TABLE (o_i int, o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
    r record;
    now_ms bigint := mwmq_ms();
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
            FOR r IN SELECT p.ms, p.seq, e.fields FROM mwmq_stream_pending p
                     LEFT JOIN mwmq_stream_entries e ON e.stream_id = p.stream_id AND e.ms = p.ms AND e.seq = p.seq
                     WHERE p.stream_id = s.id AND p.grp = gname AND p.consumer = cname AND (p.ms, p.seq) > (a_ms[i], a_seq[i])
                     ORDER BY p.ms, p.seq LIMIT cnt LOOP
                IF r.fields IS NOT NULL THEN
                    UPDATE mwmq_stream_pending p SET delivered_ms = now_ms, deliveries = p.deliveries + 1
                    WHERE p.stream_id = s.id AND p.grp = gname AND p.ms = r.ms AND p.seq = r.seq;
                END IF;
                o_i := i; o_ms := r.ms; o_seq := r.seq; o_fields := r.fields;
                RETURN NEXT;
            END LOOP;
        ELSE
            -- New entries: as a batch of one consumer.
            RETURN QUERY SELECT i, m.o_ms, m.o_seq, m.o_fields
                FROM mwmq_xreadgroup_many(snames[i], gname, ARRAY[cname], coalesce(cnt, 9007199254740991), noack) m;
        END IF;
    END LOOP;
END $$;

-- XREADGROUP ... COUNT cnt STREAMS s '>' of several consumers of one group, as one statement:
-- consumer i gets the i-th cnt new entries (o_i: its index, from 1).
CREATE FUNCTION mwmq_xreadgroup_many(sname text, gname text, cnames text[], cnt bigint, noack boolean)
RETURNS TABLE (o_i int, o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams;
    g mwmq_stream_groups;
    r record;
    now_ms bigint := mwmq_ms();
    k bigint := 0;
    who int;
    clean boolean;
BEGIN
    SELECT * INTO s FROM mwmq_streams st WHERE st.name = sname;
    IF s.id IS NULL THEN s := mwmq_stream(sname); END IF;
    IF s.id IS NULL THEN PERFORM mwmq_nogroup(sname, gname, ' in XREADGROUP with GROUP option'); END IF;
    SELECT * INTO g FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname FOR UPDATE;
    IF NOT FOUND THEN PERFORM mwmq_nogroup(sname, gname, ' in XREADGROUP with GROUP option'); END IF;
    -- (No tombstone at all: the common case, without a call per entry.)
    clean := s.length = 0 OR (s.del_ms = 0 AND s.del_seq = 0);
    FOR r IN SELECT e.ms, e.seq, e.fields FROM mwmq_stream_entries e
             WHERE e.stream_id = s.id AND (e.ms, e.seq) > (g.last_ms, g.last_seq)
             ORDER BY e.ms, e.seq LIMIT cnt * array_length(cnames, 1) LOOP
        who := (k / cnt)::int + 1;
        IF k % cnt = 0 THEN
            PERFORM mwmq_seen(s.id, gname, cnames[who], now_ms);
        END IF;
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
        o_i := who; o_ms := r.ms; o_seq := r.seq; o_fields := r.fields;
        RETURN NEXT;
    END LOOP;
    IF k > 0 THEN
        UPDATE mwmq_stream_groups x SET last_ms = g.last_ms, last_seq = g.last_seq, entries_read = g.entries_read
        WHERE x.stream_id = s.id AND x.name = gname;
    END IF;
END $$;

-- XACKs of one group, as one statement: how many entries request i acknowledged
-- (an id named twice counts for the first request that named it).
CREATE FUNCTION mwmq_xack_many(sname text, gname text, idx int[], mss bigint[], seqs bigint[])
RETURNS TABLE (o_i int, o_n bigint) LANGUAGE plpgsql AS $$
DECLARE
    sid bigint;
BEGIN
    SELECT st.id INTO sid FROM mwmq_streams st WHERE st.name = sname;
    IF sid IS NULL THEN
        PERFORM mwmq_stream(sname);
        RETURN;
    END IF;
    RETURN QUERY
    WITH u AS (SELECT * FROM unnest(idx, mss, seqs) AS u(i, ms, seq)),
    d AS (DELETE FROM mwmq_stream_pending p USING (SELECT DISTINCT u.ms, u.seq FROM u) x
          WHERE p.stream_id = sid AND p.grp = gname AND p.ms = x.ms AND p.seq = x.seq RETURNING p.ms, p.seq),
    f AS (SELECT min(u.i) AS i FROM d JOIN u ON u.ms = d.ms AND u.seq = d.seq GROUP BY d.ms, d.seq)
    SELECT f.i, count(*) FROM f GROUP BY f.i;
END $$;

CREATE FUNCTION mwmq_xack(sname text, gname text, mss bigint[], seqs bigint[], invalid boolean) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
    n bigint;
BEGIN
    IF s.id IS NULL THEN RETURN 0; END IF;
    IF invalid THEN
        PERFORM 1 FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname;
        IF FOUND THEN PERFORM mwmq_rerr('ERR Invalid stream ID specified as stream command argument'); END IF;
        RETURN 0;
    END IF;
    DELETE FROM mwmq_stream_pending p USING (SELECT DISTINCT * FROM unnest(mss, seqs)) AS u(ms, seq)
    WHERE p.stream_id = s.id AND p.grp = gname AND p.ms = u.ms AND p.seq = u.seq;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- The stream and group for XPENDING, XCLAIM, XAUTOCLAIM (NOGROUP if either is missing).
CREATE FUNCTION mwmq_group(sname text, gname text, locked boolean) RETURNS mwmq_streams LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
BEGIN
    IF s.id IS NULL THEN PERFORM mwmq_nogroup(sname, gname, ''); END IF;
    IF locked THEN
        PERFORM 1 FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname FOR UPDATE;
    ELSE
        PERFORM 1 FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname;
    END IF;
    IF NOT FOUND THEN PERFORM mwmq_nogroup(sname, gname, ''); END IF;
    RETURN s;
END $$;

-- XPENDING's summary: one row per consumer.
CREATE FUNCTION mwmq_xpending(sname text, gname text)
RETURNS TABLE (o_consumer text, o_count bigint, o_min_ms bigint, o_min_seq bigint, o_max_ms bigint, o_max_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_group(sname, gname, false);
BEGIN
    RETURN QUERY
    SELECT p.consumer, count(*),
           (array_agg(p.ms ORDER BY p.ms, p.seq))[1], (array_agg(p.seq ORDER BY p.ms, p.seq))[1],
           (array_agg(p.ms ORDER BY p.ms DESC, p.seq DESC))[1], (array_agg(p.seq ORDER BY p.ms DESC, p.seq DESC))[1]
    FROM mwmq_stream_pending p WHERE p.stream_id = s.id AND p.grp = gname
    GROUP BY p.consumer ORDER BY p.consumer COLLATE "C";
END $$;

-- XPENDING's extended form.
CREATE FUNCTION mwmq_xpending_range(sname text, gname text, min_idle bigint, a_ms bigint, a_seq bigint,
                                    b_ms bigint, b_seq bigint, cnt bigint, cname text)
RETURNS TABLE (o_ms bigint, o_seq bigint, o_consumer text, o_idle bigint, o_deliveries bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_group(sname, gname, false);
    now_ms bigint := mwmq_ms();
BEGIN
    RETURN QUERY
    SELECT p.ms, p.seq, p.consumer, now_ms - p.delivered_ms, p.deliveries
    FROM mwmq_stream_pending p
    WHERE p.stream_id = s.id AND p.grp = gname AND (p.ms, p.seq) >= (a_ms, a_seq) AND (p.ms, p.seq) <= (b_ms, b_seq)
      AND (cname IS NULL OR p.consumer = cname) AND (min_idle IS NULL OR now_ms - p.delivered_ms >= min_idle)
    ORDER BY p.ms, p.seq LIMIT cnt;
END $$;

-- Dead letters (an mwmq extension): a pending entry about to be delivered
-- again after max_deliveries deliveries leaves the group for its
-- dead-letter stream, with where it came from; true if it did.
CREATE FUNCTION mwmq_dead(s mwmq_streams, gname text, e_ms bigint, e_seq bigint, f bytea[], deliveries bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    g mwmq_stream_groups;
    extra bytea[];
BEGIN
    SELECT * INTO g FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname;
    IF g.max_deliveries IS NULL OR deliveries < g.max_deliveries THEN RETURN false; END IF;
    SELECT array_agg(convert_to(t, 'UTF8') ORDER BY n) INTO extra
    FROM unnest(ARRAY['dead-from', s.name, 'dead-group', gname, 'dead-id', e_ms || '-' || e_seq,
                      'deliveries', deliveries::text]) WITH ORDINALITY AS u(t, n);
    PERFORM mwmq_xadd_many(g.dead_letter, ARRAY[array_length(f, 1) + 8], f || extra);
    DELETE FROM mwmq_stream_pending p WHERE p.stream_id = s.id AND p.grp = gname AND p.ms = e_ms AND p.seq = e_seq;
    RETURN true;
END $$;

-- XGROUP DEADLETTER: max NULL turns it off.
CREATE FUNCTION mwmq_xgroup_deadletter(sname text, gname text, max bigint, target text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_xgroup_stream(sname, false);
BEGIN
    IF target IS NOT NULL THEN PERFORM mwmq_stream(target); END IF;
    UPDATE mwmq_stream_groups x SET max_deliveries = max, dead_letter = target WHERE x.stream_id = s.id AND x.name = gname;
    IF NOT FOUND THEN PERFORM mwmq_nogroup_for(sname, gname); END IF;
END $$;

-- XCLAIM: the entries claimed (o_fields NULL with JUSTID).
CREATE FUNCTION mwmq_xclaim(sname text, gname text, cname text, min_idle bigint, mss bigint[], seqs bigint[],
                            idle bigint, at_ms bigint, retry bigint, force boolean, justid boolean,
                            l_ms bigint, l_seq bigint, bad text)
RETURNS TABLE (o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_group(sname, gname, true);
    now_ms bigint := mwmq_ms();
    delivery bigint := now_ms;
    p mwmq_stream_pending;
    f bytea[];
    seen boolean := false;
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
        SELECT e.fields INTO f FROM mwmq_stream_entries e WHERE e.stream_id = s.id AND e.ms = mss[i] AND e.seq = seqs[i];
        IF NOT FOUND THEN
            IF p.stream_id IS NOT NULL THEN
                DELETE FROM mwmq_stream_pending x WHERE x.stream_id = s.id AND x.grp = gname AND x.ms = mss[i] AND x.seq = seqs[i];
            END IF;
            CONTINUE;
        END IF;
        IF p.stream_id IS NULL THEN
            IF NOT force THEN CONTINUE; END IF;
            INSERT INTO mwmq_stream_pending (stream_id, grp, ms, seq, consumer, delivered_ms, deliveries)
            VALUES (s.id, gname, mss[i], seqs[i], cname, delivery, CASE WHEN retry IS NOT NULL THEN retry WHEN justid THEN 1 ELSE 2 END);
        ELSE
            IF min_idle > 0 AND now_ms - p.delivered_ms < min_idle THEN CONTINUE; END IF;
            IF mwmq_dead(s, gname, mss[i], seqs[i], f, p.deliveries) THEN CONTINUE; END IF;
            UPDATE mwmq_stream_pending x SET consumer = cname, delivered_ms = delivery,
                deliveries = CASE WHEN retry IS NOT NULL THEN retry WHEN justid THEN x.deliveries ELSE x.deliveries + 1 END
            WHERE x.stream_id = s.id AND x.grp = gname AND x.ms = mss[i] AND x.seq = seqs[i];
        END IF;
        IF NOT seen THEN
            PERFORM mwmq_seen(s.id, gname, cname, now_ms);
            seen := true;
        END IF;
        o_ms := mss[i]; o_seq := seqs[i]; o_fields := CASE WHEN justid THEN NULL ELSE f END;
        RETURN NEXT;
    END LOOP;
END $$;

-- XAUTOCLAIM: o_kind 0 an entry claimed, 1 a deleted id, 2 the cursor.
CREATE FUNCTION mwmq_xautoclaim(sname text, gname text, cname text, min_idle bigint, a_ms bigint, a_seq bigint,
                                cnt bigint, justid boolean)
RETURNS TABLE (o_kind int, o_ms bigint, o_seq bigint, o_fields bytea[]) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_group(sname, gname, true);
    now_ms bigint := mwmq_ms();
    attempts bigint := cnt * 10;
    left_ bigint := cnt;
    r record;
    seen boolean := false;
    c_ms bigint := 0;
    c_seq bigint := 0;
BEGIN
    FOR r IN SELECT p.ms, p.seq, p.delivered_ms, p.deliveries, e.fields FROM mwmq_stream_pending p
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
        o_kind := 0; o_ms := r.ms; o_seq := r.seq; o_fields := CASE WHEN justid THEN NULL ELSE r.fields END;
        RETURN NEXT;
        left_ := left_ - 1;
    END LOOP;
    o_kind := 2; o_ms := c_ms; o_seq := c_seq; o_fields := NULL;
    RETURN NEXT;
END $$;

-- The stream for XGROUP's subcommands: it must exist unless CREATE ... MKSTREAM.
CREATE FUNCTION mwmq_xgroup_stream(sname text, mk boolean) RETURNS mwmq_streams LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname, true);
BEGIN
    IF s.id IS NULL THEN
        IF NOT mk THEN
            PERFORM mwmq_rerr('ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want '
                || 'to use the MKSTREAM option to create an empty stream automatically.');
        END IF;
        s := mwmq_stream_made(sname);
    END IF;
    RETURN s;
END $$;

CREATE FUNCTION mwmq_xgroup_create(sname text, gname text, last boolean, i_ms bigint, i_seq bigint, mk boolean, er bigint,
                                   bad text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_xgroup_stream(sname, mk);
BEGIN
    -- (A stream MKSTREAM made goes with the error: the statement is undone.)
    IF bad IS NOT NULL THEN PERFORM mwmq_rerr(bad); END IF;
    IF last THEN i_ms := s.last_ms; i_seq := s.last_seq; END IF;
    INSERT INTO mwmq_stream_groups (stream_id, name, last_ms, last_seq, entries_read)
    VALUES (s.id, gname, i_ms, i_seq, er) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN PERFORM mwmq_rerr('BUSYGROUP Consumer Group name already exists'); END IF;
END $$;

CREATE FUNCTION mwmq_nogroup_for(sname text, gname text) RETURNS void LANGUAGE sql AS $$
    SELECT mwmq_rerr(format('NOGROUP No such consumer group ''%s'' for key name ''%s''', gname, sname))
$$;

CREATE FUNCTION mwmq_xgroup_setid(sname text, gname text, last boolean, i_ms bigint, i_seq bigint, er bigint, bad text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_xgroup_stream(sname, false);
BEGIN
    PERFORM 1 FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname;
    IF NOT FOUND THEN PERFORM mwmq_nogroup_for(sname, gname); END IF;
    IF bad IS NOT NULL THEN PERFORM mwmq_rerr(bad); END IF;
    IF last THEN i_ms := s.last_ms; i_seq := s.last_seq; END IF;
    UPDATE mwmq_stream_groups x SET last_ms = i_ms, last_seq = i_seq, entries_read = er
    WHERE x.stream_id = s.id AND x.name = gname;
    IF NOT FOUND THEN PERFORM mwmq_nogroup_for(sname, gname); END IF;
END $$;

CREATE FUNCTION mwmq_xgroup_destroy(sname text, gname text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_xgroup_stream(sname, false);
BEGIN
    DELETE FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname;
    IF NOT FOUND THEN RETURN 0; END IF;
    DELETE FROM mwmq_stream_consumers c WHERE c.stream_id = s.id AND c.grp = gname;
    DELETE FROM mwmq_stream_pending p WHERE p.stream_id = s.id AND p.grp = gname;
    RETURN 1;
END $$;

-- CREATECONSUMER (del false: 1 if created) and DELCONSUMER (del true: its pending entries).
CREATE FUNCTION mwmq_xgroup_consumer(sname text, gname text, cname text, del boolean) RETURNS bigint LANGUAGE plpgsql AS $$
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
    INSERT INTO mwmq_stream_consumers (stream_id, grp, name, seen_ms) VALUES (s.id, gname, cname, mwmq_ms())
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION mwmq_xinfo_stream(sname text)
RETURNS TABLE (o_length bigint, o_last_ms bigint, o_last_seq bigint, o_del_ms bigint, o_del_seq bigint, o_added bigint,
               o_first_ms bigint, o_first_seq bigint, o_groups bigint,
               o_f_ms bigint, o_f_seq bigint, o_f_fields bytea[], o_l_ms bigint, o_l_seq bigint, o_l_fields bytea[])
LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
    f record;
    l record;
BEGIN
    IF s.id IS NULL THEN PERFORM mwmq_rerr('ERR no such key'); END IF;
    SELECT e.ms, e.seq, e.fields INTO f FROM mwmq_stream_entries e WHERE e.stream_id = s.id ORDER BY e.ms, e.seq LIMIT 1;
    SELECT e.ms, e.seq, e.fields INTO l FROM mwmq_stream_entries e WHERE e.stream_id = s.id ORDER BY e.ms DESC, e.seq DESC LIMIT 1;
    o_length := s.length; o_last_ms := s.last_ms; o_last_seq := s.last_seq; o_del_ms := s.del_ms; o_del_seq := s.del_seq;
    o_added := s.added; o_first_ms := coalesce(f.ms, 0); o_first_seq := coalesce(f.seq, 0);
    SELECT count(*) INTO o_groups FROM mwmq_stream_groups x WHERE x.stream_id = s.id;
    o_f_ms := f.ms; o_f_seq := f.seq; o_f_fields := f.fields;
    o_l_ms := l.ms; o_l_seq := l.seq; o_l_fields := l.fields;
    RETURN NEXT;
END $$;

CREATE FUNCTION mwmq_xinfo_groups(sname text)
RETURNS TABLE (o_name text, o_consumers bigint, o_pending bigint, o_last_ms bigint, o_last_seq bigint,
               o_entries_read bigint, o_lag bigint, o_max bigint, o_dead text) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
BEGIN
    IF s.id IS NULL THEN PERFORM mwmq_rerr('ERR no such key'); END IF;
    RETURN QUERY
    SELECT g.name,
           (SELECT count(*) FROM mwmq_stream_consumers c WHERE c.stream_id = s.id AND c.grp = g.name),
           (SELECT count(*) FROM mwmq_stream_pending p WHERE p.stream_id = s.id AND p.grp = g.name),
           g.last_ms, g.last_seq, g.entries_read, mwmq_lag(s, g), g.max_deliveries, g.dead_letter
    FROM mwmq_stream_groups g WHERE g.stream_id = s.id ORDER BY g.name COLLATE "C";
END $$;

CREATE FUNCTION mwmq_xinfo_consumers(sname text, gname text)
RETURNS TABLE (o_name text, o_pending bigint, o_idle bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
    now_ms bigint := mwmq_ms();
BEGIN
    IF s.id IS NULL THEN PERFORM mwmq_rerr('ERR no such key'); END IF;
    PERFORM 1 FROM mwmq_stream_groups x WHERE x.stream_id = s.id AND x.name = gname;
    IF NOT FOUND THEN PERFORM mwmq_nogroup_for(sname, gname); END IF;
    RETURN QUERY
    SELECT c.name, (SELECT count(*) FROM mwmq_stream_pending p WHERE p.stream_id = s.id AND p.grp = gname AND p.consumer = c.name),
           now_ms - c.seen_ms
    FROM mwmq_stream_consumers c WHERE c.stream_id = s.id AND c.grp = gname ORDER BY c.name COLLATE "C";
END $$;

-- XINFO STREAM FULL: a group's pending entries (or one consumer's), the first cnt.
CREATE FUNCTION mwmq_xinfo_pending(sname text, gname text, cnt bigint, cname text)
RETURNS TABLE (o_ms bigint, o_seq bigint, o_consumer text, o_delivered bigint, o_deliveries bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
BEGIN
    RETURN QUERY
    SELECT p.ms, p.seq, p.consumer, p.delivered_ms, p.deliveries FROM mwmq_stream_pending p
    WHERE p.stream_id = s.id AND p.grp = gname AND (cname IS NULL OR p.consumer = cname)
    ORDER BY p.ms, p.seq LIMIT cnt;
END $$;

-- XINFO STREAM FULL: a group's consumers with their seen time and pending count.
CREATE FUNCTION mwmq_xinfo_full_consumers(sname text, gname text)
RETURNS TABLE (o_name text, o_seen bigint, o_pending bigint) LANGUAGE plpgsql AS $$
DECLARE
    s mwmq_streams := mwmq_stream(sname);
BEGIN
    RETURN QUERY
    SELECT c.name, c.seen_ms,
           (SELECT count(*) FROM mwmq_stream_pending p WHERE p.stream_id = s.id AND p.grp = gname AND p.consumer = c.name)
    FROM mwmq_stream_consumers c WHERE c.stream_id = s.id AND c.grp = gname ORDER BY c.name COLLATE "C";
END $$;

CREATE FUNCTION mwmq_xlen(sname text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN coalesce((mwmq_stream(sname)).length, 0);
END $$;

-- TYPE: 'stream', 'queue' (mwmq's own) or 'none'.
CREATE FUNCTION mwmq_type(sname text) RETURNS text LANGUAGE sql AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM mwmq_streams st WHERE st.name = sname) THEN 'stream'
                WHEN EXISTS (SELECT 1 FROM mwmq_queues q WHERE q.name = sname AND q.dropped_at IS NULL) THEN 'queue'
                ELSE 'none' END
$$;

CREATE FUNCTION mwmq_exists(snames text[]) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM unnest(snames) AS n(name) WHERE mwmq_type(n.name) <> 'none'
$$;

-- DEL: streams (queues are dropped with QDROP).
CREATE FUNCTION mwmq_del(snames text[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    sid bigint;
    n bigint := 0;
BEGIN
    FOR i IN 1 .. coalesce(array_length(snames, 1), 0) LOOP
        DELETE FROM mwmq_streams st WHERE st.name = snames[i] RETURNING st.id INTO sid;
        IF sid IS NOT NULL THEN
            DELETE FROM mwmq_stream_entries e WHERE e.stream_id = sid;
            DELETE FROM mwmq_stream_groups g WHERE g.stream_id = sid;
            DELETE FROM mwmq_stream_consumers c WHERE c.stream_id = sid;
            DELETE FROM mwmq_stream_pending p WHERE p.stream_id = sid;
            n := n + 1;
            sid := NULL;
        END IF;
    END LOOP;
    RETURN n;
END $$;
