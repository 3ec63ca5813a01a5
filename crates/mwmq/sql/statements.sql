-- The statements every mwmq connection prepares when it opens
-- (src/db/statements.rs loads this file and names them in its statements!()
-- list; the methods of src/db/pgconn.rs run them). A statement begins at its line "-- statement: NAME" and
-- ends with ";". A fragment ("-- fragment: NAME", up to ";") is text
-- several statements share: {NAME} in a statement or a fragment stands for
-- it. Comment lines above a "-- statement:" line say what it is for.
-- Each statement is one round trip and its own transaction (autocommit).

-- A queue RECV's plain statements serve: no delivery limit, not paused, no
-- concurrency or rate limit (any other goes through mwmq_recv_ranked).
-- fragment: PLAIN_QUEUE
dropped_at IS NULL AND max_deliveries IS NULL AND NOT paused AND concurrency IS NULL AND rate IS NULL;

-- A lease's visibility deadline and end ($5 its length), of a message of
-- queue q (its backoff: `policies.rs`): with a backoff the message is
-- visible again the backoff after the lease's end. A statement that leases
-- the messages it chose (p) reads q from a CTE of its own, never joined to
-- the messages by the queue's id: with that join the planner may take the
-- queue's id as the only key into the messages' primary key and scan the
-- whole queue for each message leased (a queue's statistics are often
-- those of a small table), where the id and the queue lead to one row.
-- fragment: LEASE_BACKOFF
visible_at = now() + interval '1 millisecond' * $5::float8
    + CASE WHEN q.backoff_base_ms IS NULL THEN interval '0'
           ELSE mwmq_backoff(q.backoff_base_ms, q.backoff_max_ms, q.backoff_jitter, m.deliveries + 1) END,
lease_until = CASE WHEN q.backoff_base_ms IS NOT NULL THEN now() + interval '1 millisecond' * $5::float8 END;

-- The queue's id, if it exists (reused by most statements).
-- fragment: QUEUE
(SELECT id FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL);

-- ACK's check of who holds the delivery: $4, the receiver it was leased
-- to, or NULL for a caller that may act on any delivery of the queue.
-- fragment: HELD
AND ($4::text IS NULL OR leased_to = $4);

-- A message of m that is not grouped, or the oldest of its group left
-- (src/limits.rs; mwmq_recv has its own copy, frozen in schema 8).
-- fragment: GROUP_HEAD
(m.grp IS NULL OR NOT EXISTS (SELECT 1 FROM mwmq_messages o
                              WHERE o.queue_id = m.queue_id AND o.grp = m.grp AND o.id < m.id));

-- Which messages of m a receiver may take: visible, addressed to it or to
-- no one, from the sender asked for, the head of its group if it has one.
-- fragment: ELIGIBLE
m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = $2) AND ($3::text IS NULL OR m.sender = $3) AND {GROUP_HEAD};

-- What a statement that removes acknowledged messages adds so that a
-- retaining queue keeps them: gone is its DELETE ... RETURNING CTE with the
-- message's columns, retain_ms and acked_by.
-- fragment: ARCHIVE_GONE
kept AS (
    INSERT INTO mwmq_archive (queue_id, id, sender, receiver, body, sent_at, deliveries, acked_by)
    SELECT g.queue_id, g.id, g.sender, g.receiver, g.body, g.sent_at, g.deliveries, g.acked_by
    FROM gone g WHERE g.retain_ms IS NOT NULL
    ON CONFLICT DO NOTHING);

