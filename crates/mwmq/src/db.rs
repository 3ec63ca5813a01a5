//! PostgreSQL: the schema, the statements behind every command, and the
//! bounded pool of connections the workers borrow.
//!
//! Every command is one statement, so one round trip and one short
//! transaction (autocommit): a SEND's id is only returned after its INSERT
//! committed. Receivers that run at the same time never take the same
//! message: RECV and POP pick their rows with `FOR UPDATE SKIP LOCKED`,
//! lowest id first, so a receiver sees one sender's messages in the order
//! they were sent. A RECV leases what it takes: a new random lease token, the
//! receiver it went to and a visibility deadline on the row; ACK deletes the
//! row only while the lease is the current one and, with users, only for the
//! receiver it went to or an admin of the queue; NACK makes it visible again. See docs/mwmq.md.
//!
//! The pool holds at most `pool` connections. A worker that finds none free
//! waits (the wait is measured) up to `pool_wait_ms`; a connection that fails
//! is dropped, and so are the idle ones (after a database restart they are
//! all dead), and new ones are opened on demand with exponential backoff
//! between failed attempts. A request caught by a failure gets `-TRYAGAIN`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement};

use std::sync::Arc;

use crate::command::QueueOptions;
use crate::config::Config;
use crate::deadline::{Armed, Watch};
use crate::retention::ARCHIVE_GONE;

/// Schema versions, applied in order (`schema::migrate`), in one transaction.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../sql/0001_queues.sql"),
    include_str!("../sql/0002_dead_letters.sql"),
    include_str!("../sql/0003_ready_index.sql"),
    include_str!("../sql/0004_lease_tokens.sql"),
    include_str!("../sql/0005_quotas.sql"),
    include_str!("../sql/0006_streams.sql"),
    include_str!("../sql/0007_sql_api.sql"),
    include_str!("../sql/0008_limits.sql"),
    include_str!("../sql/0009_retention.sql"),
    include_str!("../sql/0010_rate_counts_pops.sql"),
    include_str!("../sql/0011_schema_mwmq.sql"),
    include_str!("../sql/0012_stream_rules.sql"),
    include_str!("../sql/0013_stream_bounds.sql"),
    include_str!("../sql/0014_sql_quota.sql"),
    include_str!("../sql/0015_reply_bounds.sql"),
    include_str!("../sql/0016_sql_bounds.sql"),
];

/// A queue RECV's plain statements serve: no delivery limit, not paused, no
/// concurrency or rate limit (any other goes through `mwmq_recv`).
const PLAIN_QUEUE: &str =
    "dropped_at IS NULL AND max_deliveries IS NULL AND NOT paused AND concurrency IS NULL AND rate IS NULL";

/// The queue's id, if it exists (reused by most statements).
const QUEUE: &str = "(SELECT id FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL)";

/// ACK's check of who holds the delivery: `$4`, the receiver it was leased
/// to, or NULL for a caller that may act on any delivery of the queue.
const HELD: &str = "AND ($4::text IS NULL OR leased_to = $4)";

/// A message of `m` that is not grouped, or the oldest of its group left
/// (`limits.rs`; `mwmq_recv` has its own copy, frozen in schema 8).
macro_rules! group_head {
    () => {
        "(m.grp IS NULL OR NOT EXISTS (SELECT 1 FROM mwmq_messages o
                                       WHERE o.queue_id = m.queue_id AND o.grp = m.grp AND o.id < m.id))"
    };
}

/// Which messages of `m` a receiver may take: visible, addressed to it or to
/// no one, from the sender asked for, the head of its group if it has one.
const ELIGIBLE: &str = concat!(
    "m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = $2) AND ($3::text IS NULL OR m.sender = $3) AND ",
    group_head!()
);

/// The statements of one connection, prepared when it opens.
struct Statements {
    send: Statement,
    send_many: Statement,
    ack_many: Statement,
    send_key: Statement,
    key_lookup: Statement,
    recv: Statement,
    recv_plain: Statement,
    recv_many: Statement,
    pop: Statement,
    peek: Statement,
    ack: Statement,
    archive: Statement,
    dead: Statement,
    nack: Statement,
    touch: Statement,
    alter: Statement,
    pause: Statement,
    recount: Statement,
    settle: Statement,
    mark: Statement,
    info: Statement,
    quota: Statement,
    redrive: Statement,
    release: Statement,
    exists: Statement,
    create: Statement,
    drop: Statement,
    len: Statement,
    list: Statement,
    pending: Statement,
}

