//! Meta commands (`mg ms md ma me`; `mn` is answered by the proxy).
//!
//! The command is forwarded exactly as the client sent it, followed by an
//! `mn`, and the reply is whatever the server sends before its `MN`: nothing
//! where quiet mode holds an answer back, two replies for a refused line and
//! its data. So every flag means what the server says it means, and the
//! connection to the server never falls out of step.
//!
//! Under replication, meta commands follow the text commands' rules:
//! - what carries or depends on one server's state is decided by the
//!   **primary**: an `mg` that asks for the cas token (`c`), compares one (`C`) or changes the
//!   item (`T` touch, `N` vivify/lease, `R` recache win, `E` new cas), an
//!   `ms`/`md`/`ma` that compares a cas token (`C`) or invalidates (`I`), and
//!   `me`. When the primary applied it, the change is copied to the other
//!   replicas without the condition (`ms` and `ma` without `C`/`I`, a plain
//!   `md` for an `md`, the new TTL for an `mg T`), as `cas` and `gat` are; so
//!   one server hands out cas tokens and win flags, and replicas keep the same
//!   value and lifetime;
//! - other `ms`, `md`, `ma` go to every replica at once and are answered by
//!   the primary unless a replica failed (a write is acknowledged only when
//!   every replica has it);
//! - other `mg` read one replica (the read policy's choice, the next one if it
//!   fails).
//!
//! Replicas a write left different get repairs, as for text writes.

use mcproto::MetaKind;

use super::{own, Answer, BackendError, Effects, Outbox, Router};
use crate::config::ReadPolicy;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// One replica, with failover.
    Read,
    /// Every replica at once.
    All,
    /// The primary decides; a success is copied to the others.
    Primary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Send,
    Wait,
    Copies,
    Done,
}

/// A meta command in progress.
#[derive(Debug)]
pub struct MetaPlan {
    kind: MetaKind,
    key: Vec<u8>,
    raw: Vec<u8>,
    route: Route,
    /// Read: replicas in the order to try. Otherwise every replica, primary first.
    servers: Vec<usize>,
    /// Read: replicas tried so far.
    tried: usize,
    answers: Vec<Option<Answer>>,
    stage: Stage,
}

impl MetaPlan {
    /// Plans a meta command placed by `key` (`raw` is the command as sent).
    pub fn new(kind: MetaKind, key: Vec<u8>, raw: Vec<u8>, router: &Router, rr: &mut usize) -> MetaPlan {
        let mut servers = router.replicas(&key);
        let line = Line::of(&raw);
        let route = if servers.len() == 1 {
            if kind.writes() {
                Route::All
            } else {
                Route::Read
            }
        } else {
            match kind {
                MetaKind::Get if line.has_any(b"cCENRT") => Route::Primary,
                MetaKind::Get => Route::Read,
                MetaKind::Set | MetaKind::Delete | MetaKind::Arith if line.has_any(b"CI") => Route::Primary,
                MetaKind::Set | MetaKind::Delete | MetaKind::Arith => Route::All,
                _ => Route::Primary,
            }
        };
        if route == Route::Read && router.read_policy == ReadPolicy::RoundRobin {
            let turn = *rr % servers.len();
            servers.rotate_left(turn);
            *rr = rr.wrapping_add(1);
        }
        let answers = if route == Route::All { vec![None; servers.len()] } else { vec![None] };
        MetaPlan { kind, key, raw, route, servers, tried: 0, answers, stage: Stage::Send }
    }

    fn emit(&self, server: usize, command: &[u8], router: &Router, out: &mut Outbox) {
        let buf = out.call(server, mcproto::meta_reply_len, router.single_cap());
        buf.extend_from_slice(command);
        buf.extend_from_slice(b"mn\r\n");
    }

