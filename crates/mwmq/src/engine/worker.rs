//! Workers: take one request at a time from the queue, borrow a database
//! connection for it, run its statement, give the connection back, write
//! the reply and record the request's stages.
//!
//! A RECV that asked to WAIT and found nothing is parked (`events.rs`)
//! instead of holding the worker; it comes back through the queue when a
//! message may be there or its wait is over. Leases whose reply could not be
//! written are given back at once. A request whose reply may be large first
//! reserves it of the output budget (`output.rs`); when that does not fit,
//! it waits in the budget's line, not in the worker.

use std::sync::Arc;
use std::time::Instant;

use mwstats::clock::now_ns;
use mwstats::slots::SlotWriter;

use crate::command::{Command, MqOp};
use crate::commands::{Answer, Batch, Core, DbFacts, Look, Outcome, Pooled};
use crate::db::LeaseRef;
use crate::engine::conn::Delivered;
use crate::engine::job::{Done, Job, Work};
use crate::resp::Reply;
use crate::shared::Shared;
use crate::telemetry::MqAcc;
use crate::telemetry::NetCounters;

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
        for db in 0..self.shared.pool.len() {
            let mine: Vec<LeaseRef> = leases.iter().filter(|l| l.db == db).copied().collect();
            if mine.is_empty() {
                continue;
            }
            let pool = &self.shared.pool[db];
            let result = pool.with(async |pg| pg.release(&mine).await).and_then(|r| r);
            match result {
                Ok(n) => NetCounters::add(&self.shared.net.leases_released, n),
                // They expire by themselves after their visibility timeout.
                Err(e) => tracing::warn!("could not give back {} leases: {e:?}", mine.len()),
            }
        }
    }

    fn request(&mut self, mut job: Box<Job>) {
        if job.conn.is_closed() && job.cmd.as_ref().is_ok_and(|c| c.wait().is_some()) {
            // A wait whose client left: nobody to look for.
            self.shared.waiters.abandoned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return crate::events::abandon(&self.shared, job, true);
        }
        let core = Core::new(&self.shared);
        if let Some(refusal) = job.cmd.as_ref().ok().and_then(|c| core.gate(c, &*job.conn)) {
            job.cmd = Err(refusal);
            return self.one(job);
        }
        let Some(job) = self.with_room(job) else { return };
        let batch = self.shared.config.server.batch;
        if batch > 1 {
            if let Some(kind) = job.cmd.as_ref().ok().and_then(|c| Batch::of(c, &*job.conn)) {
                // One statement runs on one database: its requests' queues live there.
                let home = job.cmd.as_ref().ok().and_then(|c| core.home(c));
                let more = self.shared.queue.take_matching(batch - 1, |w| match w {
                    Work::Request(j) => j.cmd.as_ref().is_ok_and(|c| {
                        kind.matches(c, &*j.conn) && core.home(c) == home && core.gate(c, &*j.conn).is_none()
                    }),
                    Work::Release(_) => false,
                });
                if !more.is_empty() {
                    let mut jobs = vec![job];
                    jobs.extend(more.into_iter().filter_map(|w| match w {
                        Work::Request(j) => self.with_room(j),
                        Work::Release(_) => None,
                    }));
                    return match jobs.len() {
                        1 => self.one(jobs.pop().expect("one")),
                        _ => self.batch(kind, jobs),
                    };
                }
            }
        }
        self.one(job);
    }

    /// The request with its reply's reservation of the output budget
    /// (`output.rs`), when its reply may be large; `None` when that does
    /// not fit now: it waits in the line (the net thread lets it go once
    /// it fits), and this worker goes on with other work.
    fn with_room(&self, mut job: Box<Job>) -> Option<Box<Job>> {
        let shared = &self.shared;
        let need = match &job.cmd {
            Ok(c) if job.reply.is_none() && !shared.stopping.load(std::sync::atomic::Ordering::Relaxed) => {
                shared.bounds.of(c)
            }
            _ => None,
        };
        let Some(need) = need else { return Some(job) };
        match shared.output.reserve(need) {
            Some(r) => {
                job.reply = Some(r);
                Some(job)
            }
            None => {
                shared.reply_line.push(job);
                None
            }
        }
    }

    /// Carries out several compatible requests as one statement.
    #[allow(clippy::vec_box)] // boxed as they came through the queue: no copies
    fn batch(&mut self, kind: Batch, mut jobs: Vec<Box<Job>>) {
        let t_dequeue = now_ns();
        let timeout_ns = self.shared.config.server.queue_timeout_ms * 1_000_000;
        let mut replies: Vec<Answer> = vec![None; jobs.len()];
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
        let core = Core::new(&self.shared);
        let home = jobs[0].cmd.as_ref().ok().and_then(|c| core.home(c)).unwrap_or(0);
        let mut db = DbFacts::default();
        let batched = {
            let items: Vec<(&Command, &crate::engine::conn::ClientConn)> =
                live.iter().filter_map(|i| jobs[*i].cmd.as_ref().ok().map(|c| (c, &*jobs[*i].conn))).collect();
            Pooled::now(core.carry_batch(&Pooled(&self.shared.pool), home, &kind, &items, &mut db))
        };
        if !batched.place(&live, &mut replies, &mut leases) {
            for job in jobs {
                self.one(job);
            }
            return;
        }
        let n = jobs.len() as u64;
        for (i, job) in jobs.iter_mut().enumerate() {
            let (reply, status, hits) =
                replies[i].take().unwrap_or((Reply::err("internal: no reply"), "server_error", 0));
            let cmd = std::mem::replace(&mut job.cmd, Err(Reply::Nil));
            let op = cmd.as_ref().map(Command::op).unwrap_or(MqOp::Other);
            let status = if reply.is_error() { status } else { "ok" };
            self.answer(job, reply, std::mem::take(&mut leases[i]), false);
            // (The connection holds the reply now.)
            job.reply = None;
            let t_reply = now_ns();
            let facts = db.share(i, hits);
            // The worker's time is counted once, shared by the batch.
            let busy = t_reply.saturating_sub(t_dequeue) / n;
            self.record(job, op, 1, status, t_dequeue, &facts, t_reply, Some(busy));
            self.shared.input.give(job.size);
            if job.conn.finish_request() {
                self.shared.done(Done { token: job.token, conn_id: job.conn.id });
            }
        }
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
                self.record_busy(t_dequeue, 0);
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
            Outcome::Nothing(_) => unreachable!("answered or parked by execute"),
            Outcome::Park(seen, next) => {
                if let Some(next) = next {
                    cmd = Ok(*next);
                }
                let names: Vec<String> = match &cmd {
                    Ok(c) => c.wait().map(|(k, _)| k.iter().map(|n| n.to_string()).collect()).unwrap_or_default(),
                    Err(_) => Vec::new(),
                };
                job.cmd = cmd;
                // The time until now was work; what follows is waiting,
                // without a reservation (it reserves again when it looks again).
                job.parked_at = Some(now_ns());
                job.reply = None;
                self.record_busy(t_dequeue, db.statements);
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                if let Err(mut back) = self.shared.waiters.park(&names, job, seen) {
                    if back.conn.is_closed() {
                        self.shared.waiters.abandoned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return crate::events::abandon(&self.shared, back, true);
                    }
                    back.parked_at = None;
                    back.t_enqueue = now_ns();
                    self.shared.queue.push_again(Work::Request(back));
                }
            }
            Outcome::Reply(reply, leases, status) => {
                let quit = matches!(cmd, Ok(Command::Quit));
                let error = reply.is_error();
                self.answer(&job, reply, leases, quit);
                job.reply = None;
                let t_reply = now_ns();
                let status = if error { status } else { "ok" };
                self.record(&job, op, keys, status, t_dequeue, &db, t_reply, None);
                self.shared.input.give(job.size);
                if job.conn.finish_request() {
                    self.shared.done(Done { token: job.token, conn_id: job.conn.id });
                }
            }
        }
    }

    /// Encodes `reply` (dropped once encoded: a large one is not held twice)
    /// and hands it to the connection.
    fn answer(&self, job: &Job, reply: Reply, leases: Vec<LeaseRef>, quit: bool) {
        if job.wait_until.is_some() && job.conn.hung_up() {
            // Its client left while it waited: no reply, the leases go back
            // now (a reply written to a closed peer would keep them until
            // they expire). The net thread closes the connection.
            let mut lost = job.conn.close();
            lost.extend(leases);
            return self.release(&lost);
        }
        let bytes = reply.to_bytes_as(job.conn.resp3());
        drop(reply);
        if quit {
            job.conn.close_after_replies();
        }
        match job.conn.deliver(bytes, leases) {
            Delivered::Written(n) | Delivered::Pending(n) => NetCounters::add(&self.shared.net.bytes_out, n as u64),
            Delivered::Lost(leases) => self.release(&leases),
        }
    }

    /// Work that answered nothing yet (a login handed on, a wait parked):
    /// its time, and the statements it ran.
    fn record_busy(&mut self, t_dequeue: u64, statements: u64) {
        let busy = now_ns().saturating_sub(t_dequeue);
        self.writer.record(&self.shared.telemetry.slots, |acc| {
            acc.stages.busy_ns += busy;
            acc.db_requests += statements;
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
        let stamps = crate::telemetry::Stamps {
            request_id: job.request_id,
            t_recv: job.t_recv,
            t_parsed: job.t_parsed,
            t_enqueue: job.t_enqueue,
            parked_ns: job.parked_ns,
        };
        let done = crate::telemetry::Done { op, keys, status, t_dequeue, t_reply, busy };
        self.shared.record_request(&mut self.writer, self.id as u32, &stamps, &done, db);
    }

    /// Carries out a command; database work borrows a pooled connection.
    fn execute(&self, c: &Command, job: &Job, db: &mut DbFacts) -> Outcome {
        let conn = &*job.conn;
        let core = Core::new(&self.shared);
        if let Some(outcome) = core.local(c, conn, job.login.clone()) {
            return outcome;
        }
        // A RECV that may wait notes the queue's wake-ups before looking.
        let seen = match c.wait() {
            Some((names, _)) if !job.last_try => Some(self.shared.waiters.seq(&names)),
            _ => None,
        };
        let outcome = Pooled::now(core.carry(&Pooled(&self.shared.pool), core.home(c), c, conn, db));
        match core.looked(core.settled(outcome, db), db) {
            Look::Answer(o) => o,
            // Nothing yet: parked until a message may be there or its wait
            // is over (a read that may not wait, or its last look, answers
            // what it found: XREAD's nothing is the null array).
            Look::Empty { next, last } => match seen {
                Some(seen) if job.wait_until.is_some_and(|u| Instant::now() < u) => Outcome::Park(seen, next),
                _ => last,
            },
        }
    }
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
        let peer = crate::commands::Session::peer(&*job.conn);
        let throttle = &shared.logins.throttle;
        job.login = Some(crate::logins::check(throttle, &shared.users, peer, credentials, "AUTH", &mut memory));
        job.t_enqueue = now_ns();
        shared.queue.push_again(Work::Request(job));
    }
}
