//! Pool workers: take a connection from the queue, carry out a batch of its
//! waiting requests, deliver the replies, and send it back to the queue if
//! more wait.
//!
//! A batch is one connection's pipelined requests (at most
//! [`MAX_BATCH`](crate::conn::MAX_BATCH)), so a pipelining client's requests
//! travel to each server in one write and its replies are read back in one
//! go, while a client with one request at a time is served exactly as in the
//! seed reports' architecture. The requests are driven by the routing core
//! (`route/`) round by round. Under replication, a batch is cut into waves so
//! that a request never overtakes, nor is overtaken by, a write of the same
//! key: a wave's rounds — failovers, cas copies — finish before the next wave
//! is sent. `stats` and `version` are answered alone, after everything before
//! them is recorded.
//!
//! The exchange with the servers honours their shared health (`health.rs`):
//! a server that is down or stalled gets nothing and its calls fail at once;
//! its probe waits; repairs waiting for a server are sent before the calls on
//! the same connection (`repair.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mwstats::clock::now_ns;
use mwstats::slots::SlotWriter;

use crate::backend::{Backend, Wait};
use crate::batch::{finish_wave, waves, Entry};
use crate::conn::{After, ClientConn, Job};
use crate::recorder::{BackendFact, WorkerAcc};
use crate::repair::{Batch, REPAIR_CAP};
use crate::route::BackendError;
use crate::shared::Shared;

/// One call's result: where its reply lies in its backend's buffer.
#[derive(Clone, Debug)]
struct CallResult {
    outcome: Result<(usize, usize), BackendError>,
    done_at: u64,
}

/// What an exchange sent to one server besides the round's calls: a repair
/// batch and the number of replies it gets.
struct Sent {
    repair: Option<(Batch, usize)>,
}

/// A worker thread's state: its connections, buffers and counters.
pub struct Worker {
    id: usize,
    shared: Arc<Shared>,
    backends: Vec<Backend>,
    outbox: crate::route::Outbox,
    results: Vec<CallResult>,
    /// Bytes of replies to consume per server after a round.
    consumed: Vec<usize>,
    /// When the round's requests were written, per server (ns).
    sent_at: Vec<u64>,
    /// Whether this worker is a server's probe right now.
    probing: Vec<bool>,
    /// Round-robin position for reads and multi-get placement.
    rr: usize,
    /// Which queue line to prefer next.
    turn: bool,
    /// This worker's way into its accumulator slot.
    writer: SlotWriter<WorkerAcc>,
}

impl Worker {
    /// A worker with (lazily opened) connections to every server.
    pub fn new(id: usize, shared: Arc<Shared>) -> Worker {
        let n = shared.addrs.len();
        let backends = shared.addrs.iter().map(|a| Backend::new(*a)).collect();
        let writer = SlotWriter::new(id, WorkerAcc::new(n));
        Worker {
            id,
            backends,
            outbox: crate::route::Outbox::new(n),
            results: Vec::new(),
            consumed: vec![0; n],
            sent_at: vec![0; n],
            probing: vec![false; n],
            rr: id,
            turn: false,
            writer,
            shared,
        }
    }

    /// Serves connections until the queue is closed and empty.
    pub fn run(mut self) {
        while let Some(conn) = self.shared.queue.pop(&mut self.turn) {
            let jobs = conn.take_batch();
            if !jobs.is_empty() {
                self.serve(&conn, jobs);
            }
            // A record that went to the spill becomes visible before the
            // connection's next request runs (`stats` counts what the client
            // was answered).
            self.writer.settle(&self.shared.telemetry.slots);
            if conn.after_batch() == After::Again {
                self.shared.queue.push_again(conn);
            }
        }
    }

    /// Carries out one batch of a connection's requests and delivers the replies.
    fn serve(&mut self, conn: &ClientConn, jobs: Vec<Job>) {
        let t_dequeue = now_ns();
        let waves = waves(&jobs, self.shared.router.replication);
        let mut entries: Vec<Entry> =
            jobs.into_iter().map(|job| Entry::begin(job, t_dequeue, &self.shared, &mut self.rr)).collect();
        for wave in waves {
            let entries = &mut entries[wave];
            self.run_wave(entries);
            finish_wave(entries, conn, &self.shared, &mut self.writer, self.id);
        }
        let busy = now_ns().saturating_sub(t_dequeue);
        self.writer.record(&self.shared.telemetry.slots, |acc| {
            acc.busy_ns += busy;
            acc.dirty = true;
        });
    }

    /// Runs the rounds of a wave until every request in it is finished.
    fn run_wave(&mut self, entries: &mut [Entry]) {
        for e in entries.iter_mut() {
            e.answer_locally(&self.shared, &mut self.writer);
        }
        loop {
            self.outbox.clear();
            let mut any = false;
            for e in entries.iter_mut().filter(|e| !e.finished) {
                let first = self.outbox.calls().len();
                let n = e.exec.round(&self.shared.router, &mut self.outbox);
                e.calls = first..first + n;
                e.finished = n == 0;
                any |= n > 0;
            }
            if !any {
                break;
            }
            self.exchange();
            let router = &self.shared.router;
            for e in entries.iter_mut().filter(|e| !e.finished) {
                for (j, ci) in e.calls.clone().enumerate() {
                    let call = self.outbox.calls()[ci];
                    if !call.reply {
                        continue;
                    }
                    let r = &self.results[ci];
                    let outcome = match &r.outcome {
                        Ok((at, len)) => Ok(self.backends[call.server].reply(*at, *len)),
                        Err(e) => Err(e),
                    };
                    e.exec.absorb(router, j, outcome);
                    e.facts.t_backend_done = e.facts.t_backend_done.max(r.done_at);
                }
            }
            self.note_facts(entries);
            for (s, b) in self.backends.iter_mut().enumerate() {
                b.consume(std::mem::take(&mut self.consumed[s]));
            }
        }
        for e in entries.iter_mut() {
            e.answer_gathered(&self.shared, &mut self.writer);
        }
    }