    pub(super) fn round(&mut self, router: &Router, out: &mut Outbox, reply: &mut Vec<u8>, fx: &mut Effects) {
        match (self.stage, self.route) {
            (Stage::Send, Route::All) => {
                for &s in &self.servers {
                    self.emit(s, &self.raw, router, out);
                }
                self.stage = Stage::Wait;
            }
            (Stage::Send, _) => {
                self.emit(self.servers[self.tried], &self.raw, router, out);
                self.tried += 1;
                self.stage = Stage::Wait;
            }
            (Stage::Wait, Route::All) => {
                self.stage = Stage::Done;
                self.combine_writes(router, reply, fx);
            }
            (Stage::Wait, route) => match self.answers[0].take() {
                Some(Ok(raw)) => {
                    reply.extend_from_slice(strip_mn(&raw));
                    self.count(reply, fx);
                    self.stage = Stage::Done;
                    if route == Route::Primary && self.servers.len() > 1 && self.applied(reply) {
                        self.copy(router, out);
                    }
                }
                failure => {
                    fx.counters.backend_failures += 1;
                    if route == Route::Read && self.tried < self.servers.len() {
                        fx.counters.read_failovers += 1;
                        self.stage = Stage::Send;
                        self.round(router, out, reply, fx);
                        return;
                    }
                    self.stage = Stage::Done;
                    let e = failure.and_then(Result::err).unwrap_or(BackendError::Down);
                    router.error_line(self.servers[self.tried - 1], &e, reply);
                    if route == Route::Primary && self.servers.len() > 1 && self.kind != MetaKind::Debug {
                        // The primary may have applied it: it must not keep what the others lack.
                        fx.repairs.push((self.servers[0], self.key.clone()));
                        fx.counters.replica_write_failures += 1;
                    }
                }
            },
            (Stage::Copies, _) => {
                self.stage = Stage::Done;
                let mut diverged = false;
                for (i, a) in self.answers.iter().enumerate() {
                    let ok = matches!(a, Some(Ok(raw)) if !strip_mn(raw).starts_with(b"SERVER_ERROR")
                        && !strip_mn(raw).starts_with(b"CLIENT_ERROR"));
                    if !ok {
                        fx.repairs.push((self.servers[i + 1], self.key.clone()));
                        diverged = true;
                    }
                }
                fx.counters.replica_disagreements += u64::from(diverged);
            }
            (Stage::Done, _) => {}
        }
    }

    pub(super) fn absorb(&mut self, i: usize, outcome: Result<&[u8], &BackendError>) {
        self.answers[i] = Some(own(outcome));
    }

    /// Whether the primary's reply says the command changed the item, so the
    /// other replicas must follow.
    fn applied(&self, reply: &[u8]) -> bool {
        let line = Line::of(&self.raw);
        match self.kind {
            // Quiet mode answers a success with nothing.
            MetaKind::Set | MetaKind::Delete => reply.is_empty() || reply.starts_with(b"HD"),
            MetaKind::Arith => reply.is_empty() || reply.starts_with(b"HD") || reply.starts_with(b"VA"),
            // Only a touch is copied: a lease (N) or a recache win (R) lives on the primary.
            MetaKind::Get => line.has_any(b"T") && (reply.starts_with(b"VA") || reply.starts_with(b"HD")),
            _ => false,
        }
    }

    /// Sends the primary's change to the other replicas, without its condition.
    fn copy(&mut self, router: &Router, out: &mut Outbox) {
        let line = Line::of(&self.raw);
        let command = match self.kind {
            MetaKind::Set | MetaKind::Arith => line.without(b"CI", &self.raw),
            MetaKind::Delete => line.only(b"b", b"md"),
            MetaKind::Get => {
                let mut c = line.only(b"bT", b"mg");
                c.truncate(c.len() - 2);
                c.extend_from_slice(b" q\r\n");
                c
            }
            _ => return,
        };
        self.answers = vec![None; self.servers.len() - 1];
        for &s in &self.servers[1..] {
            self.emit(s, &command, router, out);
        }
        self.stage = Stage::Copies;
    }

    fn combine_writes(&mut self, router: &Router, reply: &mut Vec<u8>, fx: &mut Effects) {
        let failed = self.answers.iter().position(|a| !matches!(a, Some(Ok(_))));
        match failed {
            None => {
                let Some(Some(Ok(raw))) = self.answers.first() else { unreachable!("writes have a primary") };
                reply.extend_from_slice(strip_mn(raw));
                self.count(reply, fx);
            }
            Some(i) => {
                fx.counters.backend_failures += 1;
                let e = self.answers[i].take().and_then(Result::err).unwrap_or(BackendError::Down);
                router.error_line(self.servers[i], &e, reply);
                if self.servers.len() > 1 {
                    fx.counters.replica_write_failures += 1;
                    // Whether a replica applied it cannot be told from quiet
                    // replies: every replica is repaired.
                    for &s in &self.servers {
                        fx.repairs.push((s, self.key.clone()));
                    }
                }
            }
        }
    }

