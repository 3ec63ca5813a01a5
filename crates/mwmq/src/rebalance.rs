//! `mwmq rebalance --config FILE`: moves each queue that is not on the
//! database placement names for it (a database was added to `[[databases]]`,
//! one is being drained with `drain = true`, or one renamed) to that
//! database, while mwmq serves it.
//!
//! For each such queue, from database A to database B:
//!
//! 1. the queue is created on B with A's settings (every queue to move,
//!    before one wait of `settle` for them all). Within
//!    [`crate::events::DIRECTORY_EVERY`] every mwmq sees it there and sends
//!    the queue's requests to B: new SENDs land on B, RECVs there find them;
//! 2. after `settle` (longer than that period), its messages move in
//!    batches, each taken off A (`DELETE ... RETURNING`) and written to B,
//!    committed on B first and on A then: a crash between the two leaves a
//!    message on both (delivered twice at worst), never on neither. Their ids
//!    stay (B's id sequence is moved past them), so do their deduplication
//!    keys; a message leased on A is moved with its visibility (its lease is
//!    not: its ACK answers 0 and it is delivered again when the lease runs
//!    out); the keys SENDs left on A move with every batch;
//! 3. the last batch runs with A's messages table locked against writes
//!    (`LOCK ... IN EXCLUSIVE MODE`, reads go on): the rest moves and the
//!    queue is dropped on A in the same transaction, so a SEND that a
//!    process still sent to A either commits before (and moves) or is
//!    refused after (`-NOQUEUE`: never acknowledged and lost). Writes to A
//!    wait for that one batch (milliseconds).
//!
//! A retaining queue's archive (acknowledged messages kept, QARCHIVE) moves
//! too, in batches of its own after the messages, and what was archived
//! since with the last batch: once the queue is dropped on A, A's purge
//! would delete what is left there. The queue's schedules (QSCHEDULE) move
//! with the last batch, their next tick and counters with them, and so do
//! the keys of the ticks they sent.
//!
//! While it moves a queue is never read-only: SENDs go to B from step 1 on;
//! messages still on A are out of reach of RECV for the time of their batch.

use std::time::Duration;

use postgres::Client;

use crate::config::Config;

/// Messages moved per transaction.
const BATCH: i64 = 500;

/// A queue to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// Its name.
    pub queue: String,
    /// The database it is on.
    pub from: usize,
    /// The database placement names.
    pub to: usize,
}

/// Opens a connection to each database of `cfg` (and creates or migrates
/// its schema).
fn open(cfg: &Config) -> Result<Vec<Client>, String> {
    let names = cfg.database_list();
    (0..names.len())
        .map(|i| {
            let one = cfg.for_database(i);
            let named = |e: String| format!("database {:?}: {e}", names[i].name);
            crate::db::migrate(&one).map_err(named)?;
            let mut c = crate::db::connect(&one).map_err(named)?;
            // A batch may take longer than the servers' statements.
            c.batch_execute("SET statement_timeout = 0; SET lock_timeout = 0").map_err(|e| named(e.to_string()))?;
            Ok(c)
        })
        .collect()
}

/// The queues that are not where placement puts them.
pub fn plan(cfg: &Config) -> Result<Vec<Move>, String> {
    plan_on(cfg, &mut open(cfg)?)
}

fn plan_on(cfg: &Config, conns: &mut [Client]) -> Result<Vec<Move>, String> {
    let placement = crate::placement::Placement::of(cfg);
    let mut moves = Vec::new();
    for (i, c) in conns.iter_mut().enumerate() {
        let rows = c.query("SELECT name FROM mwmq_queues WHERE dropped_at IS NULL ORDER BY name", &[]).map_err(why)?;
        for r in rows {
            let queue: String = r.get(0);
            let to = placement.home(&queue);
            if to != i {
                moves.push(Move { queue, from: i, to });
            }
        }
    }
    Ok(moves)
}

/// Moves every queue that is not where placement puts it (with `dry_run`,
/// only says which); what it did, a line per queue. `settle`: how long
/// after creating a queue on its new database its old one is drained.
pub fn run(cfg: &Config, dry_run: bool, settle: Duration) -> Result<String, String> {
    let mut conns = open(cfg)?;
    let moves = plan_on(cfg, &mut conns)?;
    let names: Vec<String> = cfg.database_list().into_iter().map(|d| d.name).collect();
    let mut out = String::new();
    if moves.is_empty() {
        out.push_str("every queue is on the database placement names for it\n");
        return Ok(out);
    }
    if dry_run {
        for m in &moves {
            out.push_str(&format!("would move {} from {} to {}\n", m.queue, names[m.from], names[m.to]));
        }
        return Ok(out);
    }
    // 1. Every queue on its new database; then one wait for every mwmq to
    // see them there; then each one's messages.
    let mut ids = Vec::new();
    for m in &moves {
        let (src, dst) = pair(&mut conns, m.from, m.to);
        ids.push(arrive(src, dst, &m.queue).map_err(|e| format!("creating {} on {}: {e}", m.queue, names[m.to]))?);
    }
    std::thread::sleep(settle);
    for (m, ids) in moves.iter().zip(ids) {
        let Some((src_id, dst_id)) = ids else { continue };
        let (src, dst) = pair(&mut conns, m.from, m.to);
        let t0 = std::time::Instant::now();
        let moved = move_messages(src, dst, src_id, dst_id).map_err(|e| format!("moving {}: {e}", m.queue))?;
        out.push_str(&format!(
            "moved {} from {} to {}: {moved} messages in {:.3} s\n",
            m.queue,
            names[m.from],
            names[m.to],
            t0.elapsed().as_secs_f64()
        ));
    }
    Ok(out)
}

