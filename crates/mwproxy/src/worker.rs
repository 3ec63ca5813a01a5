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
use mcproto::{parse_response, Request, Response};

use crate::backend::{Backend, BackendError};
use crate::conn::ClientConn;
use crate::server::Shared;
use crate::stats::{add, bump, WorkerStats};

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
    /// When its bytes were read.
    pub t_recv: Instant,
}

/// One server's part of a job: the bytes to send (a range of the worker's send
/// buffer) and, after the exchange, the length of its reply or why there is none.
pub(crate) struct Target {
    pub server: usize,
    pub request: Range<usize>,
    pub result: Result<usize, BackendError>,
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
    /// The connection of the job just finished, whose next request comes next.
    last_conn: Option<Arc<ClientConn>>,
}

impl Worker {
    /// A worker with (lazily opened) connections to every server.
    pub fn new(id: usize, shared: Arc<Shared>) -> Worker {
        let backends = shared.addrs.iter().enumerate().map(|(i, a)| Backend::new(i, *a)).collect();
        Worker { id, shared, backends, sendbuf: Vec::with_capacity(4096), rr: id, last_conn: None }
    }

    pub(crate) fn stats(&self) -> &WorkerStats {
        &self.shared.stats.workers[self.id]
    }

    /// Serves jobs until every net thread has gone and the queue is empty.
    pub fn run(mut self, queue: Receiver<Job>) {
        let mut reply = Vec::with_capacity(4096);
        for first in queue.iter() {
            let mut next = Some(first);
            while let Some(job) = next {
                self.handle(job, &mut reply);
                next = self.last_conn.take().and_then(|c| c.next_job());
            }
        }
    }

    /// Carries out one job and delivers its reply.
    fn handle(&mut self, job: Job, reply: &mut Vec<u8>) {
        {
            let start = Instant::now();
            reply.clear();
            let noreply = match &job.work {
                Work::Request(req) => {
                    self.execute(req, reply);
                    req.noreply()
                }
                Work::DropStale { key, reply: line } => {
                    self.drop_stale(key);
                    if let Some(line) = line {
                        reply.extend_from_slice(line.as_bytes());
                        reply.extend_from_slice(b"\r\n");
                    }
                    line.is_none()
                }
            };
            let c = &self.stats().counters;
            bump(&c.requests);
            if is_error_reply(reply) {
                bump(&c.error_replies);
            }
            let bytes = if noreply { Vec::new() } else { std::mem::replace(reply, Vec::with_capacity(4096)) };
            job.conn.deliver(job.seq, bytes, false, &self.shared.stats.net);
            add(&self.stats().counters.busy_ns, start.elapsed().as_nanos() as u64);
            self.last_conn = Some(job.conn);
        }
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
        for t in targets.iter_mut() {
            let b = &mut self.backends[t.server];
            let health = &self.shared.health[t.server];
            let req = &self.sendbuf[t.request.clone()];
            t.result = b.ensure(health, now_ms, cfg).and_then(|_| b.send(req)).map(|_| 0);
            if t.result.is_err() && b.was_used() {
                b.reset();
                t.result = b.ensure(health, now_ms, cfg).and_then(|_| b.send(req)).map(|_| 0);
            }
            add(&self.shared.stats.workers[self.id].backends[t.server].requests, 1);
        }
        let deadline = Instant::now() + Duration::from_millis(cfg.timeout_ms);
        for t in targets.iter_mut() {
            if t.result.is_err() {
                continue;
            }
            let b = &mut self.backends[t.server];
            let health = &self.shared.health[t.server];
            t.result = b.recv(deadline);
            if matches!(t.result, Err(BackendError::Io(_))) && b.was_used() {
                // The server closed a connection that sat idle (it restarted):
                // the request was never read, so sending it again is safe.
                b.reset();
                let req = &self.sendbuf[t.request.clone()];
                let retry_deadline = Instant::now() + Duration::from_millis(cfg.timeout_ms);
                t.result = b.ensure(health, now_ms, cfg).and_then(|_| b.send(req)).and_then(|_| b.recv(retry_deadline));
            }
        }
        for t in targets.iter_mut() {
            let health = &self.shared.health[t.server];
            match &t.result {
                Ok(_) => Backend::succeeded(health),
                Err(e) => {
                    let counters = &self.shared.stats.workers[self.id].backends[t.server];
                    bump(&counters.errors);
                    if *e == BackendError::Timeout {
                        bump(&counters.timeouts);
                    }
                    let now_ms = self.now_ms();
                    self.backends[t.server].fail(health, now_ms, cfg, e);
                }
            }
            let counters = &self.shared.stats.workers[self.id].backends[t.server];
            add(&counters.reconnects, self.backends[t.server].take_reconnects());
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
        let mut targets: Vec<Target> =
            servers.iter().map(|&s| Target { server: s, request: range.clone(), result: Ok(0) }).collect();
        self.exchange(&mut targets);
        self.combine(&targets, out);
        self.finish(&targets);
    }

    pub(crate) fn combine(&self, targets: &[Target], out: &mut Vec<u8>) {
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
        if failed {
            bump(&self.stats().counters.backend_failures);
        }
        if all_same {
            out.extend_from_slice(first.unwrap_or_default());
            return;
        }
        if !failed {
            bump(&self.stats().counters.replica_disagreements);
        }
        match (failure, first) {
            (Some(f), _) => out.extend_from_slice(&f),
            (None, Some(f)) => out.extend_from_slice(f),
            (None, None) => unreachable!("targets are never empty"),
        }
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

fn is_error_reply(reply: &[u8]) -> bool {
    reply.starts_with(b"ERROR") || reply.starts_with(b"CLIENT_ERROR") || reply.starts_with(b"SERVER_ERROR")
}

/// Parses a buffered reply that [`Backend::recv`] has already delimited.
pub(crate) fn parsed(raw: &[u8]) -> Response<'_> {
    match parse_response(raw) {
        Ok(Some((r, _))) => r,
        _ => unreachable!("recv returns whole, well-formed replies"),
    }
}
