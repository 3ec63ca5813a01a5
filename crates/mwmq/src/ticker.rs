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
//! so a schedule created by another process is seen within that. A
//! schedule another process holds is not "due" to this one: before, its
//! past `next_at` woke this ticker at once, and a process holding a
//! schedule for a while (a tick waiting for a lock) made every other
//! process run empty passes back to back, thousands a second.
//!
//! **A tick that waits holds back no other schedule.** Each schedule's
//! tick runs in a savepoint of the pass, and waits at most
//! [`LOCK_WAIT_MS`] for a lock another transaction holds: an application's
//! transaction that sent the tick's KEY (`mwmq.send(..., key => ...)`, from
//! a role that may send to the queue) and stays open, or one that sent the
//! queue's first message with a priority. Before, such a tick waited for
//! the statement timeout and failed the whole pass, every pass, so that no
//! schedule of the database (of any user) was sent while the transaction
//! stayed open. Now that schedule's tick is rolled back to its savepoint,
//! the others are sent, and it is left out of the passes for half of
//! `schedule_ms` before it is tried again (retried while on time, then
//! missed as CATCHUP says); a warning says so once, and a line when it sends.
//!
//! **A tick is sent only while its owner may send it.** A schedule sends as
//! the user who made it, and users live in each process's configuration:
//! mwmq restarted with a configuration that dropped the user or its admin
//! right on the queue (what QSCHEDULE asked for), or lowered its
//! `max_body`, or another process on the database with another `[[users]]`
//! table, does not know what the first one allowed. So the process holding
//! a tick checks, with its own users ([`refusal`]), that the owner may
//! still make the schedule; if not, the tick is **skipped** (counted in
//! `skipped`, not sent, the schedule goes on to its next tick) and the
//! schedule is **suspended** with the reason, which QSCHEDULES shows, until
//! a tick finds the owner allowed again (or QSCHEDULE replaces it). Each
//! process logs a warning once per schedule and reason, and a line when it
//! sends again. With several processes whose user tables differ, each tick
//! is decided by the process that holds it, as each SEND is by the process
//! that receives it: keep the tables the same. A process without users
//! checks nothing (anyone may send there).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::db::schedules::{self, Done, Due};
use crate::schedule::{self as time, Catchup, Timetable};
use crate::shared::Shared;
use crate::users::{Right, Users};

/// Schedules one pass takes at most (the rest: the next pass, at once).
pub const BATCH: i64 = 32;

/// Longest reason a schedule is suspended for, in bytes (it names a user
/// and a queue, of at most 200 bytes each).
pub const MAX_REASON: usize = 512;

/// Schedules a ticker remembers having warned about (past that many it
/// forgets them all, and may warn again).
const MAX_WARNED: usize = 10_000;

/// The longest a tick waits for a lock another transaction holds, ms
/// (`lock_timeout` in the pass): the tick is tried again in a later pass.
pub const LOCK_WAIT_MS: u64 = 200;

/// Why the owner of a schedule (`created_by`) may not send its ticks to
/// `queue` (bodies of `body_len` bytes) by this process's `users`; `None`
/// when it may (always without users). `max_body`: the server's.
pub fn refusal(
    users: &Users,
    max_body: usize,
    created_by: Option<&str>,
    queue: &str,
    body_len: usize,
) -> Option<String> {
    if !users.enabled() {
        return None;
    }
    let Some(name) = created_by else {
        return Some("it was made without users and this mwmq has users: QSCHEDULE it again as one".into());
    };
    let Some(user) = users.get(name) else {
        return Some(format!("its owner {name} is not one of this mwmq's users"));
    };
    if !user.may(Right::Admin, queue) {
        return Some(format!("its owner {name} has no permissions to administer queue '{queue}'"));
    }
    let (max, whose) = match user.max_body {
        Some(m) if m < max_body => (m, format!("its owner {name}'s")),
        _ => (max_body, "the server's".to_string()),
    };
    (body_len > max).then(|| format!("its body of {body_len} bytes is over {whose} limit of {max} bytes (max_body)"))
}

