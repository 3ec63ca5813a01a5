//! Per-operation counts and response times, the part of a window that
//! clients and middlewares share.
//!
//! Each protocol has its own operation classes (memcached's [`OpKind`],
//! mwmq's queue operations): a type implementing [`OpClass`]. The results
//! format only sees their names.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use crate::hist::{Hist, HistSummary};
use crate::record::OpRecord;

/// Operation classes of the results format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// A retrieval of exactly one key.
    Get,
    /// A retrieval of more than one key.
    Multiget,
    /// A storage command (set, add, replace, append, prepend, cas).
    Set,
    /// delete.
    Delete,
    /// Anything else (incr, decr, touch, flush_all, stats, version, ...).
    Other,
}

/// The operation classes of one protocol.
pub trait OpClass: Copy + std::fmt::Debug + 'static {
    /// Every class, in output order; `index` is the position in this list.
    const ALL: &'static [Self];
    /// Position in [`OpClass::ALL`].
    fn index(self) -> usize;
    /// The key used in the results format.
    fn name(self) -> &'static str;
    /// Whether requests of this class look keys up (hits and misses are counted).
    fn is_retrieval(self) -> bool {
        false
    }
}

impl OpKind {
    /// All classes, in output order.
    pub const ALL: [OpKind; 5] = [OpKind::Get, OpKind::Multiget, OpKind::Set, OpKind::Delete, OpKind::Other];

    /// The key used in the results format.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Get => "get",
            OpKind::Multiget => "multiget",
            OpKind::Set => "set",
            OpKind::Delete => "delete",
            OpKind::Other => "other",
        }
    }
}

impl OpClass for OpKind {
    const ALL: &'static [OpKind] = &OpKind::ALL;

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        OpKind::name(self)
    }

    fn is_retrieval(self) -> bool {
        matches!(self, OpKind::Get | OpKind::Multiget)
    }
}

/// Operation classes of mwmq (the message queue) in the results format,
/// shared by mwmq and by mwload's `--protocol mq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MqOp {
    /// SEND
    Send,
    /// RECV
    Recv,
    /// ACK
    Ack,
    /// NACK
    Nack,
    /// POP
    Pop,
    /// PEEK
    Peek,
    /// QCREATE, QDROP, QLEN, QLIST
    Queue,
    /// PING, CLIENT, INFO, ... and refused requests
    Other,
}

impl OpClass for MqOp {
    const ALL: &'static [MqOp] =
        &[MqOp::Send, MqOp::Recv, MqOp::Ack, MqOp::Nack, MqOp::Pop, MqOp::Peek, MqOp::Queue, MqOp::Other];

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            MqOp::Send => "send",
            MqOp::Recv => "recv",
            MqOp::Ack => "ack",
            MqOp::Nack => "nack",
            MqOp::Pop => "pop",
            MqOp::Peek => "peek",
            MqOp::Queue => "queue",
            MqOp::Other => "other",
        }
    }

    fn is_retrieval(self) -> bool {
        matches!(self, MqOp::Recv | MqOp::Pop | MqOp::Peek)
    }
}

/// Counts and response times of one operation class.
#[derive(Clone, Debug, Default)]
pub struct OpAcc {
    /// Requests completed.
    pub count: u64,
    /// Of those, answered with an error.
    pub errors: u64,
    /// Keys found (retrievals).
    pub hits: u64,
    /// Keys not found (retrievals).
    pub misses: u64,
    /// Keys requested.
    pub keys: u64,
    /// Response time in microseconds.
    pub response: Hist,
}

impl OpAcc {
    /// Adds another accumulator.
    pub fn merge(&mut self, o: &OpAcc) {
        self.count += o.count;
        self.errors += o.errors;
        self.hits += o.hits;
        self.misses += o.misses;
        self.keys += o.keys;
        self.response.merge(&o.response);
    }

    /// Back to zero.
    pub fn reset(&mut self) {
        *self = OpAcc { response: std::mem::take(&mut self.response), ..OpAcc::default() };
        self.response.reset();
    }

