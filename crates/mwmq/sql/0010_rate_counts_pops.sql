-- mwmq schema version 10.
--
-- Schema version 10: POP's share of a rate-limited queue's bucket. How
-- many of the `want` messages a POP of queue `qid` may take now: tokens
-- from the bucket, no more than there are visible messages (so a POP of an
-- empty queue spends nothing); counted in `held_rate` when that is fewer
-- than asked for.
--
-- (The Rust side: crates/mwmq/src/limits.rs.)

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
