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
//! A round is written to every server involved before any reply is read.
//! What may be sent, how long to wait and what a failure means is decided by
//! each server's [`Exchange`] (the same rules as the async engine's); the
//! worker only blocks on its sockets ([`Backend`]) for as long as the
//! exchange allows.

use std::sync::Arc;

use mwstats::clock::now_ns;
use mwstats::slots::SlotWriter;

use crate::batch::{finish_wave, waves, Entry};
use crate::carry::{Link, Tag};
use crate::conn::{After, ClientConn, Job};
use crate::exchange::{Ended, Exchange};
use crate::generation::Generation;
use crate::recorder::WorkerAcc;
use crate::route::Outbox;
use crate::shared::Shared;

/// A worker thread's state: its connections, buffers and counters.
pub struct Worker {
    id: usize,
    shared: Arc<Shared>,
    /// By server number, opened as servers are first used.
    links: Vec<Link>,
    /// The configuration in use, as of the last batch.
    /// (Taken out while a batch runs, so that no reference is counted per batch.)
    current: Option<Arc<Generation>>,
    outbox: Outbox,
    /// For each call of the outbox, whose it is.
    owners: Vec<Tag>,
    /// The bytes of one server's part of a round.
    out: Vec<u8>,
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
        Worker {
            id,
            links: Vec::new(),
            current: Some(shared.generation()),
            outbox: Outbox::new(0),
            owners: Vec::new(),
            out: Vec::new(),
            rr: id,
            turn: false,
            writer: SlotWriter::new(id, WorkerAcc::new(0)),
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
        let mut generation = self.current.take().expect("the configuration between batches");
        if self.shared.refresh(&mut generation) {
            // Nothing is in flight between batches: connections to servers
            // a reload removed are closed now.
            for (s, link) in self.links.iter_mut().enumerate().filter(|(s, _)| !generation.uses(*s)) {
                link.conn.close();
                link.ex = Exchange::new(s);
            }
        }
        let waves = waves(&jobs, generation.wave_width());
        let mut entries: Vec<Entry> =
            jobs.into_iter().map(|job| Entry::begin(job, t_dequeue, &generation, &mut self.rr)).collect();
        for wave in waves {
            let entries = &mut entries[wave];
            self.run_wave(&generation, entries);
            finish_wave(entries, &generation, conn, &self.shared, &mut self.writer, self.id);
        }
        self.current = Some(generation);
        let busy = now_ns().saturating_sub(t_dequeue);
        self.writer.record(&self.shared.telemetry.slots, |acc| {
            acc.busy_ns += busy;
            acc.dirty = true;
        });
    }

    /// Runs the rounds of a wave until every request in it is finished.
    fn run_wave(&mut self, generation: &Generation, entries: &mut [Entry]) {
        for e in entries.iter_mut() {
            e.answer_locally(generation, &self.shared, &mut self.writer);
        }
        loop {
            self.outbox.clear();
            self.owners.clear();
            for (i, e) in entries.iter_mut().enumerate().filter(|(_, e)| !e.finished) {
                let n = e.next_round(generation, &mut self.outbox);
                self.owners.extend((0..n).map(|j| (i, j)));
            }
            if self.owners.is_empty() {
                break;
            }
            self.exchange(generation, entries);
        }
        for e in entries.iter_mut() {
            e.answer_gathered(generation, &self.shared, &mut self.writer);
        }
    }

    /// Writes the round to every server involved, then reads every reply;
    /// each call's end goes straight to its request.
    fn exchange(&mut self, generation: &Generation, entries: &mut [Entry]) {
        let Worker { shared, links, outbox, owners, out, .. } = self;
        let mut ended = |end: Ended<'_, Tag>| {
            let (i, j) = end.tag;
            entries[i].absorb(generation, j, end.outcome, end.fact);
        };
        crate::carry::exchange(&shared.servers, links, outbox, owners, out, &mut ended);
    }
}
