//! Requests of the memcached text protocol: their types and how they are composed.
//!
//! Parsing lives in [`crate::parse`]; this file holds what a parsed request is and
//! how to write one back onto the wire (the proxy forwards requests to servers and
//! the load generator sends them, both through [`Request::encode`]).

use crate::number::{push_i64, push_u64};

/// The four retrieval commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GetKind {
    /// `get <key>*`
    Get,
    /// `gets <key>*`: also returns the cas unique of each item.
    Gets,
    /// `gat <exptime> <key>*`: get and touch.
    Gat,
    /// `gats <exptime> <key>*`: get and touch, with cas uniques.
    Gats,
}

impl GetKind {
    /// The command word.
    pub fn name(self) -> &'static str {
        match self {
            GetKind::Get => "get",
            GetKind::Gets => "gets",
            GetKind::Gat => "gat",
            GetKind::Gats => "gats",
        }
    }

    /// Whether the reply carries cas uniques.
    pub fn with_cas(self) -> bool {
        matches!(self, GetKind::Gets | GetKind::Gats)
    }

    /// Whether the command also changes the items' expiry time.
    pub fn touches(self) -> bool {
        matches!(self, GetKind::Gat | GetKind::Gats)
    }
}

/// The meta commands (`mg ms md ma me mn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaKind {
    /// `mg <key> <flags>*`
    Get,
    /// `ms <key> <datalen> <flags>*` and a data block.
    Set,
    /// `md <key> <flags>*`
    Delete,
    /// `ma <key> <flags>*`
    Arith,
    /// `me <key>`
    Debug,
    /// `mn`
    Noop,
}

impl MetaKind {
    /// The command word.
    pub fn name(self) -> &'static str {
        match self {
            MetaKind::Get => "mg",
            MetaKind::Set => "ms",
            MetaKind::Delete => "md",
            MetaKind::Arith => "ma",
            MetaKind::Debug => "me",
            MetaKind::Noop => "mn",
        }
    }

    /// Whether the command changes the item (and so goes to every replica).
    pub fn writes(self) -> bool {
        matches!(self, MetaKind::Set | MetaKind::Delete | MetaKind::Arith)
    }
}

/// The six storage commands, all followed by a data block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// `set`: store unconditionally.
    Set,
    /// `add`: store only if absent.
    Add,
    /// `replace`: store only if present.
    Replace,
    /// `append`: add data after an existing item's data.
    Append,
    /// `prepend`: add data before an existing item's data.
    Prepend,
    /// `cas`: store only if the item's cas unique still matches.
    Cas,
}

impl StoreKind {
    /// The command word.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Set => "set",
            StoreKind::Add => "add",
            StoreKind::Replace => "replace",
            StoreKind::Append => "append",
            StoreKind::Prepend => "prepend",
            StoreKind::Cas => "cas",
        }
    }
}

/// `incr` or `decr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArithKind {
    /// `incr <key> <delta>`
    Incr,
    /// `decr <key> <delta>`
    Decr,
}

impl ArithKind {
    /// The command word.
    pub fn name(self) -> &'static str {
        match self {
            ArithKind::Incr => "incr",
            ArithKind::Decr => "decr",
        }
    }
}