-- A message of another priority than 0 marks its queue `prioritized`
-- (`policies.rs`) in the statement that stores it, so that a statement
-- that sees the message sees the mark (they commit together): every
-- statement that stores messages does, a SEND of priority 0 at the cost of
-- a filter that is false. (Schema 17's trigger did it for any insert, at a
-- quarter of a SEND's time in the database: `sql/0017_priorities_backoff.sql`.)
-- statement: send
WITH mark AS (UPDATE mwmq_queues SET prioritized = true
              WHERE $7::smallint <> 0 AND name = $1 AND dropped_at IS NULL AND NOT prioritized)
INSERT INTO mwmq_messages (queue_id, sender, receiver, body, visible_at, counted, grp, priority)
SELECT id, $2::text, $3::text, $4::bytea, now() + interval '1 millisecond' * $5::float8,
       (max_messages IS NOT NULL OR max_bytes IS NOT NULL), $6::text, $7::smallint
FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL
  AND (max_messages IS NULL AND max_bytes IS NULL
       OR mwmq_room(id, max_messages, max_bytes, octet_length($4::bytea)))
RETURNING id;

-- Before a SEND with a PRIORITY to a queue not known to be marked
-- `prioritized`: the mark, in a statement of its own that waits at most
-- 100 ms for another transaction (schema 19 says why).
-- statement: prioritize
SELECT mwmq_prioritize($1);

-- statement: send_many
WITH mark AS (UPDATE mwmq_queues q SET prioritized = true
              FROM (SELECT DISTINCT t.queue FROM unnest($1::text[], $7::smallint[]) AS t(queue, priority)
                    WHERE t.priority <> 0) p
              WHERE q.name = p.queue AND q.dropped_at IS NULL AND NOT q.prioritized),
r AS (
   SELECT nextval('mwmq_message_ids') AS id, q.id AS queue_id, t.n, t.sender, t.receiver,
          t.body, t.delay, t.grp, t.priority,
          (q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL) AS counted
   FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::float8[], $6::text[], $7::smallint[])
        WITH ORDINALITY AS t(queue, sender, receiver, body, delay, grp, priority, n)
   JOIN mwmq_queues q ON q.name = t.queue AND q.dropped_at IS NULL
   WHERE q.max_messages IS NULL AND q.max_bytes IS NULL
      OR mwmq_room(q.id, q.max_messages, q.max_bytes, octet_length(t.body))
   -- Ids in the order the SENDs came (a group is handed out in id order).
   ORDER BY t.n),
ins AS (
   INSERT INTO mwmq_messages (queue_id, id, sender, receiver, body, visible_at, counted, grp, priority)
   SELECT queue_id, id, sender, receiver, body, now() + interval '1 millisecond' * delay, counted, grp, priority
   FROM r)
SELECT n, id FROM r;

-- statement: ack_many
WITH gone AS (
   DELETE FROM mwmq_messages m
   USING (SELECT q.id AS queue_id, q.retain_ms, t.id, t.lease, t.holder, t.n
          FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[])
               WITH ORDINALITY AS t(queue, id, lease, holder, n)
          JOIN mwmq_queues q ON q.name = t.queue AND q.dropped_at IS NULL) r
   WHERE m.queue_id = r.queue_id AND m.id = r.id AND m.lease = r.lease
     AND (r.holder IS NULL OR m.leased_to = r.holder)
   RETURNING r.n, m.queue_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries,
             m.leased_to AS acked_by, r.retain_ms),
{ARCHIVE_GONE}
SELECT n FROM gone;

-- statement: send_key
WITH mark AS (UPDATE mwmq_queues SET prioritized = true
              WHERE $8::smallint <> 0 AND name = $1 AND dropped_at IS NULL AND NOT prioritized),
k AS (
   INSERT INTO mwmq_keys (queue_id, key, message_id)
   SELECT id, $6::text, nextval('mwmq_message_ids') FROM mwmq_queues
   WHERE name = $1 AND dropped_at IS NULL
     AND (max_messages IS NULL AND max_bytes IS NULL
          OR mwmq_room(id, max_messages, max_bytes, octet_length($4::bytea)))
   ON CONFLICT DO NOTHING
   RETURNING queue_id, message_id)
INSERT INTO mwmq_messages (queue_id, id, sender, receiver, body, visible_at, counted, grp, priority)
SELECT k.queue_id, k.message_id, $2::text, $3::text, $4::bytea,
       now() + interval '1 millisecond' * $5::float8,
       (q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL), $7::text, $8::smallint
FROM k JOIN mwmq_queues q ON q.id = k.queue_id
RETURNING id;

-- statement: key_lookup
SELECT message_id FROM mwmq_keys WHERE queue_id = {QUEUE} AND key = $2;

-- The statements of a queue that never held a message of another
-- priority than 0 (`policies.rs`): its walk is the one range of priority 0,
-- as before schema 17, without the descents. A queue that did is left
-- alone, and a last row of NULLs (recv_many: served 2) says so: the
-- caller runs the *_ranked statement, and remembers the queue for a while.
-- fragment: UNPRIORITIZED
(SELECT id FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL AND NOT prioritized);

-- fragment: PRIORITIZED
EXISTS (SELECT 1 FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL AND prioritized);

-- statement: recv_many
WITH r AS (SELECT t.n, t.me FROM unnest($2::text[]) WITH ORDINALITY AS t(me, n)),
qq AS (SELECT id, prioritized, backoff_base_ms, backoff_max_ms, backoff_jitter
       FROM mwmq_queues WHERE name = $1 AND {PLAIN_QUEUE}),
c AS (SELECT m.queue_id, m.id, m.receiver, m.visible_at FROM mwmq_messages m
      WHERE m.queue_id = (SELECT id FROM qq WHERE NOT prioritized) AND m.priority = 0
        AND m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = ANY($2::text[]))
        AND ($3::text IS NULL OR m.sender = $3) AND {GROUP_HEAD}
      ORDER BY m.visible_at, m.id LIMIT $4 FOR UPDATE SKIP LOCKED),
