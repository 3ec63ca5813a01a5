//! The threads behind long polls (`waiters.rs`) and the database's events.
//!
//! A `RECV ... WAIT ms` that finds nothing does not hold a worker: the worker
//! parks the request here and takes other work. A parked request goes back to
//! the request queue when its queue may have a message for it:
//!
//! - a SEND to that queue committed in this process (woken at once);
//! - another mwmq process on the same database announced one (PostgreSQL
//!   `LISTEN mwmq` / `NOTIFY`, payload = queue name); each process announces
//!   its queues' new messages at most every `notify_ms`, from its events
//!   thread, so a burst of SENDs costs one notification, not one each. A
//!   notification is a hint for the shared poll, which looks (one statement
//!   for a burst of them, at most every `wake_ms`) and wakes as many
//!   waiters as it found messages for;
//! - the shared poll (`poller.rs`) found that it may have one (the fallback:
//!   a notification lost while the events connection reconnected, a message
//!   whose DELAY or lease ran out), one statement per database every
//!   `poll_ms` for all the waiting requests;
//! - its wait is over (then it is answered with whatever there is, maybe nothing).
//!
//! The events thread also keeps the database tidy every `maintenance_s`:
//! messages and keys of dropped queues, and deduplication keys older than
//! `dedup_window_s`.
//!
//! The vacuum thread keeps the messages table from filling with dead rows:
//! every message is inserted, leased (a new row version) and deleted, so a
//! busy queue leaves thousands of dead rows a second at the head of the
//! index every receiver walks. Autovacuum looks at a table at most once per
//! `autovacuum_naptime` (a minute by default), and between two of its runs
//! the receivers' walks grow longer and throughput sinks (measured: a third
//! lower after 80 s; docs/mwmq.md). Every `vacuum_s` the thread asks the
//! statistics how many dead rows there are and vacuums the table past
//! `vacuum_min_dead` (`SKIP_LOCKED`: a vacuum already running, from
//! autovacuum or another mwmq, is left to finish).

use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;

use crate::shared::Shared;
use crate::waiters::Waiters;

/// The channel of mwmq's notifications.
pub const CHANNEL: &str = "mwmq";

/// The timer thread: answers parked requests whose wait is over, and frees
/// those whose client left (the net thread frees most of them at once: this
/// catches one parked while its client was leaving). Runs until the waiters
/// stop. (Looking again for what parked requests wait for is the shared
/// poll's: `poller.rs`.)
pub fn run_timer_thread(shared: Arc<Shared>) {
    let w = &shared.waiters;
    // A client that left is noticed within this, whatever the waits' ends.
    let sweep = Duration::from_millis(shared.config.queues.poll_ms.clamp(1, 1000));
    loop {
        let (next, gone) = w.due(&shared.queue, Instant::now());
        for job in gone {
            abandon(&shared, job, true);
        }
        let next = next.map_or(Instant::now() + sweep, |d| d.min(Instant::now() + sweep));
        let s = w.lock();
        if s.stopping {
            break;
        }
        // A newly parked request may have an earlier deadline: `park` wakes us.
        let _ = w.changed.wait_timeout(s, next.saturating_duration_since(Instant::now()));
    }
}

/// Frees a waiting request whose client left: no statement, no reply; its
/// input budget goes back and its connection is no longer busy (the net
/// thread is told when `tell_net`: not by the net thread itself, whose
/// channel it would fill).
pub(crate) fn abandon(shared: &Shared, job: Box<crate::engine::job::Job>, tell_net: bool) {
    shared.input.give(job.size);
    if job.conn.finish_request() && tell_net {
        shared.done(crate::engine::job::Done { token: job.token, conn_id: job.conn.id });
    }
}