/// One parsed request, owning its keys and data so it can cross threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A retrieval of one or many keys. `exptime` is only used by gat/gats.
    Get {
        /// Which retrieval command.
        kind: GetKind,
        /// New expiry time for gat/gats, 0 otherwise.
        exptime: i32,
        /// Keys in the client's order (may repeat).
        keys: Vec<Vec<u8>>,
    },
    /// A storage command with its data block (without the trailing `\r\n`).
    Store {
        /// Which storage command.
        kind: StoreKind,
        /// The item's key.
        key: Vec<u8>,
        /// Opaque client flags.
        flags: u32,
        /// Expiry time as the client sent it.
        exptime: i32,
        /// The cas unique to compare against (cas only, 0 otherwise).
        cas: u64,
        /// The value.
        data: Vec<u8>,
        /// The client asked for no reply.
        noreply: bool,
    },
    /// `delete <key> [0] [noreply]`
    Delete {
        /// The item's key.
        key: Vec<u8>,
        /// The client asked for no reply.
        noreply: bool,
    },
    /// `incr`/`decr <key> <delta> [noreply]`
    Arith {
        /// incr or decr.
        kind: ArithKind,
        /// The item's key.
        key: Vec<u8>,
        /// The amount.
        delta: u64,
        /// The client asked for no reply.
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`
    Touch {
        /// The item's key.
        key: Vec<u8>,
        /// New expiry time.
        exptime: i32,
        /// The client asked for no reply.
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`
    FlushAll {
        /// Seconds until the flush takes effect, if given.
        delay: Option<i32>,
        /// The client asked for no reply.
        noreply: bool,
    },
    /// `verbosity <level> [noreply]`
    Verbosity {
        /// The new level.
        level: u32,
        /// The client asked for no reply.
        noreply: bool,
    },
    /// `cache_memlimit <megabytes> [noreply]`
    CacheMemlimit {
        /// The new memory limit.
        megabytes: u32,
        /// The client asked for no reply.
        noreply: bool,
    },
    /// `version`
    Version,
    /// `stats [args...]`
    Stats {
        /// The words after `stats` (e.g. `["backends"]`).
        args: Vec<Vec<u8>>,
    },
    /// `quit`: close the connection after earlier replies.
    Quit,
    /// A meta command, kept as the client sent it: a proxy places it by its key
    /// and forwards the bytes, so the server interprets every flag itself.
    Meta {
        /// Which meta command.
        kind: MetaKind,
        /// The key to place it by: decoded when the `b` flag says it is in
        /// base64 (and decodes), else as sent. Empty for `mn`.
        key: Vec<u8>,
        /// The command line with its line ending, and for `ms` the data block
        /// with its `\r\n`.
        raw: Vec<u8>,
    },
}

impl Request {
    /// Whether the client asked not to be answered.
    pub fn noreply(&self) -> bool {
        match self {
            Request::Store { noreply, .. }
            | Request::Delete { noreply, .. }
            | Request::Arith { noreply, .. }
            | Request::Touch { noreply, .. }
            | Request::FlushAll { noreply, .. }
            | Request::Verbosity { noreply, .. }
            | Request::CacheMemlimit { noreply, .. } => *noreply,
            _ => false,
        }
    }

