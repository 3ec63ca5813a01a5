//! What both engines do with a connection's batch of requests, apart from
//! talking to the servers: turn each job into an [`Entry`] (its request
//! started in the routing core, its timestamps), cut the batch into waves
//! ([`waves`]), answer what the proxy answers itself, deliver a finished
//! wave's replies in order and record its measurements ([`finish_wave`]).
//! The pool's workers (`worker.rs`) and the async engine's loops
//! (`pipeline.rs`) only differ in how the rounds' calls reach the servers.

use std::collections::HashSet;
use std::ops::Range;

use mcproto::Request;
use mwstats::clock::now_ns;
use mwstats::slots::SlotWriter;
use mwstats::OpKind;

use crate::conn::{ClientConn, Job};
use crate::generation::Generation;
use crate::recorder::{record, BackendFact, Finished, JobFacts, WorkerAcc};
use crate::route::{BackendError, Begin, Exec, Outbox, Work};
use crate::routes::flow::routed;
use crate::routes::{Flow, Tree};
use crate::shared::Shared;

/// A request of the batch in progress.
pub struct Entry {
    /// Its number on the connection.
    pub seq: u64,
    /// Unique per process.
    pub request_id: u64,
    /// When the read that completed it returned.
    pub t_recv: u64,
    /// When it was parsed.
    pub t_parsed: u64,
    /// When it was put in its connection's line.
    pub t_enqueue: u64,
    /// Results-format class.
    pub op: OpKind,
    /// Keys it names.
    pub keys: u64,
    /// The client wants no reply.
    pub noreply: bool,
    /// Answered from the proxy's own state when its wave comes.
    pub local: Option<Request>,
    /// Its way through the routing core (or, when it goes through a route
    /// tree, where the tree's reply and effects are put once it is done).
    pub exec: Exec,
    /// Its way through the route tree, when the configuration has one.
    pub flow: Option<Flow>,
    /// Calls of the current round it no longer waits for (an all-fastest
    /// answered): an engine that can may give them up (`Exchange::give_up`).
    pub abandon: Vec<usize>,
    /// Calls of the current round still without a reply.
    pub awaiting: usize,
    /// Timestamps and server figures noted on the way.
    pub facts: JobFacts,
    /// The routing core has its reply.
    pub finished: bool,
    /// The reply's trace status.
    pub status: &'static str,
    /// A binary-protocol request: its reply is turned into a binary response.
    pub bin: Option<Box<mcproto::binary::Ctx>>,
}

impl Entry {
    /// Starts `job` in the routing core; `t_dequeue` is when an engine took it up.
    /// `generation` is the configuration it is routed with, until it is
    /// answered (every call below takes the same one).
    pub fn begin(job: Job, t_dequeue: u64, generation: &Generation, rr: &mut usize) -> Entry {
        let (op, keys) = job.work.class();
        let noreply = job.work.noreply();
        let (exec, local, flow) = match &generation.tree {
            Some(tree) if routed(&job.work) => {
                let flow = Flow::begin(tree, Tree::ROOT, job.work, rr);
                (Exec::answered(Vec::new()), None, Some(flow))
            }
            _ => match Exec::begin(job.work, &generation.router, rr) {
                Begin::Exec(e) => (e, None, None),
                Begin::Local(req) => (Exec::answered(Vec::new()), Some(req), None),
            },
        };
        let mut facts = JobFacts::default();
        facts.begin(t_dequeue);
        Entry {
            seq: job.seq,
            request_id: job.request_id,
            t_recv: job.t_recv,
            t_parsed: job.t_parsed,
            t_enqueue: job.t_enqueue,
            op,
            keys,
            noreply,
            local,
            exec,
            flow,
            abandon: Vec::new(),
            awaiting: 0,
            facts,
            finished: false,
            status: "ok",
            bin: job.bin,
        }
    }