impl Statements {
    async fn prepare(c: &tokio_postgres::Client) -> Result<Statements, postgres::Error> {
        Ok(Statements {
            send: c.prepare(
                "INSERT INTO mwmq_messages (queue_id, sender, receiver, body, visible_at, counted, grp)
                 SELECT id, $2::text, $3::text, $4::bytea, now() + interval '1 millisecond' * $5::float8,
                        (max_messages IS NOT NULL OR max_bytes IS NOT NULL), $6::text
                 FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL
                   AND (max_messages IS NULL AND max_bytes IS NULL
                        OR mwmq_room(id, max_messages, max_bytes, octet_length($4::bytea)))
                 RETURNING id",
            ).await?,
            send_many: c.prepare(
                "WITH r AS (
                    SELECT nextval('mwmq_message_ids') AS id, q.id AS queue_id, t.n, t.sender, t.receiver,
                           t.body, t.delay, t.grp, (q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL) AS counted
                    FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::float8[], $6::text[])
                         WITH ORDINALITY AS t(queue, sender, receiver, body, delay, grp, n)
                    JOIN mwmq_queues q ON q.name = t.queue AND q.dropped_at IS NULL
                    WHERE q.max_messages IS NULL AND q.max_bytes IS NULL
                       OR mwmq_room(q.id, q.max_messages, q.max_bytes, octet_length(t.body))
                    -- Ids in the order the SENDs came (a group is handed out in id order).
                    ORDER BY t.n),
                 ins AS (
                    INSERT INTO mwmq_messages (queue_id, id, sender, receiver, body, visible_at, counted, grp)
                    SELECT queue_id, id, sender, receiver, body, now() + interval '1 millisecond' * delay, counted, grp
                    FROM r)
                 SELECT n, id FROM r",
            ).await?,
            ack_many: c.prepare(&format!(
                "WITH gone AS (
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
                 SELECT n FROM gone"
            )).await?,
            send_key: c.prepare(
                "WITH k AS (
                    INSERT INTO mwmq_keys (queue_id, key, message_id)
                    SELECT id, $6::text, nextval('mwmq_message_ids') FROM mwmq_queues
                    WHERE name = $1 AND dropped_at IS NULL
                      AND (max_messages IS NULL AND max_bytes IS NULL
                           OR mwmq_room(id, max_messages, max_bytes, octet_length($4::bytea)))
                    ON CONFLICT DO NOTHING
                    RETURNING queue_id, message_id)
                 INSERT INTO mwmq_messages (queue_id, id, sender, receiver, body, visible_at, counted, grp)
                 SELECT k.queue_id, k.message_id, $2::text, $3::text, $4::bytea,
                        now() + interval '1 millisecond' * $5::float8,
                        (q.max_messages IS NOT NULL OR q.max_bytes IS NOT NULL), $7::text
                 FROM k JOIN mwmq_queues q ON q.id = k.queue_id
                 RETURNING id",
            ).await?,
            key_lookup: c.prepare(&format!("SELECT message_id FROM mwmq_keys WHERE queue_id = {QUEUE} AND key = $2")).await?,
            // A queue without a delivery limit: the plain lease of the first
            // eligible messages (a queue with one finds nothing here).
            // One message each for several receivers (any names) of a queue
            // without a delivery limit: the first eligible messages are
            // locked; each receiver gets the first one addressed to it, if
            // any, and the others the messages addressed to no one, in
            // order. The last row counts the messages locked, and says
            // whether the queue is one this statement serves
            // (NULL, NULL, count, 1 or 0, NULL, NULL).
            recv_many: c.prepare(&format!(
                "WITH r AS (SELECT t.n, t.me FROM unnest($2::text[]) WITH ORDINALITY AS t(me, n)),
                 c AS (SELECT m.queue_id, m.id, m.receiver, m.visible_at FROM mwmq_messages m
                       WHERE m.queue_id = (SELECT id FROM mwmq_queues WHERE name = $1 AND {PLAIN_QUEUE})
                         AND m.visible_at <= now() AND (m.receiver IS NULL OR m.receiver = ANY($2::text[]))
                         AND ($3::text IS NULL OR m.sender = $3) AND {}
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
                            SET lease = mwmq_lease_token(), leased_to = p.me,
                                visible_at = now() + interval '1 millisecond' * $5::float8,
                                deliveries = m.deliveries + 1
                            FROM p WHERE m.queue_id = p.queue_id AND m.id = p.id
                            RETURNING p.n, m.queue_id, m.id, m.lease, m.sender, m.body)
                 SELECT n, queue_id, id, lease, sender, body FROM leased
                 UNION ALL SELECT NULL, NULL, (SELECT count(*) FROM c),
                                  (SELECT count(*) FROM mwmq_queues WHERE name = $1 AND {PLAIN_QUEUE}), NULL, NULL",
                group_head!()
            )).await?,
            // The messages leased weigh at most $6 (`max_reply_bytes`; body,
            // sender and 64 each, the first always: `sql/0015_reply_bounds.sql`).
            recv_plain: c.prepare(&format!(
                "UPDATE mwmq_messages m
                 SET lease = mwmq_lease_token(), leased_to = $2,
                     visible_at = now() + interval '1 millisecond' * $5::float8,
                     deliveries = m.deliveries + 1
                 FROM (SELECT x.queue_id, x.id FROM (
                           SELECT l.queue_id, l.id, sum(l.w) OVER (ORDER BY l.visible_at, l.id) AS run,
                                  row_number() OVER (ORDER BY l.visible_at, l.id) AS k
                           FROM (SELECT m.queue_id, m.id, m.visible_at,
                                        octet_length(m.body) + octet_length(m.sender) + 64 AS w
                                 FROM mwmq_messages m
                                 WHERE m.queue_id = (SELECT id FROM mwmq_queues WHERE name = $1 AND {PLAIN_QUEUE})
                                   AND {ELIGIBLE}
                                 ORDER BY visible_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) l) x
                       WHERE x.k = 1 OR x.run <= $6::bigint) c
                 WHERE m.queue_id = c.queue_id AND m.id = c.id
                 RETURNING m.queue_id, m.id, m.lease, m.sender, m.body"
            )).await?,
            // Any other queue: paused, limited or with a delivery limit
            // (`limits.rs`). The last row counts the dead letters:
            // (the queue's id or NULL without one, moved out, moved in, NULL, NULL).
            recv: c
                .prepare("SELECT r_queue_id, r_id, r_lease, r_sender, r_body FROM mwmq_recv($1, $2, $3, $4, $5, $6)")
                .await?,
            // A paused queue hands out nothing; a rate-limited one as many as
            // its bucket allows (`limits.rs`: the function is called for those only).
            pop: c.prepare(&format!(
                "WITH q AS (SELECT id, retain_ms, rate FROM mwmq_queues
                            WHERE name = $1 AND dropped_at IS NULL AND NOT paused),
                 n AS (SELECT CASE WHEN q.rate IS NULL THEN $4 ELSE mwmq_pop_allowance(q.id, q.rate, $4) END AS allowed
                       FROM q),
                 gone AS (
                    DELETE FROM mwmq_messages m
                    USING (SELECT m.queue_id, m.id FROM mwmq_messages m
                           WHERE m.queue_id = (SELECT id FROM q) AND {ELIGIBLE}
                           ORDER BY visible_at, id LIMIT (SELECT allowed FROM n) FOR UPDATE SKIP LOCKED) c
                    WHERE m.queue_id = c.queue_id AND m.id = c.id
                    RETURNING m.queue_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries + 1 AS deliveries,
                              $2::text AS acked_by, (SELECT retain_ms FROM q) AS retain_ms),
                 {ARCHIVE_GONE}
                 SELECT id, sender, body FROM gone"
            )).await?,
            peek: c.prepare(&format!(
                "SELECT m.id, m.sender, m.body FROM mwmq_messages m
                 WHERE m.queue_id = {QUEUE} AND {ELIGIBLE} ORDER BY m.visible_at, m.id LIMIT $4"
            )).await?,
            ack: c.prepare(&format!(
                "WITH q AS (SELECT id, retain_ms FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL),
                 gone AS (
                    DELETE FROM mwmq_messages m USING q
                    WHERE m.queue_id = q.id AND m.id = $2 AND m.lease = $3 {HELD}
                    RETURNING m.queue_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.deliveries,
                              m.leased_to AS acked_by, q.retain_ms),
                 {ARCHIVE_GONE}
                 SELECT count(*) FROM gone"
            )).await?,
            // (QARCHIVE and QDEAD weigh at most $3, as RECV: the first always.)
            archive: c.prepare(&format!(
                "SELECT id, sender, body, deliveries, acked_ms, acked_by FROM (
                    SELECT a.*, sum(a.w) OVER (ORDER BY a.acked_at DESC, a.id DESC) AS run,
                           row_number() OVER (ORDER BY a.acked_at DESC, a.id DESC) AS k
                    FROM (SELECT id, sender, body, deliveries, (extract(epoch FROM acked_at) * 1000)::bigint AS acked_ms,
                                 acked_by, acked_at,
                                 octet_length(body) + octet_length(sender) + coalesce(octet_length(acked_by), 0) + 128 AS w
                          FROM mwmq_archive WHERE queue_id = {QUEUE} ORDER BY acked_at DESC, id DESC LIMIT $2) a) x
                 WHERE x.k = 1 OR x.run <= $3::bigint ORDER BY x.k"
            )).await?,
            // A queue's dead letters: those it holds as a dead-letter queue,
            // and those it sent to its own; last moved first (a dead letter is
            // visible from its move on, until someone takes it).
            dead: c.prepare(
                "WITH q AS (SELECT id, name, dead_letter FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL),
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
                 WHERE x.k = 1 OR x.run <= $3::bigint ORDER BY x.k",
            ).await?,
            nack: c.prepare(&format!(
                "UPDATE mwmq_messages SET lease = NULL, leased_to = NULL,
                        visible_at = CASE WHEN $4::float8 > 0 THEN now() + interval '1 millisecond' * $4::float8
                                          ELSE least(sent_at, now()) END
                 WHERE queue_id = {QUEUE} AND id = $2 AND lease = $3 AND ($5::text IS NULL OR leased_to = $5)"
            )).await?,
            touch: c.prepare(&format!(
                "UPDATE mwmq_messages SET visible_at = now() + interval '1 millisecond' * $4::float8
                 WHERE queue_id = {QUEUE} AND id = $2 AND lease = $3 AND ($5::text IS NULL OR leased_to = $5)"
            )).await?,
            alter: c.prepare(
                "UPDATE mwmq_queues
                 SET max_deliveries = CASE WHEN $2::bool THEN nullif($3::int, 0) ELSE max_deliveries END,
                     dead_letter = CASE WHEN $4::bool THEN $5::text ELSE dead_letter END,
                     max_messages = CASE WHEN $6::bool THEN nullif($7::bigint, 0) ELSE max_messages END,
                     max_bytes = CASE WHEN $8::bool THEN nullif($9::bigint, 0) ELSE max_bytes END,
                     concurrency = CASE WHEN $10::bool THEN nullif($11::int, 0) ELSE concurrency END,
                     rate = CASE WHEN $12::bool THEN nullif($13::float8, 0) ELSE rate END,
                     retain_ms = CASE WHEN $14::bool THEN nullif($15::bigint, 0) ELSE retain_ms END
                 WHERE name = $1 AND dropped_at IS NULL
                 RETURNING id, (SELECT o.max_messages IS NOT NULL OR o.max_bytes IS NOT NULL
                                FROM mwmq_queues o WHERE o.id = mwmq_queues.id) AS had_quota,
                           (max_messages IS NOT NULL OR max_bytes IS NOT NULL) AS has_quota",
            ).await?,
            // After a quota was set or lifted: SQL transactions that read it at COMMIT before have committed (`sql/0016_sql_bounds.sql`).
            settle: c.prepare("SELECT mwmq_settle_barrier($1)").await?,
            pause: c.prepare("UPDATE mwmq_queues SET paused = $2 WHERE name = $1 AND dropped_at IS NULL RETURNING id").await?,
            // A quota set or lifted: the queue's messages are marked counted, or not.
            mark: c.prepare(
                "UPDATE mwmq_messages m SET counted = q.quota
                 FROM (SELECT id, (max_messages IS NOT NULL OR max_bytes IS NOT NULL) AS quota
                       FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL) q
                 WHERE m.queue_id = q.id AND m.counted <> q.quota",
            ).await?,
            // A quota set or lifted: the queue's count starts from what it
            // holds (nothing without a quota). The SQL callers' stripes (16
            // and up, `sql/0014_sql_quota.sql`) may be locked by open transactions and
            // are left alone: stripe 0 takes what they count away.
            recount: c.prepare(
                "WITH q AS (SELECT id, (max_messages IS NOT NULL OR max_bytes IS NOT NULL) AS counted
                            FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL),
                 s AS (SELECT coalesce(sum(c.messages), 0)::bigint AS messages, coalesce(sum(c.bytes), 0)::bigint AS bytes
                       FROM mwmq_queue_counts c WHERE c.queue_id = (SELECT id FROM q) AND c.stripe >= 16),
                 d AS (DELETE FROM mwmq_queue_counts c USING q
                       WHERE c.queue_id = q.id AND c.stripe BETWEEN 1 AND 15)
                 INSERT INTO mwmq_queue_counts AS c (queue_id, stripe, messages, bytes)
                 SELECT q.id, 0, count(m.id) - s.messages, coalesce(sum(octet_length(m.body)), 0) - s.bytes
                 FROM q CROSS JOIN s LEFT JOIN mwmq_messages m ON m.queue_id = q.id AND q.counted
                 GROUP BY q.id, s.messages, s.bytes
                 ON CONFLICT (queue_id, stripe) DO UPDATE SET messages = EXCLUDED.messages, bytes = EXCLUDED.bytes",
            ).await?,
            // Counts from the indexes (ready, not yet visible, dead letters)
            // and the quota's counters; the age of the message next in line;
            // of each queue named (QINFO names one, the /ui page many).
            info: c.prepare(
                "SELECT coalesce(q.max_deliveries, 0), q.dead_letter,
                        (SELECT count(*) FROM mwmq_messages m WHERE m.queue_id = q.id AND m.visible_at <= now()),
                        (SELECT count(*) FROM mwmq_messages m
                         WHERE m.queue_id = q.id AND m.visible_at > now() AND m.lease IS NULL),
                        (SELECT count(*) FROM mwmq_messages m
                         WHERE m.queue_id = q.id AND m.visible_at > now() AND m.lease IS NOT NULL),
                        (SELECT count(*) FROM mwmq_messages m WHERE m.queue_id = q.id AND m.dead_from IS NOT NULL),
                        coalesce(extract(epoch FROM now() - (
                            SELECT m.sent_at FROM mwmq_messages m WHERE m.queue_id = q.id AND m.visible_at <= now()
                            ORDER BY m.visible_at, m.id LIMIT 1)) * 1000, 0)::float8,
                        coalesce(q.max_messages, 0), coalesce(q.max_bytes, 0),
                        (SELECT coalesce(sum(c.messages), 0)::bigint FROM mwmq_queue_counts c WHERE c.queue_id = q.id),
                        (SELECT coalesce(sum(c.bytes), 0)::bigint FROM mwmq_queue_counts c WHERE c.queue_id = q.id),
                        q.paused, coalesce(q.concurrency, 0), coalesce(q.rate, 0),
                        coalesce(l.held_concurrency, 0), coalesce(l.held_rate, 0), coalesce(q.retain_ms, 0),
                        (SELECT count(*) FROM mwmq_archive a WHERE a.queue_id = q.id), q.name
                 FROM mwmq_queues q LEFT JOIN mwmq_queue_limits l ON l.queue_id = q.id
                 WHERE q.name = ANY($1::text[]) AND q.dropped_at IS NULL",
            ).await?,
            // Why a SEND stored nothing: no such queue (no row), or its quota.
            quota: c.prepare(
                "SELECT coalesce(q.max_messages, 0), coalesce(q.max_bytes, 0),
                        (SELECT coalesce(sum(c.messages), 0)::bigint FROM mwmq_queue_counts c WHERE c.queue_id = q.id),
                        (SELECT coalesce(sum(c.bytes), 0)::bigint FROM mwmq_queue_counts c WHERE c.queue_id = q.id)
                 FROM mwmq_queues q WHERE q.name = $1 AND q.dropped_at IS NULL",
            ).await?,
            // Dead letters back: to TO, or to the queue each came from; what
            // has nowhere to go (no such queue) stays.
            redrive: c.prepare(
                "WITH src AS (SELECT id FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL),
                 c AS (SELECT m.queue_id, m.id, coalesce($2::text, m.dead_from) AS target
                       FROM mwmq_messages m
                       WHERE m.queue_id = (SELECT id FROM src) AND m.visible_at <= now()
                       ORDER BY m.visible_at, m.id LIMIT $3 FOR UPDATE OF m SKIP LOCKED),
                 gone AS (DELETE FROM mwmq_messages m
                          USING c JOIN mwmq_queues t ON t.name = c.target AND t.dropped_at IS NULL
                          WHERE m.queue_id = c.queue_id AND m.id = c.id
                          RETURNING t.id AS target_id, m.id, m.sender, m.receiver, m.body, m.sent_at, m.grp,
                                    (t.max_messages IS NOT NULL OR t.max_bytes IS NOT NULL) AS counted),
                 ins AS (INSERT INTO mwmq_messages (queue_id, id, sender, receiver, body, sent_at, visible_at, counted, grp)
                         SELECT target_id, id, sender, receiver, body, sent_at, now(), counted, grp FROM gone RETURNING 1)
                 SELECT (SELECT count(*) FROM ins), EXISTS (SELECT 1 FROM src)",
            ).await?,
            release: c.prepare(
                "UPDATE mwmq_messages m SET lease = NULL, leased_to = NULL, visible_at = least(m.sent_at, now()), deliveries = greatest(m.deliveries - 1, 0)
                 FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS r(queue_id, id, lease)
                 WHERE m.queue_id = r.queue_id AND m.id = r.id AND m.lease = r.lease",
            ).await?,
            exists: c.prepare("SELECT 1 FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL").await?,
            // A user creates at most $7 queues and streams (NULL: no limit).
            create: c.prepare(
                "INSERT INTO mwmq_queues
                    (name, max_deliveries, dead_letter, max_messages, max_bytes, created_by, concurrency, rate,
                     retain_ms)
                 SELECT $1, nullif($2::int, 0), $3, nullif($4::bigint, 0), nullif($5::bigint, 0), $6::text,
                        nullif($8::int, 0), nullif($9::float8, 0), nullif($10::bigint, 0)
                 WHERE $7::bigint IS NULL OR mwmq_owned($6::text) < $7::bigint
                 ON CONFLICT (name) WHERE dropped_at IS NULL DO NOTHING RETURNING id",
            ).await?,
            drop: c.prepare(
                "UPDATE mwmq_queues SET dropped_at = now() WHERE name = $1 AND dropped_at IS NULL RETURNING id",
            ).await?,
            len: c.prepare(
                "SELECT (SELECT count(*) FROM mwmq_messages m WHERE m.queue_id = q.id)
                 FROM mwmq_queues q WHERE q.name = $1 AND q.dropped_at IS NULL",
            ).await?,
            list: c.prepare("SELECT name FROM mwmq_queues WHERE dropped_at IS NULL ORDER BY name LIMIT $1").await?,
            pending: c.prepare(
                "SELECT q.name FROM mwmq_queues q WHERE q.dropped_at IS NULL AND EXISTS (
                    SELECT 1 FROM mwmq_messages m WHERE m.queue_id = q.id AND m.visible_at <= now()
                    AND (m.receiver IS NULL OR m.receiver = $1))
                 ORDER BY q.name LIMIT $2",
            ).await?,
        })
    }
}

