//! Repairs: keys to delete on a server before it serves them again.
//!
//! When a replicated write leaves a key different on its replicas (one
//! replica failed or stalled, or the replicas answered differently), the
//! routing core names the replicas that may now hold a value the others do
//! not. Their keys wait here, per server, and the next exchange with that
//! server — for a server that was down, the probe that finds it back —
//! first deletes them, in the same write and on the same connection as the
//! requests that follow, so no read can see the stale value. Deleting is
//! the safe repair for a cache: the next read misses and the next write sets
//! every replica again.
//!
//! The log is bounded: past `MAX_KEYS` keys for one server, the server is
//! flushed instead (`flush_all`) when it comes back, which is what a cache
//! that missed that many writes needs anyway.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Keys kept per server before the log gives up and flushes the server.
pub const MAX_KEYS: usize = 100_000;
/// Longest reply line a repair can get.
pub const REPAIR_CAP: usize = 4096;
/// Keys deleted in one exchange.
const CHUNK: usize = 1000;

#[derive(Debug, Default)]
struct Inner {
    keys: VecDeque<Vec<u8>>,
    set: HashSet<Vec<u8>>,
    overflow: bool,
}

#[derive(Debug, Default)]
struct Log {
    pending: AtomicBool,
    inner: Mutex<Inner>,
}

/// What one exchange repairs before its own requests.
#[derive(Debug)]
pub struct Batch {
    keys: Vec<Vec<u8>>,
    flush: bool,
}

impl Batch {
    /// Appends the repair commands; returns how many replies they get.
    pub fn encode(&self, out: &mut Vec<u8>) -> usize {
        if self.flush {
            out.extend_from_slice(b"flush_all\r\n");
            return 1;
        }
        for k in &self.keys {
            // (A key a binary client set may be no text token: `md` in base64.)
            mcproto::binary::encode_delete(out, k);
        }
        self.keys.len()
    }
}

/// The repair logs of every server.
#[derive(Debug)]
pub struct Repairs {
    logs: Vec<Log>,
    max_keys: usize,
    /// Keys noted for repair.
    pub queued: AtomicU64,
    /// Keys deleted by repairs.
    pub done: AtomicU64,
    /// Servers flushed because their log overflowed.
    pub flushes: AtomicU64,
}

impl Repairs {
    /// Empty logs for `servers` servers.
    pub fn new(servers: usize) -> Repairs {
        Repairs::with_limit(servers, MAX_KEYS)
    }

    /// Empty logs keeping at most `max_keys` keys per server.
    pub fn with_limit(servers: usize, max_keys: usize) -> Repairs {
        Repairs {
            logs: (0..servers).map(|_| Log::default()).collect(),
            max_keys,
            queued: AtomicU64::new(0),
            done: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        }
    }

    fn lock(&self, server: usize) -> std::sync::MutexGuard<'_, Inner> {
        self.logs[server].inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `key` must be deleted on `server` before it serves again.
    pub fn note(&self, server: usize, key: Vec<u8>) {
        let mut log = self.lock(server);
        if !log.overflow && !log.set.contains(&key) {
            if log.keys.len() >= self.max_keys {
                log.overflow = true;
                log.keys.clear();
                log.set.clear();
            } else {
                log.set.insert(key.clone());
                log.keys.push_back(key);
            }
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.logs[server].pending.store(true, Ordering::Release);
    }

    /// Keys waiting for `server` (none: no lock taken).
    pub fn take(&self, server: usize) -> Option<Batch> {
        if !self.logs[server].pending.load(Ordering::Acquire) {
            return None;
        }
        let mut log = self.lock(server);
        let batch = if log.overflow {
            log.overflow = false;
            log.keys.clear();
            log.set.clear();
            Batch { keys: Vec::new(), flush: true }
        } else {
            let n = log.keys.len().min(CHUNK);
            let keys: Vec<Vec<u8>> = log.keys.drain(..n).collect();
            for k in &keys {
                log.set.remove(k);
            }
            Batch { keys, flush: false }
        };
        if log.keys.is_empty() {
            self.logs[server].pending.store(false, Ordering::Release);
        }
        (batch.flush || !batch.keys.is_empty()).then_some(batch)
    }

    /// The exchange failed: the batch waits for the next one.
    pub fn give_back(&self, server: usize, batch: Batch) {
        if batch.flush {
            let mut log = self.lock(server);
            log.overflow = true;
            log.keys.clear();
            log.set.clear();
            self.logs[server].pending.store(true, Ordering::Release);
            return;
        }
        for k in batch.keys {
            self.note(server, k);
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The batch was carried out.
    pub fn completed(&self, batch: &Batch) {
        if batch.flush {
            self.flushes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.done.fetch_add(batch.keys.len() as u64, Ordering::Relaxed);
        }
    }

    /// Keys waiting on `server`.
    pub fn waiting(&self, server: usize) -> usize {
        self.lock(server).keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_wait_once_per_server_and_come_back_after_a_failure() {
        let r = Repairs::new(2);
        assert!(r.take(0).is_none());
        r.note(0, b"a".to_vec());
        r.note(0, b"a".to_vec());
        r.note(0, b"b".to_vec());
        r.note(0, b"c d".to_vec());
        assert!(r.take(1).is_none());
        let b = r.take(0).unwrap();
        let mut bytes = Vec::new();
        assert_eq!(b.encode(&mut bytes), 3);
        assert_eq!(bytes, b"delete a\r\ndelete b\r\nmd YyBk b\r\n");
        assert!(r.take(0).is_none());
        r.give_back(0, b);
        let b = r.take(0).unwrap();
        r.completed(&b);
        assert_eq!(r.done.load(Ordering::Relaxed), 3);
        assert_eq!(r.waiting(0), 0);
    }

    #[test]
    fn an_overflowing_log_flushes_the_server() {
        let r = Repairs::with_limit(1, 3);
        for i in 0..5 {
            r.note(0, format!("k{i}").into_bytes());
        }
        let b = r.take(0).unwrap();
        let mut bytes = Vec::new();
        assert_eq!(b.encode(&mut bytes), 1);
        assert_eq!(bytes, b"flush_all\r\n");
        r.completed(&b);
        assert!(r.take(0).is_none());
        assert_eq!(r.flushes.load(Ordering::Relaxed), 1);
    }
}