mine AS (SELECT a.queue_id, a.id, b.n, b.me
         FROM (SELECT c.queue_id, c.id, c.receiver,
                      row_number() OVER (PARTITION BY c.receiver ORDER BY c.visible_at, c.id) AS j
               FROM c WHERE c.receiver IS NOT NULL) a
         JOIN (SELECT r.n, r.me, row_number() OVER (PARTITION BY r.me ORDER BY r.n) AS j
               FROM r WHERE r.me IS NOT NULL) b ON b.me = a.receiver AND b.j = a.j),
anyone AS (SELECT u.queue_id, u.id, w.n, w.me
           FROM (SELECT c.queue_id, c.id, row_number() OVER (ORDER BY c.visible_at, c.id) AS j
                 FROM c WHERE c.receiver IS NULL) u
           JOIN (SELECT r.n, r.me, row_number() OVER (ORDER BY r.n) AS j
                 FROM r WHERE r.n NOT IN (SELECT n FROM mine)) w ON w.j = u.j),
p AS (SELECT * FROM mine UNION ALL SELECT * FROM anyone),
leased AS (UPDATE mwmq_messages m
           SET lease = mwmq_lease_token(), leased_to = p.me, {LEASE_BACKOFF},
               deliveries = m.deliveries + 1
           FROM p, qq q WHERE m.queue_id = p.queue_id AND m.id = p.id
           RETURNING p.n, m.queue_id, m.id, m.lease, m.sender, m.body, m.priority)
SELECT n, queue_id, id, lease, sender, body, priority FROM leased
UNION ALL SELECT NULL, NULL, (SELECT count(*) FROM c),
                 coalesce((SELECT CASE WHEN prioritized THEN 2 ELSE 1 END FROM qq), 0)::bigint, NULL, NULL, NULL;

-- statement: recv_plain
WITH q AS (SELECT id, prioritized, backoff_base_ms, backoff_max_ms, backoff_jitter
           FROM mwmq_queues WHERE name = $1 AND {PLAIN_QUEUE}),
leased AS (
   UPDATE mwmq_messages m
   SET lease = mwmq_lease_token(), leased_to = $2, {LEASE_BACKOFF},
       deliveries = m.deliveries + 1
   FROM q, (SELECT x.queue_id, x.id FROM (
             SELECT l.queue_id, l.id, sum(l.w) OVER (ORDER BY l.visible_at, l.id) AS run,
                    row_number() OVER (ORDER BY l.visible_at, l.id) AS k
             FROM (SELECT m.queue_id, m.id, m.visible_at,
                          octet_length(m.body) + octet_length(m.sender) + 64 AS w
                   FROM mwmq_messages m
                   WHERE m.queue_id = (SELECT id FROM q WHERE NOT prioritized) AND m.priority = 0
                     AND {ELIGIBLE}
                   ORDER BY visible_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) l) x
         WHERE x.k = 1 OR x.run <= $6::bigint) c
   WHERE m.queue_id = c.queue_id AND m.id = c.id
   RETURNING m.queue_id, m.id, m.lease, m.sender, m.body, m.priority)
SELECT queue_id, id, lease, sender, body, priority FROM leased
UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE (SELECT prioritized FROM q);

-- statement: pop
WITH q AS (SELECT id, retain_ms, rate, prioritized FROM mwmq_queues
           WHERE name = $1 AND dropped_at IS NULL AND NOT paused),
n AS (SELECT CASE WHEN q.prioritized THEN 0 WHEN q.rate IS NULL THEN $4
                  ELSE mwmq_pop_allowance(q.id, q.rate, $4) END AS allowed
      FROM q),
gone AS (
   DELETE FROM mwmq_messages m
   USING (SELECT m.queue_id, m.id FROM mwmq_messages m
          WHERE m.queue_id = (SELECT id FROM q WHERE NOT prioritized) AND m.priority = 0 AND {ELIGIBLE}
          ORDER BY visible_at, id LIMIT (SELECT allowed FROM n) FOR UPDATE SKIP LOCKED) c
   WHERE m.queue_id = c.queue_id AND m.id = c.id
   RETURNING m.queue_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries + 1 AS deliveries,
             $2::text AS acked_by, (SELECT retain_ms FROM q) AS retain_ms, m.priority),
{ARCHIVE_GONE}
SELECT id, sender, body, priority FROM gone
UNION ALL SELECT NULL, NULL, NULL, NULL WHERE (SELECT prioritized FROM q);

-- statement: peek
(SELECT m.id, m.sender, m.body, m.priority FROM mwmq_messages m
 WHERE m.queue_id = {UNPRIORITIZED} AND m.priority = 0 AND {ELIGIBLE}
 ORDER BY m.visible_at, m.id LIMIT $4)