    /// The record of this class.
    pub fn record(&self) -> OpRecord {
        OpRecord {
            count: self.count,
            errors: self.errors,
            hits: self.hits,
            misses: self.misses,
            keys: self.keys,
            response_us: self.response.summary(),
        }
    }
}

/// All operation classes of a protocol (memcached's by default).
#[derive(Clone, Debug)]
pub struct Ops<K: OpClass = OpKind> {
    /// One accumulator per class, indexed like [`OpClass::ALL`].
    pub by_kind: Vec<OpAcc>,
    kinds: PhantomData<K>,
}

impl<K: OpClass> Default for Ops<K> {
    fn default() -> Self {
        Ops { by_kind: vec![OpAcc::default(); K::ALL.len()], kinds: PhantomData }
    }
}

impl<K: OpClass> Ops<K> {
    /// The accumulator of `kind`.
    #[inline]
    pub fn get_mut(&mut self, kind: K) -> &mut OpAcc {
        &mut self.by_kind[kind.index()]
    }

    /// The accumulator of `kind`.
    pub fn get(&self, kind: K) -> &OpAcc {
        &self.by_kind[kind.index()]
    }

    /// Records one completed request.
    #[inline]
    pub fn record(&mut self, kind: K, response_ns: u64, error: bool, keys: u64, hits: u64) {
        let a = self.get_mut(kind);
        a.count += 1;
        a.errors += u64::from(error);
        a.keys += keys;
        if kind.is_retrieval() && !error {
            a.hits += hits;
            a.misses += keys.saturating_sub(hits);
        }
        a.response.record_ns(response_ns);
    }

    /// Adds another table.
    pub fn merge(&mut self, o: &Ops<K>) {
        for (a, b) in self.by_kind.iter_mut().zip(&o.by_kind) {
            a.merge(b);
        }
    }

    /// Back to zero.
    pub fn reset(&mut self) {
        for a in &mut self.by_kind {
            a.reset();
        }
    }

    /// All classes together.
    pub fn all(&self) -> OpAcc {
        let mut all = OpAcc::default();
        for a in &self.by_kind {
            all.merge(a);
        }
        all
    }

    /// The `ops` object of a record: every class plus `all`.
    pub fn records(&self) -> BTreeMap<String, OpRecord> {
        let mut m: BTreeMap<String, OpRecord> =
            K::ALL.iter().map(|k| (k.name().to_string(), self.get(*k).record())).collect();
        m.insert("all".into(), self.all().record());
        m
    }
}

/// A summary of an empty histogram (for absent data).
pub fn empty_summary() -> HistSummary {
    Hist::new().summary()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug)]
    enum Queue {
        Send,
        Recv,
    }

    impl OpClass for Queue {
        const ALL: &'static [Queue] = &[Queue::Send, Queue::Recv];
        fn index(self) -> usize {
            self as usize
        }
        fn name(self) -> &'static str {
            match self {
                Queue::Send => "send",
                Queue::Recv => "recv",
            }
        }
    }

    #[test]
    fn another_protocols_classes() {
        let mut o = Ops::<Queue>::default();
        o.record(Queue::Recv, 50_000, false, 1, 1);
        let r = o.records();
        assert_eq!(r.keys().map(String::as_str).collect::<Vec<_>>(), ["all", "recv", "send"]);
        assert_eq!((r["recv"].count, r["recv"].hits, r["send"].count), (1, 0, 0));
    }

    #[test]
    fn records_and_totals() {
        let mut o: Ops = Ops::default();
        o.record(OpKind::Get, 100_000, false, 1, 1);
        o.record(OpKind::Multiget, 300_000, false, 5, 3);
        o.record(OpKind::Set, 200_000, true, 1, 0);
        let all = o.all();
        assert_eq!((all.count, all.errors, all.keys, all.hits, all.misses), (3, 1, 7, 4, 2));
        let r = o.records();
        assert_eq!(r["multiget"].misses, 2);
        assert_eq!(r["all"].response_us.count, 3);
        o.reset();
        assert_eq!(o.all().count, 0);
    }
}
