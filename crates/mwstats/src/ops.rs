//! Per-operation counts and response times, the part of a window that
//! clients and middlewares share.

use std::collections::BTreeMap;

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

/// All operation classes.
#[derive(Clone, Debug, Default)]
pub struct Ops {
    /// One accumulator per class, indexed like [`OpKind::ALL`].
    pub by_kind: [OpAcc; 5],
}

impl Ops {
    /// The accumulator of `kind`.
    #[inline]
    pub fn get_mut(&mut self, kind: OpKind) -> &mut OpAcc {
        &mut self.by_kind[kind as usize]
    }

    /// The accumulator of `kind`.
    pub fn get(&self, kind: OpKind) -> &OpAcc {
        &self.by_kind[kind as usize]
    }

    /// Records one completed request.
    #[inline]
    pub fn record(&mut self, kind: OpKind, response_ns: u64, error: bool, keys: u64, hits: u64) {
        let a = self.get_mut(kind);
        a.count += 1;
        a.errors += u64::from(error);
        a.keys += keys;
        if matches!(kind, OpKind::Get | OpKind::Multiget) && !error {
            a.hits += hits;
            a.misses += keys.saturating_sub(hits);
        }
        a.response.record_ns(response_ns);
    }

    /// Adds another table.
    pub fn merge(&mut self, o: &Ops) {
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
            OpKind::ALL.iter().map(|k| (k.name().to_string(), self.get(*k).record())).collect();
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

    #[test]
    fn records_and_totals() {
        let mut o = Ops::default();
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