/// Why a command could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbError {
    /// The database cannot be reached or was lost mid-request: try again (`-TRYAGAIN`).
    Unavailable(String),
    /// `-NOQUEUE no such queue 'q'`
    NoQueue(String),
    /// `-EXISTS queue 'q' already exists`
    Exists(String),
    /// `-OVERQUOTA ...`: a queue's or a user's quota.
    OverQuota(String),
    /// Anything else the database refused (`-ERR database: ...`).
    Failed(String),
    /// Redis's own refusal, as Redis words it (the stream commands).
    Redis(String),
    /// With several databases, a command would create a queue or stream
    /// for this user: its queues and streams on the other databases must be
    /// counted, and the command run again (`commands/owned.rs`).
    CountOwned(String),
}

/// Whether an error means the server cannot take writes: a standby, or a
/// primary being failed over (pg_auto_failover makes the new primary
/// read-only until the old one is known to be down). The connection is
/// given up so that the next one finds the host that accepts writes.
pub(crate) fn read_only(e: &postgres::Error) -> bool {
    e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION)
}

/// Whether an error means the connection cannot be used any more.
pub(crate) fn connection_lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // A parameter or column mwmq could not convert is its own mistake,
        // not the connection's (which stays usable).
        None if client_side(e) => false,
        None => true, // an I/O error, not an answer from the server
        Some(c) => {
            c.code().starts_with("08")
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
        }
    }
}

/// Whether an error without an SQLSTATE arose in this process (converting a
/// parameter or a column), not on the connection.
fn client_side(e: &postgres::Error) -> bool {
    let text = e.to_string();
    text.starts_with("error serializing") || text.starts_with("error deserializing")
}

fn classify(e: postgres::Error) -> DbError {
    if connection_lost(&e) {
        return DbError::Unavailable(format!(
            "database connection lost ({e}); the request may or may not have taken effect"
        ));
    }
    if read_only(&e) {
        return DbError::Unavailable("the database server is read-only (a standby, or a failover under way)".into());
    }
    match e.code() {
        Some(c) if *c == SqlState::QUERY_CANCELED => {
            DbError::Unavailable("the database did not answer in time (statement_timeout)".into())
        }
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED => {
            DbError::Unavailable(format!("the database aborted the transaction ({e})"))
        }
        _ => DbError::Failed(e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string())),
    }
}

/// One SEND (alone, or in a batch).
#[derive(Debug, Clone, Copy)]
pub struct SendRow<'a> {
    /// Queue.
    pub queue: &'a str,
    /// Sender's name.
    pub sender: &'a str,
    /// Receiver, if addressed.
    pub to: Option<&'a str>,
    /// The message.
    pub body: &'a [u8],
    /// Invisible for this long.
    pub delay_ms: u64,
    /// Its ordered group, if any.
    pub group: Option<&'a str>,
}

/// A leased message as RECV returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    /// The database it lives on (for releasing the lease).
    pub db: usize,
    /// The queue's internal id (for releasing the lease).
    pub queue_id: i64,
    /// Message id.
    pub id: i64,
    /// Lease number; ACK and NACK need it.
    pub lease: i64,
    /// Who sent it.
    pub sender: String,
    /// The message.
    pub body: Vec<u8>,
}

/// What a RECV got.
#[derive(Debug, Default)]
pub struct Received {
    /// The messages it leased.
    pub messages: Vec<Leased>,
    /// Messages it found delivered too often and moved to the dead-letter queue.
    pub dead_lettered: u64,
    /// ... or dropped, there being no dead-letter queue.
    pub dropped: u64,
    /// Whether the queue proved not plain (the full statement leased what the plain one could not).
    pub not_plain: bool,
    /// Statements it ran (the plain one, the full one, or both).
    pub statements: u64,
}

/// What QINFO reports of the database.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueState {
    /// Deliveries before dead-lettering (0: never).
    pub max_deliveries: u32,
    /// Where dead letters go.
    pub dead_letter: Option<String>,
    /// Visible now.
    pub ready: i64,
    /// Sent with a DELAY or NACKed with one, not visible yet.
    pub delayed: i64,
    /// Leased by a RECV.
    pub leased: i64,
    /// Messages here that were dead-lettered from another queue.
    pub dead_letters_held: i64,
    /// Age of the visible message next in line, ms (0 without one).
    pub oldest_ready_ms: i64,
    /// Most messages it may hold (0: no limit).
    pub max_messages: i64,
    /// Most bytes of bodies it may hold (0: no limit).
    pub max_bytes: i64,
    /// Messages it holds, as its quota counts them (0 without a quota).
    pub counted_messages: i64,
    /// Bytes of bodies it holds, as its quota counts them (0 without a quota).
    pub counted_bytes: i64,
    /// Whether it hands out nothing (QPAUSE).
    pub paused: bool,
    /// Most messages leased at once (0: no limit).
    pub concurrency: i64,
    /// Most deliveries per second (0: no limit).
    pub rate: f64,
    /// RECVs the concurrency limit cut short, across every mwmq process.
    pub held_by_concurrency: i64,
    /// RECVs the rate limit cut short, across every mwmq process.
    pub held_by_rate: i64,
    /// How long acknowledged messages are kept, ms (0: not kept).
    pub retain_ms: i64,
    /// Acknowledged messages kept now.
    pub archived: i64,
}