/// `text` cut to at most `most` bytes, on a character's boundary.
fn cut(mut text: String, most: usize) -> String {
    if text.len() > most {
        let mut end = most;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The schedules this ticker warned about, and why (a warning once per
/// schedule and reason, and a line when it sends again).
#[derive(Default)]
struct Warned(HashMap<String, String>);

/// The schedules whose tick failed in a pass of this ticker (a lock held
/// past [`LOCK_WAIT_MS`], or another error of that schedule's alone): each
/// left out of the passes until its time here, and whether it was warned
/// about (a warning once, a line when it sends again).
#[derive(Default)]
struct Held {
    until: HashMap<String, Instant>,
    warned: std::collections::HashSet<String>,
}

impl Held {
    /// The schedules left out of a pass at `now`.
    fn names(&mut self, now: Instant) -> Vec<String> {
        self.until.retain(|_, t| *t > now);
        self.until.keys().cloned().collect()
    }

    /// Schedule `name`'s tick failed (`why`): left out until `until`.
    fn failed(&mut self, name: &str, why: &str, until: Instant) {
        if self.until.len() >= MAX_WARNED || self.warned.len() >= MAX_WARNED {
            self.until.clear();
            self.warned.clear();
        }
        self.until.insert(name.to_string(), until);
        if self.warned.insert(name.to_string()) {
            tracing::warn!(schedule = %name, "schedule's tick not sent, tried again in a later pass: {why}");
        }
    }

    /// Schedule `name` went through a pass.
    fn passed(&mut self, name: &str) {
        if self.warned.remove(name) {
            tracing::info!(schedule = %name, "schedule's tick went through");
        }
    }
}

impl Warned {
    /// Logs what changed for schedule `name` in this process's eyes: now
    /// suspended for `why`, or sending again (`None`) after this process
    /// warned (not after another's: two processes whose users differ would
    /// log each tick).
    fn note(&mut self, name: &str, why: Option<&str>) {
        match why {
            Some(why) if self.0.get(name).map(String::as_str) != Some(why) => {
                if self.0.len() >= MAX_WARNED {
                    self.0.clear();
                }
                self.0.insert(name.to_string(), why.to_string());
                tracing::warn!(schedule = %name, "schedule suspended: its ticks are skipped, not sent: {why}");
            }
            Some(_) => {}
            None => {
                if self.0.remove(name).is_some() {
                    tracing::info!(schedule = %name, "schedule sends again: its owner may send to its queue");
                }
            }
        }
    }
}

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
    let mut warned = Warned::default();
    let mut held = Held::default();
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
        match pass(&shared, c, grace, poll / 2, &mut warned, &mut held) {
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

/// One pass: the schedules due (but those `held` back), each tick's
/// message and the move of the schedule, in one transaction, each schedule
/// in a savepoint of its own; how long until the next tick due (ms; 0: more
/// may be due now, `None`: no schedule).
fn pass(
    shared: &Shared,
    c: &mut postgres::Client,
    grace: chrono::Duration,
    retry: Duration,
    warned: &mut Warned,
    held: &mut Held,
) -> Result<Option<i64>, postgres::Error> {
    let mut tx = c.transaction()?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = {LOCK_WAIT_MS}"))?;
    let due = schedules::due(&mut tx, BATCH, &held.names(Instant::now()))?;
    let mut woken = Vec::new();
    for d in &due {
        if d.dropped {
            schedules::forget(&mut tx, &d.name)?;
            warned.0.remove(&d.name);
            continue;
        }
        let mut sp = tx.savepoint("tick")?;
        let done = schedules::body(&mut sp, &d.name).and_then(|body| {
            let sent_len = time::body_for(&body, &time::tick_text(DateTime::<Utc>::UNIX_EPOCH)).len();
            let why =
                refusal(&shared.users, shared.config.server.max_body, d.created_by.as_deref(), &d.queue, sent_len)
                    .map(|w| cut(w, MAX_REASON));
            let done = fire(&mut sp, d, &body, grace, why)?;
            schedules::done(&mut sp, &d.name, &done)?;
            Ok(done)
        });
        match done {
            Ok(done) => {
                sp.commit()?;
                held.passed(&d.name);
                warned.note(&d.name, done.suspended.as_deref());
                if done.sent > 0 {
                    woken.push((d.queue.clone(), d.priority > 0));
                }
            }
            Err(e) if crate::db::connection_lost(&e) => return Err(e),
            Err(e) => {
                sp.rollback()?;
                let why = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string());
                held.failed(&d.name, &why, Instant::now() + retry);
            }
        }
    }
    let next = if due.len() as i64 == BATCH { Some(0) } else { schedules::next_due_ms(&mut tx)? };
    tx.commit()?;
    for (q, prioritized) in woken {
        // (As a SEND with a PRIORITY does: this process's RECVs go straight to
        // the statements that walk the priorities.)
        if prioritized {
            shared.prioritized.found(&q);
        }
        shared.waiters.sent(&shared.queue, &q);
    }
    Ok(next)
}

/// Sends what a pass sends of schedule `d`, or skips it: `suspended` says
/// why its owner may not send it.
fn fire(
    tx: &mut postgres::Transaction,
    d: &Due,
    body: &[u8],
    grace: chrono::Duration,
    suspended: Option<String>,
) -> Result<Done, postgres::Error> {
    let t = match Timetable::new(&d.cron, &d.tz) {
        Ok(t) => t,
        Err(e) => {
            // (Checked when it was made; a time zone gone from a newer tz database.)
            tracing::warn!(schedule = %d.name, "schedule stopped: {e}");
            return Ok(Done { next_us: None, suspended, ..Done::default() });
        }
    };
    let catchup = Catchup::parse(&d.catchup).unwrap_or_default();
    let plan = time::plan(&t, at(d.next_us), at(d.now_us), grace, catchup);
    let mut done = Done { next_us: plan.next_at.map(us), missed: plan.missed as i64, ..Done::default() };
    if suspended.is_some() {
        done.skipped = plan.send.len() as i64;
        done.suspended = suspended;
        return Ok(done);
    }
    for tick in plan.send {
        let text = time::tick_text(tick);
        let key = format!("{}{text}", d.key_prefix);
        match schedules::send(tx, d, &key, &time::body_for(body, &text))? {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::users::UserConfig;

    /// An argon2 PHC string (never checked here: no one logs in).
    const HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$aGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGg";

    fn users(list: &[(&str, &[&str], Option<usize>)]) -> Users {
        let configs: Vec<UserConfig> = list
            .iter()
            .map(|(name, admin, max_body)| UserConfig {
                name: name.to_string(),
                password_hash: HASH.into(),
                admin: admin.iter().map(|p| p.to_string()).collect(),
                max_body: *max_body,
                ..UserConfig::default()
            })
            .collect();
        Users::from_config(&configs).unwrap()
    }

    #[test]
    fn an_owner_who_lost_the_right_or_is_gone_sends_nothing() {
        let none = users(&[]);
        assert_eq!(refusal(&none, 10, None, "jobs", 1_000), None, "without users nothing is checked");
        let u = users(&[("alice", &["jobs.*"], Some(100)), ("bob", &["*"], None)]);
        assert_eq!(refusal(&u, 4096, Some("alice"), "jobs.a", 100), None);
        assert_eq!(refusal(&u, 4096, Some("bob"), "other", 4096), None);
        assert_eq!(
            refusal(&u, 4096, Some("alice"), "other", 10).unwrap(),
            "its owner alice has no permissions to administer queue 'other'"
        );
        assert_eq!(
            refusal(&u, 4096, Some("carol"), "jobs.a", 10).unwrap(),
            "its owner carol is not one of this mwmq's users"
        );
        assert!(refusal(&u, 4096, None, "jobs.a", 10).unwrap().contains("made without users"));
        assert_eq!(
            refusal(&u, 4096, Some("alice"), "jobs.a", 101).unwrap(),
            "its body of 101 bytes is over its owner alice's limit of 100 bytes (max_body)"
        );
        assert!(refusal(&u, 4096, Some("bob"), "x", 4097)
            .unwrap()
            .ends_with("over the server's limit of 4096 bytes (max_body)"));
        assert!(refusal(&u, 50, Some("alice"), "jobs.a", 51).unwrap().contains("the server's limit of 50 bytes"));
    }

    #[test]
    fn a_reason_is_cut_on_a_character() {
        assert_eq!(cut("éé".into(), 3), "é");
        assert_eq!(cut("abc".into(), 5), "abc");
        let long = format!("its owner {} is not one of this mwmq's users", "é".repeat(400));
        assert!(cut(long, MAX_REASON).len() <= MAX_REASON);
    }
}
