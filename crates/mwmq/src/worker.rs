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

use crate::command::{Command, MqOp};
use crate::conn::{ClientConn, Delivered};
use crate::db::{DbConn, DbError, LeaseRef};
use crate::resp::Reply;
use crate::shared::{Done, Job, NetCounters, Shared, Work};
use crate::telemetry::MqAcc;

/// What carrying out a command led to.
enum Outcome {
    /// Answer with this reply; the leases travel in it.
    Reply(Reply, Vec<LeaseRef>, &'static str),
    /// The RECV found nothing and may wait: park it.
    Park(u64),
}

/// Database facts of one request.
#[derive(Default)]
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
        let t_dequeue = now_ns();
        let mut db = DbFacts::default();
        let timeout_ns = self.shared.config.server.queue_timeout_ms * 1_000_000;
        let cmd = std::mem::replace(&mut job.cmd, Err(Reply::Nil));
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
        match outcome {
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
                self.record(&job, op, keys, status, t_dequeue, &db, t_reply);
                self.shared.done(Done { token: job.token, conn_id: job.conn.id, size: job.size });
            }
        }
    }

    fn answer(&self, job: &Job, reply: &Reply, leases: Vec<LeaseRef>, quit: bool) {
        let bytes = reply.to_bytes();
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
        let busy = t_reply.saturating_sub(t_dequeue);
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
            _ => {}
        }
        // A RECV that may wait notes the queue's wake-ups before looking.
        let seen = match c {
            Command::Recv(r) if r.wait_ms > 0 && !job.last_try => Some(self.shared.waiters.seq(&r.queue)),
            _ => None,
        };
        let mut pg = match self.shared.pool.get() {
            Ok(pg) => pg,
            Err(e) => {
                db.unavailable = true;
                db.failed = true;
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
            Err(e) => {
                db.failed = true;
                let status = match e {
                    DbError::Unavailable(_) | DbError::Failed(_) => {
                        db.unavailable = matches!(e, DbError::Unavailable(_));
                        "server_error"
                    }
                    DbError::NoQueue(_) | DbError::Exists(_) => "client_error",
                };
                if matches!(e, DbError::NoQueue(_) | DbError::Exists(_)) {
                    // The database answered; the request was wrong.
                    db.failed = false;
                }
                Outcome::Reply(e.reply(), Vec::new(), status)
            }
        }
    }

    fn statement(&self, pg: &mut DbConn, c: &Command, conn: &ClientConn, db: &mut DbFacts) -> Result<Outcome, DbError> {
        let me = conn.name();
        let me = me.as_deref();
        let ok = |r: Reply| Ok(Outcome::Reply(r, Vec::new(), "ok"));
        db.statements = 1;
        match c {
            Command::Send(s) => {
                let id = pg.send(&s.queue, me.unwrap_or(""), s.to.as_deref(), &s.body, s.delay_ms, s.key.as_deref())?;
                self.shared.waiters.sent(&self.shared, &s.queue);
                ok(Reply::Int(id))
            }
            Command::Recv(r) => {
                let msgs = pg.recv(&r.queue, me, r.from.as_deref(), r.count, r.vt_ms)?;
                db.hits = msgs.len() as u64;
                let leases = msgs.iter().map(|m| LeaseRef { queue_id: m.queue_id, id: m.id, lease: m.lease }).collect();
                let items = msgs
                    .into_iter()
                    .map(|m| {
                        Reply::Array(vec![
                            Reply::Int(m.id),
                            Reply::Int(m.lease),
                            Reply::text(m.sender),
                            Reply::Bulk(m.body),
                        ])
                    })
                    .collect();
                Ok(Outcome::Reply(Reply::Array(items), leases, "ok"))
            }
            Command::Pop { queue, from } | Command::Peek { queue, from } => {
                let take = matches!(c, Command::Pop { .. });
                match pg.first(queue, me, from.as_deref(), take)? {
                    Some(m) => {
                        db.hits = 1;
                        ok(Reply::Array(vec![Reply::Int(m.id), Reply::text(m.sender), Reply::Bulk(m.body)]))
                    }
                    None => ok(Reply::Nil),
                }
            }
            Command::Ack { queue, id, lease } => ok(Reply::Int(i64::from(pg.ack(queue, *id, *lease)?))),
            Command::Nack { queue, id, lease, delay_ms } => {
                let done = pg.nack(queue, *id, *lease, *delay_ms)?;
                if done && *delay_ms == 0 {
                    self.shared.waiters.sent(&self.shared, queue);
                }
                ok(Reply::Int(i64::from(done)))
            }
            Command::Create(q) => {
                pg.create(q)?;
                ok(Reply::Simple("OK"))
            }
            Command::Drop(q) => {
                pg.drop_queue(q)?;
                self.shared.waiters.dropped(&self.shared, q);
                ok(Reply::Simple("OK"))
            }
            Command::Len(q) => ok(Reply::Int(pg.len(q)?)),
            Command::List { pending } => {
                let names = pg.list(pending.then_some(me))?;
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
        line("\r\n# Database\r\npool_size", s.pool.size().to_string());
        line("pool_open", open.to_string());
        line("pool_idle", idle.to_string());
        line("db_statements", acc.db_requests.to_string());
        line("db_errors", acc.db_errors.to_string());
        line("db_unavailable", acc.db_unavailable.to_string());
        t
    }
}