    /// Adds the request's next round of calls to `outbox` and returns how
    /// many; 0 means it is finished.
    pub fn next_round(&mut self, generation: &Generation, outbox: &mut Outbox) -> usize {
        self.abandon.clear();
        let first = outbox.calls().len();
        let n = match (&mut self.flow, &generation.tree) {
            (Some(flow), Some(tree)) => {
                let n = flow.round(tree, outbox);
                if n == 0 {
                    (self.exec.reply, self.exec.effects) = flow.finish();
                }
                n
            }
            _ => {
                outbox.numbering(&generation.ids);
                self.exec.round(&generation.router, outbox)
            }
        };
        self.awaiting = outbox.calls()[first..].iter().filter(|c| c.reply).count();
        self.finished = n == 0;
        n
    }

    /// Call `j` of the current round ended (in any order); true when it was
    /// the last one the round waited for, or when it left calls the request
    /// no longer waits for ([`Entry::abandon`]: the engine gives them up, then
    /// takes the next round once [`Entry::awaiting`] is 0).
    pub fn absorb(
        &mut self,
        generation: &Generation,
        j: usize,
        outcome: Result<&[u8], &BackendError>,
        fact: BackendFact,
    ) -> bool {
        self.facts.add(fact);
        let before = self.abandon.len();
        match (&mut self.flow, &generation.tree) {
            (Some(flow), Some(tree)) => flow.absorb(tree, j, outcome, &mut self.abandon),
            _ => self.exec.absorb(&generation.router, j, outcome),
        }
        self.awaiting -= 1;
        self.awaiting == 0 || (before == 0 && !self.abandon.is_empty())
    }

    /// Answers a request the proxy answers from its own state (`stats
    /// settings`, ...), once its wave comes; what was recorded before is
    /// made visible first.
    pub fn answer_locally(&mut self, generation: &Generation, shared: &Shared, writer: &mut SlotWriter<WorkerAcc>) {
        if let Some(req) = self.local.take() {
            writer.settle(&shared.telemetry.slots);
            self.exec.reply = crate::local::reply(&req, shared, generation);
        }
    }

    /// Builds the reply of a request that gathered every server's answer
    /// (`version`, `stats`), once the routing core is done with it.
    pub fn answer_gathered(&mut self, generation: &Generation, shared: &Shared, writer: &mut SlotWriter<WorkerAcc>) {
        if let Some((req, answers)) = self.exec.take_gathered() {
            writer.settle(&shared.telemetry.slots);
            self.exec.reply = crate::local::gathered(&req, &answers, shared, generation);
        }
    }
}

/// Delivers a finished wave's replies to its connection (in request order,
/// whatever order they finished in), adds its requests to the carrier's
/// accumulator and notes the repairs they leave behind.
pub fn finish_wave(
    entries: &mut [Entry],
    generation: &Generation,
    conn: &ClientConn,
    shared: &Shared,
    writer: &mut SlotWriter<WorkerAcc>,
    carrier: usize,
) {
    for e in entries.iter_mut() {
        e.status = reply_status(&e.exec.reply);
    }
    let replies = entries.iter_mut().map(|e| {
        let reply = std::mem::take(&mut e.exec.reply);
        let reply = match &e.bin {
            Some(ctx) => mcproto::binary::reply(ctx, &reply),
            None if e.noreply => Vec::new(),
            None => reply,
        };
        // (Judged on the proxy's own reply, whatever protocol it goes out in.)
        (e.seq, reply, matches!(e.status, "server_error" | "client_error"))
    });
    conn.deliver_all(replies, &shared.net);
    let t_reply = now_ns();
    let trace_every = if shared.config.stats.out.is_some() { shared.config.stats.trace_every } else { 0 };
    for e in entries.iter_mut() {
        for (server, key) in e.exec.effects.repairs.drain(..) {
            shared.servers.repairs.note(generation.ids[server], key);
        }
        e.facts.counters = std::mem::take(&mut e.exec.effects.counters);
        e.facts.hits = e.exec.effects.hits;
        if e.status != "ok" {
            e.facts.counters.error_replies += 1;
        }
    }
    writer.record(&shared.telemetry.slots, |acc| {
        for e in entries.iter() {
            let f = Finished {
                request_id: e.request_id,
                op: e.op,
                keys: e.keys,
                status: e.status,
                t_recv: e.t_recv,
                t_parsed: e.t_parsed,
                t_enqueue: e.t_enqueue,
                t_reply,
            };
            record(acc, &f, &e.facts, carrier, trace_every);
        }
    });
}

