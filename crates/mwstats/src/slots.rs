//! Per-thread accumulators that a stats thread collects once per window.
//!
//! Each measuring thread owns one slot: a mutex that only it takes on the
//! request path (uncontended) and that the stats thread takes once per window to
//! swap the accumulator for an empty one. Threads record through a
//! [`SlotWriter`], which uses `try_lock` and falls back to a private spill
//! accumulator when the stats thread holds the slot at that instant, so a
//! measuring thread never waits.

use std::sync::{Mutex, MutexGuard, TryLockError};

use crossbeam_utils::CachePadded;

use crate::writer::TraceRow;

/// Something that can be filled, merged and emptied.
pub trait Accumulator: Send {
    /// Adds `other` into `self` (and may take things out of `other`, e.g. trace rows).
    fn absorb(&mut self, other: &mut Self);
    /// Back to empty, keeping allocations.
    fn clear(&mut self);
    /// Whether anything was recorded since the last clear.
    fn is_dirty(&self) -> bool;
    /// The sampled requests it holds, if it keeps any (taken out).
    fn take_trace(&mut self) -> Vec<TraceRow> {
        Vec::new()
    }
    /// Puts sampled requests back (after [`Accumulator::take_trace`]).
    fn put_trace(&mut self, _rows: Vec<TraceRow>) {}
}

/// One accumulator per measuring thread.
pub struct Slots<A> {
    slots: Vec<CachePadded<Mutex<A>>>,
}

impl<A: Accumulator> Slots<A> {
    /// Slots holding the given (empty) accumulators.
    pub fn new(accs: Vec<A>) -> Slots<A> {
        Slots { slots: accs.into_iter().map(|a| CachePadded::new(Mutex::new(a))).collect() }
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Slot `i` if it is free right now.
    pub fn try_lock(&self, i: usize) -> Option<MutexGuard<'_, A>> {
        match self.slots[i].try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Slot `i`, waiting if needed (stats thread, admin views).
    pub fn lock(&self, i: usize) -> MutexGuard<'_, A> {
        self.slots[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Swaps every slot with `spares[i]`, absorbs the collected accumulators
    /// into `into` and clears them (they are the next spares).
    pub fn collect(&self, spares: &mut [A], into: &mut A) {
        for (i, spare) in spares.iter_mut().enumerate() {
            std::mem::swap(&mut *self.lock(i), spare);
        }
        for spare in spares.iter_mut() {
            if spare.is_dirty() {
                into.absorb(spare);
                spare.clear();
            }
        }
    }
}

impl<A: Accumulator + Clone> Slots<A> {
    /// Adds what the slots hold now (not yet collected) to `into`, without
    /// their trace rows, leaving the slots as they are.
    pub fn peek(&self, into: &mut A) {
        for i in 0..self.len() {
            let mut c = self.lock(i).clone();
            c.take_trace();
            into.absorb(&mut c);
        }
    }
}

impl<A: Accumulator> Slots<A> {
    /// Closes a window: collects every slot into `window` and adds it to the
    /// run's `total` as well; the sampled requests stay in `window` only (they
    /// go to trace.csv once, and the totals do not grow with them).
    pub fn close_window(&self, spares: &mut [A], window: &mut A, total: &mut A) {
        self.collect(spares, window);
        let trace = window.take_trace();
        total.absorb(window);
        window.put_trace(trace);
    }
}

/// A measuring thread's handle on its slot.
pub struct SlotWriter<A> {
    index: usize,
    spill: A,
}

impl<A: Accumulator> SlotWriter<A> {
    /// The writer of slot `index`; `spill` is an empty accumulator of the same shape.
    pub fn new(index: usize, spill: A) -> SlotWriter<A> {
        SlotWriter { index, spill }
    }

    /// Records through `f` into the slot, or into the spill if the slot is busy.
    #[inline]
    pub fn record(&mut self, slots: &Slots<A>, f: impl FnOnce(&mut A)) {
        match slots.try_lock(self.index) {
            Some(mut acc) => {
                if self.spill.is_dirty() {
                    acc.absorb(&mut self.spill);
                    self.spill.clear();
                }
                f(&mut acc);
            }
            None => f(&mut self.spill),
        }
    }

    /// Moves a spill into the slot, waiting for the slot if needed. Called
    /// after a reply is out and before the thread takes more work, so that what
    /// a client was answered is visible to whoever reads the slots next (the
    /// wait, rare and short, delays no reply).
    pub fn settle(&mut self, slots: &Slots<A>) {
        if self.spill.is_dirty() {
            slots.lock(self.index).absorb(&mut self.spill);
            self.spill.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Count(u64);

    impl Accumulator for Count {
        fn absorb(&mut self, o: &mut Self) {
            self.0 += o.0;
        }
        fn clear(&mut self) {
            self.0 = 0;
        }
        fn is_dirty(&self) -> bool {
            self.0 > 0
        }
    }

    #[test]
    fn writers_never_wait_and_nothing_is_lost() {
        let slots = Slots::new(vec![Count(0), Count(0)]);
        let mut w = SlotWriter::new(1, Count(0));
        w.record(&slots, |c| c.0 += 1);
        {
            let _held = slots.lock(1);
            w.record(&slots, |c| c.0 += 10); // goes to the spill
        }
        w.record(&slots, |c| c.0 += 100); // spill handed over
        let mut total = Count(0);
        let mut spares = vec![Count(0), Count(0)];
        slots.collect(&mut spares, &mut total);
        assert_eq!(total.0, 111);
        assert_eq!(slots.lock(1).0, 0);
    }

    #[test]
    fn a_settled_spill_is_in_the_slot() {
        let slots = Slots::new(vec![Count(0)]);
        let mut w = SlotWriter::new(0, Count(0));
        {
            let _held = slots.lock(0);
            w.record(&slots, |c| c.0 += 7); // goes to the spill
        }
        assert_eq!(slots.lock(0).0, 0);
        w.settle(&slots);
        assert_eq!(slots.lock(0).0, 7);
        w.settle(&slots); // nothing left to move
        assert_eq!(slots.lock(0).0, 7);
    }
}