UNION ALL SELECT NULL, NULL, NULL, NULL WHERE {PRIORITIZED};

-- A queue without a delivery limit: the plain lease of the first
-- eligible messages (a queue with one finds nothing here).
-- One message each for several receivers (any names) of a queue
-- without a delivery limit: the first eligible messages are
-- locked; each receiver gets the first one addressed to it, if
-- any, and the others the messages addressed to no one, in
-- order. The last row counts the messages locked, and says
-- whether the queue is one this statement serves
-- (NULL, NULL, count, 1 or 0, NULL, NULL).
-- statement: recv_many_ranked
WITH r AS (SELECT t.n, t.me FROM unnest($2::text[]) WITH ORDINALITY AS t(me, n)),
qq AS (SELECT id, backoff_base_ms, backoff_max_ms, backoff_jitter
       FROM mwmq_queues WHERE name = $1 AND {PLAIN_QUEUE}),
c AS (SELECT l.queue_id, l.id, l.receiver, row_number() OVER () AS o FROM (
         SELECT m.queue_id, m.id, m.receiver
         FROM qq q
         CROSS JOIN generate_series(9, 0, -1) AS v(pr)
         CROSS JOIN LATERAL (
            SELECT m.queue_id, m.id, m.receiver FROM mwmq_messages m
            WHERE m.queue_id = q.id AND m.priority = v.pr
              AND m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = ANY($2::text[]))
              AND ($3::text IS NULL OR m.sender = $3) AND {GROUP_HEAD}
            ORDER BY m.visible_at, m.id LIMIT $4 FOR UPDATE SKIP LOCKED) m
         LIMIT $4) l),
mine AS (SELECT a.queue_id, a.id, b.n, b.me
         FROM (SELECT c.queue_id, c.id, c.receiver,
                      row_number() OVER (PARTITION BY c.receiver ORDER BY c.o) AS j
               FROM c WHERE c.receiver IS NOT NULL) a
         JOIN (SELECT r.n, r.me, row_number() OVER (PARTITION BY r.me ORDER BY r.n) AS j
               FROM r WHERE r.me IS NOT NULL) b ON b.me = a.receiver AND b.j = a.j),
anyone AS (SELECT u.queue_id, u.id, w.n, w.me
           FROM (SELECT c.queue_id, c.id, row_number() OVER (ORDER BY c.o) AS j
                 FROM c WHERE c.receiver IS NULL) u
           JOIN (SELECT r.n, r.me, row_number() OVER (ORDER BY r.n) AS j
                 FROM r WHERE r.n NOT IN (SELECT n FROM mine)) w ON w.j = u.j),
p AS (SELECT * FROM mine UNION ALL SELECT * FROM anyone),
leased AS (UPDATE mwmq_messages m
           SET lease = mwmq_lease_token(), leased_to = p.me, {LEASE_BACKOFF},
               deliveries = m.deliveries + 1
           FROM p, qq q WHERE m.queue_id = p.queue_id AND m.id = p.id
           RETURNING p.n, m.queue_id, m.id, m.lease, m.sender, m.body, m.priority)
SELECT n, queue_id, id, lease, sender, body, priority FROM leased
UNION ALL SELECT NULL, NULL, (SELECT count(*) FROM c), (SELECT count(*) FROM qq), NULL, NULL, NULL;

-- The messages leased weigh at most $6 (`max_reply_bytes`; body,
-- sender and 64 each, the first always: `sql/0015_reply_bounds.sql`).
-- statement: recv_plain_ranked
UPDATE mwmq_messages m
SET lease = mwmq_lease_token(), leased_to = $2, {LEASE_BACKOFF},
    deliveries = m.deliveries + 1
FROM (SELECT x.queue_id, x.id, x.backoff_base_ms, x.backoff_max_ms, x.backoff_jitter FROM (
          SELECT l.*, sum(l.w) OVER (ROWS UNBOUNDED PRECEDING) AS run, row_number() OVER () AS k
          FROM (SELECT m.queue_id, m.id, octet_length(m.body) + octet_length(m.sender) + 64 AS w,
                       q.backoff_base_ms, q.backoff_max_ms, q.backoff_jitter
                FROM (SELECT id, prioritized, backoff_base_ms, backoff_max_ms, backoff_jitter
                      FROM mwmq_queues WHERE name = $1 AND {PLAIN_QUEUE}) q
                CROSS JOIN generate_series(9, 0, -1) AS v(pr)
                CROSS JOIN LATERAL (
                   SELECT m.queue_id, m.id, m.body, m.sender FROM mwmq_messages m
                   WHERE m.queue_id = q.id AND m.priority = v.pr AND {ELIGIBLE}
                   ORDER BY m.visible_at, m.id LIMIT $4 FOR UPDATE SKIP LOCKED) m
                LIMIT $4) l) x
      WHERE x.k = 1 OR x.run <= $6::bigint) q
