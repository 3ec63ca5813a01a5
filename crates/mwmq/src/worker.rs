//! Workers: take one request at a time from the queue, borrow a database
//! connection for it, run its statement, give the connection back, write
//! the reply and record the request's stages.
//!
//! A RECV that asked to WAIT and found nothing is parked (`events.rs`)
//! instead of holding the worker; it comes back through the queue when a
//! message may be there or its wait is over. Leases whose reply could not be
//! written are given back at once.

use std::sync::Arc;
use std::time::Instant;

use mwstats::clock::now_ns;
use mwstats::slots::SlotWriter;
use mwstats::stages::Timeline;

use crate::command::{Command, Credentials, MqOp, Recv};
use crate::conn::{ClientConn, Delivered};
use crate::db::{DbConn, DbError, LeaseRef, Leased, SendRow};
use crate::job::{Done, Job, Work};
use crate::resp::Reply;
use crate::shared::Shared;
use crate::telemetry::MqAcc;
use crate::telemetry::NetCounters;
use crate::users::Right;

/// What carrying out a command led to.
enum Outcome {
    /// Answer with this reply; the leases travel in it.
    Reply(Reply, Vec<LeaseRef>, &'static str),
    /// The RECV found nothing and may wait: park it.
    Park(u64),
    /// A login whose password the login threads must check.
    Verify,
}

/// Requests a worker may carry out together (`batch` > 1).
#[derive(Debug, Clone)]
enum Batch {
    /// SENDs without a KEY, to any queues.
    Send,
    /// ACKs, of any queues.
    Ack,
    /// POPs of one queue by one receiver with one FROM.
    Pop { queue: String, me: Option<String>, from: Option<String> },
    /// RECVs of one message each (no COUNT, no WAIT), of one queue by one
    /// receiver with one FROM and one lease length.
    Recv { r: Recv, me: Option<String> },
}

impl Batch {
    fn of(job: &Job) -> Option<Batch> {
        match &job.cmd {
            Ok(Command::Send(s)) if s.key.is_none() => Some(Batch::Send),
            Ok(Command::Ack { .. }) => Some(Batch::Ack),
            Ok(Command::Pop { queue, from }) => {
                Some(Batch::Pop { queue: queue.clone(), me: job.conn.identity(), from: from.clone() })
            }
            // (A RECV that may wait is parked when it finds nothing: it goes alone.)
            Ok(Command::Recv(r)) if r.count == 1 && r.wait_ms == 0 => {
                Some(Batch::Recv { r: r.clone(), me: job.conn.identity() })
            }
            _ => None,
        }
    }

    /// Whether `job` may join a batch of this kind: `Batch::of(job) == self`,
    /// without copying anything (the queue is scanned under its lock); the
    /// connection's identity is looked at only once the command matches.
    fn matches(&self, job: &Job) -> bool {
        let me = |who: &Option<String>| job.conn.identity() == *who;
        match (self, &job.cmd) {
            (Batch::Send, Ok(Command::Send(s))) => s.key.is_none(),
            (Batch::Ack, Ok(Command::Ack { .. })) => true,
            (Batch::Pop { queue, me: who, from }, Ok(Command::Pop { queue: q, from: f })) => {
                q == queue && f == from && me(who)
            }
            // (`r` has COUNT 1 and no WAIT, so equal arguments are batchable too.)
            (Batch::Recv { r, me: who }, Ok(Command::Recv(x))) => x == r && me(who),
            _ => false,
        }
    }
}

/// Database facts of one request.
#[derive(Default, Clone, Copy)]
struct DbFacts {
    t_pool: Option<u64>,
    t_send: Option<u64>,
    t_done: Option<u64>,
    statements: u64,
    failed: bool,
    unavailable: bool,
    hits: u64,
}

/// One worker thread.
pub struct Worker {
    id: usize,
    shared: Arc<Shared>,
    writer: SlotWriter<MqAcc>,
}

impl Worker {
    /// Worker `id`.
    pub fn new(id: usize, shared: Arc<Shared>) -> Worker {
        Worker { id, shared, writer: SlotWriter::new(id, MqAcc::default()) }
    }

    /// Runs until the queue is closed and empty.
    pub fn run(mut self) {
        let mut turn = false;
        while let Some(work) = self.shared.queue.pop(&mut turn) {
            match work {
                Work::Request(job) => self.request(job),
                Work::Release(leases) => self.release(&leases),
            }
            self.writer.settle(&self.shared.telemetry.slots);
        }
    }

    fn release(&self, leases: &[LeaseRef]) {
        if leases.is_empty() {
            return;
        }
        let result = self.shared.pool.get().and_then(|mut c| {
            let r = c.release(leases);
            self.shared.pool.put(c);
            r
        });
        match result {
            Ok(n) => NetCounters::add(&self.shared.net.leases_released, n),
            // They expire by themselves after their visibility timeout.
            Err(e) => tracing::warn!("could not give back {} leases: {e:?}", leases.len()),
        }
    }