/// A dead letter (QDEAD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Message id.
    pub id: i64,
    /// The queue it is in now (a dead-letter queue).
    pub queue: String,
    /// The queue it was dead-lettered from.
    pub from: String,
    /// Why (`max_deliveries`).
    pub reason: Option<String>,
    /// Times it was handed out.
    pub deliveries: i64,
    /// Who sent it.
    pub sender: String,
    /// When it was sent, ms since 1970.
    pub sent_at_ms: i64,
    /// Its body.
    pub body: Vec<u8>,
}

/// An acknowledged message kept by a retaining queue (QARCHIVE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archived {
    /// Message id.
    pub id: i64,
    /// Who sent it.
    pub sender: String,
    /// Its body.
    pub body: Vec<u8>,
    /// Times it was handed out.
    pub deliveries: i64,
    /// When it was acknowledged, ms since 1970.
    pub acked_at_ms: i64,
    /// The receiver it was delivered to (none: delivered to no named receiver).
    pub acked_by: Option<String>,
}

/// A message as POP and PEEK return it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Message id.
    pub id: i64,
    /// Who sent it.
    pub sender: String,
    /// The message.
    pub body: Vec<u8>,
}

/// A lease to give back (its reply never reached the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRef {
    /// The database (index in the `[[databases]]` list).
    pub db: usize,
    /// Queue id.
    pub queue_id: i64,
    /// Message id.
    pub id: i64,
    /// Lease number.
    pub lease: i64,
}

/// One open connection with its statements, spoken asynchronously: several
/// statements may be in flight on it at once (pipelined, each its own
/// transaction, each answered only after its commit: tokio-postgres reads a
/// statement's result up to the ReadyForQuery that follows the commit, and
/// an error there fails the statement).
pub struct PgConn {
    client: tokio_postgres::Client,
    st: Statements,
    /// The stream commands' statements (`streamdb::STATEMENTS`).
    xst: Vec<Statement>,
    /// Set when a statement failed in a way that leaves the connection unusable.
    broken: AtomicBool,
    /// Set by the driver when the server said it cancelled a commit's wait
    /// for the synchronous standby ([`UNREPLICATED`]).
    unreplicated: Arc<AtomicBool>,
    /// The server it reached (`host:port`), to tell a failover.
    pub server: String,
    /// Which of the databases (`[[databases]]`) it is a connection to.
    pub db: usize,
}

/// The start of the WARNING PostgreSQL sends when a commit's wait for the
/// synchronous standby is cancelled (`pg_cancel_backend`, a cancel request):
/// the transaction committed locally, but a failover may lose it.
pub const UNREPLICATED: &str = "canceling wait for synchronous replication";

/// What a statement answers when its connection saw [`UNREPLICATED`]: its
/// commit (or one pipelined with it) may exist on the primary only.
fn unreplicated_error() -> DbError {
    DbError::Unavailable(
        "the database committed locally but its synchronous standby did not confirm it (the wait was cancelled); \
         it may be lost by a failover: retry (with the same KEY)"
            .into(),
    )
}

/// Runs `open` on a thread of its own and waits at most `limit` for it: a
/// database that accepts connections but never answers (a frozen server)
/// must not hold the caller. A connection that comes too late is closed.
pub fn within<T: Send + 'static>(
    limit: Duration,
    open: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("db-open".into())
        .spawn(move || {
            let _ = tx.send(open());
        })
        .map_err(|e| e.to_string())?;
    rx.recv_timeout(limit)
        .map_err(|_| format!("the database did not finish opening a connection within {} ms", limit.as_millis()))?
}

impl PgConn {
    /// The client (for the stream statements of `streamdb.rs`).
    pub(crate) fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Stream statement `i` (`streamdb::STATEMENTS`).
    pub(crate) fn stream_statement(&self, i: usize) -> &Statement {
        &self.xst[i]
    }

    /// A statement's result as every statement's is checked.
    pub(crate) fn checked<T>(&self, r: Result<T, postgres::Error>) -> Result<T, DbError> {
        self.check(r)
    }

    fn check<T>(&self, r: Result<T, postgres::Error>) -> Result<T, DbError> {
        // The driver saw the warning before the statement's last message,
        // so a statement answered after it is caught here.
        if self.unreplicated.load(Ordering::Acquire) {
            self.broken.store(true, Ordering::Relaxed);
            return Err(unreplicated_error());
        }
        r.map_err(|e| {
            if connection_lost(&e) || read_only(&e) {
                self.broken.store(true, Ordering::Relaxed);
            }
            classify(e)
        })
    }

    /// A leased message from a row of `recv_plain` or `recv` (queue id, id, lease, sender, body).
    fn leased(&self, r: &tokio_postgres::Row) -> Leased {
        Leased { db: self.db, queue_id: r.get(0), id: r.get(1), lease: r.get(2), sender: r.get(3), body: r.get(4) }
    }

    async fn exists(&self, queue: &str) -> Result<bool, DbError> {
        let r = self.client.query_opt(&self.st.exists, &[&queue]).await;
        Ok(self.check(r)?.is_some())
    }

    async fn or_no_queue<T>(&self, queue: &str, empty: T) -> Result<T, DbError> {
        if self.exists(queue).await? {
            Ok(empty)
        } else {
            Err(DbError::NoQueue(queue.to_string()))
        }
    }

    /// SEND of `row`: the new message's id (or, with a key seen before, the
    /// first one's); `group`: its ordered group (GROUP).
    pub async fn send(&self, row: &SendRow<'_>, key: Option<&str>) -> Result<i64, DbError> {
        let SendRow { queue, sender, to, body, delay_ms, group } = *row;
        let delay = delay_ms as f64;
        match key {
            None => {
                let r = self.client.query_opt(&self.st.send, &[&queue, &sender, &to, &body, &delay, &group]).await;
                match self.check(r)? {
                    Some(row) => Ok(row.get(0)),
                    None => Err(self.not_sent(queue).await?),
                }
            }
            Some(k) => {
                let r =
                    self.client.query_opt(&self.st.send_key, &[&queue, &sender, &to, &body, &delay, &k, &group]).await;
                if let Some(row) = self.check(r)? {
                    return Ok(row.get(0));
                }
                // The key is known (a retry), the queue is full, or it does not exist.
                let r = self.client.query_opt(&self.st.key_lookup, &[&queue, &k]).await;
                match self.check(r)? {
                    Some(row) => Ok(row.get(0)),
                    None => Err(self.not_sent(queue).await?),
                }
            }
        }
    }

    /// RECV: up to `count` messages, leased for `vt_ms`, lowest id first,
    /// weighing at most `maxb` bytes (the first always; body, sender and 64
    /// each); and of the messages looked at, how many were dead-lettered
    /// (moved to the dead-letter queue, or dropped when there is none).
    #[allow(clippy::too_many_arguments)]
    pub async fn recv(
        &self,
        queue: &str,
        me: Option<&str>,
        from: Option<&str>,
        count: u32,
        vt_ms: u64,
        plain_first: bool,
        maxb: i64,
    ) -> Result<Received, DbError> {
        let (count, vt) = (i64::from(count), vt_ms as f64);
        // The common case in one plain statement (unless the queue is known
        // not to be plain); an empty answer may also mean a queue with a
        // delivery limit, paused or limited (or none at all): then the full one.
        if plain_first {
            let r = self.client.query(&self.st.recv_plain, &[&queue, &me, &from, &count, &vt, &maxb]).await;
            let plain = self.check(r)?;
            if !plain.is_empty() {
                let mut messages: Vec<Leased> = plain.iter().map(|r| self.leased(r)).collect();
                messages.sort_by_key(|m| m.id);
                return Ok(Received { messages, dead_lettered: 0, dropped: 0, not_plain: false, statements: 1 });
            }
        }
        let r = self.client.query(&self.st.recv, &[&queue, &me, &from, &count, &vt, &maxb]).await;
        let mut rows = self.check(r)?;
        let totals = rows.pop().expect("the statement's last row counts the dead letters");
        let (exists, dead, moved): (bool, i64, i64) =
            (totals.get::<_, Option<i64>>(0).is_some(), totals.get(1), totals.get(2));
        if !exists {
            return Err(DbError::NoQueue(queue.to_string()));
        }
        let mut messages: Vec<Leased> = rows.iter().map(|r| self.leased(r)).collect();
        messages.sort_by_key(|m| m.id);
        let not_plain = !plain_first || !messages.is_empty() || dead > 0;
        let statements = 1 + u64::from(plain_first);
        Ok(Received { messages, dead_lettered: moved as u64, dropped: (dead - moved) as u64, not_plain, statements })
    }

    /// One message each for several RECVs of `queue` by `receivers`
    /// (any names, repeated or not) with one FROM and lease length, looking
    /// at most at `limit` messages: each receiver's message, by its index in
    /// `receivers`, how many messages were looked at, and whether the queue
    /// is one this serves (it exists and has no delivery limit).
    pub async fn recv_many(
        &self,
        queue: &str,
        receivers: &[Option<&str>],
        from: Option<&str>,
        limit: usize,
        vt_ms: u64,
    ) -> Result<(Vec<(usize, Leased)>, i64, bool), DbError> {
        let (limit, vt) = (limit as i64, vt_ms as f64);
        let r = self.client.query(&self.st.recv_many, &[&queue, &receivers, &from, &limit, &vt]).await;
        let mut rows = self.check(r)?;
        let totals = rows.pop().expect("the statement's last row counts the messages looked at");
        let (looked, served): (i64, i64) = (totals.get(2), totals.get(3));
        let mut out: Vec<(usize, Leased)> = rows
            .iter()
            .map(|r| {
                let n: i64 = r.get(0);
                let m = Leased {
                    db: self.db,
                    queue_id: r.get(1),
                    id: r.get(2),
                    lease: r.get(3),
                    sender: r.get(4),
                    body: r.get(5),
                };
                (n as usize - 1, m)
            })
            .collect();
        out.sort_by_key(|(_, m)| m.id);
        Ok((out, looked, served == 1))
    }