/// The listener thread (with `notify`): LISTENs on its own connection and
/// hands every queue or stream another process announced to the poller as a
/// hint (`poller.rs`): anyone who can log in to the database can NOTIFY on
/// the channel, so a notification wakes nobody by itself.
pub fn run_listener_thread(shared: Arc<Shared>, db: usize) {
    let cfg = &shared.config.for_database(db);
    let w = &shared.waiters;
    let mut backoff = Duration::from_millis(cfg.database.retry_min_ms);
    while !w.lock().stopping {
        let mut c = match crate::db::connect(cfg)
            .and_then(|mut c| c.batch_execute(&format!("LISTEN {CHANNEL}")).map(|_| c).map_err(|e| e.to_string()))
        {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("listener connection: {e}");
                sleep_on(w, backoff);
                backoff = (backoff * 2).min(Duration::from_millis(cfg.database.retry_max_ms));
                continue;
            }
        };
        backoff = Duration::from_millis(cfg.database.retry_min_ms);
        // Whatever was announced while not listening was missed: look again.
        w.poll_now();
        loop {
            if w.lock().stopping {
                return;
            }
            let mut failed = false;
            {
                let mut n = c.notifications();
                let mut it = n.timeout_iter(Duration::from_millis(200));
                // (Back to the stop's check after a quiet 200 ms or 1024 notifications.)
                for _ in 0..1024 {
                    match it.next() {
                        Ok(Some(note)) => w.hint(note.payload()),
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!("notifications: {e}");
                            failed = true;
                            break;
                        }
                    }
                }
            }
            if failed || c.is_closed() {
                break;
            }
        }
    }
}

/// The notifier thread: announces this process's new messages (at most every
/// `notify_ms`, one NOTIFY per queue per batch) and runs the maintenance, on
/// its own connection.
pub fn run_notifier_thread(shared: Arc<Shared>) {
    let cfg = &shared.config;
    let w = &shared.waiters;
    let debounce = Duration::from_millis(cfg.database.notify_ms);
    let maintenance_every = Duration::from_secs(cfg.queues.maintenance_s);
    let mut next_maintenance = Instant::now() + maintenance_every;
    let mut backoff = Duration::from_millis(cfg.database.retry_min_ms);
    // A connection per database (`[[databases]]`): a queue is announced on its own.
    let dbs = shared.pool.len();
    let configs: Vec<crate::config::Config> = (0..dbs).map(|d| cfg.for_database(d)).collect();
    let mut conns: Vec<Option<postgres::Client>> = (0..dbs).map(|_| None).collect();
    loop {
        let (announce, tidy) = {
            let mut s = w.lock();
            loop {
                if s.stopping {
                    return;
                }
                let due = Instant::now() >= next_maintenance;
                if !s.announce.is_empty() || s.tidy || due {
                    break;
                }
                let wait = next_maintenance.saturating_duration_since(Instant::now());
                s = w.announced.wait_timeout(s, wait).unwrap_or_else(|p| p.into_inner()).0;
            }
            (std::mem::take(&mut s.announce), std::mem::take(&mut s.tidy))
        };
        let maintain = tidy || Instant::now() >= next_maintenance;
        if maintain {
            next_maintenance = Instant::now() + maintenance_every;
        }
        let mut failed = false;
        for (d, conn) in conns.iter_mut().enumerate() {
            let queues: Vec<String> = announce.iter().filter(|q| shared.pool.home(q) == d).cloned().collect();
            if queues.is_empty() && !maintain {
                continue;
            }
            if conn.as_ref().is_none_or(|c| c.is_closed()) {
                match crate::db::connect(&configs[d]) {
                    Ok(c) => *conn = Some(c),
                    Err(e) => {
                        tracing::debug!("notifier connection: {e}");
                        // Waiters elsewhere fall back to polling; keep what is owed.
                        let mut s = w.lock();
                        s.announce.extend(queues);
                        s.tidy |= maintain;
                        failed = true;
                        continue;
                    }
                }
            }
            let c = conn.as_mut().expect("connected above");
            if !queues.is_empty() {
                let sql = format!("SELECT pg_notify('{CHANNEL}', q) FROM unnest($1::text[]) AS q");
                if let Err(e) = c.execute(&sql, &[&queues]) {
                    tracing::debug!("notify failed: {e}");
                }
            }
            if maintain {
                if let Err(e) = maintenance(c, cfg.queues.dedup_window_s) {
                    tracing::warn!("maintenance failed: {e}");
                }
                match c.query("SELECT name FROM mwmq_queues WHERE paused AND dropped_at IS NULL", &[]) {
                    Ok(rows) => shared.paused.refresh(d, rows.iter().map(|r| r.get(0))),
                    Err(e) => tracing::debug!("paused queues: {e}"),
                }
            }
        }
        if failed {
            sleep_on(w, backoff);
            backoff = (backoff * 2).min(Duration::from_millis(cfg.database.retry_max_ms));
            continue;
        }
        backoff = Duration::from_millis(cfg.database.retry_min_ms);
        // Debounce: a burst of SENDs is announced once per interval.
        std::thread::sleep(debounce);
    }
}

