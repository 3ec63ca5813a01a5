//! What a load thread measures during a window.

use std::collections::BTreeMap;

use mwstats::record::OpRecord;
use mwstats::slots::Accumulator;
use mwstats::{Hist, MqOp, OpAcc, OpClass, OpKind, Ops};

/// Counts and response times of one thread (or merged).
#[derive(Clone, Debug, Default)]
pub struct ClientAcc {
    /// Per operation class (memcached).
    pub ops: Ops,
    /// Bytes sent plus received, per operation class (for KB/s).
    pub bytes: [u64; 5],
    /// Per operation class (`--protocol mq`).
    pub mq: Ops<MqOp>,
    /// Bytes sent plus received, per mq operation class.
    pub mq_bytes: [u64; 8],
    /// Requests sent more than 1 ms after their intended time.
    pub late: u64,
    /// Open loop: how late each send left after its intended time.
    pub send_late: Hist,
    /// Open loop: gaps between a thread's consecutive sends.
    pub send_gap: Hist,
    /// Open-loop arrivals not sent: no connection of the thread was up.
    pub unsent: u64,
    /// Values read back with the wrong content.
    pub verify_failures: u64,
    /// Think times actually spent (closed loop): their sum in ns and number.
    pub think_ns: u64,
    /// Number of think times.
    pub thinks: u64,
    dirty: bool,
}

impl ClientAcc {
    /// Records one completed request.
    #[inline]
    pub fn record(&mut self, op: OpKind, response_ns: u64, error: bool, keys: u64, hits: u64, bytes: u64) {
        self.ops.record(op, response_ns, error, keys, hits);
        self.bytes[op as usize] += bytes;
        self.dirty = true;
    }

    /// Records one completed request of the message queue.
    #[inline]
    pub fn record_mq(&mut self, op: MqOp, response_ns: u64, error: bool, hits: u64, bytes: u64) {
        self.mq.record(op, response_ns, error, 1, hits);
        self.mq_bytes[op.index()] += bytes;
        self.dirty = true;
    }

    /// Every request, whatever the protocol.
    pub fn all(&self) -> OpAcc {
        let mut a = self.ops.all();
        a.merge(&self.mq.all());
        a
    }

    /// Bytes of every request.
    pub fn all_bytes(&self) -> u64 {
        self.bytes.iter().chain(&self.mq_bytes).sum()
    }

    /// The `ops` of a record: the classes of the protocol spoken.
    pub fn records(&self, mq: bool) -> BTreeMap<String, OpRecord> {
        if mq {
            self.mq.records()
        } else {
            self.ops.records()
        }
    }

    /// Records an open-loop send: `late_ns` after its intended time, `gap_ns`
    /// after the thread's previous send; `late` when past the lateness limit.
    pub fn record_send(&mut self, late_ns: u64, gap_ns: Option<u64>, late: bool) {
        self.send_late.record_ns(late_ns);
        if let Some(g) = gap_ns {
            self.send_gap.record_ns(g);
        }
        self.late += u64::from(late);
        self.dirty = true;
    }

    /// Records one think time as it was actually spent.
    pub fn record_think(&mut self, ns: u64) {
        self.think_ns += ns;
        self.thinks += 1;
        self.dirty = true;
    }

    /// Mean think time actually spent, in microseconds (0 without think times).
    pub fn think_mean_us(&self) -> f64 {
        if self.thinks == 0 {
            0.0
        } else {
            self.think_ns as f64 / self.thinks as f64 / 1000.0
        }
    }

    /// Records an arrival that could not be sent.
    pub fn record_unsent(&mut self) {
        self.unsent += 1;
        self.dirty = true;
    }

    /// Records values that failed verification.
    pub fn record_verify_failures(&mut self, n: u64) {
        self.verify_failures += n;
        self.dirty = true;
    }
}

impl Accumulator for ClientAcc {
    fn absorb(&mut self, o: &mut Self) {
        self.ops.merge(&o.ops);
        for (a, b) in self.bytes.iter_mut().zip(o.bytes) {
            *a += b;
        }
        self.mq.merge(&o.mq);
        for (a, b) in self.mq_bytes.iter_mut().zip(o.mq_bytes) {
            *a += b;
        }
        self.late += o.late;
        self.send_late.merge(&o.send_late);
        self.send_gap.merge(&o.send_gap);
        self.unsent += o.unsent;
        self.verify_failures += o.verify_failures;
        self.think_ns += o.think_ns;
        self.thinks += o.thinks;
        self.dirty |= o.dirty;
    }

    fn clear(&mut self) {
        self.ops.reset();
        self.bytes = [0; 5];
        self.mq.reset();
        self.mq_bytes = [0; 8];
        self.late = 0;
        self.send_late.reset();
        self.send_gap.reset();
        self.unsent = 0;
        self.verify_failures = 0;
        self.think_ns = 0;
        self.thinks = 0;
        self.dirty = false;
    }

    fn is_dirty(&self) -> bool {
        self.dirty
    }
}

/// Connections lost during a run, and how many of them came back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Connections {
    /// Losses (a connection lost twice counts twice).
    pub lost: u64,
    /// Losses repaired by reconnecting (`--reconnect`).
    pub reconnected: u64,
}

impl Connections {
    /// Connections still down at the end (or given up).
    pub fn down(&self) -> u64 {
        self.lost.saturating_sub(self.reconnected)
    }
}