    /// TOUCH: whether the lease was current (the message is now invisible for `ms` more).
    /// `holder`: the receiver the delivery must have gone to (`None`: anyone's).
    pub async fn touch(
        &self,
        queue: &str,
        id: i64,
        lease: i64,
        ms: u64,
        holder: Option<&str>,
    ) -> Result<bool, DbError> {
        let ms = ms as f64;
        let r = self.client.execute(&self.st.touch, &[&queue, &id, &lease, &ms, &holder]).await;
        if self.check(r)? == 1 {
            return Ok(true);
        }
        self.or_no_queue(queue, false).await
    }

    /// QALTER
    pub async fn alter(&self, queue: &str, o: &QueueOptions) -> Result<(), DbError> {
        let max = o.max_deliveries.map(|m| m as i32);
        let dead = o.dead_letter.clone().flatten();
        let (msgs, bytes) = (o.max_messages.map(|m| m as i64), o.max_bytes.map(|m| m as i64));
        let concurrency = o.concurrency.map(|c| c as i32);
        let rate = o.rate_per_s();
        let retain = o.retain_ms.map(|r| r as i64);
        let r = self
            .client
            .query_opt(
                &self.st.alter,
                &[
                    &queue,
                    &max.is_some(),
                    &max.unwrap_or(0),
                    &o.dead_letter.is_some(),
                    &dead,
                    &msgs.is_some(),
                    &msgs.unwrap_or(0),
                    &bytes.is_some(),
                    &bytes.unwrap_or(0),
                    &concurrency.is_some(),
                    &concurrency.unwrap_or(0),
                    &rate.is_some(),
                    &rate.unwrap_or(0.0),
                    &retain.is_some(),
                    &retain.unwrap_or(0),
                ],
            )
            .await;
        let Some(row) = self.check(r)? else {
            return Err(DbError::NoQueue(queue.to_string()));
        };
        if msgs.is_some() || bytes.is_some() {
            // Set or lifted: SQL transactions that read the old state at
            // their COMMIT are let finish first; a value changed needs no wait.
            let settled = if row.get::<_, bool>(1) != row.get::<_, bool>(2) {
                let r = self.client.query_one(&self.st.settle, &[&queue]).await;
                self.check(r)?.get::<_, bool>(0)
            } else {
                true
            };
            // Its messages marked first (they count from now on), then what it holds now.
            let r = self.client.execute(&self.st.mark, &[&queue]).await;
            self.check(r)?;
            let r = self.client.execute(&self.st.recount, &[&queue]).await;
            self.check(r)?;
            if !settled {
                return Err(DbError::Redis(format!(
                    "TRYAGAIN the quota of queue '{queue}' is changed, but an SQL transaction that sent to it \
                     checked its COMMIT before the change and is still open (SET CONSTRAINTS ... IMMEDIATE): \
                     its messages may be miscounted; run this QALTER again once it ended"
                )));
            }
        }
        Ok(())
    }

    /// The rows of a statement that lists `count` of a queue's messages
    /// (`$1` the queue, `$2` how many); none: `-NOQUEUE` if it does not exist.
    async fn listing(
        &self,
        st: &Statement,
        queue: &str,
        count: u32,
        maxb: i64,
    ) -> Result<Vec<tokio_postgres::Row>, DbError> {
        let r = self.client.query(st, &[&queue, &i64::from(count), &maxb]).await;
        let rows = self.check(r)?;
        if rows.is_empty() {
            return self.or_no_queue(queue, Vec::new()).await;
        }
        Ok(rows)
    }

    /// QARCHIVE: the latest `count` acknowledged messages kept, newest
    /// first, weighing at most `maxb` bytes (the first always).
    pub async fn archived(&self, queue: &str, count: u32, maxb: i64) -> Result<Vec<Archived>, DbError> {
        Ok(self
            .listing(&self.st.archive, queue, count, maxb)
            .await?
            .iter()
            .map(|r| Archived {
                id: r.get(0),
                sender: r.get(1),
                body: r.get(2),
                deliveries: i64::from(r.get::<_, i32>(3)),
                acked_at_ms: r.get(4),
                acked_by: r.get(5),
            })
            .collect())
    }

    /// QDEAD: the latest `count` dead letters of `queue`, weighing at most `maxb` bytes (the first always).
    pub async fn dead_letters(&self, queue: &str, count: u32, maxb: i64) -> Result<Vec<DeadLetter>, DbError> {
        Ok(self
            .listing(&self.st.dead, queue, count, maxb)
            .await?
            .iter()
            .map(|r| DeadLetter {
                id: r.get(0),
                queue: r.get(1),
                from: r.get(2),
                reason: r.get(3),
                deliveries: i64::from(r.get::<_, i32>(4)),
                sender: r.get(5),
                sent_at_ms: r.get(6),
                body: r.get(7),
            })
            .collect())
    }

    /// QPAUSE (`on`) or QRESUME.
    pub async fn pause(&self, queue: &str, on: bool) -> Result<(), DbError> {
        let r = self.client.query_opt(&self.st.pause, &[&queue, &on]).await;
        match self.check(r)? {
            Some(_) => Ok(()),
            None => Err(DbError::NoQueue(queue.to_string())),
        }
    }

    /// Why a SEND to `queue` stored nothing: the queue does not exist, or is full.
    pub async fn not_sent(&self, queue: &str) -> Result<DbError, DbError> {
        let r = self.client.query_opt(&self.st.quota, &[&queue]).await;
        Ok(match self.check(r)? {
            None => DbError::NoQueue(queue.to_string()),
            Some(row) => {
                let (max_messages, max_bytes, messages, bytes): (i64, i64, i64, i64) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                DbError::OverQuota(format!(
                    "queue '{queue}' is full: {messages} messages, {bytes} bytes (MAXMESSAGES {max_messages}, \
                     MAXBYTES {max_bytes}; 0 is no limit)"
                ))
            }
        })
    }

    /// QINFO: what the queue holds now.
    pub async fn info(&self, queue: &str) -> Result<QueueState, DbError> {
        let mut found = self.infos(&[queue]).await?;
        found.pop().map(|(_, state)| state).ok_or_else(|| DbError::NoQueue(queue.to_string()))
    }

    /// What each of `queues` that exists holds now, in one statement: (name, state).
    pub async fn infos(&self, queues: &[&str]) -> Result<Vec<(String, QueueState)>, DbError> {
        let r = self.client.query(&self.st.info, &[&queues]).await;
        Ok(self
            .check(r)?
            .iter()
            .map(|row| {
                let state = QueueState {
                    max_deliveries: row.get::<_, i32>(0) as u32,
                    dead_letter: row.get(1),
                    ready: row.get(2),
                    delayed: row.get(3),
                    leased: row.get(4),
                    dead_letters_held: row.get(5),
                    oldest_ready_ms: row.get::<_, f64>(6) as i64,
                    max_messages: row.get(7),
                    max_bytes: row.get(8),
                    counted_messages: row.get(9),
                    counted_bytes: row.get(10),
                    paused: row.get(11),
                    concurrency: i64::from(row.get::<_, i32>(12)),
                    rate: row.get(13),
                    held_by_concurrency: row.get(14),
                    held_by_rate: row.get(15),
                    retain_ms: row.get(16),
                    archived: row.get(17),
                };
                (row.get(18), state)
            })
            .collect())
    }

    /// REDRIVE: messages moved back.
    pub async fn redrive(&self, queue: &str, to: Option<&str>, count: u32) -> Result<i64, DbError> {
        if let Some(t) = to {
            if !self.exists(t).await? {
                return Err(DbError::NoQueue(t.to_string()));
            }
        }
        let r = self.client.query_one(&self.st.redrive, &[&queue, &to, &i64::from(count)]).await;
        let row = self.check(r)?;
        if !row.get::<_, bool>(1) {
            return Err(DbError::NoQueue(queue.to_string()));
        }
        Ok(row.get(0))
    }

    /// POP (`take`) or PEEK: the first eligible message.
    pub async fn first(
        &self,
        queue: &str,
        me: Option<&str>,
        from: Option<&str>,
        take: bool,
    ) -> Result<Option<Message>, DbError> {
        Ok(self.first_n(queue, me, from, take, 1).await?.pop())
    }

    /// The first `n` eligible messages, taken (POP) or not (PEEK), lowest id first.
    pub async fn first_n(
        &self,
        queue: &str,
        me: Option<&str>,
        from: Option<&str>,
        take: bool,
        n: usize,
    ) -> Result<Vec<Message>, DbError> {
        let st = if take { &self.st.pop } else { &self.st.peek };
        let limit = n as i64;
        let r = self.client.query(st, &[&queue, &me, &from, &limit]).await;
        let rows = self.check(r)?;
        if rows.is_empty() {
            return self.or_no_queue(queue, Vec::new()).await;
        }
        let mut out: Vec<Message> =
            rows.iter().map(|r| Message { id: r.get(0), sender: r.get(1), body: r.get(2) }).collect();
        out.sort_by_key(|m| m.id);
        Ok(out)
    }

