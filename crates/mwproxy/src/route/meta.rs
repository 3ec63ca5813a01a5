//! Meta commands (`mg ms md ma me`; `mn` is answered by the proxy).
//!
//! The command is forwarded exactly as the client sent it, followed by an
//! `mn`, and the reply is whatever the server sends before its `MN`: nothing
//! where quiet mode holds an answer back, two replies for a refused line and
//! its data. So every flag means what the server says it means, and the
//! connection to the server never falls out of step. `mg` reads one replica
//! (the read policy's choice, the next one if it fails), `me` the primary;
//! `ms`, `md` and `ma` go to every replica and are answered by the primary,
//! unless a replica failed: a write is acknowledged only when every replica
//! has it, and a failed one leaves repairs behind as text writes do.

use mcproto::MetaKind;

use super::{own, Answer, BackendError, Effects, Outbox, Router};
use crate::config::ReadPolicy;

#[derive(Debug, PartialEq, Eq)]
enum Stage {
    Send,
    Wait,
    Done,
}

/// A meta command in progress.
#[derive(Debug)]
pub struct MetaPlan {
    kind: MetaKind,
    key: Vec<u8>,
    raw: Vec<u8>,
    /// Reads: replicas in the order to try. Writes: every replica, primary first.
    servers: Vec<usize>,
    /// Reads: replicas tried so far.
    tried: usize,
    answers: Vec<Option<Answer>>,
    stage: Stage,
}

impl MetaPlan {
    /// Plans a meta command placed by `key` (`raw` is the command as sent).
    pub fn new(kind: MetaKind, key: Vec<u8>, raw: Vec<u8>, router: &Router, rr: &mut usize) -> MetaPlan {
        let mut servers = router.replicas(&key);
        if kind == MetaKind::Get && router.read_policy == ReadPolicy::RoundRobin {
            let turn = *rr % servers.len();
            servers.rotate_left(turn);
            *rr = rr.wrapping_add(1);
        }
        let answers = if kind.writes() { vec![None; servers.len()] } else { vec![None] };
        MetaPlan { kind, key, raw, servers, tried: 0, answers, stage: Stage::Send }
    }

    fn emit(&self, server: usize, router: &Router, out: &mut Outbox) {
        let buf = out.call(server, mcproto::meta_reply_len, router.single_cap());
        buf.extend_from_slice(&self.raw);
        buf.extend_from_slice(b"mn\r\n");
    }

    pub(super) fn round(&mut self, router: &Router, out: &mut Outbox, reply: &mut Vec<u8>, fx: &mut Effects) {
        match self.stage {
            Stage::Send if self.kind.writes() => {
                for &s in &self.servers {
                    self.emit(s, router, out);
                }
                self.stage = Stage::Wait;
            }
            Stage::Send => {
                self.emit(self.servers[self.tried], router, out);
                self.tried += 1;
                self.stage = Stage::Wait;
            }
            Stage::Wait if self.kind.writes() => {
                self.stage = Stage::Done;
                self.combine_writes(router, reply, fx);
            }
            Stage::Wait => match self.answers[0].take() {
                Some(Ok(raw)) => {
                    self.stage = Stage::Done;
                    reply.extend_from_slice(strip_mn(&raw));
                    self.count(reply, fx);
                }
                failure => {
                    fx.counters.backend_failures += 1;
                    if self.tried < self.servers.len() && self.kind == MetaKind::Get {
                        fx.counters.read_failovers += 1;
                        self.stage = Stage::Send;
                        self.round(router, out, reply, fx);
                    } else {
                        self.stage = Stage::Done;
                        let e = failure.and_then(Result::err).unwrap_or(BackendError::Down);
                        router.error_line(self.servers[self.tried - 1], &e, reply);
                    }
                }
            },
            Stage::Done => {}
        }
    }

    pub(super) fn absorb(&mut self, i: usize, outcome: Result<&[u8], &BackendError>) {
        self.answers[i] = Some(own(outcome));
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

/// A server's reply without the `MN` that closes it.
fn strip_mn(raw: &[u8]) -> &[u8] {
    &raw[..raw.len().saturating_sub(b"MN\r\n".len())]
}
