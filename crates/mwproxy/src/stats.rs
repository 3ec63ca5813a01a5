//! Counters behind the `stats` command.
//!
//! Each worker counts into its own cache-line-padded block, so workers never
//! write the same memory; `stats` adds the blocks up when asked. Net threads
//! share one block of connection counters. Names follow memcached's `stats`
//! output where memcached has the same quantity (cmd_get, get_hits, ...).

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

macro_rules! counter_block {
    ($(#[$meta:meta])* $name:ident { $($(#[doc = $doc:literal])* $field:ident),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Default, Debug)]
        pub struct $name {
            $($(#[doc = $doc])* pub $field: AtomicU64,)*
        }

        impl $name {
            /// Counter names in output order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Adds every counter to `acc` (same order as `NAMES`).
            pub fn add_to(&self, acc: &mut [u64]) {
                let vals = [$(self.$field.load(Ordering::Relaxed)),*];
                for (a, v) in acc.iter_mut().zip(vals) {
                    *a += v;
                }
            }

            /// Sets every counter to zero (`stats reset`).
            pub fn reset(&self) {
                $(self.$field.store(0, Ordering::Relaxed);)*
            }
        }
    };
}

counter_block! {
    /// What one worker has done.
    WorkerCounters {
        /// Requests handled.
        requests,
        /// Keys asked for by get/gets (memcached counts keys, not commands).
        cmd_get,
        /// Keys found.
        get_hits,
        /// Keys not found.
        get_misses,
        /// Storage commands (set, add, replace, append, prepend, cas).
        cmd_set,
        /// touch commands and keys of gat/gats.
        cmd_touch,
        /// touch and gat keys found.
        touch_hits,
        /// touch and gat keys not found.
        touch_misses,
        /// delete commands that removed an item.
        delete_hits,
        /// delete commands that found nothing.
        delete_misses,
        /// incr commands that found the item.
        incr_hits,
        /// incr commands that did not.
        incr_misses,
        /// decr commands that found the item.
        decr_hits,
        /// decr commands that did not.
        decr_misses,
        /// cas commands that stored.
        cas_hits,
        /// cas commands on missing items.
        cas_misses,
        /// cas commands with a stale cas unique.
        cas_badval,
        /// flush_all commands.
        cmd_flush,
        /// Replies that were errors (ERROR, CLIENT_ERROR, SERVER_ERROR).
        error_replies,
        /// Requests that failed because a server failed.
        backend_failures,
        /// Replicated writes whose replicas answered differently.
        replica_disagreements,
        /// Multi-gets answered with the hits of only some servers.
        multiget_partial,
        /// Reads answered by another replica after the chosen one failed.
        read_failovers,
        /// Nanoseconds spent on jobs (worker utilisation).
        busy_ns,
    }
}

counter_block! {
    /// One worker's traffic to one server.
    BackendCounters {
        /// Requests sent.
        requests,
        /// Requests that got no usable reply.
        errors,
        /// Of those, timeouts.
        timeouts,
        /// Connections opened after a failure.
        reconnects,
    }
}

counter_block! {
    /// Connection counters shared by the net threads.
    NetCounters {
        /// Connections accepted since start.
        total_connections,
        /// Connections refused because max_connections was reached.
        rejected_connections,
        /// Connections closed.
        closed_connections,
        /// Bytes read from clients.
        bytes_read,
        /// Bytes written to clients.
        bytes_written,
        /// Inputs refused by the parser (each got memcached's error).
        protocol_errors,
        /// Times a net thread found the request queue full and stopped reading.
        queue_full,
    }
}

/// A worker's counters: its own and per server.
#[derive(Debug)]
pub struct WorkerStats {
    /// Request counters.
    pub counters: WorkerCounters,
    /// One block per server, in configuration order.
    pub backends: Vec<BackendCounters>,
}

/// All counters of a proxy.
#[derive(Debug)]
pub struct Registry {
    /// One block per worker.
    pub workers: Vec<CachePadded<WorkerStats>>,
    /// Net thread counters.
    pub net: NetCounters,
}

impl Registry {
    /// Counters for `workers` workers and `servers` servers, all zero.
    pub fn new(workers: usize, servers: usize) -> Registry {
        let workers = (0..workers)
            .map(|_| {
                CachePadded::new(WorkerStats {
                    counters: WorkerCounters::default(),
                    backends: (0..servers).map(|_| BackendCounters::default()).collect(),
                })
            })
            .collect();
        Registry { workers, net: NetCounters::default() }
    }

    /// Worker counters summed over workers, as (name, value).
    pub fn worker_totals(&self) -> Vec<(&'static str, u64)> {
        let mut acc = vec![0; WorkerCounters::NAMES.len()];
        for w in &self.workers {
            w.counters.add_to(&mut acc);
        }
        WorkerCounters::NAMES.iter().copied().zip(acc).collect()
    }

    /// Counters of server `index` summed over workers.
    pub fn backend_totals(&self, index: usize) -> Vec<(&'static str, u64)> {
        let mut acc = vec![0; BackendCounters::NAMES.len()];
        for w in &self.workers {
            w.backends[index].add_to(&mut acc);
        }
        BackendCounters::NAMES.iter().copied().zip(acc).collect()
    }

    /// Net counters as (name, value).
    pub fn net_totals(&self) -> Vec<(&'static str, u64)> {
        let mut acc = vec![0; NetCounters::NAMES.len()];
        self.net.add_to(&mut acc);
        NetCounters::NAMES.iter().copied().zip(acc).collect()
    }

    /// Zeroes every counter.
    pub fn reset(&self) {
        for w in &self.workers {
            w.counters.reset();
            for b in &w.backends {
                b.reset();
            }
        }
        self.net.reset();
    }
}

/// Adds one to a counter that only its owner writes.
#[inline]
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to a counter.
#[inline]
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_up_over_workers() {
        let r = Registry::new(3, 2);
        for w in &r.workers {
            bump(&w.counters.cmd_get);
            add(&w.backends[1].requests, 2);
        }
        let t = r.worker_totals();
        assert_eq!(t.iter().find(|(n, _)| *n == "cmd_get").unwrap().1, 3);
        assert_eq!(r.backend_totals(1)[0], ("requests", 6));
        assert_eq!(r.backend_totals(0)[0], ("requests", 0));
        r.reset();
        assert!(r.worker_totals().iter().all(|(_, v)| *v == 0));
    }
}
