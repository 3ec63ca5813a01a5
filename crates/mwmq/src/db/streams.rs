//! Redis Streams in PostgreSQL: the tables and the functions behind every
//! stream command. Each command is one statement (one round trip, one
//! transaction): a call of a PL/pgSQL function that carries out Redis's
//! algorithm for it (ids, the consumer group's last id and entries-read
//! counter, the pending entries list) and returns rows the engine turns
//! into Redis's reply. An XADD is answered after its row committed.
//!
//! - `mwmq_streams`: one row per stream: its last id (XADD's `*` takes
//!   `max(clock, last)`, so ids increase even when the clock steps back),
//!   the largest id XDEL removed, entries ever added, the length. XADDs to
//!   one stream take its row's lock, so ids commit in order and a reader
//!   never sees a later id before an earlier one.
//! - `mwmq_stream_entries`: the entries, fields and values as one `bytea[]`.
//! - `mwmq_stream_groups`, `mwmq_stream_consumers`, `mwmq_stream_pending`:
//!   consumer groups (last-delivered id, entries-read: NULL is Redis's
//!   "unknown"), their consumers (seen time) and the pending entries
//!   (owner, delivery time, delivery count). Readers of one group take the
//!   group's row lock for the time of their statement.
//!
//! Errors Redis gives are raised with SQLSTATE `MWR01` and the reply's text
//! as the message; the engine answers them verbatim.

use postgres::error::SqlState;

use super::{DbError, PgConn};
use crate::xcommand::{Sid, Trim, Trimming};

/// The SQLSTATE of errors whose message is the Redis reply.
pub const REDIS_ERROR: &str = "MWR01";

