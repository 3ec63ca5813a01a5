//! The stages of a request inside a middleware, as both middlewares measure
//! them (mwproxy: net thread, queue, worker, memcached servers; mwmq: net
//! thread, queue, worker, database pool, PostgreSQL).
//!
//! A worker fills a [`Timeline`] per request and adds it to its own
//! [`Stages`]: per-class counts and response time, a histogram per stage,
//! the time requests spent queued (whose sum over a window is the mean queue
//! length times the window), and one trace row every k-th request.

use crate::hist::Hist;
use crate::ops::{OpClass, Ops};
use crate::writer::TraceRow;

/// Most trace rows kept per window (bounds memory if the stats thread lags).
pub const MAX_TRACE_ROWS: usize = 200_000;

/// When one request passed each stage (monotonic ns, see [`crate::clock`]).
#[derive(Clone, Copy, Debug)]
pub struct Timeline<K> {
    /// Unique per process (trace sampling picks multiples of k).
    pub request_id: u64,
    /// Operation class.
    pub op: K,
    /// Keys (or messages) requested.
    pub keys: u64,
    /// Keys found (retrievals).
    pub hits: u64,
    /// `ok`, `error`, `client_error`, `server_error`, ...
    pub status: &'static str,
    /// Worker that carried it.
    pub worker: u32,
    /// Servers (or database connections) involved.
    pub servers: u32,
    /// Its bytes were read.
    pub t_recv: u64,
    /// Parsed.
    pub t_parsed: u64,
    /// Put on the request queue.
    pub t_enqueue: u64,
    /// Taken by a worker.
    pub t_dequeue: u64,
    /// A pooled connection was in hand (mwmq), `None` without a pool.
    pub t_pool: Option<u64>,
    /// First request sent to a server / first statement sent to the database
    /// (= t_dequeue when none was).
    pub t_send: u64,
    /// Last server reply parsed / the database's last answer.
    pub t_backend_done: u64,
    /// Reply handed to the client socket.
    pub t_reply: u64,
}

/// Everything measured about requests in a window, for one worker or merged.
#[derive(Clone, Debug)]
pub struct Stages<K: OpClass> {
    /// Per operation class: counts, hits, response time (t_reply - t_recv).
    pub ops: Ops<K>,
    /// t_enqueue - t_recv.
    pub net: Hist,
    /// t_dequeue - t_enqueue.
    pub queue: Hist,
    /// t_pool - t_dequeue: waiting for a pooled connection (mwmq).
    pub pool: Hist,
    /// t_backend_done - t_send.
    pub server: Hist,
    /// t_reply - t_dequeue.
    pub service: Hist,
    /// Nanoseconds workers spent on requests (added by the worker).
    pub busy_ns: u64,
    /// Sum of queue times in ns (divided by the window length: mean queue length).
    pub queue_ns: u64,
    /// Sampled requests.
    pub trace: Vec<TraceRow>,
    /// Whether anything was recorded since the last reset.
    pub dirty: bool,
}

impl<K: OpClass> Default for Stages<K> {
    fn default() -> Self {
        Stages {
            ops: Ops::default(),
            net: Hist::new(),
            queue: Hist::new(),
            pool: Hist::new(),
            server: Hist::new(),
            service: Hist::new(),
            busy_ns: 0,
            queue_ns: 0,
            trace: Vec::new(),
            dirty: false,
        }
    }
}

