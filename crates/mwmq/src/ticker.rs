//! The ticker: a thread per database in every mwmq process that sends the
//! messages of the schedules due there (`QSCHEDULE`).
//!
//! **One message per tick, whichever process and whatever fails.** A pass
//! is one transaction on the ticker's own connection: it locks the
//! schedules due (`FOR UPDATE SKIP LOCKED`: a schedule another process is
//! sending is skipped, and seen again only once that one has moved its next
//! tick on), inserts each tick's message — a SEND with the KEY made of the
//! schedule's prefix and the tick — and moves the schedule's `next_at` past
//! the ticks it sent, then commits. The message and the move commit
//! together or not at all: a process SIGKILLed between the tick and the
//! send, or a database that restarts mid-pass, leaves the schedule as it
//! was (PostgreSQL rolls the open transaction back), and the next pass of
//! any process sends that tick, late but within the grace. A commit whose
//! answer was lost has moved `next_at`, so nothing is sent twice. The KEY
//! is a second guard: a tick's message is recognisable (`{tick}` in the
//! body, the KEY) and a SEND of a key already there returns the first id
//! rather than storing another, e.g. after `mwmq rebalance` carried the
//! keys to another database.
//!
//! **The clock is the database's** (`now()` at the start of the pass), so
//! processes on hosts whose clocks differ agree on which ticks are due.
//! Which ticks a pass sends — on time, or missed and then as CATCHUP says —
//! is `schedule::plan`.
//!
//! A pass takes at most [`BATCH`] schedules; the thread sleeps until the
//! next tick due (asked of the database), at most `[queues] schedule_ms`,
//! so a schedule created by another process is seen within that.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::db::schedules::{self, Done, Due};
use crate::schedule::{self as time, Catchup, Timetable};
use crate::shared::Shared;

/// Schedules one pass takes at most (the rest: the next pass, at once).
pub const BATCH: i64 = 32;

fn at(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// Sleeps until `until` unless mwmq stops first; whether it stops.
fn nap(shared: &Shared, until: Instant) -> bool {
    loop {
        let now = Instant::now();
        if now >= until {
            return shared.waiters.lock().stopping;
        }
        if crate::events::sleep_unless_stopping(&shared.waiters, until - now) {
            return true;
        }
    }
}

/// The ticker of database `db`, until mwmq stops.
pub fn run_ticker_thread(shared: Arc<Shared>, db: usize) {
    let cfg = shared.config.for_database(db);
    let poll = Duration::from_millis(cfg.queues.schedule_ms);
    let grace = chrono::Duration::milliseconds(i64::try_from(cfg.queues.schedule_grace_ms).unwrap_or(i64::MAX));
    let mut conn: Option<postgres::Client> = None;
    let mut wait = Duration::ZERO;
    loop {
        if nap(&shared, Instant::now() + wait) {
            return;
        }
        wait = poll;
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            match crate::db::connect(&cfg) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!("ticker connection: {e}");
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        match pass(&shared, c, grace).and_then(|more| if more { Ok(Some(0)) } else { schedules::next_due_ms(c) }) {
            Ok(next) => {
                if let Some(ms) = next {
                    wait = Duration::from_millis(ms.max(0) as u64).min(poll);
                }
            }
            Err(e) => {
                if crate::db::connection_lost(&e) {
                    tracing::debug!("ticker: {e}");
                    conn = None;
                } else {
                    tracing::warn!("ticker: {}", e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().into()));
                }
            }
        }
    }
}

/// One pass: the schedules due, each tick's message and the move of the
/// schedule, in one transaction; whether more may be due.
fn pass(shared: &Shared, c: &mut postgres::Client, grace: chrono::Duration) -> Result<bool, postgres::Error> {
    let mut tx = c.transaction()?;
    let due = schedules::due(&mut tx, BATCH)?;
    let mut woken = Vec::new();
    for d in &due {
        if d.dropped {
            schedules::forget(&mut tx, &d.name)?;
            continue;
        }
        let done = fire(&mut tx, d, grace)?;
        schedules::done(&mut tx, &d.name, &done)?;
        if done.sent > 0 {
            woken.push(d.queue.clone());
        }
    }
    tx.commit()?;
    for q in woken {
        shared.waiters.sent(&shared.queue, &q);
    }
    Ok(due.len() as i64 == BATCH)
}

/// Sends what a pass sends of schedule `d`.
fn fire(tx: &mut postgres::Transaction, d: &Due, grace: chrono::Duration) -> Result<Done, postgres::Error> {
    let t = match Timetable::new(&d.cron, &d.tz) {
        Ok(t) => t,
        Err(e) => {
            // (Checked when it was made; a time zone gone from a newer tz database.)
            tracing::warn!(schedule = %d.name, "schedule stopped: {e}");
            return Ok(Done { next_us: None, ..Done::default() });
        }
    };
    let catchup = Catchup::parse(&d.catchup).unwrap_or_default();
    let plan = time::plan(&t, at(d.next_us), at(d.now_us), grace, catchup);
    let mut done = Done { next_us: plan.next_at.map(us), missed: plan.missed as i64, ..Done::default() };
    for tick in plan.send {
        let text = time::tick_text(tick);
        let key = format!("{}{text}", d.key_prefix);
        match schedules::send(tx, d.queue_id, &key, &d.sender, &time::body_for(&d.body, &text))? {
            Some(id) => {
                done.sent += 1;
                done.last_id = Some(id);
                done.last_tick_us = Some(us(tick));
            }
            None => done.refused += 1,
        }
    }
    if done.missed > 0 || done.refused > 0 {
        tracing::info!(schedule = %d.name, missed = done.missed, refused = done.refused, "schedule's ticks not sent");
    }
    Ok(done)
}