/// The statements behind the stream commands, prepared with a connection.
pub const STATEMENTS: &[&str] = &[
    "SELECT * FROM mwmq_xadd($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    "SELECT mwmq_xlen($1)",
    "SELECT * FROM mwmq_xrange($1, $2, $3, $4, $5, $6, $7, $8)",
    "SELECT * FROM mwmq_xread($1, $2, $3, $4, $5, $6)",
    "SELECT * FROM mwmq_xlast($1, $2)",
    "SELECT mwmq_xdel($1, $2, $3)",
    "SELECT mwmq_xtrim($1, $2, $3, $4, $5, $6)",
    "SELECT * FROM mwmq_xreadgroup($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    "SELECT mwmq_xack($1, $2, $3, $4, $5)",
    "SELECT * FROM mwmq_xpending($1, $2)",
    "SELECT * FROM mwmq_xpending_range($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    "SELECT * FROM mwmq_xclaim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
    "SELECT * FROM mwmq_xautoclaim($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    "SELECT mwmq_xgroup_create($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    "SELECT mwmq_xgroup_setid($1, $2, $3, $4, $5, $6, $7)",
    "SELECT mwmq_xgroup_destroy($1, $2)",
    "SELECT mwmq_xgroup_consumer($1, $2, $3, $4)",
    "SELECT * FROM mwmq_xinfo_stream($1)",
    "SELECT * FROM mwmq_xinfo_groups($1)",
    "SELECT * FROM mwmq_xinfo_consumers($1, $2, $3)",
    "SELECT mwmq_type($1)",
    "SELECT mwmq_exists($1)",
    "SELECT mwmq_del($1)",
    "SELECT * FROM mwmq_xadd_many($1, $2, $3, $4, $5)",
    "SELECT * FROM mwmq_xreadgroup_many($1, $2, $3, $4, $5, $6, $7)",
    "SELECT * FROM mwmq_xack_many($1, $2, $3, $4, $5)",
    "SELECT * FROM mwmq_xinfo_pending($1, $2, $3, $4)",
    "SELECT * FROM mwmq_xinfo_full_consumers($1, $2)",
    "SELECT mwmq_xgroup_deadletter($1, $2, $3, $4, $5, $6)",
    READ_GROUP_FAST,
    ACK_FAST,
    // QALTER on a stream: MAXMESSAGES ($2 given, $3) and MAXBYTES ($4, $5), 0 lifting it.
    "UPDATE mwmq_streams SET max_entries = CASE WHEN $2 THEN nullif($3::bigint, 0) ELSE max_entries END,
                             max_bytes = CASE WHEN $4 THEN nullif($5::bigint, 0) ELSE max_bytes END
     WHERE name = $1 RETURNING id",
    "SELECT * FROM mwmq_xinfo_full_group($1, $2, $3, $4)",
];

/// XREADGROUP of new entries by consumers `$3` (COUNT `$4` each, NOACK
/// `$5`) of stream `$1`'s group `$2` as one plain statement, for the common
/// case: a stream without tombstones, a group whose entries-read is known
/// and that has each consumer already (a new one may be one too many:
/// `sql/0015_reply_bounds.sql`), and no consumer's entries weighing more than `$6`
/// (`max_reply_bytes`) unless it has one. The row with index 0 says the
/// group was found in that case; when it is missing the statement did
/// nothing and `mwmq_xreadgroup_many` (the general case, Redis's errors,
/// replies cut by their bytes) runs instead. A consumer's row is touched
/// once: its names are made distinct before the clock is read (read per
/// row, a tick between two rows of one consumer once made them distinct,
/// and the upsert failed: "cannot affect row a second time").
const READ_GROUP_FAST: &str = "
WITH st AS (SELECT id, length, del_ms, del_seq FROM mwmq_streams WHERE name = $1),
g AS (SELECT x.stream_id, x.last_ms, x.last_seq FROM mwmq_stream_groups x JOIN st ON x.stream_id = st.id
      WHERE x.name = $2 AND x.entries_read IS NOT NULL AND (st.length = 0 OR (st.del_ms = 0 AND st.del_seq = 0))
        AND NOT EXISTS (SELECT 1 FROM unnest($3::text[]) AS n(name) WHERE NOT EXISTS (
                            SELECT 1 FROM mwmq_stream_consumers c
                            WHERE c.stream_id = x.stream_id AND c.grp = $2 AND c.name = n.name))
      FOR UPDATE OF x),
e AS (SELECT n.ms, n.seq, n.fields, n.w FROM g, LATERAL (
          SELECT x.ms, x.seq, x.fields, x.bytes + 16 * x.items + 64 AS w FROM mwmq_stream_entries x
          WHERE x.stream_id = g.stream_id AND (x.ms, x.seq) > (g.last_ms, g.last_seq)
          ORDER BY x.ms, x.seq LIMIT $4::bigint * cardinality($3::text[])) n),
k AS (SELECT e.ms, e.seq, e.fields, e.w, row_number() OVER (ORDER BY e.ms, e.seq) AS k FROM e),
a AS (SELECT k.ms, k.seq, k.fields, k.k, k.w, ((k.k - 1) / $4::bigint + 1)::int AS who FROM k),
big AS (SELECT 1 FROM a GROUP BY a.who HAVING count(*) > 1 AND sum(a.w) > $6::bigint),
w AS (SELECT a.ms, a.seq, a.fields, a.k, a.who FROM a WHERE NOT EXISTS (SELECT 1 FROM big)),
p AS (INSERT INTO mwmq_stream_pending AS p (stream_id, grp, ms, seq, consumer, delivered_ms, deliveries)
      SELECT g.stream_id, $2, w.ms, w.seq, ($3::text[])[w.who], mwmq_ms(), 1 FROM w, g WHERE NOT $5::boolean
      ON CONFLICT (stream_id, grp, ms, seq)
      DO UPDATE SET consumer = EXCLUDED.consumer, delivered_ms = EXCLUDED.delivered_ms, deliveries = 1),
c AS (INSERT INTO mwmq_stream_consumers AS c (stream_id, grp, name, seen_ms)
      SELECT g.stream_id, $2, n.name, mwmq_ms() FROM (SELECT DISTINCT ($3::text[])[w.who] AS name FROM w) n, g
      ON CONFLICT (stream_id, grp, name) DO UPDATE SET seen_ms = EXCLUDED.seen_ms
      WHERE c.seen_ms < EXCLUDED.seen_ms - 100),
m AS (SELECT w.ms, w.seq, (SELECT count(*) FROM w) AS n FROM w ORDER BY w.k DESC LIMIT 1),
u AS (UPDATE mwmq_stream_groups x SET last_ms = m.ms, last_seq = m.seq, entries_read = x.entries_read + m.n
      FROM m, g WHERE x.stream_id = g.stream_id AND x.name = $2)
SELECT w.who, w.ms, w.seq, w.fields FROM w
UNION ALL SELECT 0, NULL::bigint, NULL::bigint, NULL::bytea[] FROM g WHERE NOT EXISTS (SELECT 1 FROM big)";

/// XACKs `$3` (request index), `$4`, `$5` (ids) of stream `$1`'s group `$2`
/// as one plain statement: per request, the entries it acknowledged (an id
/// named twice counts for the first request); the row with index 0 counts
/// the stream (0: none by that name, so maybe a queue's: WRONGTYPE).
const ACK_FAST: &str = "
WITH u AS (SELECT * FROM unnest($3::int[], $4::bigint[], $5::bigint[]) AS u(i, ms, seq)),
st AS (SELECT id FROM mwmq_streams WHERE name = $1),
d AS (DELETE FROM mwmq_stream_pending p USING (SELECT DISTINCT u.ms, u.seq FROM u) x, st
      WHERE p.stream_id = st.id AND p.grp = $2 AND p.ms = x.ms AND p.seq = x.seq RETURNING p.ms, p.seq),
f AS (SELECT min(u.i) AS i FROM d JOIN u ON u.ms = d.ms AND u.seq = d.seq GROUP BY d.ms, d.seq)
SELECT f.i, count(*) FROM f GROUP BY f.i
UNION ALL SELECT 0, count(*) FROM st";

/// Which statement (an index into [`STATEMENTS`]).
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub enum X {
    Add,
    Len,
    Range,
    Read,
    Last,
    Del,
    Trim,
    ReadGroup,
    Ack,
    Pending,
    PendingRange,
    Claim,
    AutoClaim,
    GroupCreate,
    GroupSetId,
    GroupDestroy,
    GroupConsumer,
    InfoStream,
    InfoGroups,
    InfoConsumers,
    Type,
    Exists,
    DelKeys,
    AddMany,
    ReadGroupMany,
    AckMany,
    InfoPending,
    InfoFullConsumers,
    GroupDeadLetter,
    ReadGroupFast,
    AckFast,
    Limit,
    InfoFullGroup,
}

/// A trim as the functions take it: kind (0 none, 1 MAXLEN, 2 MINID), maxlen, min id, limit.
pub fn trim_args(t: Option<&Trimming>) -> (i32, i64, Sid, Option<i64>) {
    match t {
        None => (0, 0, Sid::ZERO, None),
        Some(t) => match t.trim {
            Trim::MaxLen(n) => (1, n, Sid::ZERO, t.limit),
            Trim::MinId(id) => (2, 0, id, t.limit),
        },
    }
}

/// Splits ids into their parts' arrays.
pub fn id_arrays(ids: &[Sid]) -> (Vec<i64>, Vec<i64>) {
    (ids.iter().map(|i| i.ms).collect(), ids.iter().map(|i| i.seq).collect())
}

/// Whether a database error carries a Redis reply (its message).
pub fn redis_error(e: &postgres::Error) -> Option<String> {
    let db = e.as_db_error()?;
    (*db.code() == SqlState::from_code(REDIS_ERROR)).then(|| db.message().to_string())
}

impl PgConn {
    /// Runs stream statement `x` with `params`; its rows.
    pub async fn x(
        &self,
        x: X,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, DbError> {
        let r = self.client().query(self.stream_statement(x as usize), params).await;
        if let Some(m) = r.as_ref().err().and_then(redis_error) {
            return Err(DbError::Redis(m));
        }
        self.checked(r)
    }
}