    /// Several SENDs (without keys) in one statement and one commit: each
    /// one's id, or `None` when its queue does not exist.
    pub async fn send_many(&self, sends: &[SendRow<'_>]) -> Result<Vec<Option<i64>>, DbError> {
        let queues: Vec<&str> = sends.iter().map(|s| s.queue).collect();
        let senders: Vec<&str> = sends.iter().map(|s| s.sender).collect();
        let to: Vec<Option<&str>> = sends.iter().map(|s| s.to).collect();
        let bodies: Vec<&[u8]> = sends.iter().map(|s| s.body).collect();
        let delays: Vec<f64> = sends.iter().map(|s| s.delay_ms as f64).collect();
        let groups: Vec<Option<&str>> = sends.iter().map(|s| s.group).collect();
        let r = self.client.query(&self.st.send_many, &[&queues, &senders, &to, &bodies, &delays, &groups]).await;
        let mut out = vec![None; sends.len()];
        for row in self.check(r)? {
            let n: i64 = row.get(0);
            out[(n - 1) as usize] = Some(row.get(1));
        }
        Ok(out)
    }

    /// Several ACKs in one statement: whether each lease was current. A
    /// `false` may also mean that the queue does not exist ([`DbConn::queue_exists`]).
    /// Each ACK is (queue, id, lease, holder) as for [`DbConn::ack`].
    pub async fn ack_many(&self, acks: &[(&str, i64, i64, Option<&str>)]) -> Result<Vec<bool>, DbError> {
        let queues: Vec<&str> = acks.iter().map(|a| a.0).collect();
        let ids: Vec<i64> = acks.iter().map(|a| a.1).collect();
        let leases: Vec<i64> = acks.iter().map(|a| a.2).collect();
        let holders: Vec<Option<&str>> = acks.iter().map(|a| a.3).collect();
        let r = self.client.query(&self.st.ack_many, &[&queues, &ids, &leases, &holders]).await;
        let mut out = vec![false; acks.len()];
        for row in self.check(r)? {
            let n: i64 = row.get(0);
            out[(n - 1) as usize] = true;
        }
        Ok(out)
    }

    /// Whether a queue exists.
    pub async fn queue_exists(&self, queue: &str) -> Result<bool, DbError> {
        self.exists(queue).await
    }

    /// ACK: whether the lease was current (and the message is now gone).
    /// `holder`: the receiver the delivery must have gone to (`None`: anyone's).
    pub async fn ack(&self, queue: &str, id: i64, lease: i64, holder: Option<&str>) -> Result<bool, DbError> {
        let r = self.client.query_one(&self.st.ack, &[&queue, &id, &lease, &holder]).await;
        if self.check(r)?.get::<_, i64>(0) == 1 {
            return Ok(true);
        }
        self.or_no_queue(queue, false).await
    }

    /// NACK: whether the lease was current (and the message is visible again after `delay_ms`).
    /// `holder`: the receiver the delivery must have gone to (`None`: anyone's).
    pub async fn nack(
        &self,
        queue: &str,
        id: i64,
        lease: i64,
        delay_ms: u64,
        holder: Option<&str>,
    ) -> Result<bool, DbError> {
        let delay = delay_ms as f64;
        let r = self.client.execute(&self.st.nack, &[&queue, &id, &lease, &delay, &holder]).await;
        if self.check(r)? == 1 {
            return Ok(true);
        }
        self.or_no_queue(queue, false).await
    }

    /// Gives leases back: the messages are visible again at once, as if never received.
    pub async fn release(&self, leases: &[LeaseRef]) -> Result<u64, DbError> {
        let q: Vec<i64> = leases.iter().map(|l| l.queue_id).collect();
        let i: Vec<i64> = leases.iter().map(|l| l.id).collect();
        let l: Vec<i64> = leases.iter().map(|l| l.lease).collect();
        let r = self.client.execute(&self.st.release, &[&q, &i, &l]).await;
        self.check(r)
    }

    /// QCREATE
    /// `creator` may have at most `max_queues` queues (`None`: no limit).
    pub async fn create(
        &self,
        queue: &str,
        o: &QueueOptions,
        creator: Option<&str>,
        max_queues: Option<u64>,
    ) -> Result<(), DbError> {
        let max = o.max_deliveries.unwrap_or(0) as i32;
        let dead = o.dead_letter.clone().flatten();
        let (msgs, bytes) = (o.max_messages.unwrap_or(0) as i64, o.max_bytes.unwrap_or(0) as i64);
        let cap = max_queues.map(|m| m as i64);
        let concurrency = o.concurrency.unwrap_or(0) as i32;
        let rate = o.rate_per_s().unwrap_or(0.0);
        let retain = o.retain_ms.unwrap_or(0) as i64;
        // A name is a queue's or a stream's, never both.
        let r = self.client.query_one(self.stream_statement(crate::streamdb::X::Type as usize), &[&queue]).await;
        if self.check(r)?.get::<_, &str>(0) == "stream" {
            return Err(DbError::Redis("WRONGTYPE Operation against a key holding the wrong kind of value".into()));
        }
        let r = self
            .client
            .query_opt(
                &self.st.create,
                &[&queue, &max, &dead, &msgs, &bytes, &creator, &cap, &concurrency, &rate, &retain],
            )
            .await;
        if self.check(r)?.is_some() {
            if msgs > 0 || bytes > 0 {
                // What SENDs may have put in before they saw its quota.
                let r = self.client.execute(&self.st.mark, &[&queue]).await;
                self.check(r)?;
                let r = self.client.execute(&self.st.recount, &[&queue]).await;
                self.check(r)?;
            }
            return Ok(());
        }
        if self.exists(queue).await? {
            return Err(DbError::Exists(queue.to_string()));
        }
        Err(DbError::OverQuota(format!(
            "user {} may create at most {} queues (max_queues)",
            creator.unwrap_or("?"),
            max_queues.unwrap_or(0)
        )))
    }

    /// QDROP: the queue disappears at once; its messages are removed in the background.
    pub async fn drop_queue(&self, queue: &str) -> Result<(), DbError> {
        let r = self.client.query_opt(&self.st.drop, &[&queue]).await;
        if self.check(r)?.is_none() {
            return Err(DbError::NoQueue(queue.to_string()));
        }
        Ok(())
    }

    /// QLEN: messages in the queue, leased or not.
    pub async fn len(&self, queue: &str) -> Result<i64, DbError> {
        let r = self.client.query_opt(&self.st.len, &[&queue]).await;
        match self.check(r)? {
            Some(row) => Ok(row.get(0)),
            None => Err(DbError::NoQueue(queue.to_string())),
        }
    }

    /// QLIST, or QLIST PENDING for `me`: at most `most` names.
    pub async fn list(&self, pending_for: Option<Option<&str>>, most: i64) -> Result<Vec<String>, DbError> {
        let r = match pending_for {
            None => self.client.query(&self.st.list, &[&most]).await,
            Some(me) => self.client.query(&self.st.pending, &[&me, &most]).await,
        };
        Ok(self.check(r)?.iter().map(|r| r.get(0)).collect())
    }

    /// Whether a statement failed in a way that leaves the connection unusable.
    pub fn broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed) || self.client.is_closed()
    }

    /// Marks the connection unusable (its statement ran past the deadline).
    pub fn set_broken(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }

    /// Opens a connection (it works once the returned driver runs: spawn
    /// it), sets the session up and prepares every statement.
    pub async fn open(cfg: &Config) -> Result<(PgConn, Driver), String> {
        let unreplicated = Arc::new(AtomicBool::new(false));
        let (client, driver) = connect_async(cfg, unreplicated.clone()).await?;
        let mut driver = driver;
        // The session's settings and the statements, while the driver runs.
        let ((st, xst), server) = {
            let ready = async {
                client.batch_execute(&session_settings(cfg)).await.map_err(|e| e.to_string())?;
                let server: String = client
                    .query_one(SERVER, &[])
                    .await
                    .map_err(|e| format!("asking the server who it is: {e}"))?
                    .get(0);
                let st = Statements::prepare(&client).await.map_err(|e| format!("preparing statements: {e}"))?;
                let mut xst = Vec::with_capacity(crate::streamdb::STATEMENTS.len());
                for sql in crate::streamdb::STATEMENTS {
                    xst.push(client.prepare(sql).await.map_err(|e| format!("preparing statements: {e}"))?);
                }
                Ok::<_, String>(((st, xst), server))
            };
            tokio::pin!(ready);
            tokio::select! {
                st = &mut ready => st?,
                end = &mut driver => return Err(match end {
                    Err(e) => format!("the database closed the connection: {e}"),
                    Ok(()) => "the database closed the connection".into(),
                }),
            }
        };
        Ok((PgConn { client, st, xst, broken: AtomicBool::new(false), unreplicated, server, db: 0 }, driver))
    }
}

/// What keeps a connection's socket going: it must run (spawned on a
/// runtime, or polled beside the statements) for the client to work.
pub type Driver = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), postgres::Error>> + Send>>;

/// A pooled connection for the pool engine's workers: the connection with a
/// runtime of its own, on which a worker blocks for its statements (as the
/// `postgres` crate does); the statement deadline watches its socket.
pub struct DbConn {
    pg: PgConn,
    rt: tokio::runtime::Runtime,
    /// Its socket, watched for the statement deadline (`deadline.rs`).
    armed: Option<Arc<Armed>>,
}

impl Drop for DbConn {
    fn drop(&mut self) {
        // Closing politely waits for the server: a frozen one never answers.
        if let Some(a) = &self.armed {
            a.cut();
        }
    }
}