WHERE m.queue_id = q.queue_id AND m.id = q.id
RETURNING m.queue_id, m.id, m.lease, m.sender, m.body, m.priority;

-- Any other queue: paused, limited, with a delivery limit or a backoff
-- (`limits.rs`, `policies.rs`). The last row counts the dead letters:
-- (the queue's id or NULL without one, moved out, moved in, NULL, NULL, NULL).
-- statement: recv
SELECT r_queue_id, r_id, r_lease, r_sender, r_body, r_priority FROM mwmq_recv_ranked($1, $2, $3, $4, $5, $6);

-- A paused queue hands out nothing; a rate-limited one as many as
-- its bucket allows (`limits.rs`: the function is called for those only).
-- statement: pop_ranked
WITH q AS (SELECT id, retain_ms, rate, prioritized FROM mwmq_queues
           WHERE name = $1 AND dropped_at IS NULL AND NOT paused),
n AS (SELECT CASE WHEN q.rate IS NULL THEN $4 ELSE mwmq_pop_allowance(q.id, q.rate, $4) END AS allowed
      FROM q),
gone AS (
   DELETE FROM mwmq_messages m
   USING (SELECT c.queue_id, c.id FROM q
          CROSS JOIN generate_series(9, 0, -1) AS v(pr)
          CROSS JOIN LATERAL (
             SELECT m.queue_id, m.id FROM mwmq_messages m
             WHERE m.queue_id = q.id AND m.priority = v.pr AND {ELIGIBLE}
             ORDER BY m.visible_at, m.id LIMIT (SELECT allowed FROM n) FOR UPDATE SKIP LOCKED) c
          LIMIT (SELECT allowed FROM n)) c
   WHERE m.queue_id = c.queue_id AND m.id = c.id
   RETURNING m.queue_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries + 1 AS deliveries,
             $2::text AS acked_by, (SELECT retain_ms FROM q) AS retain_ms, m.priority),
{ARCHIVE_GONE}
SELECT id, sender, body, priority FROM gone;

-- statement: peek_ranked
SELECT m.id, m.sender, m.body, m.priority
FROM (SELECT id, prioritized FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL) q
CROSS JOIN generate_series(9, 0, -1) AS v(pr)
CROSS JOIN LATERAL (
   SELECT m.id, m.sender, m.body, m.priority FROM mwmq_messages m
   WHERE m.queue_id = q.id AND m.priority = v.pr AND {ELIGIBLE} ORDER BY m.visible_at, m.id LIMIT $4) m
LIMIT $4;

-- statement: ack
WITH q AS (SELECT id, retain_ms FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL),
gone AS (
   DELETE FROM mwmq_messages m USING q
   WHERE m.queue_id = q.id AND m.id = $2 AND m.lease = $3 {HELD}
   RETURNING m.queue_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries,
             m.leased_to AS acked_by, q.retain_ms),
{ARCHIVE_GONE}
SELECT count(*) FROM gone;

-- (QARCHIVE and QDEAD weigh at most $3, as RECV: the first always.)
-- statement: archive
SELECT id, sender, body, deliveries, acked_ms, acked_by FROM (
   SELECT a.*, sum(a.w) OVER (ORDER BY a.acked_at DESC, a.id DESC) AS run,
          row_number() OVER (ORDER BY a.acked_at DESC, a.id DESC) AS k
   FROM (SELECT id, sender, body, deliveries, (extract(epoch FROM acked_at) * 1000)::bigint AS acked_ms,
                acked_by, acked_at,
                octet_length(body) + octet_length(sender) + coalesce(octet_length(acked_by), 0) + 128 AS w
         FROM mwmq_archive WHERE queue_id = {QUEUE} ORDER BY acked_at DESC, id DESC LIMIT $2) a) x
WHERE x.k = 1 OR x.run <= $3::bigint ORDER BY x.k;

-- A queue's dead letters: those it holds as a dead-letter queue,
-- and those it sent to its own; last moved first (a dead letter is
-- visible from its move on, until someone takes it).
-- statement: dead
WITH q AS (SELECT id, name, dead_letter FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL),
d AS (SELECT m.id, dq.name AS held_in, m.dead_from, m.dead_reason, m.deliveries, m.sender,
             (extract(epoch FROM m.sent_at) * 1000)::bigint AS sent_ms, m.body, m.visible_at,
             octet_length(m.body) + octet_length(m.sender) + octet_length(dq.name)
               + coalesce(octet_length(m.dead_from), 0) + 256 AS w
      FROM q JOIN mwmq_queues dq ON dq.dropped_at IS NULL AND (dq.id = q.id OR dq.name = q.dead_letter)
      JOIN mwmq_messages m ON m.queue_id = dq.id AND m.dead_from IS NOT NULL
                          AND (dq.id = q.id OR m.dead_from = q.name)
      ORDER BY m.visible_at DESC, m.id DESC LIMIT $2)
SELECT id, held_in, dead_from, dead_reason, deliveries, sender, sent_ms, body FROM (
   SELECT d.*, sum(d.w) OVER (ORDER BY d.visible_at DESC, d.id DESC) AS run,
          row_number() OVER (ORDER BY d.visible_at DESC, d.id DESC) AS k FROM d) x
WHERE x.k = 1 OR x.run <= $3::bigint ORDER BY x.k;

-- $4: the DELAY given (NULL: none). A NACK without DELAY of a queue with
-- a backoff waits the backoff (unless that was the last delivery
-- MAXDELIVERIES allows: it is dead-lettered next); a DELAY, even 0, wins.
-- statement: nack
UPDATE mwmq_messages m SET lease = NULL, leased_to = NULL, lease_until = NULL,
       visible_at = CASE WHEN $4::float8 > 0 THEN now() + interval '1 millisecond' * $4::float8
                         WHEN $4::float8 IS NULL AND q.backoff_base_ms IS NOT NULL
                              AND (q.max_deliveries IS NULL OR m.deliveries < q.max_deliveries)
                         THEN now() + mwmq_backoff(q.backoff_base_ms, q.backoff_max_ms, q.backoff_jitter, m.deliveries)
                         ELSE least(m.sent_at, now()) END
FROM mwmq_queues q
WHERE q.name = $1 AND q.dropped_at IS NULL AND m.queue_id = q.id AND m.id = $2 AND m.lease = $3
  AND ($5::text IS NULL OR m.leased_to = $5);

-- A lease followed by a backoff keeps its backoff after the new end.
-- statement: touch
UPDATE mwmq_messages
SET visible_at = now() + interval '1 millisecond' * $4::float8 + coalesce(visible_at - lease_until, interval '0'),
    lease_until = CASE WHEN lease_until IS NOT NULL THEN now() + interval '1 millisecond' * $4::float8 END
WHERE queue_id = {QUEUE} AND id = $2 AND lease = $3 AND ($5::text IS NULL OR leased_to = $5);

-- statement: alter
UPDATE mwmq_queues
SET max_deliveries = CASE WHEN $2::bool THEN nullif($3::int, 0) ELSE max_deliveries END,
    dead_letter = CASE WHEN $4::bool THEN $5::text ELSE dead_letter END,
    max_messages = CASE WHEN $6::bool THEN nullif($7::bigint, 0) ELSE max_messages END,
    max_bytes = CASE WHEN $8::bool THEN nullif($9::bigint, 0) ELSE max_bytes END,
    concurrency = CASE WHEN $10::bool THEN nullif($11::int, 0) ELSE concurrency END,
    rate = CASE WHEN $12::bool THEN nullif($13::float8, 0) ELSE rate END,
    retain_ms = CASE WHEN $14::bool THEN nullif($15::bigint, 0) ELSE retain_ms END,
    backoff_base_ms = CASE WHEN $16::bool THEN nullif($17::bigint, 0) ELSE backoff_base_ms END,
    backoff_max_ms = CASE WHEN $16::bool THEN nullif($18::bigint, 0) ELSE backoff_max_ms END,
    backoff_jitter = CASE WHEN $16::bool THEN nullif($19::smallint, 0) ELSE backoff_jitter END
WHERE name = $1 AND dropped_at IS NULL
RETURNING id, (SELECT o.max_messages IS NOT NULL OR o.max_bytes IS NOT NULL
               FROM mwmq_queues o WHERE o.id = mwmq_queues.id) AS had_quota,
          (max_messages IS NOT NULL OR max_bytes IS NOT NULL) AS has_quota;

-- After a quota was set or lifted: SQL transactions that read it at COMMIT before have committed (`sql/0016_sql_bounds.sql`).
-- statement: settle
SELECT mwmq_settle_barrier($1);

-- statement: pause
UPDATE mwmq_queues SET paused = $2 WHERE name = $1 AND dropped_at IS NULL RETURNING id;

-- A quota set or lifted: the queue's messages are marked counted, or not.
-- statement: mark
UPDATE mwmq_messages m SET counted = q.quota
FROM (SELECT id, (max_messages IS NOT NULL OR max_bytes IS NOT NULL) AS quota
      FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL) q
WHERE m.queue_id = q.id AND m.counted <> q.quota;

-- A quota set or lifted: the queue's count starts from what it
-- holds (nothing without a quota). The SQL callers' stripes (16
-- and up, `sql/0014_sql_quota.sql`) may be locked by open transactions and
-- are left alone: stripe 0 takes what they count away.
-- statement: recount
WITH q AS (SELECT id, (max_messages IS NOT NULL OR max_bytes IS NOT NULL) AS counted
           FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL),
