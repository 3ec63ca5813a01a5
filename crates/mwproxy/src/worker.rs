//! Workers: take one job at a time from the request queue and carry it through.
//!
//! A job is processed start to finish by one worker: it decides which servers
//! are involved (see `route.rs`), writes the request to every one of them,
//! then reads every reply, merges them into the client's reply and delivers it
//! to the connection. This file holds the loop and the plumbing shared by all
//! commands: the exchange with several servers at once and the rules for
//! combining replicas' answers. The commands themselves are in `commands.rs`.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use mcproto::{parse_response, MetaKind, Request, Response};
use mwstats::clock::now_ns;
use mwstats::OpKind;

use crate::backend::{Backend, BackendError, Framing};
use crate::conn::ClientConn;
use crate::recorder::{record, BackendFact, Finished, JobFacts, WorkerAcc};
use crate::server::Shared;
use mwstats::slots::SlotWriter;

/// What a job asks of a worker.
#[derive(Debug)]
pub enum Work {
    /// A client request.
    Request(Request),
    /// A `set` whose value was too large: drop the key's old value on its
    /// replicas (as memcached does) and answer `reply`.
    DropStale {
        /// The key to delete.
        key: Vec<u8>,
        /// memcached's error line, or `None` under noreply.
        reply: Option<&'static str>,
    },
}

/// One request on its way through the proxy.
pub struct Job {
    /// The client connection to answer.
    pub conn: Arc<ClientConn>,
    /// The request's number on its connection (replies go out in this order).
    pub seq: u64,
    /// What to do.
    pub work: Work,
    /// Unique per process (trace sampling uses it).
    pub request_id: u64,
    /// When the read that completed the request returned (ns, `mwstats::clock`).
    pub t_recv: u64,
    /// When it was parsed.
    pub t_parsed: u64,
    /// When it was put in line for a worker.
    pub t_enqueue: u64,
}

/// One server's part of a job: the bytes to send (a range of the worker's send
/// buffer) and, after the exchange, the length of its reply or why there is none.
pub(crate) struct Target {
    pub server: usize,
    pub request: Range<usize>,
    pub result: Result<usize, BackendError>,
    /// When its reply was complete (or the attempt failed).
    pub done_at: Option<u64>,
    /// How its reply is delimited.
    pub framing: Framing,
}

impl Target {
    /// A target for `server` whose request is `request` in the send buffer.
    pub fn new(server: usize, request: Range<usize>) -> Target {
        Target { server, request, result: Ok(0), done_at: None, framing: mcproto::response_len }
    }

    /// A target whose request is a meta command followed by `mn`: its reply
    /// runs to the `MN`.
    pub fn meta(server: usize, request: Range<usize>) -> Target {
        Target { framing: mcproto::meta_reply_len, ..Target::new(server, request) }
    }
}

/// A worker thread's state: its connections, buffers and counters.
pub struct Worker {
    pub(crate) id: usize,
    pub(crate) shared: Arc<Shared>,
    pub(crate) backends: Vec<Backend>,
    /// Requests to servers are encoded here; targets point into it.
    pub(crate) sendbuf: Vec<u8>,
    /// Round-robin position for reads and multi-get placement.
    pub(crate) rr: usize,
    /// What the current job has done so far.
    pub(crate) facts: JobFacts,
    /// This worker's way into its accumulator slot.
    writer: SlotWriter<WorkerAcc>,
}

impl Worker {
    /// A worker with (lazily opened) connections to every server.
    pub fn new(id: usize, shared: Arc<Shared>) -> Worker {
        let backends = shared.addrs.iter().map(|a| Backend::new(*a)).collect();
        let writer = SlotWriter::new(id, WorkerAcc::new(shared.addrs.len()));
        Worker { id, shared, backends, sendbuf: Vec::with_capacity(4096), rr: id, facts: JobFacts::default(), writer }
    }

    /// Serves jobs until every net thread has gone and the queue is empty.
    pub fn run(mut self, queue: Receiver<Job>) {
        let mut reply = Vec::with_capacity(4096);
        for first in queue.iter() {
            let mut next = Some(first);
            while let Some(job) = next {
                let conn = self.handle(job, &mut reply);
                // A record that went to the spill becomes visible before the
                // connection's next request runs (`stats` counts what the
                // client was answered).
                self.writer.settle(&self.shared.telemetry.slots);
                // The connection's next request, if one waits, comes next.
                next = conn.next_job();
            }
        }
    }