impl DbConn {
    /// Opens a connection, sets its session up and prepares every statement,
    /// within the connect timeout and the statement deadline; its socket is
    /// watched by `watch`.
    pub fn open(cfg: &Config, db: usize, watch: &Arc<Watch>) -> Result<DbConn, String> {
        let limit = Duration::from_millis(cfg.database.connect_timeout_ms)
            + cfg.statement_deadline().unwrap_or(Duration::from_secs(30));
        let (cfg, watch) = (cfg.clone(), watch.clone());
        within(limit, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("a runtime for the connection: {e}"))?;
            let (pg, armed) = {
                let _one_at_a_time = crate::deadline::OPENING.lock().unwrap_or_else(|p| p.into_inner());
                let before = crate::deadline::sockets();
                let (mut pg, driver) = rt.block_on(PgConn::open(&cfg))?;
                pg.db = db;
                rt.spawn(driver);
                let after = crate::deadline::sockets();
                let ports = crate::dbtls::split(&cfg.database.url)
                    .ok()
                    .and_then(|t| t.conninfo.parse::<postgres::Config>().ok())
                    .map(|c| c.get_ports().to_vec())
                    .unwrap_or_default();
                let ports = if ports.is_empty() { vec![5432] } else { ports };
                (pg, crate::deadline::new_socket(&before, &after, &ports).map(|s| watch.watch(s)))
            };
            if armed.is_none() {
                tracing::warn!(
                    "could not tell this connection's socket apart: its statements have no client-side deadline"
                );
            }
            Ok(DbConn { pg, rt, armed })
        })
    }

    /// Runs `f` on the connection, blocking until it is done.
    pub fn run<T>(&mut self, f: impl AsyncFnOnce(&PgConn) -> T) -> T {
        let pg = &self.pg;
        self.rt.block_on(f(pg))
    }

    /// Whether a statement failed in a way that leaves the connection unusable.
    pub fn broken(&self) -> bool {
        self.pg.broken()
    }
}

/// Connects with the configured timeouts and session settings.
pub fn connect(cfg: &Config) -> Result<Client, String> {
    let _one_at_a_time = crate::deadline::OPENING.lock().unwrap_or_else(|p| p.into_inner());
    connect_now(cfg)
}

/// Where and how to connect: the libpq settings with the password found
/// (PGPASSWORD, passfile, PGPASSFILE, ~/.pgpass, as libpq), mwmq's name,
/// and whether TLS is spoken (never over a Unix socket: libpq ignores
/// sslmode there too).
fn target(cfg: &Config) -> Result<(tokio_postgres::Config, Option<crate::dbtls::DbTarget>), String> {
    let target = crate::dbtls::split(&cfg.database.url)?;
    let mut pg: tokio_postgres::Config = target.conninfo.parse().map_err(|e| format!("connection string: {e}"))?;
    pg.connect_timeout(Duration::from_millis(cfg.database.connect_timeout_ms));
    if pg.get_password().is_none() {
        if let Some(p) = crate::pgpass::password_for(&pg, target.passfile.as_deref()) {
            pg.password(p);
        }
    }
    if pg.get_application_name().is_none() {
        pg.application_name("mwmq");
    }
    let unix_only = pg.get_hosts().iter().all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let tls = (pg.get_hosts().is_empty() || !unix_only) && target.mode != crate::dbtls::Mode::Disable;
    Ok((pg, tls.then_some(target)))
}