s AS (SELECT coalesce(sum(c.messages), 0)::bigint AS messages, coalesce(sum(c.bytes), 0)::bigint AS bytes
      FROM mwmq_queue_counts c WHERE c.queue_id = (SELECT id FROM q) AND c.stripe >= 16),
d AS (DELETE FROM mwmq_queue_counts c USING q
      WHERE c.queue_id = q.id AND c.stripe BETWEEN 1 AND 15)
INSERT INTO mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
SELECT q.id, 0, count(m.id) - s.messages, coalesce(sum(octet_length(m.body)), 0) - s.bytes
FROM q CROSS JOIN s LEFT JOIN mwmq_messages m ON m.queue_id = q.id AND q.counted
GROUP BY q.id, s.messages, s.bytes
ON CONFLICT (queue_id, stripe) DO UPDATE SET messages = EXCLUDED.messages, bytes = EXCLUDED.bytes;

-- Counts from the indexes, priority by priority (ready, not yet
-- visible: delayed or backing off, or leased), dead letters, and the
-- quota's counters; the age of the ready message that waited longest (of
-- any priority: the head of each priority's line); of each queue named
-- (QINFO names one, the /ui page many).
-- statement: info
SELECT coalesce(q.max_deliveries, 0), q.dead_letter, lv.ready, lv.delayed, lv.leased,
       (SELECT count(*) FROM mwmq_messages m WHERE m.queue_id = q.id AND m.dead_from IS NOT NULL),
       coalesce(extract(epoch FROM now() - lv.oldest) * 1000, 0)::float8,
       coalesce(q.max_messages, 0), coalesce(q.max_bytes, 0),
       (SELECT coalesce(sum(c.messages), 0)::bigint FROM mwmq_queue_counts c WHERE c.queue_id = q.id),
       (SELECT coalesce(sum(c.bytes), 0)::bigint FROM mwmq_queue_counts c WHERE c.queue_id = q.id),
       q.paused, coalesce(q.concurrency, 0), coalesce(q.rate, 0),
       coalesce(l.held_concurrency, 0), coalesce(l.held_rate, 0), coalesce(q.retain_ms, 0),
       (SELECT count(*) FROM mwmq_archive a WHERE a.queue_id = q.id), q.name,
       lv.ready_levels, lv.ready_counts, coalesce(q.backoff_base_ms, 0), coalesce(q.backoff_max_ms, 0),
       coalesce(q.backoff_jitter, 0)::int