    /// memcached-style counters from the reply (quiet mode leaves it empty
    /// for an `mg` miss and an `md` success).
    fn count(&self, reply: &[u8], fx: &mut Effects) {
        let c = &mut fx.counters;
        match self.kind {
            MetaKind::Get => {
                c.cmd_get += 1;
                if reply.starts_with(b"VA ") || reply.starts_with(b"HD") {
                    c.get_hits += 1;
                    fx.hits = 1;
                } else if reply.is_empty() || reply.starts_with(b"EN") {
                    c.get_misses += 1;
                }
            }
            MetaKind::Set => c.cmd_set += 1,
            MetaKind::Delete => {
                if reply.is_empty() || reply.starts_with(b"HD") {
                    c.delete_hits += 1;
                } else if reply.starts_with(b"NF") {
                    c.delete_misses += 1;
                }
            }
            _ => {}
        }
    }
}

/// Whether a meta write's outcome depends on the item it finds: a compare
/// and swap (`C`), an invalidation (`I`), a mode other than set (`ME` add,
/// `MA` append, `MP` prepend, `MR` replace), or arithmetic. Sent to two
/// pools holding different items, such a write may succeed on one and be
/// refused by the other, which then keeps a value the first no longer has.
pub fn conditional(kind: MetaKind, raw: &[u8]) -> bool {
    let line = Line::of(raw);
    let mode = |f: &&[u8]| f.len() > 1 && f[0] == b'M' && !f[1].eq_ignore_ascii_case(&b'S');
    match kind {
        MetaKind::Set => line.has_any(b"CI") || line.flags().iter().any(mode),
        MetaKind::Delete => line.has_any(b"CI"),
        MetaKind::Arith => true,
        _ => false,
    }
}

/// A plain meta delete of the key `raw` names (`md <key> [b]`).
pub fn delete_of(raw: &[u8]) -> Vec<u8> {
    Line::of(raw).only(b"b", b"md")
}