    /// Carries out one job, delivers its reply and records it; returns the job's connection.
    fn handle(&mut self, job: Job, reply: &mut Vec<u8>) -> Arc<ClientConn> {
        self.facts.begin(now_ns());
        reply.clear();
        let (noreply, op, keys) = match &job.work {
            Work::Request(req) => {
                self.execute(req, reply);
                let (op, keys) = classify(req);
                (req.noreply(), op, keys)
            }
            Work::DropStale { key, reply: line } => {
                self.drop_stale(key);
                reply.extend_from_slice(line.unwrap_or(mcproto::parse::TOO_LARGE).as_bytes());
                reply.extend_from_slice(b"\r\n");
                (line.is_none(), OpKind::Set, 1)
            }
        };
        let status = reply_status(reply);
        if status != "ok" {
            self.facts.counters.error_replies += 1;
        }
        let bytes = if noreply { Vec::new() } else { std::mem::replace(reply, Vec::with_capacity(4096)) };
        job.conn.deliver(job.seq, bytes, false, &self.shared.net);
        let finished = Finished {
            request_id: job.request_id,
            op,
            keys,
            status,
            t_recv: job.t_recv,
            t_parsed: job.t_parsed,
            t_enqueue: job.t_enqueue,
            t_reply: now_ns(),
        };
        self.record(&finished);
        job.conn
    }

    /// Adds the finished job to this worker's accumulator, or to the spill if
    /// the stats thread holds it right now.
    fn record(&mut self, f: &Finished) {
        let trace_every = if self.shared.config.stats.out.is_some() { self.shared.config.stats.trace_every } else { 0 };
        let (facts, id) = (&self.facts, self.id);
        self.writer.record(&self.shared.telemetry.slots, |acc| record(acc, f, facts, id, trace_every));
    }

    fn now_ms(&self) -> u64 {
        self.shared.started.elapsed().as_millis() as u64
    }

    /// Writes every target's request, then reads every reply. Each target's
    /// `result` ends up as the reply length (reply still buffered in its
    /// backend until [`Worker::finish`]) or the failure.
    pub(crate) fn exchange(&mut self, targets: &mut [Target]) {
        let cfg = &self.shared.config.backend;
        let now_ms = self.now_ms();
        let t_send = now_ns();
        self.facts.t_send.get_or_insert(t_send);
        for t in targets.iter_mut() {
            let b = &mut self.backends[t.server];
            let health = &self.shared.health[t.server];
            let req = &self.sendbuf[t.request.clone()];
            t.result = b.send(health, now_ms, cfg, req).map(|_| 0);
            if t.result.is_err() && b.was_used() {
                b.reset();
                t.result = b.send(health, now_ms, cfg, req).map(|_| 0);
            }
        }
        let deadline = Instant::now() + Duration::from_millis(cfg.timeout_ms);
        for t in targets.iter_mut() {
            if t.result.is_err() {
                continue;
            }
            let b = &mut self.backends[t.server];
            let health = &self.shared.health[t.server];
            t.result = b.recv(deadline, t.framing);
            t.done_at = Some(now_ns());
            if matches!(t.result, Err(BackendError::Io(_))) && b.was_used() {
                // The server closed a connection that sat idle (it restarted):
                // the request was never read, so sending it again is safe.
                b.reset();
                let req = &self.sendbuf[t.request.clone()];
                let retry_deadline = Instant::now() + Duration::from_millis(cfg.timeout_ms);
                t.result = b.send(health, now_ms, cfg, req).and_then(|_| b.recv(retry_deadline, t.framing));
                t.done_at = Some(now_ns());
            }
        }
        let done = now_ns();
        self.facts.t_backend_done = done;
        for t in targets.iter_mut() {
            let health = &self.shared.health[t.server];
            if let Err(e) = &t.result {
                let now_ms = self.now_ms();
                self.backends[t.server].fail(health, now_ms, cfg, e);
            } else {
                Backend::succeeded(health);
            }
            self.facts.backend.push(BackendFact {
                server: t.server,
                ns: t.done_at.unwrap_or(done).saturating_sub(t_send),
                failed: t.result.is_err(),
                timeout: matches!(t.result, Err(BackendError::Timeout)),
                reconnects: self.backends[t.server].take_reconnects(),
            });
        }
    }

    /// Writes commands that produce no reply (noreply) to one server; a failure
    /// only closes that connection, as for any other request.
    pub(crate) fn send_without_reply(&mut self, server: usize, bytes: &[u8]) {
        let cfg = &self.shared.config.backend;
        let now_ms = self.now_ms();
        let health = &self.shared.health[server];
        let b = &mut self.backends[server];
        if let Err(e) = b.send(health, now_ms, cfg, bytes) {
            b.fail(health, now_ms, cfg, &e);
        }
    }

    /// Releases the replies of an exchange.
    pub(crate) fn finish(&mut self, targets: &[Target]) {
        for t in targets {
            if let Ok(n) = t.result {
                self.backends[t.server].consume(n);
            }
        }
    }