FROM mwmq_queues q LEFT JOIN mwmq_queue_limits l ON l.queue_id = q.id
CROSS JOIN LATERAL (
   SELECT coalesce(sum(r.ready), 0)::bigint AS ready, coalesce(sum(d.delayed), 0)::bigint AS delayed,
          coalesce(sum(d.leased), 0)::bigint AS leased, min(h.sent_at) AS oldest,
          coalesce(array_agg(v.pr::int) FILTER (WHERE r.ready > 0), '{}') AS ready_levels,
          coalesce(array_agg(r.ready) FILTER (WHERE r.ready > 0), '{}') AS ready_counts
   FROM mwmq_walk(q.id, q.prioritized) AS v(pr)
   CROSS JOIN LATERAL (SELECT count(*) AS ready FROM mwmq_messages m
                       WHERE m.queue_id = q.id AND m.priority = v.pr AND m.visible_at <= now()) r
   CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE m.lease IS NULL OR m.lease_until <= now()) AS delayed,
                              count(*) FILTER (WHERE m.lease IS NOT NULL
                                                 AND coalesce(m.lease_until, m.visible_at) > now()) AS leased
                       FROM mwmq_messages m
                       WHERE m.queue_id = q.id AND m.priority = v.pr AND m.visible_at > now()) d
   LEFT JOIN LATERAL (SELECT m.sent_at FROM mwmq_messages m
                      WHERE m.queue_id = q.id AND m.priority = v.pr AND m.visible_at <= now()
                      ORDER BY m.visible_at, m.id LIMIT 1) h ON true) lv
WHERE q.name = ANY($1::text[]) AND q.dropped_at IS NULL;

