//! Steering a queue's deliveries: ordered groups (`SEND q body GROUP g`:
//! a message is handed out only while no older message of its group is
//! left in the queue, so a group's messages go one at a time, in the order
//! sent, and a NACKed or expired one stays first), pausing it (`QPAUSE`/`QRESUME`: SENDs are
//! stored, nothing is handed out, parked RECVs stay parked) and limiting
//! them (`QALTER q CONCURRENCY n`: at most n of its messages leased at once;
//! `QALTER q RATE n/s`: at most n deliveries a second, in bursts of up to a
//! second's worth), across every mwmq process on the database.
//!
//! A queue with none of these (and no delivery limit) is served by RECV's
//! one-statement plain path, as before. Any other queue goes through the SQL
//! function `mwmq_recv`, which hands out nothing for a paused queue and, for
//! a limited one, first takes the queue's advisory lock for the rest of the
//! transaction: each RECV of a limited queue then counts the leases the one
//! before it committed (a statement of PL/pgSQL takes its snapshot after
//! the lock is granted, which a single statement could not), takes tokens
//! from the queue's bucket in `mwmq_queue_limits`, and counts how often a
//! limit cut a RECV short. The dead-letter handling is the same as before
//! (it moved here from the statement RECV prepared). Its last row counts the
//! dead letters and carries the queue's id (NULL: no such queue), so an
//! empty RECV needs no statement of its own to tell the two apart.
//!
//! The lock is held until the commit, so limited RECVs of one queue would
//! run at the disk's flush rate (measured: 0.27x a plain queue's RECV+ACK
//! pairs). Their transactions therefore commit without waiting for the
//! flush (`synchronous_commit = off`, for that transaction only): a crash
//! may forget the last leases, and their messages are then delivered again,
//! as after an expired lease — the at-least-once delivery every RECV has.
//! SENDs and ACKs still wait for their commit to be durable.
//!
//! RATE counts POPs too (schema 10): a POP of a queue with a rate takes the
//! same advisory lock and tokens from the same bucket (`mwmq_pop_allowance`,
//! called only for such queues, in POP's own statement), as many as there
//! are messages visible up to what it asks, so POP and RECV together stay
//! within the rate. Unlike RECV's, a POP's commit still waits for its flush
//! (a POP is at most once: a forgotten POP would deliver its message
//! again), so a rate-limited queue's POPs run at most at the disk's flush
//! rate. CONCURRENCY counts leases, which a POP does not hold.

/// Schema version 8: the settings, the buckets, and the RECV for queues
/// that are not plain.
pub const MIGRATION: &str = r#"
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
"#;

/// Schema version 10: POP's share of a rate-limited queue's bucket. How
/// many of the `want` messages a POP of queue `qid` may take now: tokens
/// from the bucket, no more than there are visible messages (so a POP of an
/// empty queue spends nothing); counted in `held_rate` when that is fewer
/// than asked for.
pub const POP_MIGRATION: &str = r#"
CREATE FUNCTION mwmq_pop_allowance(qid bigint, rate double precision, want bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    burst double precision := greatest(rate, 1);
    tokens double precision;
    visible bigint;
    allowed bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(1836543345, (qid % 2147483647)::integer);
    SELECT least(burst, l.tokens + extract(epoch FROM clock_timestamp() - l.refilled_at) * rate)
    INTO tokens FROM mwmq_queue_limits l WHERE l.queue_id = qid;
    IF NOT FOUND THEN
        tokens := burst;
    END IF;
    SELECT count(*) INTO visible
    FROM (SELECT 1 FROM mwmq_messages m WHERE m.queue_id = qid AND m.visible_at <= now() LIMIT want) v;
    allowed := least(want, visible, floor(tokens)::bigint);
    INSERT INTO mwmq_queue_limits AS l (queue_id, tokens, refilled_at, held_rate)
    VALUES (qid, tokens - allowed, clock_timestamp(), (allowed < least(want, visible))::integer)
    ON CONFLICT (queue_id) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at, held_rate = l.held_rate + EXCLUDED.held_rate;
    RETURN allowed;
END
$$;
"#;

/// Parses RATE's value: `n/s`, `n/min` or `n/h` (n a positive number; `n`
/// alone is per second), as deliveries per second; 0 lifts the limit.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let bad =
        || format!("RATE {text:?}: a number of deliveries per second, minute or hour (10/s, 30/min, 0: no limit)");
    let (n, per) = match text.split_once('/') {
        Some((n, unit)) => (
            n,
            match unit.to_ascii_lowercase().as_str() {
                "s" | "sec" => 1.0,
                "m" | "min" => 60.0,
                "h" | "hour" => 3600.0,
                _ => return Err(bad()),
            },
        ),
        None => (text, 1.0),
    };
    let n: f64 = n.trim().parse().map_err(|_| bad())?;
    if !n.is_finite() || !(0.0..=1e9).contains(&n) {
        return Err(bad());
    }
    Ok(n / per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_per_second_minute_or_hour() {
        assert_eq!(parse_rate("10/s").unwrap(), 10.0);
        assert_eq!(parse_rate("30/min").unwrap(), 0.5);
        assert_eq!(parse_rate("7200/h").unwrap(), 2.0);
        assert_eq!(parse_rate("5").unwrap(), 5.0);
        assert_eq!(parse_rate("0").unwrap(), 0.0);
        for bad in ["-1/s", "x/s", "10/fortnight", "NaN", "inf"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }
}