/// "error performing TLS handshake" says little without its cause.
fn connect_error(e: postgres::Error) -> String {
    match std::error::Error::source(&e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// The session's settings. The statements find messages through the
/// (queue_id, id) index, lowest id first. Left to itself the planner may
/// choose a bitmap scan and a sort while the table's statistics are those of
/// an empty table; bitmap scans never mark the index entries of deleted
/// messages dead, so every POP would visit every message ever deleted until
/// the next vacuum. An index scan marks them as it passes, and costs the same
/// when the table is small. (docs/mwmq.md) Those settings make any plan that
/// would still need a disabled node look expensive, which would start the
/// JIT compiler (hundreds of ms) on a statement that runs in one: off.
/// The search path is mwmq's schema only, whatever the connection string
/// or the role's defaults say, before any statement names anything
/// (`schema.rs`: nothing in `public` is ever what mwmq calls).
fn session_settings(cfg: &Config) -> String {
    let timeout = cfg.database.statement_timeout_ms;
    format!(
        "SET search_path = mwmq; SET statement_timeout = {timeout}; SET lock_timeout = {timeout}; \
         SET enable_bitmapscan = off; SET enable_seqscan = off; SET enable_sort = off; SET jit = off; \
         SET mwmq.max_consumers = {}",
        cfg.server.max_consumers_per_group
    )
}

/// [`connect`], without waiting for other connections being opened.
fn connect_now(cfg: &Config) -> Result<Client, String> {
    let (pg, tls) = target(cfg)?;
    let pg = postgres::Config::from(pg);
    let mut client = match &tls {
        None => pg.connect(NoTls),
        Some(t) => pg.connect(crate::dbtls::connector(t)?),
    }
    .map_err(connect_error)?;
    client.batch_execute(&session_settings(cfg)).map_err(|e| e.to_string())?;
    Ok(client)
}

/// Who a connection reached: `host:port` (`local:port` over a Unix socket).
const SERVER: &str = "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')";

/// Connects asynchronously: the client, and the driver that must run for it
/// to work. The driver sets `unreplicated` when the server warns that it
/// cancelled a commit's wait for the synchronous standby.
async fn connect_async(
    cfg: &Config,
    unreplicated: Arc<AtomicBool>,
) -> Result<(tokio_postgres::Client, Driver), String> {
    let (pg, tls) = target(cfg)?;
    match &tls {
        None => {
            let (c, conn) = pg.connect(tokio_postgres::NoTls).await.map_err(connect_error)?;
            Ok((c, drive(conn, unreplicated)))
        }
        Some(t) => {
            let (c, conn) = pg.connect(crate::dbtls::connector(t)?).await.map_err(connect_error)?;
            Ok((c, drive(conn, unreplicated)))
        }
    }
}

/// Runs a connection, reading the server's notices: tokio-postgres hands
/// them over in the order they arrived, each before the messages that
/// followed it are passed on to the statements waiting for them.
fn drive<S, T>(mut conn: tokio_postgres::Connection<S, T>, unreplicated: Arc<AtomicBool>) -> Driver
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use std::task::Poll;
    Box::pin(std::future::poll_fn(move |cx| loop {
        match conn.poll_message(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => return Poll::Ready(Ok(())),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
            Poll::Ready(Some(Ok(tokio_postgres::AsyncMessage::Notice(n)))) => {
                if n.message().starts_with(UNREPLICATED) {
                    unreplicated.store(true, Ordering::Release);
                    tracing::warn!(
                        "the database cancelled a commit's wait for its synchronous standby: {}",
                        n.message()
                    );
                }
            }
            Poll::Ready(Some(Ok(_))) => {}
        }
    }))
}

/// Creates or migrates the schema (`schema.rs`); refuses a database whose schema is newer than this program.
pub fn migrate(cfg: &Config) -> Result<u32, String> {
    crate::schema::migrate(cfg, MIGRATIONS)
}

/// Pool counters (cumulative).
#[derive(Debug, Default)]
pub struct PoolCounters {
    /// Borrowings that had to wait.
    pub waits: AtomicU64,
    /// Borrowings that gave up after `pool_wait_ms`.
    pub timeouts: AtomicU64,
    /// Connections opened.
    pub connects: AtomicU64,
    /// Failed attempts to open one.
    pub connect_failures: AtomicU64,
    /// Connections dropped after a failure.
    pub lost: AtomicU64,
    /// Which server answers and when none did.
    pub primary: PrimaryWatch,
}

/// Which database server mwmq writes to, and the time it spent without one:
/// from a request that found the database unavailable (connection lost or
/// refused, read-only, no answer in time) until one is answered again. A
/// failover is a connection opened on another server than the one before
/// (a multi-host `--db`, `target_session_attrs=read-write`).
#[derive(Debug, Default)]
pub struct PrimaryWatch {
    /// Since when (ns since mwmq started) no request has been answered; 0 while answered.
    down_since: AtomicU64,
    /// Time without an answering database, ns, over the periods that ended.
    down_ns: AtomicU64,
    /// Periods without one that ended.
    outages: AtomicU64,
    /// Connections opened on another server than the previous one.
    failovers: AtomicU64,
    /// The server connections were last opened on.
    server: Mutex<String>,
}

impl PrimaryWatch {
    /// A connection was opened on `server`.
    pub fn opened(&self, server: &str) {
        let mut last = self.server.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_str() != server {
            if !last.is_empty() {
                self.failovers.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(from = %last, to = %server, "the database server that accepts writes changed (failover)");
            }
            *last = server.to_string();
        }
    }

    /// A request found the database unavailable at `now` (ns).
    pub fn unavailable(&self, now: u64) {
        let _ = self.down_since.compare_exchange(0, now.max(1), Ordering::AcqRel, Ordering::Relaxed);
    }

    /// A request's statement was answered at `now` (ns).
    pub fn answered(&self, now: u64) {
        if self.down_since.load(Ordering::Relaxed) == 0 {
            return;
        }
        let since = self.down_since.swap(0, Ordering::AcqRel);
        if since != 0 {
            self.down_ns.fetch_add(now.saturating_sub(since), Ordering::Relaxed);
            self.outages.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Failovers seen.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Periods without an answering database that ended.
    pub fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// Seconds without an answering database, the current period included (at `now`, ns).
    pub fn down_seconds(&self, now: u64) -> f64 {
        let since = self.down_since.load(Ordering::Relaxed);
        let current = if since == 0 { 0 } else { now.saturating_sub(since) };
        (self.down_ns.load(Ordering::Relaxed) + current) as f64 / 1e9
    }

    /// Whether requests find the database unavailable now.
    pub fn down(&self) -> bool {
        self.down_since.load(Ordering::Relaxed) != 0
    }

    /// The server connections were last opened on (`host:port`).
    pub fn server(&self) -> String {
        self.server.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct PoolState {
    idle: Vec<DbConn>,
    /// Connections open or being opened.
    open: usize,
    /// No new attempt before this instant (backoff).
    next_attempt: Instant,
    backoff: Duration,
    last_error: Option<String>,
}

/// The bounded pool of database connections.
pub struct Pool {
    /// The statement deadlines of its connections.
    pub watch: Arc<Watch>,
    size: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
    cfg: Config,
    /// Which database (`[[databases]]`) it holds connections to.
    index: usize,
    /// Counters for the results and `/metrics`.
    pub counters: PoolCounters,
}

impl Pool {
    /// An empty pool of `cfg.pool_size()` connections (opened on demand).
    pub fn new(cfg: &Config, index: usize) -> Pool {
        Pool {
            index,
            watch: Watch::start(),
            size: cfg.pool_size(),
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
                next_attempt: Instant::now(),
                backoff: Duration::from_millis(cfg.database.retry_min_ms),
                last_error: None,
            }),
            freed: Condvar::new(),
            cfg: cfg.clone(),
            counters: PoolCounters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections in the pool at most.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Connections open now, and of those idle.
    pub fn occupancy(&self) -> (usize, usize) {
        let s = self.lock();
        (s.open, s.idle.len())
    }

    /// Opens connections until `n` are open (at start, so the first requests do not pay for it).
    pub fn fill(&self, n: usize) -> Result<(), String> {
        for _ in 0..n.min(self.size) {
            let c = DbConn::open(&self.cfg, self.index, &self.watch)?;
            self.counters.connects.fetch_add(1, Ordering::Relaxed);
            self.counters.primary.opened(&c.pg.server);
            let mut s = self.lock();
            s.open += 1;
            s.idle.push(c);
        }
        Ok(())
    }

    /// A connection, waiting at most `pool_wait_ms` for one to be free.
    pub fn get(&self) -> Result<DbConn, DbError> {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.database.pool_wait_ms);
        let mut s = self.lock();
        let mut waited = false;
        loop {
            if let Some(c) = s.idle.pop() {
                drop(s);
                return Ok(self.armed(c));
            }
            let now = Instant::now();
            if s.open < self.size && now >= s.next_attempt {
                s.open += 1;
                drop(s);
                match DbConn::open(&self.cfg, self.index, &self.watch) {
                    Ok(c) => {
                        self.counters.connects.fetch_add(1, Ordering::Relaxed);
                        self.counters.primary.opened(&c.pg.server);
                        let mut s = self.lock();
                        s.backoff = Duration::from_millis(self.cfg.database.retry_min_ms);
                        s.last_error = None;
                        drop(s);
                        return Ok(self.armed(c));
                    }
                    Err(e) => {
                        self.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                        let mut s = self.lock();
                        s.open -= 1;
                        s.next_attempt = Instant::now() + s.backoff;
                        s.backoff = (s.backoff * 2).min(Duration::from_millis(self.cfg.database.retry_max_ms));
                        if s.last_error.as_deref() != Some(e.as_str()) {
                            tracing::warn!("cannot connect to the database: {e}");
                        }
                        s.last_error = Some(e.clone());
                        drop(s);
                        self.freed.notify_all();
                        return Err(DbError::Unavailable(format!("the database is unavailable: {e}")));
                    }
                }
            }
            if s.open < self.size {
                // Backing off after failures: fail fast rather than hold the request.
                let e = s.last_error.clone().unwrap_or_else(|| "reconnecting".into());
                return Err(DbError::Unavailable(format!("the database is unavailable: {e}")));
            }
            if now >= deadline {
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(DbError::Unavailable(format!(
                    "no database connection became free within {} ms",
                    self.cfg.database.pool_wait_ms
                )));
            }
            if !waited {
                waited = true;
                self.counters.waits.fetch_add(1, Ordering::Relaxed);
            }
            s = self.freed.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Runs `f` on a connection borrowed for it and given back after: its
    /// result, or why no connection could be had.
    pub fn with<T>(&self, f: impl AsyncFnOnce(&PgConn) -> T) -> Result<T, DbError> {
        let mut c = self.get()?;
        let r = c.run(f);
        self.put(c);
        Ok(r)
    }

    /// Returns a connection. A broken one is closed, and so are the idle ones
    /// (what killed one connection — a restart, a terminated backend — has
    /// usually killed them all); new ones are opened on demand.
    pub fn put(&self, c: DbConn) {
        if let Some(a) = &c.armed {
            self.watch.disarm(a);
        }
        let mut s = self.lock();
        if c.broken() {
            self.counters.lost.fetch_add(1, Ordering::Relaxed);
            let idle = std::mem::take(&mut s.idle);
            s.open -= 1 + idle.len();
            drop(s);
            drop(idle);
            drop(c);
        } else {
            s.idle.push(c);
            drop(s);
        }
        self.freed.notify_one();
    }

    /// `c`, its statements due within the deadline from now.
    fn armed(&self, c: DbConn) -> DbConn {
        if let (Some(a), Some(limit)) = (&c.armed, self.cfg.statement_deadline()) {
            self.watch.arm(a, limit);
        }
        c
    }

    /// Closes every idle connection (at shutdown).
    pub fn close(&self) {
        let mut s = self.lock();
        let idle = std::mem::take(&mut s.idle);
        s.open -= idle.len();
        drop(s);
        drop(idle);
    }
}

/// The pools of every database the queues are spread over (one with
/// `--db`), and which queue lives where ([`crate::placement`]).
pub struct Pools {
    all: Vec<Pool>,
    /// Queue name -> database.
    pub placement: crate::placement::Placement,
    /// Queues found on another database than placement names, and not on
    /// that one (created before a database was added, not moved yet by
    /// `mwmq rebalance`): served where they are. Refreshed by the directory
    /// thread, with several databases only.
    misplaced: std::sync::RwLock<std::collections::HashMap<String, usize>>,
}

impl Pools {
    /// A pool for each database of `cfg`.
    pub fn new(cfg: &Config) -> Pools {
        let list = cfg.database_list();
        Pools {
            all: (0..list.len()).map(|i| Pool::new(&cfg.for_database(i), i)).collect(),
            placement: crate::placement::Placement::of(cfg),
            misplaced: Default::default(),
        }
    }

    /// The database `queue` lives on: where placement puts it, unless it is
    /// found only on another one (not moved yet).
    pub fn home(&self, queue: &str) -> usize {
        if self.all.len() > 1 {
            if let Some(i) = self.misplaced.read().unwrap_or_else(|p| p.into_inner()).get(queue) {
                return *i;
            }
        }
        self.placement.home(queue)
    }

    /// Looks at every database's queues (`names[i]`: database i's, `None`
    /// where it did not answer: what was known of it stays) and notes those
    /// that are not where placement puts them.
    pub fn found(&self, names: &[Option<Vec<String>>]) {
        use std::collections::{HashMap, HashSet};
        let sets: Vec<Option<HashSet<&str>>> =
            names.iter().map(|n| n.as_ref().map(|n| n.iter().map(String::as_str).collect())).collect();
        let mut map = self.misplaced.write().unwrap_or_else(|p| p.into_inner());
        // What a database that did not answer held, or what its home would, is kept.
        let mut next: HashMap<String, usize> = map
            .iter()
            .filter(|(q, i)| sets[**i].is_none() || sets[self.placement.home(q)].is_none())
            .map(|(q, i)| (q.clone(), *i))
            .collect();
        for (i, set) in sets.iter().enumerate() {
            for q in set.iter().flatten() {
                let home = self.placement.home(q);
                if home != i && sets[home].as_ref().is_some_and(|h| !h.contains(q)) {
                    next.insert(q.to_string(), i);
                }
            }
        }
        *map = next;
    }

    /// Queues served where placement does not put them, now.
    pub fn misplaced(&self) -> usize {
        self.misplaced.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// How many databases.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Whether there are none (never).
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Every pool, in configuration order.
    pub fn iter(&self) -> std::slice::Iter<'_, Pool> {
        self.all.iter()
    }

    /// Connections the pools may hold, together.
    pub fn size(&self) -> usize {
        self.all.iter().map(Pool::size).sum()
    }

    /// Connections open now, and of those idle, together.
    pub fn occupancy(&self) -> (usize, usize) {
        self.all.iter().map(Pool::occupancy).fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }

    /// A counter added over the pools.
    pub fn sum(&self, counter: impl Fn(&PoolCounters) -> &AtomicU64) -> u64 {
        self.all.iter().map(|p| counter(&p.counters).load(Ordering::Relaxed)).sum()
    }

    /// Statements whose connection was cut at the deadline, together.
    pub fn cut(&self) -> u64 {
        self.all.iter().map(|p| p.watch.cut.load(Ordering::Relaxed)).sum()
    }

    /// Failovers seen, on every database.
    pub fn failovers(&self) -> u64 {
        self.all.iter().map(|p| p.counters.primary.failovers()).sum()
    }

    /// Periods without an answering database that ended, on every database.
    pub fn outages(&self) -> u64 {
        self.all.iter().map(|p| p.counters.primary.outages()).sum()
    }

    /// Seconds without an answering database, added over the databases.
    pub fn down_seconds(&self, now: u64) -> f64 {
        self.all.iter().map(|p| p.counters.primary.down_seconds(now)).sum()
    }

    /// Whether requests find some database unavailable now.
    pub fn down(&self) -> bool {
        self.all.iter().any(|p| p.counters.primary.down())
    }

    /// The servers connections were last opened on, one per database.
    pub fn servers(&self) -> String {
        self.all.iter().map(|p| p.counters.primary.server()).collect::<Vec<_>>().join(",")
    }

    /// Closes the idle connections of every pool.
    pub fn close(&self) {
        self.all.iter().for_each(Pool::close);
    }
}

impl std::ops::Index<usize> for Pools {
    type Output = Pool;
    fn index(&self, i: usize) -> &Pool {
        &self.all[i]
    }
}
