-- The statements of periodic jobs (schema 18, sql/0018_schedules.sql), in
-- the form of statements.sql: the commands' (QSCHEDULE, QUNSCHEDULE,
-- QSCHEDULES, src/commands/schedules.rs), run unprepared, as such rare
-- commands may be, and the ticker's (src/ticker.rs), run in its
-- transaction on a connection of its own. Times travel as microseconds
-- since the Unix epoch (bigint): a schedule's next tick never fires again
-- is 'infinity', shown as NULL.

-- A time from microseconds since the epoch.
-- fragment: AT
timestamptz 'epoch' + interval '1 microsecond';

-- The database's clock, in microseconds: every mwmq process that shares
-- the database reads the same one, so the ticks they compute agree.
-- statement: clock
SELECT (extract(epoch FROM now()) * 1000000)::bigint;

-- QSCHEDULE: create or replace (sql/0018_schedules.sql says how).
-- statement: put
SELECT mwmq_schedule_put($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, {AT} * $13::bigint, $14::smallint, $15,
                         $16::bigint);

-- What a creation with several databases must know of the others: the
-- schedules user $1 created there, and whether the name $2 is taken there.
-- statement: elsewhere
SELECT (SELECT count(*) FROM mwmq_schedules WHERE created_by = $1),
       EXISTS (SELECT 1 FROM mwmq_schedules WHERE name = $2);

-- QUNSCHEDULE: the schedule's queue, and whether the caller may remove it
-- ($2: its admin patterns as LIKE patterns; NULL: no users; a schedule of a
-- dropped queue anyone may); removed if so.
-- statement: remove
WITH target AS (
    SELECT s.name, q.name AS queue,
           ($2::text[] IS NULL OR q.dropped_at IS NOT NULL
            OR EXISTS (SELECT 1 FROM unnest($2::text[]) p WHERE q.name LIKE p ESCAPE '\')) AS allowed
    FROM mwmq_schedules s JOIN mwmq_queues q ON q.id = s.queue_id
    WHERE s.name = $1 FOR UPDATE OF s),
gone AS (DELETE FROM mwmq_schedules s USING target t WHERE s.name = t.name AND t.allowed RETURNING s.name)
SELECT t.queue, t.allowed FROM target t;

-- QSCHEDULES: the schedules of the queues that exist and the caller may
-- see ($2: the patterns of its rights as LIKE patterns; NULL: no users),
-- by name, at most $1: what the reply's bound counts is what it shows.
-- statement: list
SELECT s.name, q.name, s.cron, s.tz, s.catchup, s.key_prefix, octet_length(s.body)::bigint, s.created_by,
       CASE WHEN isfinite(s.next_at) THEN (extract(epoch FROM s.next_at) * 1000)::bigint END,
       (extract(epoch FROM s.last_tick) * 1000)::bigint, (extract(epoch FROM s.last_run_at) * 1000)::bigint,
       s.last_id, s.sent, s.missed, s.refused, s.priority::bigint, s.grp, s.delay_ms, s.skipped, s.suspended
FROM mwmq_schedules s JOIN mwmq_queues q ON q.id = s.queue_id AND q.dropped_at IS NULL
WHERE $2::text[] IS NULL OR EXISTS (SELECT 1 FROM unnest($2::text[]) p WHERE q.name LIKE p ESCAPE '\')
ORDER BY s.name LIMIT $1;

-- The ticker: the schedules due, locked, but those named in $2 (their
-- tick failed in a pass a moment ago: tried again later); those another
-- process is sending are skipped (it moves their next tick before it lets
-- go). Without their bodies: the ticker reads one at a time (`body`), so
-- that a pass holds one body, not $1 of them.
-- statement: due
SELECT s.name, s.queue_id, q.name, q.dropped_at IS NOT NULL, s.cron, s.tz, s.key_prefix, s.catchup, s.sender,
       (extract(epoch FROM s.next_at) * 1000000)::bigint, (extract(epoch FROM now()) * 1000000)::bigint,
       s.created_by, s.priority, s.grp, s.delay_ms
FROM mwmq_schedules s JOIN mwmq_queues q ON q.id = s.queue_id
WHERE s.next_at <= now() AND s.name <> ALL ($2::text[])
ORDER BY s.next_at LIMIT $1 FOR UPDATE OF s SKIP LOCKED;

-- A schedule's body (locked by the pass that reads it).
-- statement: body
SELECT body FROM mwmq_schedules WHERE name = $1;

-- The message a tick's key names, if it was sent already, and whether it
-- is a forgery: a message still in the queue that another sender than the
-- schedule's ($3) sent with the key (a user with the send right only, who
-- can read the prefix in QSCHEDULES and so every tick's key ahead). A
-- message gone (received and acknowledged) counts as sent: whoever could
-- consume it could consume the tick's own message as well.
-- statement: sent
SELECT k.message_id, coalesce(m.sender <> $3::text, false)
FROM mwmq_keys k LEFT JOIN mwmq_messages m ON m.queue_id = k.queue_id AND m.id = k.message_id
WHERE k.queue_id = $1 AND k.key = $2;

-- A forged tick's key let go, for the tick's own message to take it.
-- statement: unkey
DELETE FROM mwmq_keys WHERE queue_id = $1 AND key = $2;

-- A pass over a schedule done: its next tick ($2; NULL: never again), the
-- latest tick sent ($3) and its message ($4), what it sent, missed, was
-- refused and skipped, and why it is suspended ($9; NULL: it is not).
-- statement: done
UPDATE mwmq_schedules
SET next_at = coalesce({AT} * $2::bigint, 'infinity'),
    last_tick = coalesce({AT} * $3::bigint, last_tick),
    last_run_at = CASE WHEN $3::bigint IS NULL THEN last_run_at ELSE now() END,
    last_id = coalesce($4::bigint, last_id),
    sent = sent + $5::bigint, missed = missed + $6::bigint, refused = refused + $7::bigint,
    skipped = skipped + $8::bigint, suspended = $9::text
WHERE name = $1;

-- A schedule whose queue was dropped goes with it.
-- statement: forget
DELETE FROM mwmq_schedules WHERE name = $1;

-- How long until the next tick of any schedule, in ms (NULL: none), at the
-- end of a pass (in its transaction, which sees the ticks it moved): those
-- still due at its start are held by another process (which moves them on)
-- or were left for later by this one, and do not count: the ticker sleeps
-- until a tick to come, or `schedule_ms`.
-- statement: next_due
SELECT (extract(epoch FROM min(next_at) - clock_timestamp()) * 1000)::bigint FROM mwmq_schedules
WHERE next_at > now() AND isfinite(next_at);
