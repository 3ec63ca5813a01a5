//! Periodic jobs' statements (`sql/schedules.sql`, schema 18): the
//! commands' (QSCHEDULE, QUNSCHEDULE, QSCHEDULES), run on a command's
//! connection like any statement, and the ticker's (`ticker.rs`), run in
//! one transaction on a blocking connection of its own. Times are
//! microseconds since the Unix epoch, read from the database's clock.

use super::statements::Texts;
use super::streams::redis_error;
use super::{DbError, PgConn};

/// The statements of `sql/schedules.sql` this file runs (its test checks
/// that the file has each, and no other).
pub const STATEMENTS: &[&str] =
    &["clock", "put", "elsewhere", "remove", "list", "due", "body", "sent", "unkey", "done", "forget", "next_due"];

fn sql(name: &str) -> &'static str {
    Texts::schedules().get(name)
}

/// A new or replacing schedule, as QSCHEDULE gives it.
#[derive(Debug, Clone)]
pub struct NewSchedule<'a> {
    /// Its name.
    pub name: &'a str,
    /// The queue it sends to.
    pub queue: &'a str,
    /// The cron expression, as given.
    pub cron: &'a str,
    /// The IANA time zone it is read in.
    pub tz: &'a str,
    /// Each message's body (`{tick}` replaced when sent).
    pub body: &'a [u8],
    /// Each message's KEY is this and the tick.
    pub key_prefix: &'a str,
    /// `none`, `one` or `all`.
    pub catchup: &'a str,
    /// Each message's sender.
    pub sender: &'a str,
    /// The user creating it (`None`: no users).
    pub who: Option<&'a str>,
    /// The user's admin patterns as LIKE patterns (`None`: no users).
    pub admin_like: Option<Vec<String>>,
    /// The user's `max_schedules` (`None`: no limit).
    pub cap: Option<i64>,
    /// The user's schedules on the other databases.
    pub elsewhere: i64,
    /// Its first tick (µs).
    pub next_us: i64,
    /// Each message's PRIORITY.
    pub priority: i16,
    /// Each message's GROUP.
    pub group: Option<&'a str>,
    /// Each message's DELAY, ms.
    pub delay_ms: i64,
}

/// A schedule as QSCHEDULES lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRow {
    /// Its name.
    pub name: String,
    /// The queue it sends to.
    pub queue: String,
    /// Its cron expression.
    pub cron: String,
    /// Its time zone.
    pub tz: String,
    /// Its CATCHUP.
    pub catchup: String,
    /// Its messages' KEY prefix.
    pub key_prefix: String,
    /// Its body's length.
    pub body_bytes: i64,
    /// Who created it (`None`: no users).
    pub created_by: Option<String>,
    /// Its next tick, ms since the epoch (`None`: it never fires again).
    pub next_ms: Option<i64>,
    /// The latest tick it sent, ms.
    pub last_tick_ms: Option<i64>,
    /// When it sent it, ms.
    pub last_run_ms: Option<i64>,
    /// The message it sent for it.
    pub last_id: Option<i64>,
    /// Ticks sent.
    pub sent: i64,
    /// Ticks missed (CATCHUP).
    pub missed: i64,
    /// Ticks refused (the queue full).
    pub refused: i64,
    /// Each message's PRIORITY.
    pub priority: i64,
    /// Each message's GROUP.
    pub group: Option<String>,
    /// Each message's DELAY, ms.
    pub delay_ms: i64,
    /// Ticks skipped: its owner could no longer send them.
    pub skipped: i64,
    /// Why its ticks are skipped (`None`: they are not).
    pub suspended: Option<String>,
}

impl PgConn {
    /// A statement's failure, Redis's refusals (MWR01) as they are worded.
    fn refusal(&self, e: postgres::Error) -> DbError {
        match redis_error(&e) {
            Some(m) => DbError::Redis(m),
            None => self.checked::<()>(Err(e)).unwrap_err(),
        }
    }

    /// The database's clock (µs).
    pub async fn clock_us(&self) -> Result<i64, DbError> {
        let r = self.client().query_one(sql("clock"), &[]).await;
        Ok(self.checked(r)?.get(0))
    }