/// Two distinct connections of `conns`.
fn pair(conns: &mut [Client], a: usize, b: usize) -> (&mut Client, &mut Client) {
    assert_ne!(a, b);
    if a < b {
        let (l, r) = conns.split_at_mut(b);
        (&mut l[a], &mut r[0])
    } else {
        let (l, r) = conns.split_at_mut(a);
        (&mut r[0], &mut l[b])
    }
}

const COLUMNS: &str =
    "id, sender, receiver, body, sent_at, visible_at, deliveries, dead_from, dead_reason, counted, grp, priority";

/// A database error as PostgreSQL words it.
fn why(e: postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}{}", d.message(), d.detail().map(|x| format!(" ({x})")).unwrap_or_default()),
        None => e.to_string(),
    }
}

/// Step 1 for one queue: it is created on the new database with the old
/// one's settings; the two queue ids (`None`: dropped meanwhile).
fn arrive(src: &mut Client, dst: &mut Client, queue: &str) -> Result<Option<(i64, i64)>, String> {
    let e = why;
    let Some(row) = src
        .query_opt(
            "SELECT id, max_deliveries, dead_letter, max_messages, max_bytes, created_by, paused, concurrency, rate, retain_ms,
                    backoff_base_ms, backoff_max_ms, backoff_jitter
             FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL",
            &[&queue],
        )
        .map_err(e)?
    else {
        return Ok(None);
    };
    let src_id: i64 = row.get(0);
    let (max_del, dead): (Option<i32>, Option<String>) = (row.get(1), row.get(2));
    let (max_msgs, max_bytes, by): (Option<i64>, Option<i64>, Option<String>) = (row.get(3), row.get(4), row.get(5));
    let (paused, concurrency, rate): (bool, Option<i32>, Option<f64>) = (row.get(6), row.get(7), row.get(8));
    let retain: Option<i64> = row.get(9);
    let backoff: (Option<i64>, Option<i64>, Option<i16>) = (row.get(10), row.get(11), row.get(12));
    // 1. The queue on its new database (kept if a run before made it).
    dst.execute(
        "INSERT INTO mwmq_queues
            (name, max_deliveries, dead_letter, max_messages, max_bytes, created_by, paused, concurrency, rate,
             retain_ms, backoff_base_ms, backoff_max_ms, backoff_jitter)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (name) WHERE dropped_at IS NULL DO NOTHING",
        &[
            &queue,
            &max_del,
            &dead,
            &max_msgs,
            &max_bytes,
            &by,
            &paused,
            &concurrency,
            &rate,
            &retain,
            &backoff.0,
            &backoff.1,
            &backoff.2,
        ],
    )
    .map_err(e)?;
    let dst_id: i64 = dst
        .query_one("SELECT id FROM mwmq_queues WHERE name = $1 AND dropped_at IS NULL", &[&queue])
        .map_err(e)?
        .get(0);
    // Ids are each database's own: the new side's are moved past the old
    // side's, so that the SENDs it takes from now on do not meet the ids of
    // the messages coming over (those that still do get new ids: `renamed`).
    let top: i64 = src.query_one("SELECT last_value FROM mwmq_message_ids", &[]).map_err(e)?.get(0);
    dst.execute("SELECT setval('mwmq_message_ids', greatest((SELECT last_value FROM mwmq_message_ids), $1))", &[&top])
        .map_err(e)?;
    Ok(Some((src_id, dst_id)))
}