/// The trace status of a reply: `ok`, `error`, `client_error` or `server_error`.
pub fn reply_status(reply: &[u8]) -> &'static str {
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

/// Cuts a batch into waves. With one replica per key a batch is one wave
/// (each server executes its requests in order, and no request needs a second
/// round). Under replication a request starts a new wave when it names a key
/// that an earlier request of the wave writes, or writes a key that an
/// earlier one names, so that failovers, cas copies and repairs happen before
/// anything that follows. `stats` and `version` are always a wave of their own.
pub fn waves(jobs: &[Job], replication: usize) -> Vec<Range<usize>> {
    if jobs.len() <= 1 {
        // (One request is one wave, whatever it is.)
        return (!jobs.is_empty()).then_some(0..jobs.len()).into_iter().collect();
    }
    let mut waves = Vec::new();
    let mut start = 0;
    let mut read: HashSet<&[u8]> = HashSet::new();
    let mut written: HashSet<&[u8]> = HashSet::new();
    let mut everything = false;
    for (i, job) in jobs.iter().enumerate() {
        let local = matches!(job.work, Work::Request(Request::Version | Request::Stats { .. }));
        // (`version` and `stats` are answered from the proxy's counters: alone,
        // after everything before them is recorded.)
        if replication == 1 {
            // Only `version` and `stats` cut a batch: skip the key sets.
            if local {
                if i > start {
                    waves.push(start..i);
                }
                waves.push(i..i + 1);
                start = i + 1;
            }
            continue;
        }
        let keys = job.work.keys();
        let writes = job.work.writes();
        let conflict = local
            || (replication > 1
                && (everything
                    || match &keys {
                        None => i > start,
                        Some(ks) => ks.iter().any(|k| written.contains(k) || (writes && read.contains(k))),
                    }));
        if conflict && i > start {
            waves.push(start..i);
            start = i;
            read.clear();
            written.clear();
            everything = false;
        }
        match keys {
            None => everything = true,
            Some(ks) => {
                let set = if writes { &mut written } else { &mut read };
                set.extend(ks);
            }
        }
        if local {
            waves.push(start..i + 1);
            start = i + 1;
            read.clear();
            written.clear();
            everything = false;
        }
    }
    if start < jobs.len() {
        waves.push(start..jobs.len());
    }
    waves
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcproto::{parse_request, Limits, Parsed};

    fn jobs(text: &str) -> Vec<Job> {
        let mut buf = text.as_bytes();
        let mut out = Vec::new();
        while !buf.is_empty() {
            let Parsed::Request { request, consumed } = parse_request(buf, &Limits::default()) else { panic!() };
            buf = &buf[consumed..];
            let seq = out.len() as u64;
            let work = Work::Request(request);
            out.push(Job {
                seq,
                work,
                request_id: seq,
                t_recv: 0,
                t_parsed: 0,
                t_enqueue: 0,
                size: consumed,
                bin: None,
            });
        }
        out
    }

    #[test]
    fn a_batch_is_one_wave_without_replication_and_is_cut_at_conflicts_with_it() {
        let batch = jobs("get a\r\nset a 0 0 1\r\nx\r\nget a b\r\nset c 0 0 1\r\ny\r\nget d\r\n");
        assert_eq!(waves(&batch, 1), vec![0..5]);
        // `set a` writes what `get a` read; `get a b` reads what `set a` wrote.
        assert_eq!(waves(&batch, 2), vec![0..1, 1..2, 2..5]);
        let batch = jobs("get a\r\nflush_all\r\nget b\r\nstats\r\nget c\r\n");
        assert_eq!(waves(&batch, 1), vec![0..3, 3..4, 4..5], "stats is answered alone");
        assert_eq!(waves(&batch, 2), vec![0..1, 1..2, 2..3, 3..4, 4..5], "flush_all concerns every key");
    }
}