    /// QSCHEDULE's row: `created` or `replaced`.
    pub async fn schedule_put(&self, s: &NewSchedule<'_>) -> Result<String, DbError> {
        let r = self
            .client()
            .query_one(
                sql("put"),
                &[
                    &s.name,
                    &s.queue,
                    &s.cron,
                    &s.tz,
                    &s.body,
                    &s.key_prefix,
                    &s.catchup,
                    &s.sender,
                    &s.who,
                    &s.admin_like,
                    &s.cap,
                    &s.elsewhere,
                    &s.next_us,
                    &s.priority,
                    &s.group,
                    &s.delay_ms,
                ],
            )
            .await;
        match r {
            Ok(row) => Ok(row.get(0)),
            Err(e) => Err(self.refusal(e)),
        }
    }

    /// What this database holds of `user`'s schedules, and whether `name` is one of its.
    pub async fn schedules_here(&self, user: Option<&str>, name: &str) -> Result<(i64, bool), DbError> {
        let r = self.client().query_one(sql("elsewhere"), &[&user, &name]).await;
        let row = self.checked(r)?;
        Ok((row.get(0), row.get(1)))
    }

    /// QUNSCHEDULE on this database: the schedule's queue and whether it
    /// was removed (the caller's `admin_like` patterns allowing); `None`:
    /// no such schedule here.
    pub async fn unschedule(
        &self,
        name: &str,
        admin_like: Option<&[String]>,
    ) -> Result<Option<(String, bool)>, DbError> {
        let r = self.client().query_opt(sql("remove"), &[&name, &admin_like]).await;
        Ok(self.checked(r)?.map(|row| (row.get(0), row.get(1))))
    }

    /// QSCHEDULES on this database: those of the queues whose names match
    /// one of `see_like` (LIKE patterns; `None`: every queue), at most
    /// `most`, by name.
    pub async fn schedules(&self, see_like: Option<&[String]>, most: i64) -> Result<Vec<ScheduleRow>, DbError> {
        let r = self.client().query(sql("list"), &[&most, &see_like]).await;
        Ok(self
            .checked(r)?
            .iter()
            .map(|r| ScheduleRow {
                name: r.get(0),
                queue: r.get(1),
                cron: r.get(2),
                tz: r.get(3),
                catchup: r.get(4),
                key_prefix: r.get(5),
                body_bytes: r.get(6),
                created_by: r.get(7),
                next_ms: r.get(8),
                last_tick_ms: r.get(9),
                last_run_ms: r.get(10),
                last_id: r.get(11),
                sent: r.get(12),
                missed: r.get(13),
                refused: r.get(14),
                priority: r.get(15),
                group: r.get(16),
                delay_ms: r.get(17),
                skipped: r.get(18),
                suspended: r.get(19),
            })
            .collect())
    }
}

/// A schedule due, as the ticker takes it (locked until its transaction ends).
#[derive(Debug, Clone)]
pub struct Due {
    /// Its name.
    pub name: String,
    /// Its queue's id.
    pub queue_id: i64,
    /// Its queue.
    pub queue: String,
    /// Whether its queue was dropped.
    pub dropped: bool,
    /// Its cron expression.
    pub cron: String,
    /// Its time zone.
    pub tz: String,
    /// Its messages' KEY prefix.
    pub key_prefix: String,
    /// Its CATCHUP.
    pub catchup: String,
    /// Its messages' sender.
    pub sender: String,
    /// Its next tick (µs).
    pub next_us: i64,
    /// The database's clock (µs) at the start of the transaction.
    pub now_us: i64,
    /// Who made it (`None`: no users then).
    pub created_by: Option<String>,
    /// Its messages' PRIORITY.
    pub priority: i16,
    /// Its messages' GROUP.
    pub group: Option<String>,
    /// Its messages' DELAY, ms.
    pub delay_ms: i64,
}

