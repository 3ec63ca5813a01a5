//! The failures seen lately: which (source, user name, password) triples
//! failed in the last [`REPEAT_WINDOW`], so that a client that sends the
//! same wrong password again is answered at once, unchecked and uncounted.
//!
//! A triple is kept as a 64-bit keyed hash (SipHash with a key drawn at
//! random when the process starts and never written anywhere): no password
//! is kept, and nobody outside the process can aim a password at another's
//! entry. At most [`MAX_REMEMBERED`] triples, forgotten oldest first; an
//! entry is never renewed, so a password is checked again at least once per
//! window.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Attempt;

/// How long a failed password is remembered as wrong.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(60);
/// Failed triples remembered at most (about 40 bytes each).
pub const MAX_REMEMBERED: usize = 16_384;

/// The triples, by hash, with when each failed; and the same in the order
/// they failed (to forget the oldest first).
#[derive(Debug, Default)]
struct Seen {
    at: HashMap<u64, Instant>,
    order: VecDeque<(u64, Instant)>,
}

#[derive(Debug, Default)]
pub(super) struct Remembered {
    key: std::collections::hash_map::RandomState,
    seen: Mutex<Seen>,
}

impl Remembered {
    fn hash(&self, a: &Attempt) -> u64 {
        self.key.hash_one((a.source, a.user, a.secret))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `a`'s triple failed within the window.
    pub(super) fn contains(&self, a: &Attempt) -> bool {
        let h = self.hash(a);
        self.lock().at.get(&h).is_some_and(|t| t.elapsed() < REPEAT_WINDOW)
    }

    /// `a`'s triple failed now.
    pub(super) fn remember(&self, a: &Attempt) {
        let h = self.hash(a);
        let now = Instant::now();
        let mut seen = self.lock();
        while let Some(&(old, at)) = seen.order.front() {
            if now.duration_since(at) < REPEAT_WINDOW && seen.order.len() < MAX_REMEMBERED {
                break;
            }
            seen.order.pop_front();
            // (A triple that failed twice at once is in the order twice: the
            // later entry keeps it.)
            if seen.at.get(&old) == Some(&at) {
                seen.at.remove(&old);
            }
        }
        seen.at.insert(h, now);
        seen.order.push_back((h, now));
    }

    /// Forgets every triple.
    pub(super) fn clear(&self) {
        *self.lock() = Seen::default();
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().at.len()
    }
}