    /// Per-server timings of the round just done, for each request.
    fn note_facts(&mut self, entries: &mut [Entry]) {
        let calls = self.outbox.calls();
        for e in entries.iter_mut().filter(|e| !e.finished) {
            for ci in e.calls.clone() {
                let call = calls[ci];
                if !call.reply {
                    continue;
                }
                let r = &self.results[ci];
                let sent = self.sent_at[call.server];
                e.facts.t_send = Some(e.facts.t_send.map_or(sent, |t| t.min(sent)));
                e.facts.backend.push(BackendFact {
                    server: call.server,
                    ns: r.done_at.saturating_sub(sent),
                    failed: r.outcome.is_err(),
                    timeout: matches!(r.outcome, Err(BackendError::Timeout)),
                    reconnects: self.backends[call.server].take_reconnects(),
                });
            }
        }
    }

    /// Sends the outbox to its servers and reads every reply.
    fn exchange(&mut self) {
        let Worker { shared, backends, outbox, results, consumed, probing, sent_at, .. } = self;
        let cfg = &shared.config.backend;
        let health = &shared.health;
        let deadline = Instant::now() + Duration::from_millis(cfg.timeout_ms);
        let slice = cfg.stall_slice();
        let calls = outbox.calls();
        let pending = CallResult { outcome: Ok((0, 0)), done_at: 0 };
        results.clear();
        results.resize(calls.len(), pending);
        let fail = |results: &mut Vec<CallResult>, s: usize, e: &BackendError| {
            let now = now_ns();
            for (r, c) in results.iter_mut().zip(calls) {
                if c.server == s && r.outcome.is_ok() {
                    *r = CallResult { outcome: Err(e.clone()), done_at: now };
                }
            }
        };
        let mut sent: Vec<Option<Sent>> = (0..outbox.servers()).map(|_| None).collect();
        for s in 0..outbox.servers() {
            if outbox.bytes(s).is_empty() {
                continue;
            }
            let probe = match health.admit(s) {
                Ok(p) => p,
                Err(e) => {
                    health.gave_up(s, &e);
                    fail(results, s, &e);
                    continue;
                }
            };
            probing[s] = probe;
            let b = &mut backends[s];
            let repair = shared.repairs.take(s);
            let mut wait = Wait { health, server: s, deadline, slice, probe: &mut probing[s] };
            let mut done = b.ensure(cfg, probe);
            let mut repair_replies = 0;
            if let (Ok(()), Some(batch)) = (&done, &repair) {
                let mut bytes = Vec::new();
                repair_replies = batch.encode(&mut bytes);
                done = b.send(&bytes, &mut wait);
            }
            if done.is_ok() {
                done = b.send(outbox.bytes(s), &mut wait);
            }
            if let Err(e) = done {
                b.fail();
                if let Some(batch) = repair {
                    shared.repairs.give_back(s, batch);
                }
                health.failed(s, &e);
                fail(results, s, &e);
                end_probe(health, probing, s);
                continue;
            }
            health.begin_wait(s);
            sent_at[s] = now_ns();
            sent[s] = Some(Sent { repair: repair.map(|b| (b, repair_replies)) });
        }
        for s in 0..outbox.servers() {
            let Some(Sent { repair, .. }) = sent[s].take() else { continue };
            let b = &mut backends[s];
            let mut wait = Wait { health, server: s, deadline, slice, probe: &mut probing[s] };
            let mut at = 0;
            let mut failure: Option<BackendError> = None;
            let mut answered = false;
            if let Some((batch, replies)) = repair {
                for _ in 0..replies {
                    match b.recv(at, mcproto::status_reply_len, REPAIR_CAP, &mut wait) {
                        Ok(len) => at += len,
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    }
                }
                if failure.is_none() {
                    answered = true;
                    shared.repairs.completed(&batch);
                } else {
                    shared.repairs.give_back(s, batch);
                }
            }
            for (r, c) in results.iter_mut().zip(calls) {
                if c.server != s || !c.reply {
                    continue;
                }
                if let Some(e) = &failure {
                    *r = CallResult { outcome: Err(e.clone()), done_at: now_ns() };
                    continue;
                }
                match b.recv(at, c.framing, c.cap, &mut wait) {
                    Ok(len) => {
                        *r = CallResult { outcome: Ok((at, len)), done_at: now_ns() };
                        at += len;
                        answered = true;
                    }
                    Err(e) => {
                        *r = CallResult { outcome: Err(e.clone()), done_at: now_ns() };
                        failure = Some(e);
                    }
                }
            }
            health.end_wait(s);
            match &failure {
                None if answered => health.succeeded(s),
                None => {}
                Some(e @ BackendError::Stalled) => {
                    b.fail();
                    health.gave_up(s, e);
                }
                Some(e) => {
                    b.fail();
                    health.failed(s, e);
                }
            }
            consumed[s] = at;
            end_probe(health, probing, s);
        }
    }
}

fn end_probe(health: &crate::health::Health, probing: &mut [bool], s: usize) {
    if std::mem::take(&mut probing[s]) {
        health.end_probe(s);
    }
}