/// The schedules due, at most `most`, locked in `tx`; those locked by
/// another ticker, and those named in `skip`, left out.
pub fn due(tx: &mut postgres::Transaction, most: i64, skip: &[String]) -> Result<Vec<Due>, postgres::Error> {
    Ok(tx
        .query(sql("due"), &[&most, &skip])?
        .iter()
        .map(|r| Due {
            name: r.get(0),
            queue_id: r.get(1),
            queue: r.get(2),
            dropped: r.get(3),
            cron: r.get(4),
            tz: r.get(5),
            key_prefix: r.get(6),
            catchup: r.get(7),
            sender: r.get(8),
            next_us: r.get(9),
            now_us: r.get(10),
            created_by: r.get(11),
            priority: r.get(12),
            group: r.get(13),
            delay_ms: r.get(14),
        })
        .collect())
}

/// Schedule `name`'s body (empty if it is gone).
pub fn body(tx: &mut postgres::Transaction, name: &str) -> Result<Vec<u8>, postgres::Error> {
    Ok(tx.query_opt(sql("body"), &[&name])?.map(|r| r.get(0)).unwrap_or_default())
}

/// A tick's message: its id (a new one, or the one its key was sent with
/// before by the schedule's sender); `None` when the queue refused it (full).
///
/// A message another sender put in the queue with the tick's key ahead of
/// the tick is not taken for the tick's: its key is let go and the tick's
/// message sent, so that a user who may only send cannot replace a
/// schedule's messages with their own.
pub fn send(tx: &mut postgres::Transaction, d: &Due, key: &str, body: &[u8]) -> Result<Option<i64>, postgres::Error> {
    let (queue_id, sender) = (d.queue_id, d.sender.as_str());
    // SEND ... KEY's own statement (`statements.sql`: the queue's quota,
    // the mark of a queue of priorities), addressed to no one.
    let send = Texts::get_all().get("send_key");
    let (receiver, delay) = (None::<&str>, d.delay_ms as f64);
    let args: [&(dyn postgres::types::ToSql + Sync); 8] =
        [&d.queue, &sender, &receiver, &body, &delay, &key, &d.group, &d.priority];
    if let Some(row) = tx.query_opt(send, &args)? {
        return Ok(Some(row.get(0)));
    }
    match tx.query_opt(sql("sent"), &[&queue_id, &key, &sender])? {
        Some(r) if r.get::<_, bool>(1) => {
            tx.execute(sql("unkey"), &[&queue_id, &key])?;
            Ok(tx.query_opt(send, &args)?.map(|r| r.get(0)))
        }
        Some(r) => Ok(Some(r.get(0))),
        None => Ok(None),
    }
}

/// What a pass did with a schedule.
#[derive(Debug, Clone, Default)]
pub struct Done {
    /// Its next tick (µs; `None`: never again).
    pub next_us: Option<i64>,
    /// The latest tick sent (µs).
    pub last_tick_us: Option<i64>,
    /// Its message.
    pub last_id: Option<i64>,
    /// Ticks sent.
    pub sent: i64,
    /// Ticks missed.
    pub missed: i64,
    /// Ticks refused.
    pub refused: i64,
    /// Ticks skipped (its owner may not send them).
    pub skipped: i64,
    /// Why it is suspended (`None`: it is not).
    pub suspended: Option<String>,
}

/// Records a pass over schedule `name`.
pub fn done(tx: &mut postgres::Transaction, name: &str, d: &Done) -> Result<(), postgres::Error> {
    tx.execute(
        sql("done"),
        &[&name, &d.next_us, &d.last_tick_us, &d.last_id, &d.sent, &d.missed, &d.refused, &d.skipped, &d.suspended],
    )?;
    Ok(())
}

/// Removes schedule `name` (its queue was dropped).
pub fn forget(tx: &mut postgres::Transaction, name: &str) -> Result<(), postgres::Error> {
    tx.execute(sql("forget"), &[&name])?;
    Ok(())
}

/// How long until the next tick to come of any schedule, ms (`None`:
/// none), at the end of a pass: those due at its start do not count.
pub fn next_due_ms(tx: &mut postgres::Transaction) -> Result<Option<i64>, postgres::Error> {
    Ok(tx.query_one(sql("next_due"), &[])?.get(0))
}