impl<K: OpClass> Stages<K> {
    /// Adds one finished request; every `trace_every`-th (by id) becomes a trace row.
    pub fn record(&mut self, t: &Timeline<K>, trace_every: u64) {
        self.dirty = true;
        let error = t.status != "ok";
        self.ops.record(t.op, t.t_reply.saturating_sub(t.t_recv), error, t.keys, t.hits);
        self.net.record_ns(t.t_enqueue.saturating_sub(t.t_recv));
        let queue_ns = t.t_dequeue.saturating_sub(t.t_enqueue);
        self.queue.record_ns(queue_ns);
        self.queue_ns += queue_ns;
        if let Some(p) = t.t_pool {
            self.pool.record_ns(p.saturating_sub(t.t_dequeue));
        }
        self.server.record_ns(t.t_backend_done.saturating_sub(t.t_send));
        self.service.record_ns(t.t_reply.saturating_sub(t.t_dequeue));
        if trace_every > 0 && t.request_id.is_multiple_of(trace_every) && self.trace.len() < MAX_TRACE_ROWS {
            self.trace.push(TraceRow {
                request_id: t.request_id,
                op: t.op.name(),
                keys: t.keys as u32,
                worker: t.worker,
                t_recv: t.t_recv,
                t_parsed: t.t_parsed,
                t_enqueue: t.t_enqueue,
                t_dequeue: t.t_dequeue,
                t_send: t.t_send,
                t_backend_done: t.t_backend_done,
                t_reply: t.t_reply,
                servers: t.servers,
                status: t.status,
            });
        }
    }

    /// Adds another accumulator (trace rows are moved, not copied).
    pub fn merge(&mut self, o: &mut Stages<K>) {
        if !o.dirty {
            return;
        }
        self.ops.merge(&o.ops);
        self.net.merge(&o.net);
        self.queue.merge(&o.queue);
        self.pool.merge(&o.pool);
        self.server.merge(&o.server);
        self.service.merge(&o.service);
        self.busy_ns += o.busy_ns;
        self.queue_ns += o.queue_ns;
        self.trace.append(&mut o.trace);
        self.dirty = true;
    }

    /// Back to empty, keeping allocations.
    pub fn reset(&mut self) {
        if !self.dirty {
            return;
        }
        self.ops.reset();
        for h in [&mut self.net, &mut self.queue, &mut self.pool, &mut self.server, &mut self.service] {
            h.reset();
        }
        self.busy_ns = 0;
        self.queue_ns = 0;
        self.trace.clear();
        self.dirty = false;
    }

    /// Requests completed.
    pub fn requests(&self) -> u64 {
        self.ops.by_kind.iter().map(|o| o.count).sum()
    }

    /// Mean number of requests queued over a window of `duration_ms`.
    pub fn queue_length_mean(&self, duration_ms: u64) -> f64 {
        round4(self.queue_ns as f64 / (duration_ms.max(1) * 1_000_000) as f64)
    }

    /// Busy time of `workers` workers over a window of `duration_ms`, 0..1.
    pub fn utilisation(&self, workers: u64, duration_ms: u64) -> f64 {
        round4(self.busy_ns as f64 / (workers.max(1) as f64 * (duration_ms.max(1) * 1_000_000) as f64))
    }
}

/// Rounded to 4 decimals (for ratios in records).
pub fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OpKind;

    fn timeline(id: u64, recv: u64) -> Timeline<OpKind> {
        Timeline {
            request_id: id,
            op: OpKind::Get,
            keys: 1,
            hits: 1,
            status: "ok",
            worker: 0,
            servers: 1,
            t_recv: recv,
            t_parsed: recv + 1_000,
            t_enqueue: recv + 2_000,
            t_dequeue: recv + 5_000,
            t_pool: Some(recv + 7_000),
            t_send: recv + 8_000,
            t_backend_done: recv + 38_000,
            t_reply: recv + 50_000,
        }
    }

    #[test]
    fn stages_and_samples() {
        let mut s = Stages::<OpKind>::default();
        for id in 0..10 {
            s.record(&timeline(id, id * 100_000), 5);
        }
        assert_eq!(s.requests(), 10);
        assert_eq!(s.queue.quantile(0.5), 3);
        assert_eq!(s.pool.quantile(0.5), 2);
        assert_eq!(s.server.quantile(0.5), 30);
        assert_eq!(s.service.quantile(0.5), 45);
        assert_eq!(s.trace.len(), 2);
        assert_eq!(s.queue_length_mean(1), 0.03);
        let mut total = Stages::<OpKind>::default();
        total.merge(&mut s);
        assert_eq!((total.requests(), total.trace.len(), s.trace.len()), (10, 2, 0));
        total.reset();
        assert_eq!(total.requests(), 0);
    }
}