    /// Appends the request in wire form. With `with_noreply = false` the
    /// `noreply` word is left out, so the receiver always answers (a proxy needs
    /// the answer even when its client does not).
    pub fn encode(&self, out: &mut Vec<u8>, with_noreply: bool) {
        let noreply = with_noreply && self.noreply();
        match self {
            Request::Meta { raw, .. } => {
                out.extend_from_slice(raw);
                return;
            }
            Request::Get { kind, exptime, keys } => {
                encode_get(out, *kind, *exptime, keys.iter().map(|k| k.as_slice()));
                return;
            }
            Request::Store { kind, key, flags, exptime, cas, data, .. } => {
                encode_store_line(out, *kind, key, *flags, *exptime, data.len(), *cas, noreply);
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
                return;
            }
            Request::Delete { key, .. } => {
                out.extend_from_slice(b"delete ");
                out.extend_from_slice(key);
            }
            Request::Arith { kind, key, delta, .. } => {
                out.extend_from_slice(kind.name().as_bytes());
                out.push(b' ');
                out.extend_from_slice(key);
                out.push(b' ');
                push_u64(out, *delta);
            }
            Request::Touch { key, exptime, .. } => {
                out.extend_from_slice(b"touch ");
                out.extend_from_slice(key);
                out.push(b' ');
                push_i64(out, i64::from(*exptime));
            }
            Request::FlushAll { delay, .. } => {
                out.extend_from_slice(b"flush_all");
                if let Some(d) = delay {
                    out.push(b' ');
                    push_i64(out, i64::from(*d));
                }
            }
            Request::Verbosity { level, .. } => {
                out.extend_from_slice(b"verbosity ");
                push_u64(out, u64::from(*level));
            }
            Request::CacheMemlimit { megabytes, .. } => {
                out.extend_from_slice(b"cache_memlimit ");
                push_u64(out, u64::from(*megabytes));
            }
            Request::Version => out.extend_from_slice(b"version"),
            Request::Stats { args } => {
                out.extend_from_slice(b"stats");
                for a in args {
                    out.push(b' ');
                    out.extend_from_slice(a);
                }
            }
            Request::Quit => out.extend_from_slice(b"quit"),
        }
        if noreply {
            out.extend_from_slice(b" noreply");
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends a retrieval line for `keys` (which must not be empty for a useful request).
pub fn encode_get<'k>(out: &mut Vec<u8>, kind: GetKind, exptime: i32, keys: impl IntoIterator<Item = &'k [u8]>) {
    out.extend_from_slice(kind.name().as_bytes());
    if kind.touches() {
        out.push(b' ');
        push_i64(out, i64::from(exptime));
    }
    for k in keys {
        out.push(b' ');
        out.extend_from_slice(k);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends the command line of a storage request (the data block follows it).
#[allow(clippy::too_many_arguments)]
pub fn encode_store_line(
    out: &mut Vec<u8>,
    kind: StoreKind,
    key: &[u8],
    flags: u32,
    exptime: i32,
    bytes: usize,
    cas: u64,
    noreply: bool,
) {
    out.extend_from_slice(kind.name().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, u64::from(flags));
    out.push(b' ');
    push_i64(out, i64::from(exptime));
    out.push(b' ');
    push_u64(out, bytes as u64);
    if kind == StoreKind::Cas {
        out.push(b' ');
        push_u64(out, cas);
    }
    if noreply {
        out.extend_from_slice(b" noreply");
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(r: &Request, noreply: bool) -> String {
        let mut v = Vec::new();
        r.encode(&mut v, noreply);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn encodes_every_command() {
        let k = || b"k".to_vec();
        let get = Request::Get { kind: GetKind::Gats, exptime: -1, keys: vec![k(), b"x".to_vec()] };
        assert_eq!(enc(&get, true), "gats -1 k x\r\n");
        let cas = Request::Store {
            kind: StoreKind::Cas,
            key: k(),
            flags: 3,
            exptime: 0,
            cas: 99,
            data: b"a\r\nb".to_vec(),
            noreply: true,
        };
        assert_eq!(enc(&cas, true), "cas k 3 0 4 99 noreply\r\na\r\nb\r\n");
        assert_eq!(enc(&cas, false), "cas k 3 0 4 99\r\na\r\nb\r\n");
        let del = Request::Delete { key: k(), noreply: true };
        assert_eq!(enc(&del, true), "delete k noreply\r\n");
        let incr = Request::Arith { kind: ArithKind::Decr, key: k(), delta: 5, noreply: false };
        assert_eq!(enc(&incr, true), "decr k 5\r\n");
        let touch = Request::Touch { key: k(), exptime: 10, noreply: false };
        assert_eq!(enc(&touch, true), "touch k 10\r\n");
        assert_eq!(enc(&Request::FlushAll { delay: None, noreply: false }, true), "flush_all\r\n");
        assert_eq!(enc(&Request::FlushAll { delay: Some(3), noreply: true }, true), "flush_all 3 noreply\r\n");
        assert_eq!(enc(&Request::Verbosity { level: 1, noreply: false }, true), "verbosity 1\r\n");
        assert_eq!(enc(&Request::Version, true), "version\r\n");
        assert_eq!(enc(&Request::Stats { args: vec![b"slabs".to_vec()] }, true), "stats slabs\r\n");
        assert_eq!(enc(&Request::Quit, true), "quit\r\n");
    }
}