/// How often the directory thread looks for queues that are not where
/// placement puts them (`mwmq rebalance` waits longer than this between
/// creating a queue on its new database and draining the old one).
pub const DIRECTORY_EVERY: Duration = Duration::from_secs(1);

/// The directory thread (several databases): every [`DIRECTORY_EVERY`]
/// lists each database's queues, so that a queue not yet moved to the
/// database placement names (one was added) is served where it is, and one
/// that was moved is served on its new database.
pub fn run_directory_thread(shared: Arc<Shared>) {
    let configs: Vec<_> = (0..shared.pool.len()).map(|i| shared.config.for_database(i)).collect();
    let mut conns: Vec<Option<postgres::Client>> = configs.iter().map(|_| None).collect();
    let w = &shared.waiters;
    loop {
        sleep_on(w, DIRECTORY_EVERY);
        if w.lock().stopping {
            return;
        }
        shared.pool.found(&queue_names(&configs, &mut conns));
    }
}

/// Each database's queues (`None` for one that did not answer), on the
/// connections in `conns` (opened where missing, dropped after a failure).
pub fn queue_names(
    configs: &[crate::config::Config],
    conns: &mut [Option<postgres::Client>],
) -> Vec<Option<Vec<String>>> {
    configs
        .iter()
        .zip(conns.iter_mut())
        .map(|(cfg, conn)| {
            if conn.as_ref().is_none_or(|c| c.is_closed()) {
                *conn = crate::db::connect(cfg).ok();
            }
            let c = conn.as_mut()?;
            match c.query("SELECT name FROM mwmq_queues WHERE dropped_at IS NULL", &[]) {
                Ok(rows) => Some(rows.iter().map(|r| r.get(0)).collect()),
                Err(e) => {
                    tracing::debug!("directory: {e}");
                    *conn = None;
                    None
                }
            }
        })
        .collect()
}

/// Sleeps `wait` or until the process stops; whether it is stopping.
pub(crate) fn sleep_unless_stopping(w: &Waiters, wait: Duration) -> bool {
    sleep_on(w, wait);
    w.lock().stopping
}

fn sleep_on(w: &Waiters, wait: Duration) {
    let s = w.lock();
    if !s.stopping {
        let _ = w.changed.wait_timeout(s, wait);
    }
}

/// Removes what dropped queues left and deduplication keys past their window.
pub fn maintenance(c: &mut postgres::Client, dedup_window_s: u64) -> Result<(), postgres::Error> {
    let window = dedup_window_s as f64;
    c.execute(
        "DELETE FROM mwmq_messages WHERE queue_id IN (SELECT id FROM mwmq_queues WHERE dropped_at IS NOT NULL)",
        &[],
    )?;
    c.execute(
        "DELETE FROM mwmq_keys WHERE queue_id IN (SELECT id FROM mwmq_queues WHERE dropped_at IS NOT NULL)
         OR created_at < now() - interval '1 second' * $1::float8",
        &[&window],
    )?;
    // A dropped queue's row stays until its archive is gone (`retention.rs`).
    c.execute(
        "DELETE FROM mwmq_queues q WHERE q.dropped_at IS NOT NULL
         AND NOT EXISTS (SELECT 1 FROM mwmq_messages m WHERE m.queue_id = q.id)
         AND NOT EXISTS (SELECT 1 FROM mwmq_keys k WHERE k.queue_id = q.id)
         AND NOT EXISTS (SELECT 1 FROM mwmq_archive a WHERE a.queue_id = q.id)",
        &[],
    )?;
    Ok(())
}

