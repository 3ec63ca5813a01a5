//! Counters behind the `stats` command.
//!
//! Worker counters are plain numbers kept in each worker's window accumulator
//! (see `recorder.rs`), so workers never write shared memory for them. Net
//! threads share one block of atomic connection counters. Names follow
//! memcached's `stats` output where memcached has the same quantity.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! plain_block {
    ($(#[$meta:meta])* $name:ident { $($(#[doc = $doc:literal])* $field:ident),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Default, Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl $name {
            /// Counter names in output order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Values in the order of `NAMES`.
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$field),*]
            }

            /// Adds another block.
            pub fn add(&mut self, o: &$name) {
                $(self.$field += o.$field;)*
            }

            /// Subtracts an earlier snapshot (saturating), for `stats reset`.
            pub fn since(&self, base: &$name) -> $name {
                $name { $($field: self.$field.saturating_sub(base.$field),)* }
            }
        }
    };
}

macro_rules! atomic_block {
    ($(#[$meta:meta])* $name:ident { $($(#[doc = $doc:literal])* $field:ident),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Default, Debug)]
        pub struct $name {
            $($(#[doc = $doc])* pub $field: AtomicU64,)*
        }

        impl $name {
            /// Counter names in output order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Current values in the order of `NAMES`.
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$field.load(Ordering::Relaxed)),*]
            }

            /// The counter called `name` in values taken by [`Self::values`].
            pub fn value_of(values: &[u64], name: &str) -> u64 {
                let i = Self::NAMES.iter().position(|n| *n == name).expect("a known counter name");
                values[i]
            }
        }
    };
}

plain_block! {
    /// What workers have done, in memcached's `stats` terms. Each worker counts
    /// into its own block; blocks are added up per window and for `stats`.
    WorkerCounters {
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
        /// Replicated writes that some replicas did not confirm (failed or
        /// stalled); acknowledged only when the write quorum confirmed them.
        replica_write_failures,
        /// Multi-gets answered with the hits of only some servers.
        multiget_partial,
        /// Reads answered by another replica after the chosen one failed.
        read_failovers,
    }
}

atomic_block! {
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
        /// Connections that spoke memcached's binary protocol.
        binary_connections,
        /// Times a net thread found the request queue full and stopped reading.
        queue_full,
        /// Login attempts (memcached's `auth_cmds`).
        auth_cmds,
        /// Login attempts with wrong credentials (memcached's `auth_errors`).
        auth_errors,
        /// Login attempts refused unchecked: their source address or user name failed too often.
        auth_throttled,
        /// Connections closed after `[auth] max_failures` failed logins, or
        /// a login from a throttled address.
        auth_closed,
        /// Connections closed because they had not logged in within `[auth] login_timeout_secs`.
        login_timeouts,
        /// Connections closed because their TLS handshake did not finish within `[tls] handshake_timeout_secs`.
        handshake_timeouts,
        /// Connections closed because too many others were still handshaking (`[tls] max_handshaking`).
        handshake_refused,
        /// Client connections whose TLS handshake failed (plaintext to the TLS
        /// port, an unknown or missing client certificate, ...).
        tls_handshake_failures,
        /// Configurations reloaded (SIGHUP, `POST /reload`).
        config_reloads,
        /// Reloads refused (the running configuration was kept).
        config_reload_failures,
    }
}

/// Adds `n` to a shared counter.
#[inline]
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Adds one to a shared counter.
#[inline]
pub fn bump(c: &AtomicU64) {
    add(c, 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_add_and_subtract() {
        let mut a = WorkerCounters { cmd_get: 3, ..Default::default() };
        let b = WorkerCounters { cmd_get: 2, get_hits: 1, ..Default::default() };
        a.add(&b);
        assert_eq!((a.cmd_get, a.get_hits), (5, 1));
        assert_eq!(a.since(&b).cmd_get, 3);
        assert_eq!(WorkerCounters::NAMES.len(), a.values().len());
        let n = NetCounters::default();
        bump(&n.bytes_read);
        assert_eq!(NetCounters::value_of(&n.values(), "bytes_read"), 1);
    }
}