-- Why a SEND stored nothing: no such queue (no row), or its quota.
-- statement: quota
SELECT coalesce(q.max_messages, 0), coalesce(q.max_bytes, 0),
       (SELECT coalesce(sum(c.messages), 0)::bigint FROM mwmq_queue_counts c WHERE c.queue_id = q.id),
       (SELECT coalesce(sum(c.bytes), 0)::bigint FROM mwmq_queue_counts c WHERE c.queue_id = q.id)
FROM mwmq_queues q WHERE q.name = $1 AND q.dropped_at IS NULL;

-- Dead letters back: to TO, or to the queue each came from; what
-- has nowhere to go (no such queue) stays.
-- statement: redrive
WITH src AS (SELECT id FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL),
c AS (SELECT m.queue_id, m.id, coalesce($2::text, m.dead_from) AS target
      FROM mwmq_messages m
      WHERE m.queue_id = (SELECT id FROM src) AND m.visible_at <= now()
      ORDER BY m.priority DESC, m.visible_at, m.id LIMIT $3 FOR UPDATE OF m SKIP LOCKED),
gone AS (DELETE FROM mwmq_messages m
         USING c JOIN mwmq_queues t ON t.name = c.target AND t.dropped_at IS NULL
         WHERE m.queue_id = c.queue_id AND m.id = c.id
         RETURNING t.id AS target_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.grp, m.priority,
                   (t.max_messages IS NOT NULL OR t.max_bytes IS NOT NULL) AS counted),
ins AS (INSERT INTO mwmq_messages (queue_id, id, sender, receiver, body, sent_at, visible_at, counted, grp, priority)
        SELECT target_id, id, sender, receiver, body, sent_at, now(), counted, grp, priority FROM gone RETURNING 1),
mark AS (UPDATE mwmq_queues t SET prioritized = true
         FROM (SELECT DISTINCT target_id FROM gone WHERE priority <> 0) g
         WHERE t.id = g.target_id AND NOT t.prioritized)
SELECT (SELECT count(*) FROM ins), EXISTS (SELECT 1 FROM src);

-- statement: release
UPDATE mwmq_messages m SET lease = NULL, leased_to = NULL, lease_until = NULL, visible_at = least(m.sent_at, now()),
       deliveries = greatest(m.deliveries - 1, 0)
FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS r(queue_id, id, lease)
WHERE m.queue_id = r.queue_id AND m.id = r.id AND m.lease = r.lease;

-- statement: exists
SELECT 1 FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL;

-- A user creates at most $7 queues and streams (NULL: no limit).
-- statement: create
INSERT INTO mwmq_queues
   (name, max_deliveries, dead_letter, max_messages, max_bytes, created_by, concurrency, rate,
    retain_ms, backoff_base_ms, backoff_max_ms, backoff_jitter)
SELECT $1, nullif($2::int, 0), $3, nullif($4::bigint, 0), nullif($5::bigint, 0), $6::text,
       nullif($8::int, 0), nullif($9::float8, 0), nullif($10::bigint, 0), nullif($11::bigint, 0),
       nullif($12::bigint, 0), nullif($13::smallint, 0)
WHERE $7::bigint IS NULL OR mwmq_owned($6::text) < $7::bigint
ON CONFLICT (name) WHERE dropped_at IS NULL DO NOTHING RETURNING id;

-- statement: drop
UPDATE mwmq_queues SET dropped_at = now() WHERE name = $1 AND dropped_at IS NULL RETURNING id;

-- statement: len
SELECT (SELECT count(*) FROM mwmq_messages m WHERE m.queue_id = q.id)
FROM mwmq_queues q WHERE q.name = $1 AND q.dropped_at IS NULL;

-- QLIST: the queues whose names match one of $2 (the caller's patterns as
-- LIKE patterns; NULL: no users), at most $1: the reply's bound counts
-- only what the caller may see (it counted every queue, so a user with two
-- queues was refused once others had many).
-- statement: list
SELECT q.name FROM mwmq_queues q
WHERE q.dropped_at IS NULL
  AND ($2::text[] IS NULL OR EXISTS (SELECT 1 FROM unnest($2::text[]) p WHERE q.name LIKE p ESCAPE '\'))
ORDER BY q.name LIMIT $1;

-- QLIST PENDING: the same, of the queues with a message $1 may take now.
-- statement: pending
SELECT q.name FROM mwmq_queues q WHERE q.dropped_at IS NULL
  AND ($3::text[] IS NULL OR EXISTS (SELECT 1 FROM unnest($3::text[]) p WHERE q.name LIKE p ESCAPE '\'))
  AND EXISTS (
   SELECT 1 FROM mwmq_walk(q.id, q.prioritized) AS v(pr)
   JOIN mwmq_messages m ON m.queue_id = q.id AND m.priority = v.pr
   WHERE m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = $1))
ORDER BY q.name LIMIT $2;