    /// The reply bytes of a successful target.
    pub(crate) fn reply_of(&self, t: &Target) -> Option<&[u8]> {
        t.result.as_ref().ok().map(|&n| self.backends[t.server].reply(n))
    }

    /// The `SERVER_ERROR` line for a failed target.
    pub(crate) fn error_line(&self, server: usize, e: &BackendError, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("SERVER_ERROR backend {} {}\r\n", self.shared.addrs[server], e).as_bytes());
    }

    /// Sends one encoded request to several servers and combines their answers
    /// the way replicated writes are answered: the common answer when all agree,
    /// otherwise the first answer that is not a success (disagreement counted).
    pub(crate) fn fan_out(&mut self, servers: &[usize], out: &mut Vec<u8>) {
        let range = 0..self.sendbuf.len();
        let mut targets: Vec<Target> = servers.iter().map(|&s| Target::new(s, range.clone())).collect();
        self.exchange(&mut targets);
        let (failed, disagreed) = self.combine(&targets, out);
        self.facts.counters.backend_failures += u64::from(failed);
        self.facts.counters.replica_disagreements += u64::from(disagreed);
        self.finish(&targets);
    }

    /// Appends the combined answer; says whether a server failed and whether
    /// the replicas that answered disagreed.
    pub(crate) fn combine(&self, targets: &[Target], out: &mut Vec<u8>) -> (bool, bool) {
        let mut first: Option<&[u8]> = None;
        let mut all_same = true;
        let mut failure: Option<Vec<u8>> = None;
        for t in targets {
            match self.reply_of(t) {
                Some(raw) => {
                    match first {
                        None => first = Some(raw),
                        Some(f) if f != raw => all_same = false,
                        _ => {}
                    }
                    let ok = matches!(parse_response(raw), Ok(Some((r, _))) if r.is_success());
                    if !ok && failure.is_none() {
                        failure = Some(raw.to_vec());
                    }
                }
                None => {
                    all_same = false;
                    if failure.is_none() {
                        let mut line = Vec::new();
                        self.error_line(t.server, t.result.as_ref().unwrap_err(), &mut line);
                        failure = Some(line);
                    }
                }
            }
        }
        let failed = targets.iter().any(|t| t.result.is_err());
        if all_same {
            out.extend_from_slice(first.unwrap_or_default());
            return (failed, false);
        }
        match (failure, first) {
            (Some(f), _) => out.extend_from_slice(&f),
            (None, Some(f)) => out.extend_from_slice(f),
            (None, None) => unreachable!("targets are never empty"),
        }
        (failed, !failed)
    }

    /// Deletes a key on all its replicas, ignoring the answers.
    fn drop_stale(&mut self, key: &[u8]) {
        self.sendbuf.clear();
        Request::Delete { key: key.to_vec(), noreply: false }.encode(&mut self.sendbuf, false);
        let servers = self.shared.ring.replicas(key, self.shared.config.routing.replication);
        let mut ignored = Vec::new();
        self.fan_out(&servers, &mut ignored);
    }
}

/// The trace status of a reply: `ok`, `error`, `client_error` or `server_error`.
fn reply_status(reply: &[u8]) -> &'static str {
    if reply.starts_with(b"SERVER_ERROR") {
        "server_error"
    } else if reply.starts_with(b"CLIENT_ERROR") {
        "client_error"
    } else if reply.starts_with(b"ERROR") {
        "error"
    } else {
        "ok"
    }
}

/// The results-format class of a request and the keys it names.
fn classify(req: &Request) -> (OpKind, u64) {
    match req {
        Request::Get { keys, .. } if keys.len() == 1 => (OpKind::Get, 1),
        Request::Get { keys, .. } if keys.len() > 1 => (OpKind::Multiget, keys.len() as u64),
        Request::Store { .. } => (OpKind::Set, 1),
        Request::Delete { .. } => (OpKind::Delete, 1),
        Request::Arith { .. } | Request::Touch { .. } => (OpKind::Other, 1),
        Request::Meta { kind, .. } => match kind {
            MetaKind::Get => (OpKind::Get, 1),
            MetaKind::Set => (OpKind::Set, 1),
            MetaKind::Delete => (OpKind::Delete, 1),
            MetaKind::Arith | MetaKind::Debug => (OpKind::Other, 1),
            MetaKind::Noop => (OpKind::Other, 0),
        },
        _ => (OpKind::Other, 0),
    }
}

/// Parses a buffered reply that [`Backend::recv`] has already delimited.
pub(crate) fn parsed(raw: &[u8]) -> Response<'_> {
    match parse_response(raw) {
        Ok(Some((r, _))) => r,
        _ => unreachable!("recv returns whole, well-formed replies"),
    }
}
