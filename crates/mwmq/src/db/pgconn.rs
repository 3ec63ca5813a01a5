//! One connection and its statements: a method per statement.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postgres::Statement;

use crate::command::QueueOptions;
use crate::config::Config;

use super::connect::{connect_async, session_settings, SERVER};
use super::statements::Statements;
use super::*;

/// One open connection with its statements, spoken asynchronously: several
/// statements may be in flight on it at once (pipelined, each its own
/// transaction, each answered only after its commit: tokio-postgres reads a
/// statement's result up to the ReadyForQuery that follows the commit, and
/// an error there fails the statement).
pub struct PgConn {
    client: tokio_postgres::Client,
    st: Statements,
    /// The stream commands' statements (`streams::STATEMENTS`).
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
    /// The client (for the stream statements of `db/streams.rs`).
    pub(crate) fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Stream statement `i` (`streams::STATEMENTS`).
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
        Leased {
            db: self.db,
            queue_id: r.get(0),
            id: r.get(1),
            lease: r.get(2),
            sender: r.get(3),
            body: r.get(4),
            priority: r.get(5),
        }
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
        let SendRow { queue, sender, to, body, delay_ms, group, priority } = *row;
        let (delay, priority) = (delay_ms as f64, i16::from(priority));
        match key {
            None => {
                let r = self
                    .client
                    .query_opt(&self.st.send, &[&queue, &sender, &to, &body, &delay, &group, &priority])
                    .await;
                match self.check(r)? {
                    Some(row) => Ok(row.get(0)),
                    None => Err(self.not_sent(queue).await?),
                }
            }
            Some(k) => {
                let r = self
                    .client
                    .query_opt(&self.st.send_key, &[&queue, &sender, &to, &body, &delay, &k, &group, &priority])
                    .await;
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

    /// RECV: up to `count` messages, leased for `vt_ms`, highest priority
    /// first and then lowest id first,
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
        ranked: bool,
    ) -> Result<Received, DbError> {
        let (count, vt) = (i64::from(count), vt_ms as f64);
        let mut statements = 0;
        let mut prioritized = ranked;
        // The common case in one plain statement (unless the queue is known
        // not to be plain); an empty answer may also mean a queue with a
        // delivery limit, paused or limited (or none at all): then the full one.
        if plain_first {
            let args: [&(dyn postgres::types::ToSql + Sync); 6] = [&queue, &me, &from, &count, &vt, &maxb];
            let st = if ranked { &self.st.recv_plain_ranked } else { &self.st.recv_plain };
            let mut plain = self.check(self.client.query(st, &args).await)?;
            statements += 1;
            if !ranked && plain.last().is_some_and(|r| r.get::<_, Option<i64>>(0).is_none()) {
                // A queue with priorities: the walk over them.
                prioritized = true;
                plain = self.check(self.client.query(&self.st.recv_plain_ranked, &args).await)?;
                statements += 1;
            }
            if !plain.is_empty() {
                let mut messages: Vec<Leased> = plain.iter().map(|r| self.leased(r)).collect();
                messages.sort_by_key(|m| (std::cmp::Reverse(m.priority), m.id));
                return Ok(Received {
                    messages,
                    dead_lettered: 0,
                    dropped: 0,
                    not_plain: false,
                    statements,
                    prioritized,
                });
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
        prioritized |= totals.get::<_, Option<i16>>(5) == Some(1);
        let mut messages: Vec<Leased> = rows.iter().map(|r| self.leased(r)).collect();
        messages.sort_by_key(|m| (std::cmp::Reverse(m.priority), m.id));
        let not_plain = !plain_first || !messages.is_empty() || dead > 0;
        statements += 1;
        let (dead_lettered, dropped) = (moved as u64, (dead - moved) as u64);
        Ok(Received { messages, dead_lettered, dropped, not_plain, statements, prioritized })
    }

    /// One message each for several RECVs of `queue` by `receivers`
    /// (any names, repeated or not) with one FROM and lease length, looking
    /// at most at `limit` messages: each receiver's message, by its index in
    /// `receivers`, how many messages were looked at, whether the queue
    /// is one this serves (it exists and has no delivery limit), and whether
    /// it proved to have priorities (`ranked`: it is known to: the walk over them).
    pub async fn recv_many(
        &self,
        queue: &str,
        receivers: &[Option<&str>],
        from: Option<&str>,
        limit: usize,
        vt_ms: u64,
        ranked: bool,
    ) -> Result<(Vec<(usize, Leased)>, i64, bool, bool), DbError> {
        let (limit, vt) = (limit as i64, vt_ms as f64);
        let args: [&(dyn postgres::types::ToSql + Sync); 5] = [&queue, &receivers, &from, &limit, &vt];
        let st = if ranked { &self.st.recv_many_ranked } else { &self.st.recv_many };
        let mut rows = self.check(self.client.query(st, &args).await)?;
        let mut prioritized = ranked;
        if !ranked && rows.last().is_some_and(|t| t.get::<_, i64>(3) == 2) {
            // A queue with priorities (nothing was leased): the walk over them.
            prioritized = true;
            rows = self.check(self.client.query(&self.st.recv_many_ranked, &args).await)?;
        }
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
                    priority: r.get(6),
                };
                (n as usize - 1, m)
            })
            .collect();
        out.sort_by_key(|(_, m)| m.id);
        Ok((out, looked, served == 1, prioritized))
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
        let backoff = o.backoff.map(|b| b.unwrap_or(crate::policies::Backoff { base_ms: 0, max_ms: 0, jitter_pct: 0 }));
        let (base, max_wait, jitter) = match backoff {
            Some(b) => (b.base_ms as i64, b.max_ms as i64, i16::from(b.jitter_pct)),
            None => (0, 0, 0),
        };
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
                    &backoff.is_some(),
                    &base,
                    &max_wait,
                    &jitter,
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
                    ready_by_priority: {
                        let (levels, counts): (Vec<i32>, Vec<i64>) = (row.get(19), row.get(20));
                        levels.into_iter().zip(counts).collect()
                    },
                    backoff: match (row.get::<_, i64>(21), row.get::<_, i64>(22), row.get::<_, i32>(23)) {
                        (0, _, _) => None,
                        (base, max, jitter) => Some(crate::policies::Backoff {
                            base_ms: base as u64,
                            max_ms: max as u64,
                            jitter_pct: jitter as u8,
                        }),
                    },
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

    /// POP (`take`) or PEEK: the first eligible message, and whether the
    /// queue proved to have priorities (see [`PgConn::first_n`]).
    pub async fn first(
        &self,
        queue: &str,
        me: Option<&str>,
        from: Option<&str>,
        take: bool,
        ranked: bool,
    ) -> Result<(Option<Message>, bool), DbError> {
        let (mut found, prioritized) = self.first_n(queue, me, from, take, 1, ranked).await?;
        Ok((found.pop(), prioritized))
    }

    /// The first `n` eligible messages, taken (POP) or not (PEEK), highest
    /// priority first, then lowest id first; and whether the queue proved
    /// to have priorities (`ranked`: it is known to, so the statement that
    /// walks them runs at once).
    pub async fn first_n(
        &self,
        queue: &str,
        me: Option<&str>,
        from: Option<&str>,
        take: bool,
        n: usize,
        ranked: bool,
    ) -> Result<(Vec<Message>, bool), DbError> {
        let (st, walk) = if take { (&self.st.pop, &self.st.pop_ranked) } else { (&self.st.peek, &self.st.peek_ranked) };
        let limit = n as i64;
        let args: [&(dyn postgres::types::ToSql + Sync); 4] = [&queue, &me, &from, &limit];
        let mut rows = self.check(self.client.query(if ranked { walk } else { st }, &args).await)?;
        let mut prioritized = ranked;
        if !ranked && rows.last().is_some_and(|r| r.get::<_, Option<i64>>(0).is_none()) {
            prioritized = true;
            rows = self.check(self.client.query(walk, &args).await)?;
        }
        if rows.is_empty() {
            return Ok((self.or_no_queue(queue, Vec::new()).await?, prioritized));
        }
        let mut out: Vec<Message> = rows
            .iter()
            .map(|r| Message { id: r.get(0), sender: r.get(1), body: r.get(2), priority: r.get(3) })
            .collect();
        out.sort_by_key(|m| (std::cmp::Reverse(m.priority), m.id));
        Ok((out, prioritized))
    }

    /// Marks `queue` prioritized before a SEND with a PRIORITY (schema 19):
    /// `false` when another transaction holds its row (an application's that
    /// sent its first message with a priority and has not ended), so that
    /// the SEND's own update of the mark would wait for it.
    pub async fn prioritize(&self, queue: &str) -> Result<bool, DbError> {
        let r = self.client.query_one(&self.st.prioritize, &[&queue]).await;
        match r {
            Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => Ok(false),
            r => self.check(r).map(|_| true),
        }
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
        let priorities: Vec<i16> = sends.iter().map(|s| i16::from(s.priority)).collect();
        let r = self
            .client
            .query(&self.st.send_many, &[&queues, &senders, &to, &bodies, &delays, &groups, &priorities])
            .await;
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

    /// NACK: whether the lease was current (and the message is visible again
    /// after `delay_ms`, or without one after the queue's backoff, if any).
    /// `holder`: the receiver the delivery must have gone to (`None`: anyone's).
    pub async fn nack(
        &self,
        queue: &str,
        id: i64,
        lease: i64,
        delay_ms: Option<u64>,
        holder: Option<&str>,
    ) -> Result<bool, DbError> {
        let delay = delay_ms.map(|d| d as f64);
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
        let (base, max_wait, jitter) = match o.backoff.flatten() {
            Some(b) => (b.base_ms as i64, b.max_ms as i64, i16::from(b.jitter_pct)),
            None => (0, 0, 0),
        };
        // A name is a queue's or a stream's, never both.
        let r = self.client.query_one(self.stream_statement(crate::db::streams::X::Type as usize), &[&queue]).await;
        if self.check(r)?.get::<_, &str>(0) == "stream" {
            return Err(DbError::Redis("WRONGTYPE Operation against a key holding the wrong kind of value".into()));
        }
        let r = self
            .client
            .query_opt(
                &self.st.create,
                &[
                    &queue,
                    &max,
                    &dead,
                    &msgs,
                    &bytes,
                    &creator,
                    &cap,
                    &concurrency,
                    &rate,
                    &retain,
                    &base,
                    &max_wait,
                    &jitter,
                ],
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

    /// QLIST, or QLIST PENDING for `me`: at most `most` names, of the
    /// queues matching one of `like` (LIKE patterns; `None`: every queue).
    pub async fn list(
        &self,
        pending_for: Option<Option<&str>>,
        most: i64,
        like: Option<&[String]>,
    ) -> Result<Vec<String>, DbError> {
        let r = match pending_for {
            None => self.client.query(&self.st.list, &[&most, &like]).await,
            Some(me) => self.client.query(&self.st.pending, &[&me, &most, &like]).await,
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
                let mut xst = Vec::with_capacity(crate::db::streams::STATEMENTS.len());
                for sql in crate::db::streams::STATEMENTS {
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