/// What memcached answers a meta command that finds no item (a `null`
/// route's and an all-async node's reply): `EN` to a get (nothing when it
/// is quiet, `q`), `NS` to a set, `NF` to the rest, with the opaque (`O`) and
/// the key (`k`, and `b` when it is in base64) echoed in the order asked.
pub fn miss_reply(kind: MetaKind, raw: &[u8]) -> Vec<u8> {
    let line = Line::of(raw);
    if kind == MetaKind::Get && line.has_any(b"q") {
        return Vec::new();
    }
    let mut out = match kind {
        MetaKind::Get | MetaKind::Debug => b"EN".to_vec(),
        MetaKind::Set => b"NS".to_vec(),
        _ => b"NF".to_vec(),
    };
    if kind != MetaKind::Debug {
        let base64 = line.flags().contains(&&b"b"[..]);
        for f in line.flags() {
            match f[0] {
                b'O' => {
                    out.push(b' ');
                    out.extend_from_slice(f);
                }
                b'k' => {
                    out.extend_from_slice(b" k");
                    out.extend_from_slice(line.words.get(1).copied().unwrap_or_default());
                    if base64 {
                        out.extend_from_slice(b" b");
                    }
                }
                _ => {}
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A meta command's first line, split into words (command, key, for `ms`
/// the data length, then flags).
struct Line<'a> {
    words: Vec<&'a [u8]>,
    /// Index of the first flag.
    flags_at: usize,
}

impl<'a> Line<'a> {
    fn of(raw: &'a [u8]) -> Line<'a> {
        let end = memchr::memchr(b'\n', raw).unwrap_or(raw.len());
        let line = raw[..end].strip_suffix(b"\r").unwrap_or(&raw[..end]);
        let words: Vec<&[u8]> = line.split(|&b| b == b' ').filter(|w| !w.is_empty()).collect();
        let flags_at = if words.first() == Some(&&b"ms"[..]) { 3 } else { 2 };
        Line { words, flags_at }
    }

    fn flags(&self) -> &[&'a [u8]] {
        self.words.get(self.flags_at..).unwrap_or(&[])
    }

    /// Whether a flag starting with one of `letters` is present.
    fn has_any(&self, letters: &[u8]) -> bool {
        self.flags().iter().any(|f| letters.contains(&f[0]))
    }

    /// The whole command (line and data block) without the flags starting with `letters`.
    fn without(&self, letters: &[u8], raw: &[u8]) -> Vec<u8> {
        let mut out = self.words[..self.flags_at.min(self.words.len())].join(&b' ');
        for f in self.flags().iter().filter(|f| !letters.contains(&f[0])) {
            out.push(b' ');
            out.extend_from_slice(f);
        }
        out.extend_from_slice(b"\r\n");
        let end = memchr::memchr(b'\n', raw).map_or(raw.len(), |i| i + 1);
        out.extend_from_slice(&raw[end..]);
        out
    }

    /// `command key` with only the flags starting with `letters`.
    fn only(&self, letters: &[u8], command: &[u8]) -> Vec<u8> {
        let mut out = command.to_vec();
        out.push(b' ');
        out.extend_from_slice(self.words.get(1).copied().unwrap_or_default());
        for f in self.flags().iter().filter(|f| letters.contains(&f[0])) {
            out.push(b' ');
            out.extend_from_slice(f);
        }
        out.extend_from_slice(b"\r\n");
        out
    }
}

/// A server's reply without the `MN` that closes it.
fn strip_mn(raw: &[u8]) -> &[u8] {
    &raw[..raw.len().saturating_sub(b"MN\r\n".len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_are_dropped_from_copies() {
        let raw = b"ms k 2 C123 T60 I q\r\nhi\r\n";
        let line = Line::of(raw);
        assert!(line.has_any(b"C") && line.has_any(b"I") && !line.has_any(b"N"));
        assert_eq!(line.without(b"CI", raw), b"ms k 2 T60 q\r\nhi\r\n");
        let raw = b"md Zm9v b I T30 q\r\n";
        assert_eq!(Line::of(raw).only(b"b", b"md"), b"md Zm9v b\r\n");
        let raw = b"mg k v c T90\r\n";
        assert_eq!(Line::of(raw).only(b"bT", b"mg"), b"mg k T90\r\n");
    }

    #[test]
    fn writes_whose_outcome_depends_on_the_item_are_told_apart() {
        assert!(!conditional(MetaKind::Set, b"ms k 2 T60\r\nhi\r\n"));
        assert!(!conditional(MetaKind::Set, b"ms k 2 MS\r\nhi\r\n"));
        for raw in [&b"ms k 2 C9\r\nhi\r\n"[..], b"ms k 2 ME\r\nhi\r\n", b"ms k 2 Ma\r\nhi\r\n", b"ms k 2 I\r\nhi\r\n"]
        {
            assert!(conditional(MetaKind::Set, raw), "{}", String::from_utf8_lossy(raw));
        }
        assert!(!conditional(MetaKind::Delete, b"md k q\r\n"));
        assert!(conditional(MetaKind::Delete, b"md k C5\r\n"));
        assert!(conditional(MetaKind::Arith, b"ma k\r\n"));
        assert!(!conditional(MetaKind::Get, b"mg k v\r\n"));
        assert_eq!(delete_of(b"ms Zm9v 2 b C9 q\r\nhi\r\n"), b"md Zm9v b\r\n");
    }

    #[test]
    fn a_miss_is_answered_as_memcached_answers_it() {
        // (Each as memcached 1.6 answers a key it does not hold.)
        assert_eq!(miss_reply(MetaKind::Get, b"mg k v q O5 k\r\n"), b"");
        assert_eq!(miss_reply(MetaKind::Get, b"mg k v O6 k\r\n"), b"EN O6 kk\r\n");
        assert_eq!(miss_reply(MetaKind::Get, b"mg Zm9v b k O6 v\r\n"), b"EN kZm9v b O6\r\n");
        assert_eq!(miss_reply(MetaKind::Set, b"ms k 1 q ME O7 k\r\nx\r\n"), b"NS O7 kk\r\n");
        assert_eq!(miss_reply(MetaKind::Delete, b"md k q O9\r\n"), b"NF O9\r\n");
        assert_eq!(miss_reply(MetaKind::Arith, b"ma k\r\n"), b"NF\r\n");
        assert_eq!(miss_reply(MetaKind::Debug, b"me k\r\n"), b"EN\r\n");
    }
}