/// Runs `job` every `every` on a connection of its own (opened by `open`,
/// and again when `job` finds it lost), until mwmq stops; `what` names it in
/// the log. What `job` does not handle itself is logged at debug level.
pub(crate) fn every_on_own_connection(
    shared: &Shared,
    every: Duration,
    what: &str,
    open: impl Fn() -> Result<postgres::Client, String>,
    mut job: impl FnMut(&mut postgres::Client) -> Result<(), postgres::Error>,
) {
    let w = &shared.waiters;
    let mut conn: Option<postgres::Client> = None;
    loop {
        sleep_on(w, every);
        if w.lock().stopping {
            return;
        }
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            match open() {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!("{what} connection: {e}");
                    continue;
                }
            }
        }
        if let Err(e) = job(conn.as_mut().expect("connected above")) {
            tracing::debug!("{what}: {e}");
            // The database went away (a restart): open a new connection next time.
            if crate::db::connection_lost(&e) {
                conn = None;
            }
        }
    }
}

/// The vacuum thread (`vacuum_s` > 0): vacuums `mwmq_messages` when it holds
/// `vacuum_min_dead` dead rows or more, on its own connection.
pub fn run_vacuum_thread(shared: Arc<Shared>, db: usize) {
    let cfg = &shared.config.for_database(db);
    let min_dead = i64::try_from(cfg.queues.vacuum_min_dead).unwrap_or(i64::MAX);
    let mut warned = false;
    // Not bound by the statement deadline of the workers' connections: a
    // vacuum of a large table may take longer, and nobody waits for it.
    let open = || {
        crate::db::connect(cfg)
            .and_then(|mut c| c.batch_execute("SET statement_timeout = 0").map(|()| c).map_err(|e| e.to_string()))
    };
    every_on_own_connection(&shared, Duration::from_secs(cfg.queues.vacuum_s), "vacuum", open, |c| {
        match vacuum_if_needed(c, min_dead) {
            Ok(true) => {
                shared.vacuums.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) if !warned && !crate::db::connection_lost(&e) => {
                // E.g. a database user that does not own the table may not vacuum it.
                let why = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string());
                tracing::warn!("vacuum of mwmq_messages failed (left to autovacuum): {why}");
                warned = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    });
}

/// Vacuums the messages table if it has `min_dead` dead rows or more; whether it did.
fn vacuum_if_needed(c: &mut postgres::Client, min_dead: i64) -> Result<bool, postgres::Error> {
    let dead: i64 = c
        .query_one(
            "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
                              WHERE relid = 'mwmq_messages'::regclass), 0)",
            &[],
        )?
        .get(0);
    if dead < min_dead {
        return Ok(false);
    }
    c.batch_execute("VACUUM (SKIP_LOCKED) mwmq_messages")?;
    Ok(true)
}

/// The sampling thread: until the process stops. The first sample only
/// notes the counters (nothing happened before it as far as it knows).
pub fn run_rates_thread(shared: Arc<Shared>) {
    let period = Duration::from_millis(shared.config.queues.rates_sample_ms);
    loop {
        shared.rates.sample(shared.queues.all(), mwstats::clock::unix_ms());
        if sleep_unless_stopping(&shared.waiters, period) {
            return;
        }
    }
}

/// The purge thread of database `db`: [`crate::retention::purge`] every `purge_ms`, on a
/// connection of its own.
pub fn run_purge_thread(shared: std::sync::Arc<crate::shared::Shared>, db: usize) {
    let cfg = shared.config.for_database(db);
    let every = std::time::Duration::from_millis(cfg.queues.purge_ms);
    every_on_own_connection(
        &shared,
        every,
        "purge",
        || crate::db::connect(&cfg),
        |c| {
            let n = crate::retention::purge(c)?;
            if n > 0 {
                tracing::debug!(purged = n, "acknowledged messages kept long enough deleted");
            }
            Ok(())
        },
    );
}