    fn request(&mut self, mut job: Box<Job>) {
        if let Some(refusal) = job.cmd.as_ref().ok().and_then(|c| self.gate(c, &job.conn)) {
            job.cmd = Err(refusal);
            return self.one(job);
        }
        let batch = self.shared.config.server.batch;
        if batch > 1 {
            if let Some(kind) = Batch::of(&job) {
                let more = self.shared.queue.take_matching(batch - 1, |w| match w {
                    Work::Request(j) => {
                        kind.matches(j) && j.cmd.as_ref().ok().and_then(|c| self.gate(c, &j.conn)).is_none()
                    }
                    Work::Release(_) => false,
                });
                if !more.is_empty() {
                    let mut jobs = vec![job];
                    jobs.extend(more.into_iter().filter_map(|w| match w {
                        Work::Request(j) => Some(j),
                        Work::Release(_) => None,
                    }));
                    return self.batch(kind, jobs);
                }
            }
        }
        self.one(job);
    }

    /// Carries out several compatible requests as one statement.
    #[allow(clippy::vec_box)] // boxed as they came through the queue: no copies
    fn batch(&mut self, kind: Batch, mut jobs: Vec<Box<Job>>) {
        let t_dequeue = now_ns();
        let timeout_ns = self.shared.config.server.queue_timeout_ms * 1_000_000;
        let mut replies: Vec<Option<(Reply, &'static str, u64)>> = vec![None; jobs.len()];
        // Leases each reply carries (RECV), given back if it cannot be delivered.
        let mut leases: Vec<Vec<LeaseRef>> = vec![Vec::new(); jobs.len()];
        for (i, job) in jobs.iter().enumerate() {
            if timeout_ns > 0 && t_dequeue.saturating_sub(job.t_enqueue) > timeout_ns {
                let msg = format!(
                    "TRYAGAIN the request waited more than {} ms for a worker",
                    self.shared.config.server.queue_timeout_ms
                );
                replies[i] = Some((Reply::Error(msg), "server_error", 0));
            }
        }
        let live: Vec<usize> = (0..jobs.len()).filter(|i| replies[*i].is_none()).collect();
        let mut db = DbFacts::default();
        match self.shared.pool.get() {
            Err(e) => {
                db.failed = true;
                db.unavailable = true;
                for i in &live {
                    replies[*i] = Some((e.reply(), "server_error", 0));
                }
            }
            Ok(mut pg) => {
                let now = now_ns();
                db.t_pool = Some(now);
                db.t_send = Some(now);
                db.statements = 1;
                let result = self.batch_statement(&mut pg, &kind, &jobs, &live, &mut replies, &mut leases);
                db.t_done = Some(now_ns());
                self.shared.pool.put(pg);
                match result {
                    Ok(n) => db.statements = n,
                    Err(e) => {
                        db.failed = !matches!(e, DbError::NoQueue(_) | DbError::Exists(_) | DbError::OverQuota(_));
                        db.unavailable = matches!(e, DbError::Unavailable(_));
                        let status = if db.failed { "server_error" } else { "client_error" };
                        for i in &live {
                            replies[*i] = Some((e.reply(), status, 0));
                        }
                    }
                }
            }
        }
        let n = jobs.len() as u64;
        for (i, job) in jobs.iter_mut().enumerate() {
            let (reply, status, hits) =
                replies[i].take().unwrap_or((Reply::err("internal: no reply"), "server_error", 0));
            let cmd = std::mem::replace(&mut job.cmd, Err(Reply::Nil));
            let op = cmd.as_ref().map(Command::op).unwrap_or(MqOp::Other);
            self.answer(job, &reply, std::mem::take(&mut leases[i]), false);
            let t_reply = now_ns();
            let status = if reply.is_error() { status } else { "ok" };
            let facts = DbFacts {
                hits,
                statements: u64::from(i == 0) * db.statements,
                failed: i == 0 && db.failed,
                unavailable: i == 0 && db.unavailable,
                ..db
            };
            // The worker's time is counted once, shared by the batch.
            let busy = t_reply.saturating_sub(t_dequeue) / n;
            self.record(job, op, 1, status, t_dequeue, &facts, t_reply, Some(busy));
            self.shared.input.give(job.size);
            if job.conn.finish_request() {
                self.shared.done(Done { token: job.token, conn_id: job.conn.id });
            }
        }
    }

    /// Hands one of `msgs` (taken from `queue`) to each request of `live`
    /// in turn; those left without one get `empty`.
    fn deal<M>(
        &self,
        queue: &str,
        msgs: Vec<M>,
        live: &[usize],
        replies: &mut [Option<(Reply, &'static str, u64)>],
        empty: Reply,
        mut reply: impl FnMut(usize, M) -> Reply,
    ) {
        let n = msgs.len() as u64;
        self.shared.queues.add(queue, |c| c.received += n);
        let mut msgs = msgs.into_iter();
        for &i in live {
            replies[i] = Some(match msgs.next() {
                Some(m) => (reply(i, m), "ok", 1),
                None => (empty.clone(), "ok", 0),
            });
        }
    }

    /// Leases up to `count` messages of `queue`. When the statement met only
    /// dead letters at the front (moved or dropped in the same statement)
    /// and leased fewer than `enough`, it runs again, at most 8 more times,
    /// so that a poison message does not send receivers away empty-handed.
    /// `statements` counts the statements run.
    fn lease(
        &self,
        pg: &mut DbConn,
        r: &Recv,
        me: Option<&str>,
        count: u32,
        enough: usize,
        statements: &mut u64,
    ) -> Result<Vec<Leased>, DbError> {
        let mut msgs = Vec::new();
        for again in 0..=8 {
            if again > 0 {
                *statements += 1;
            }
            let got = pg.recv(&r.queue, me, r.from.as_deref(), count - msgs.len() as u32, r.vt_ms)?;
            self.dead_lettered(&r.queue, &got);
            let moved = got.dead_lettered + got.dropped;
            msgs.extend(got.messages);
            if msgs.len() >= enough || moved == 0 {
                break;
            }
        }
        Ok(msgs)
    }

    fn batch_statement(
        &self,
        pg: &mut DbConn,
        kind: &Batch,
        jobs: &[Box<Job>],
        live: &[usize],
        replies: &mut [Option<(Reply, &'static str, u64)>],
        leases: &mut [Vec<LeaseRef>],
    ) -> Result<u64, DbError> {
        let mut statements = 1;
        match kind {
            Batch::Send => {
                let names: Vec<Option<String>> = live.iter().map(|i| jobs[*i].conn.identity()).collect();
                let rows: Vec<SendRow<'_>> = live
                    .iter()
                    .zip(&names)
                    .map(|(i, me)| match &jobs[*i].cmd {
                        Ok(Command::Send(s)) => SendRow {
                            queue: &s.queue,
                            sender: me.as_deref().unwrap_or(""),
                            to: s.to.as_deref(),
                            body: &s.body,
                            delay_ms: s.delay_ms,
                        },
                        _ => unreachable!("a SEND batch holds SENDs"),
                    })
                    .collect();
                let ids = pg.send_many(&rows)?;
                let mut woken = std::collections::HashSet::new();
                for ((i, id), row) in live.iter().zip(ids).zip(&rows) {
                    replies[*i] = Some(match id {
                        Some(id) => {
                            if woken.insert(row.queue) {
                                self.shared.waiters.sent(&self.shared.queue, row.queue);
                            }
                            self.shared.queues.add(row.queue, |c| c.sent += 1);
                            (Reply::Int(id), "ok", 0)
                        }
                        None => (pg.not_sent(row.queue)?.reply(), "client_error", 0),
                    });
                }
            }
            Batch::Ack => {
                let holders: Vec<Option<String>> = live
                    .iter()
                    .map(|i| match &jobs[*i].cmd {
                        Ok(Command::Ack { queue, .. }) => self.holder(&jobs[*i].conn, queue),
                        _ => unreachable!("an ACK batch holds ACKs"),
                    })
                    .collect();
                let acks: Vec<(&str, i64, i64, Option<&str>)> = live
                    .iter()
                    .zip(&holders)
                    .map(|(i, holder)| match &jobs[*i].cmd {
                        Ok(Command::Ack { queue, id, lease }) => (queue.as_str(), *id, *lease, holder.as_deref()),
                        _ => unreachable!("an ACK batch holds ACKs"),
                    })
                    .collect();
                let done = pg.ack_many(&acks)?;
                let mut exists = std::collections::HashMap::new();
                for ((i, ok), a) in live.iter().zip(done).zip(&acks) {
                    let known = ok
                        || match exists.get(a.0) {
                            Some(e) => *e,
                            None => {
                                let e = pg.queue_exists(a.0)?;
                                exists.insert(a.0, e);
                                e
                            }
                        };
                    if ok {
                        self.shared.queues.add(a.0, |c| c.acked += 1);
                    }
                    replies[*i] = Some(if known {
                        (Reply::Int(i64::from(ok)), "ok", 0)
                    } else {
                        (DbError::NoQueue(a.0.to_string()).reply(), "client_error", 0)
                    });
                }
            }
            Batch::Pop { queue, me, from } => {
                let msgs = pg.first_n(queue, me.as_deref(), from.as_deref(), true, live.len())?;
                self.deal(queue, msgs, live, replies, Reply::Nil, |_, m| {
                    Reply::Array(vec![Reply::Int(m.id), Reply::text(m.sender), Reply::Bulk(m.body)])
                });
            }
            Batch::Recv { r, me } => {
                // One statement leases a message for each RECV.
                let n = live.len();
                let msgs = self.lease(pg, r, me.as_deref(), n as u32, n, &mut statements)?;
                self.deal(&r.queue, msgs, live, replies, Reply::Array(Vec::new()), |i, m| {
                    let (item, lease) = leased_item(m);
                    leases[i] = vec![lease];
                    Reply::Array(vec![item])
                });
            }
        }
        Ok(statements)
    }

    fn one(&mut self, mut job: Box<Job>) {
        let t_dequeue = now_ns();
        let mut db = DbFacts::default();
        let timeout_ns = self.shared.config.server.queue_timeout_ms * 1_000_000;
        let mut cmd = std::mem::replace(&mut job.cmd, Err(Reply::Nil));
        let op = cmd.as_ref().map(Command::op).unwrap_or(MqOp::Other);
        let (outcome, keys) = match &cmd {
            Err(refusal) => (Outcome::Reply(refusal.clone(), Vec::new(), "client_error"), 0),
            Ok(_) if timeout_ns > 0 && t_dequeue.saturating_sub(job.t_enqueue) > timeout_ns => (
                Outcome::Reply(
                    Reply::Error(format!(
                        "TRYAGAIN the request waited more than {} ms for a worker",
                        self.shared.config.server.queue_timeout_ms
                    )),
                    Vec::new(),
                    "server_error",
                ),
                0,
            ),
            Ok(c) => {
                let keys = match c {
                    Command::Recv(r) => u64::from(r.count),
                    _ => 1,
                };
                (self.execute(c, &job, &mut db), keys)
            }
        };
        let outcome = match outcome {
            Outcome::Verify => {
                job.cmd = cmd;
                self.record_busy(t_dequeue);
                match self.shared.logins.submit(job) {
                    Ok(()) => return,
                    Err(back) => {
                        job = back;
                        cmd = std::mem::replace(&mut job.cmd, Err(Reply::Nil));
                        let busy = Reply::Error("TRYAGAIN too many logins are waiting to be checked".into());
                        Outcome::Reply(busy, Vec::new(), "server_error")
                    }
                }
            }
            o => o,
        };
        match outcome {
            Outcome::Verify => unreachable!("handed to the login threads above"),
            Outcome::Park(seen) => {
                let queue = match &cmd {
                    Ok(Command::Recv(r)) => r.queue.clone(),
                    _ => unreachable!("only RECV parks"),
                };
                job.cmd = cmd;
                // The time until now was work; what follows is waiting.
                job.parked_at = Some(now_ns());
                self.record_busy(t_dequeue);
                if let Err(mut back) = self.shared.waiters.park(&queue, job, seen) {
                    back.parked_at = None;
                    back.t_enqueue = now_ns();
                    self.shared.queue.push_again(Work::Request(back));
                }
            }
            Outcome::Reply(reply, leases, status) => {
                let quit = matches!(cmd, Ok(Command::Quit));
                self.answer(&job, &reply, leases, quit);
                let t_reply = now_ns();
                let error = reply.is_error();
                let status = if error { status } else { "ok" };
                self.record(&job, op, keys, status, t_dequeue, &db, t_reply, None);
                self.shared.input.give(job.size);
                if job.conn.finish_request() {
                    self.shared.done(Done { token: job.token, conn_id: job.conn.id });
                }
            }
        }
    }

    fn answer(&self, job: &Job, reply: &Reply, leases: Vec<LeaseRef>, quit: bool) {
        let bytes = reply.to_bytes_as(job.conn.resp3());
        if quit {
            job.conn.close_after_replies();
        }
        match job.conn.deliver(&bytes, leases) {
            Delivered::Written(n) | Delivered::Pending(n) => NetCounters::add(&self.shared.net.bytes_out, n as u64),
            Delivered::Lost(leases) => self.release(&leases),
        }
    }

    fn record_busy(&mut self, t_dequeue: u64) {
        let busy = now_ns().saturating_sub(t_dequeue);
        self.writer.record(&self.shared.telemetry.slots, |acc| {
            acc.stages.busy_ns += busy;
            acc.stages.dirty = true;
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        job: &Job,
        op: MqOp,
        keys: u64,
        status: &'static str,
        t_dequeue: u64,
        db: &DbFacts,
        t_reply: u64,
        busy: Option<u64>,
    ) {
        // A long poll's wait is not part of its response time: measured from
        // when it was last queued, as if it had arrived then.
        let shift = job.parked_ns;
        let t = Timeline {
            request_id: job.request_id,
            op,
            keys,
            hits: db.hits,
            status,
            worker: self.id as u32,
            servers: u32::from(db.statements > 0),
            t_recv: job.t_recv + shift,
            t_parsed: job.t_parsed + shift,
            t_enqueue: job.t_enqueue.max(job.t_parsed + shift),
            t_dequeue,
            t_pool: db.t_pool,
            t_send: db.t_send.unwrap_or(t_dequeue),
            t_backend_done: db.t_done.or(db.t_send).unwrap_or(t_dequeue),
            t_reply,
        };
        let trace_every = self.shared.config.stats.trace_every;
        let busy = busy.unwrap_or_else(|| t_reply.saturating_sub(t_dequeue));
        self.writer.record(&self.shared.telemetry.slots, |acc| {
            acc.stages.record(&t, trace_every);
            acc.stages.busy_ns += busy;
            acc.db_requests += db.statements;
            acc.db_errors += u64::from(db.failed);
            acc.db_unavailable += u64::from(db.unavailable);
            if shift > 0 {
                acc.long_polls += 1;
                acc.long_poll.record_ns(shift);
            }
        });
    }

    /// Carries out a command; database work borrows a pooled connection.
    fn execute(&self, c: &Command, job: &Job, db: &mut DbFacts) -> Outcome {
        let conn = &job.conn;
        let local = |r: Reply| Outcome::Reply(r, Vec::new(), "ok");
        match c {
            Command::Ping(None) => return local(Reply::Simple("PONG")),
            Command::Ping(Some(m)) => return local(Reply::Bulk(m.clone())),
            Command::Quit | Command::ClientInfo | Command::Select => return local(Reply::Simple("OK")),
            Command::SetName(n) => {
                conn.set_name(n.clone());
                return local(Reply::Simple("OK"));
            }
            Command::GetName => return local(conn.name().map(Reply::text).unwrap_or(Reply::Nil)),
            Command::ClientId => return local(Reply::Int(conn.id as i64)),
            Command::CommandDocs => return local(Reply::Array(Vec::new())),
            Command::Info => return local(Reply::text(self.info())),
            Command::Auth(credentials) => {
                return match self.log_in(conn, credentials, job) {
                    Some(reply) => local(reply),
                    None => Outcome::Verify,
                }
            }
            Command::Hello { proto, setname, auth } => {
                if let Some(credentials) = auth {
                    match self.log_in(conn, credentials, job) {
                        None => return Outcome::Verify,
                        Some(reply) if reply.is_error() => return local(reply),
                        Some(_) => {}
                    }
                }
                if let Some(p) = proto {
                    conn.set_resp3(*p == 3);
                }
                if let Some(n) = setname {
                    conn.set_name(n.clone());
                }
                let t = Reply::text;
                return local(Reply::Map(vec![
                    (t("server"), t("mwmq")),
                    (t("version"), t(crate::VERSION)),
                    (t("proto"), Reply::Int(if conn.resp3() { 3 } else { 2 })),
                    (t("id"), Reply::Int(conn.id as i64)),
                    (t("mode"), t("standalone")),
                    (t("role"), t("master")),
                    (t("modules"), Reply::Array(Vec::new())),
                ]));
            }
            _ => {}
        }
        // QINFO's database figures, if read lately: no connection needed.
        if let Command::QueueInfo(q) = c {
            if let Some(state) = self.shared.info_cache.get(q, self.info_ttl()) {
                return local(queue_info(&state, &self.shared.queues.get(q)));
            }
        }
        // A RECV that may wait notes the queue's wake-ups before looking.
        let seen = match c {
            Command::Recv(r) if r.wait_ms > 0 && !job.last_try => Some(self.shared.waiters.seq(&r.queue)),
            _ => None,
        };
        let waiting = seen.is_some() && job.wait_until.is_some_and(|u| Instant::now() < u);
        let mut pg = match self.shared.pool.get() {
            Ok(pg) => pg,
            Err(e) => {
                db.unavailable = true;
                db.failed = true;
                if waiting {
                    return Outcome::Park(seen.unwrap_or_default());
                }
                return Outcome::Reply(e.reply(), Vec::new(), "server_error");
            }
        };
        let now = now_ns();
        db.t_pool = Some(now);
        db.t_send = Some(now);
        let result = self.statement(&mut pg, c, conn, db);
        db.t_done = Some(now_ns());
        self.shared.pool.put(pg);
        match result {
            Ok(Outcome::Reply(Reply::Array(items), _, _)) if items.is_empty() && seen.is_some() => {
                let until = job.wait_until.unwrap_or_else(Instant::now);
                if Instant::now() < until {
                    Outcome::Park(seen.unwrap_or_default())
                } else {
                    local(Reply::Array(items))
                }
            }
            Ok(o) => o,
            // A long poll that meets a database that cannot answer waits on
            // (parked) until its wait is over, instead of failing.
            Err(DbError::Unavailable(_)) if waiting => {
                db.failed = true;
                db.unavailable = true;
                Outcome::Park(seen.unwrap_or_default())
            }
            Err(e) => {
                db.failed = true;
                let status = match e {
                    DbError::Unavailable(_) | DbError::Failed(_) => {
                        db.unavailable = matches!(e, DbError::Unavailable(_));
                        "server_error"
                    }
                    DbError::NoQueue(_) | DbError::Exists(_) | DbError::OverQuota(_) => "client_error",
                };
                if matches!(e, DbError::NoQueue(_) | DbError::Exists(_) | DbError::OverQuota(_)) {
                    // The database answered; the request was wrong.
                    db.failed = false;
                }
                Outcome::Reply(e.reply(), Vec::new(), status)
            }
        }
    }

    /// With users configured: the refusal of a command this connection may
    /// not run (not logged in, or no right on the queue), as Redis words it.
    fn gate(&self, c: &Command, conn: &ClientConn) -> Option<Reply> {
        if !self.shared.users.enabled() {
            return None;
        }
        let Some(user) = conn.user() else {
            return match c {
                Command::Auth(_) | Command::Ping(_) | Command::Quit | Command::Hello { auth: Some(_), .. } => None,
                Command::Hello { .. } => Some(Reply::Error(
                    "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> \
                     AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol \
                     version at the same time"
                        .into(),
                )),
                _ => Some(Reply::Error("NOAUTH Authentication required.".into())),
            };
        };
        let need =
            |right: Right, queue: &str| (!user.may(right, queue)).then(|| Reply::Error(user.refusal(right, queue)));
        match c {
            Command::Send(s) => need(Right::Send, &s.queue).or_else(|| match user.max_body {
                Some(max) if s.body.len() > max => Some(Reply::Error(format!(
                    "OVERQUOTA a body of {} bytes is over user {}'s limit of {max} bytes (max_body)",
                    s.body.len(),
                    user.name
                ))),
                _ => None,
            }),
            Command::Recv(r) => need(Right::Receive, &r.queue),
            Command::Pop { queue, .. } | Command::Peek { queue, .. } => need(Right::Receive, queue),
            // On a delivery: its receiver's, or any for an admin of the queue (see `holder`).
            Command::Ack { queue, .. } | Command::Nack { queue, .. } | Command::Touch { queue, .. } => {
                need(Right::Receive, queue).filter(|_| !user.may(Right::Admin, queue))
            }
            // Dead letters are sends into the target: its send right too.
            Command::Create(q, o) | Command::Alter(q, o) => need(Right::Admin, q).or_else(|| match &o.dead_letter {
                Some(Some(target)) => need(Right::Send, target),
                _ => None,
            }),
            Command::Drop(q) => need(Right::Admin, q),
            Command::Redrive { queue, to, .. } => {
                need(Right::Admin, queue).or_else(|| to.as_deref().and_then(|t| need(Right::Admin, t)))
            }
            Command::Len(q) | Command::QueueInfo(q) => need(Right::See, q),
            _ => None,
        }
    }

    /// Whose delivery an ACK, NACK or TOUCH of `queue` by this connection
    /// may act on: with users, the connection's own (the receiver a lease
    /// went to) unless it is an admin of the queue; `None`: any delivery
    /// whose id and lease it names (no users: identities are only names).
    fn holder(&self, conn: &ClientConn, queue: &str) -> Option<String> {
        if !self.shared.users.enabled() {
            return None;
        }
        let user = conn.user()?;
        (!user.may(Right::Admin, queue)).then(|| user.name.clone())
    }

    /// How long QINFO's database figures are kept.
    fn info_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.shared.config.queues.info_cache_ms)
    }

    /// Counts what a RECV dead-lettered.
    fn dead_lettered(&self, queue: &str, got: &crate::db::Received) {
        if got.dead_lettered + got.dropped > 0 {
            self.shared.queues.add(queue, |c| {
                c.dead_lettered += got.dead_lettered;
                c.dropped += got.dropped;
            });
        }
    }

    /// `AUTH` and `HELLO ... AUTH`: the connection becomes the user, or
    /// hears Redis's refusal; `None`: the password is to be checked on the
    /// login threads (the request comes back with the outcome in
    /// `job.login`). Failed attempts are counted, make the connection wait
    /// before its next one is checked, and count against its source address;
    /// a throttled attempt is refused without a check.
    fn log_in(&self, conn: &ClientConn, credentials: &Credentials, job: &Job) -> Option<Reply> {
        let users = &self.shared.users;
        if !users.enabled() {
            return Some(Reply::err(
                "AUTH <password> called without any password configured for the default user. Are you sure your \
                 configuration is correct?",
            ));
        }
        let wrong = || Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into());
        let throttle = &self.shared.logins.throttle;
        match &job.login {
            Some(Some(user)) => {
                conn.attempts.succeeded();
                conn.set_user(user.clone());
                Some(Reply::Simple("OK"))
            }
            Some(None) => {
                conn.attempts.failed();
                if let Some(a) = conn.peer {
                    throttle.failed(a);
                }
                tracing::debug!(user = %credentials.user, "failed login");
                Some(wrong())
            }
            None if !conn.attempts.may_try() || conn.peer.is_some_and(|a| !throttle.may_try(a)) => {
                users.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Some(wrong())
            }
            None => None,
        }
    }

    fn statement(&self, pg: &mut DbConn, c: &Command, conn: &ClientConn, db: &mut DbFacts) -> Result<Outcome, DbError> {
        let me = conn.identity();
        let me = me.as_deref();
        let ok = |r: Reply| Ok(Outcome::Reply(r, Vec::new(), "ok"));
        db.statements = 1;
        match c {
            Command::Send(s) => {
                let id = pg.send(&s.queue, me.unwrap_or(""), s.to.as_deref(), &s.body, s.delay_ms, s.key.as_deref())?;
                self.shared.waiters.sent(&self.shared.queue, &s.queue);
                self.shared.queues.add(&s.queue, |c| c.sent += 1);
                ok(Reply::Int(id))
            }
            Command::Recv(r) => {
                let msgs = self.lease(pg, r, me, r.count, 1, &mut db.statements)?;
                let n = msgs.len() as u64;
                self.shared.queues.add(&r.queue, |c| c.received += n);
                db.hits = n;
                let (items, leases) = msgs.into_iter().map(leased_item).unzip();
                Ok(Outcome::Reply(Reply::Array(items), leases, "ok"))
            }
            Command::Pop { queue, from } | Command::Peek { queue, from } => {
                let take = matches!(c, Command::Pop { .. });
                match pg.first(queue, me, from.as_deref(), take)? {
                    Some(m) => {
                        db.hits = 1;
                        if take {
                            self.shared.queues.add(queue, |c| c.received += 1);
                        }
                        ok(Reply::Array(vec![Reply::Int(m.id), Reply::text(m.sender), Reply::Bulk(m.body)]))
                    }
                    None => ok(Reply::Nil),
                }
            }
            Command::Ack { queue, id, lease } => {
                let done = pg.ack(queue, *id, *lease, self.holder(conn, queue).as_deref())?;
                if done {
                    self.shared.queues.add(queue, |c| c.acked += 1);
                }
                ok(Reply::Int(i64::from(done)))
            }
            Command::Touch { queue, id, lease, ms } => {
                let held = pg.touch(queue, *id, *lease, *ms, self.holder(conn, queue).as_deref())?;
                ok(Reply::Int(i64::from(held)))
            }
            Command::Nack { queue, id, lease, delay_ms } => {
                let done = pg.nack(queue, *id, *lease, *delay_ms, self.holder(conn, queue).as_deref())?;
                if done {
                    self.shared.queues.add(queue, |c| c.nacked += 1);
                }
                if done && *delay_ms == 0 {
                    self.shared.waiters.sent(&self.shared.queue, queue);
                }
                ok(Reply::Int(i64::from(done)))
            }
            Command::Create(_, options) | Command::Alter(_, options) if dead_letter_missing(pg, options)? => {
                Err(DbError::NoQueue(options.dead_letter.clone().flatten().unwrap_or_default()))
            }
            Command::Create(q, options) => {
                let user = conn.user();
                pg.create(q, options, user.as_ref().map(|u| u.name.as_str()), user.as_ref().map(|u| u.max_queues))?;
                ok(Reply::Simple("OK"))
            }
            Command::Alter(q, options) => {
                pg.alter(q, options)?;
                self.shared.info_cache.forget(q);
                ok(Reply::Simple("OK"))
            }
            Command::Redrive { queue, to, count } => {
                let moved = pg.redrive(queue, to.as_deref(), *count)?;
                if let Some(t) = to {
                    self.shared.waiters.sent(&self.shared.queue, t);
                }
                ok(Reply::Int(moved))
            }
            Command::QueueInfo(q) => {
                let state = pg.info(q)?;
                self.shared.info_cache.put(q, state.clone(), self.info_ttl());
                ok(queue_info(&state, &self.shared.queues.get(q)))
            }
            Command::Drop(q) => {
                pg.drop_queue(q)?;
                self.shared.waiters.dropped(&self.shared.queue, q);
                self.shared.queues.forget(q);
                self.shared.info_cache.forget(q);
                ok(Reply::Simple("OK"))
            }
            Command::Len(q) => ok(Reply::Int(pg.len(q)?)),
            Command::List { pending } => {
                let mut names = pg.list(pending.then_some(me))?;
                if let Some(user) = conn.user() {
                    names.retain(|q| user.may(Right::See, q));
                }
                ok(Reply::Array(names.into_iter().map(Reply::text).collect()))
            }
            _ => unreachable!("local commands are answered before borrowing a connection"),
        }
    }

    fn info(&self) -> String {
        let s = &self.shared;
        let acc = s.telemetry.everything();
        let (open, idle) = s.pool.occupancy();
        let net = s.net.snapshot();
        let mut t = String::new();
        let mut line = |k: &str, v: String| {
            t.push_str(k);
            t.push(':');
            t.push_str(&v);
            t.push_str("\r\n");
        };
        line("# Server\r\nmwmq_version", crate::VERSION.to_string());
        line("process_id", std::process::id().to_string());
        line("tcp_port", s.port.to_string());
        line("uptime_in_seconds", s.started.elapsed().as_secs().to_string());
        line("workers", s.config.server.workers.to_string());
        line(
            "\r\n# Clients\r\nconnected_clients",
            s.open_connections.load(std::sync::atomic::Ordering::Relaxed).to_string(),
        );
        line("maxclients", s.max_connections.to_string());
        line("blocked_clients", s.waiters.parked().to_string());
        line("\r\n# Stats\r\ntotal_connections_received", net.accepted.to_string());
        line("total_commands_processed", acc.stages.requests().to_string());
        line("rejected_connections", net.rejected.to_string());
        line("total_net_input_bytes", net.bytes_in.to_string());
        line("total_net_output_bytes", net.bytes_out.to_string());
        line("queue_length", s.queue.len().to_string());
        line("leases_released", net.leases_released.to_string());
        line("tls_handshake_failures", net.tls_handshake_failures.to_string());
        line("handshake_timeouts", net.handshake_timeouts.to_string());
        line("handshake_refused", net.handshake_refused.to_string());
        line("login_timeouts", net.login_timeouts.to_string());
        line("statements_cut", s.pool.watch.cut.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("auth_users", if s.users.enabled() { "yes" } else { "no" }.to_string());
        line("auth_failures", s.users.failures.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("auth_throttled", s.logins.throttle.refused.load(std::sync::atomic::Ordering::Relaxed).to_string());
        line("logins_waiting", s.logins.waiting().to_string());
        line("\r\n# Database\r\npool_size", s.pool.size().to_string());
        line("pool_open", open.to_string());
        line("pool_idle", idle.to_string());
        line("db_statements", acc.db_requests.to_string());
        line("db_errors", acc.db_errors.to_string());
        line("db_unavailable", acc.db_unavailable.to_string());
        line("vacuums", s.vacuums.load(std::sync::atomic::Ordering::Relaxed).to_string());
        t
    }
}

/// Whether QCREATE or QALTER names a dead-letter queue that does not exist.
fn dead_letter_missing(pg: &mut DbConn, options: &crate::command::QueueOptions) -> Result<bool, DbError> {
    match &options.dead_letter {
        Some(Some(target)) => Ok(!pg.queue_exists(target)?),
        _ => Ok(false),
    }
}

/// QINFO's answer: what the queue holds now (from the database) and what
/// this process has seen happen to it since start.
fn queue_info(state: &crate::db::QueueState, counts: &crate::queues::Counts) -> Reply {
    let t = Reply::text;
    let mut fields = vec![
        (t("ready"), Reply::Int(state.ready)),
        (t("delayed"), Reply::Int(state.delayed)),
        (t("leased"), Reply::Int(state.leased)),
        (t("oldest_ready_ms"), Reply::Int(state.oldest_ready_ms)),
        (t("max_deliveries"), Reply::Int(i64::from(state.max_deliveries))),
        (t("dead_letter"), state.dead_letter.clone().map(Reply::text).unwrap_or(Reply::Nil)),
        (t("dead_letters_held"), Reply::Int(state.dead_letters_held)),
        (t("max_messages"), Reply::Int(state.max_messages)),
        (t("max_bytes"), Reply::Int(state.max_bytes)),
        (t("counted_messages"), Reply::Int(state.counted_messages)),
        (t("counted_bytes"), Reply::Int(state.counted_bytes)),
    ];
    fields.extend(counts.fields().into_iter().map(|(k, v)| (t(k), Reply::Int(v as i64))));
    Reply::Map(fields)
}

/// A leased message as RECV answers it (`[id, lease, sender, body]`) and the
/// lease its reply carries.
fn leased_item(m: Leased) -> (Reply, LeaseRef) {
    let lease = LeaseRef { queue_id: m.queue_id, id: m.id, lease: m.lease };
    (Reply::Array(vec![Reply::Int(m.id), Reply::Int(m.lease), Reply::text(m.sender), Reply::Bulk(m.body)]), lease)
}

/// A login thread (`logins.rs`): checks the passwords of the logins handed to
/// it, in one argon2 memory block of its own, and puts each request back on
/// the request queue with the outcome, until mwmq stops.
pub fn run_login_thread(shared: Arc<Shared>) {
    let mut memory = crate::users::Verifier::default();
    let rx = shared.logins.receiver();
    loop {
        let mut job = match rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(job) => job,
            Err(_) if shared.stopping.load(std::sync::atomic::Ordering::Relaxed) && rx.is_empty() => return,
            Err(_) => continue,
        };
        let credentials = match &job.cmd {
            Ok(Command::Auth(c)) | Ok(Command::Hello { auth: Some(c), .. }) => c,
            _ => unreachable!("only logins are queued for the login threads"),
        };
        job.login = Some(shared.users.check_with(&credentials.user, &credentials.password, &mut memory));
        job.t_enqueue = now_ns();
        shared.queue.push_again(Work::Request(job));
    }
}