/// Steps 2 and 3 for one queue: its messages and keys, and the queue dropped
/// on the old database; the messages moved.
fn move_messages(src: &mut Client, dst: &mut Client, src_id: i64, dst_id: i64) -> Result<u64, String> {
    let e = why;
    let mut moved = 0u64;
    let mut renamed = std::collections::HashMap::new();
    loop {
        let n = move_batch(src, dst, src_id, dst_id, false, &mut renamed).map_err(e)?;
        moved += n;
        if n < BATCH as u64 {
            break;
        }
    }
    // The archive (of a queue that retains), each batch committed on the new side first.
    loop {
        let (mut s, mut d) = (src.transaction().map_err(e)?, dst.transaction().map_err(e)?);
        let n = move_archive(&mut s, &mut d, src_id, dst_id, BATCH).map_err(e)?;
        d.commit().map_err(e)?;
        s.commit().map_err(e)?;
        if n < BATCH as u64 {
            break;
        }
    }
    // 3. The rest, and the queue dropped on the old database, at once.
    moved += move_batch(src, dst, src_id, dst_id, true, &mut renamed).map_err(e)?;
    Ok(moved)
}

/// Moves up to [`BATCH`] messages and the keys (`last`: all messages that
/// are left, and the queue dropped on `src`, with `src`'s messages locked
/// against writes). A message whose id the new side gave meanwhile gets a
/// new one (`renamed`, old -> new: its key follows it).
fn move_batch(
    src: &mut Client,
    dst: &mut Client,
    src_id: i64,
    dst_id: i64,
    last: bool,
    renamed: &mut std::collections::HashMap<i64, i64>,
) -> Result<u64, postgres::Error> {
    let mut s = src.transaction()?;
    if last {
        s.batch_execute("LOCK TABLE mwmq_messages IN EXCLUSIVE MODE")?;
    }
    let limit = if last { i64::MAX } else { BATCH };
    let rows = s.query(
        &format!(
            "DELETE FROM mwmq_messages m USING (SELECT queue_id, id FROM mwmq_messages WHERE queue_id = $1
                                                 ORDER BY id LIMIT $2) t
             WHERE m.queue_id = t.queue_id AND m.id = t.id RETURNING {}",
            COLUMNS.split(", ").map(|c| format!("m.{c}")).collect::<Vec<_>>().join(", ")
        ),
        &[&src_id, &limit],
    )?;
    // The deduplication keys move with every batch: a retried SEND finds its key on the new database.
    let keys =
        s.query("DELETE FROM mwmq_keys WHERE queue_id = $1 RETURNING key, message_id, created_at", &[&src_id])?;
    if last {
        s.execute("UPDATE mwmq_queues SET dropped_at = now() WHERE id = $1", &[&src_id])?;
    }
    let mut d = dst.transaction()?;
    let insert = d.prepare(&format!(
        "INSERT INTO mwmq_messages (queue_id, {COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (queue_id, id) DO NOTHING"
    ))?;
    let insert_new_id = d.prepare(&format!(
        "INSERT INTO mwmq_messages (queue_id, {COLUMNS})
         VALUES ($1, nextval('mwmq_message_ids'), $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id"
    ))?;
    let mut top = 0i64;
    for r in &rows {
        let id: i64 = r.get(0);
        top = top.max(id);
        let (sender, receiver, body): (String, Option<String>, Vec<u8>) = (r.get(1), r.get(2), r.get(3));
        let (sent, visible): (std::time::SystemTime, std::time::SystemTime) = (r.get(4), r.get(5));
        let (deliveries, from, reason, counted): (i32, Option<String>, Option<String>, bool) =
            (r.get(6), r.get(7), r.get(8), r.get(9));
        let (group, priority): (Option<String>, i16) = (r.get(10), r.get(11));
        // The message's columns after its queue and id: the same for both inserts.
        let columns: [&(dyn postgres::types::ToSql + Sync); 11] =
            [&sender, &receiver, &body, &sent, &visible, &deliveries, &from, &reason, &counted, &group, &priority];
        let with_id: Vec<&(dyn postgres::types::ToSql + Sync)> =
            [&dst_id as _, &id as _].into_iter().chain(columns).collect();
        let fresh = d.execute(&insert, &with_id)?;
        if fresh == 0 {
            let new_id: Vec<&(dyn postgres::types::ToSql + Sync)> =
                std::iter::once(&dst_id as _).chain(columns).collect();
            let new: i64 = d.query_one(&insert_new_id, &new_id)?.get(0);
            renamed.insert(id, new);
        }
    }
    if last {
        // What was archived since the archive's batches.
        move_archive(&mut s, &mut d, src_id, dst_id, i64::MAX)?;
        move_schedules(&mut s, &mut d, src_id, dst_id)?;
    }
    if rows.iter().any(|r| r.get::<_, i16>(11) != 0) {
        // A message of another priority than 0 marks its queue (`policies.rs`).
        d.execute("UPDATE mwmq_queues SET prioritized = true WHERE id = $1 AND NOT prioritized", &[&dst_id])?;
    }
    for k in &keys {
        let (key, id, at): (String, i64, std::time::SystemTime) = (k.get(0), k.get(1), k.get(2));
        let id = renamed.get(&id).copied().unwrap_or(id);
        d.execute(
            "INSERT INTO mwmq_keys (queue_id, key, message_id, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
            &[&dst_id, &key, &id, &at],
        )?;
    }
    if top > 0 {
        // New ids on this database must not meet the moved ones.
        d.execute(
            "SELECT setval('mwmq_message_ids', greatest((SELECT last_value FROM mwmq_message_ids), $1))",
            &[&top],
        )?;
    }
    d.commit()?;
    s.commit()?;
    Ok(rows.len() as u64)
}

/// Moves the queue's schedules (QSCHEDULE), with their next tick and
/// counters, in the last batch's transactions: the old side's ticker stops
/// sending with the commit that drops the queue there, the new side's
/// starts with the commit before it (a crash between the two leaves the
/// queue, and its schedule, on both, as it leaves messages: a tick sent on
/// both sides at worst). A name the new side already has keeps the new
/// side's schedule.
fn move_schedules(
    s: &mut postgres::Transaction,
    d: &mut postgres::Transaction,
    src_id: i64,
    dst_id: i64,
) -> Result<u64, postgres::Error> {
    const MOVED: &str =
        "name, cron, tz, body, key_prefix, catchup, sender, created_by, created_at::text, next_at::text,
                         last_tick::text, last_run_at::text, last_id, sent, missed, refused, priority, grp, delay_ms,
                         skipped, suspended";
    let rows = s.query(&format!("DELETE FROM mwmq_schedules WHERE queue_id = $1 RETURNING {MOVED}"), &[&src_id])?;
    for r in &rows {
        let (name, cron, tz, body): (String, String, String, Vec<u8>) = (r.get(0), r.get(1), r.get(2), r.get(3));
        let (key_prefix, catchup, sender, created_by): (String, String, String, Option<String>) =
            (r.get(4), r.get(5), r.get(6), r.get(7));
        let (created_at, next_at, last_tick, last_run_at): (String, String, Option<String>, Option<String>) =
            (r.get(8), r.get(9), r.get(10), r.get(11));
        let (last_id, sent, missed, refused): (Option<i64>, i64, i64, i64) =
            (r.get(12), r.get(13), r.get(14), r.get(15));
        let (priority, grp, delay_ms): (i16, Option<String>, i64) = (r.get(16), r.get(17), r.get(18));
        let (skipped, suspended): (i64, Option<String>) = (r.get(19), r.get(20));
        d.execute(
            "INSERT INTO mwmq_schedules (name, queue_id, cron, tz, body, key_prefix, catchup, sender, created_by,
                                         created_at, next_at, last_tick, last_run_at, last_id, sent, missed, refused,
                                         priority, grp, delay_ms, skipped, suspended)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::timestamptz, $11::text::timestamptz, $12::text::timestamptz,
                     $13::text::timestamptz, $14, $15, $16, $17, $18, $19, $20, $21, $22)
             ON CONFLICT (name) DO NOTHING",
            &[
                &name,
                &dst_id,
                &cron,
                &tz,
                &body,
                &key_prefix,
                &catchup,
                &sender,
                &created_by,
                &created_at,
                &next_at,
                &last_tick,
                &last_run_at,
                &last_id,
                &sent,
                &missed,
                &refused,
                &priority,
                &grp,
                &delay_ms,
                &skipped,
                &suspended,
            ],
        )?;
    }
    Ok(rows.len() as u64)
}

/// Moves up to `limit` archived messages of the queue (oldest first), in
/// the two transactions given: how many.
fn move_archive(
    s: &mut postgres::Transaction,
    d: &mut postgres::Transaction,
    src_id: i64,
    dst_id: i64,
    limit: i64,
) -> Result<u64, postgres::Error> {
    let rows = s.query(
        "DELETE FROM mwmq_archive a USING (SELECT queue_id, id FROM mwmq_archive WHERE queue_id = $1
                                          ORDER BY acked_at, id LIMIT $2) t
         WHERE a.queue_id = t.queue_id AND a.id = t.id
         RETURNING a.id, a.sender, a.receiver, a.body, a.sent_at, a.deliveries, a.acked_at, a.acked_by",
        &[&src_id, &limit],
    )?;
    if rows.is_empty() {
        return Ok(0);
    }
    let insert = d.prepare(
        "INSERT INTO mwmq_archive (queue_id, id, sender, receiver, body, sent_at, deliveries, acked_at, acked_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
    )?;
    for r in &rows {
        let (id, sender, receiver, body): (i64, String, Option<String>, Vec<u8>) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let (sent, deliveries, acked, by): (std::time::SystemTime, i32, std::time::SystemTime, Option<String>) =
            (r.get(4), r.get(5), r.get(6), r.get(7));
        d.execute(&insert, &[&dst_id, &id, &sender, &receiver, &body, &sent, &deliveries, &acked, &by])?;
    }
    Ok(rows.len() as u64)
}
