//! Writes: to every replica of the key, and `flush_all`/`verbosity` to every server.
//!
//! A replicated write is answered with the replicas' common answer. When they
//! differ, the client gets the first answer that is not a success (a replica
//! that could not be used counts as `SERVER_ERROR backend ...`), unless the
//! write quorum is below R and enough replicas confirmed it. Either way the
//! replicas must not stay different without anybody noticing: the write is
//! counted, and every replica that may now hold a different value than the
//! others gets a repair — the key is deleted there before that server serves
//! again — so reads converge. `cas` is decided by the primary and, when it
//! stored, copied to the other replicas with `set`.

use mcproto::{encode_store_line, ArithKind, Request, StoreKind};

use super::{is_success, own, Answer, BackendError, Effects, Outbox, Router};

/// Longest single-line reply a write can get (a line, or a number).
const LINE_CAP: usize = 4096;

#[derive(Debug, PartialEq, Eq)]
enum Stage {
    Send,
    Combine,
    Done,
}

#[derive(Debug)]
enum What {
    /// A request for one key, to all its replicas.
    Replicated(Request),
    /// A request for every server (`flush_all`, `verbosity`, `cache_memlimit`).
    Broadcast(Request),
    /// Delete an oversized `set`'s old value; the client gets this line (or nothing).
    DropStale(Option<&'static str>),
}

/// A write in progress.
#[derive(Debug)]
pub struct WritePlan {
    what: What,
    key: Vec<u8>,
    servers: Vec<usize>,
    answers: Vec<Option<Answer>>,
    stage: Stage,
}

impl WritePlan {
    /// Plans `req`: a keyed write goes to the key's replicas, `flush_all` and
    /// `verbosity` to every server.
    pub fn new(req: Request, router: &Router) -> WritePlan {
        let key = match &req {
            Request::Store { key, .. }
            | Request::Delete { key, .. }
            | Request::Arith { key, .. }
            | Request::Touch { key, .. } => Some(key.clone()),
            _ => None,
        };
        match key {
            Some(key) => {
                let servers = router.replicas(&key);
                WritePlan::with(What::Replicated(req), key, servers)
            }
            None => WritePlan::with(What::Broadcast(req), Vec::new(), (0..router.servers()).collect()),
        }
    }

    /// Deletes `key` on its replicas, then answers `reply` (memcached drops a
    /// key's old value when a `set` of it is refused as too large).
    pub fn drop_stale(key: Vec<u8>, reply: Option<&'static str>, router: &Router) -> WritePlan {
        let servers = router.replicas(&key);
        WritePlan::with(What::DropStale(reply), key, servers)
    }

    fn with(what: What, key: Vec<u8>, servers: Vec<usize>) -> WritePlan {
        let answers = vec![None; servers.len()];
        WritePlan { what, key, servers, answers, stage: Stage::Send }
    }

    pub(super) fn round(&mut self, router: &Router, out: &mut Outbox, reply: &mut Vec<u8>, fx: &mut Effects) {
        match self.stage {
            Stage::Send => {
                // memcached answers cache_memlimit with lines of its own
                // (MEMLIMIT_TOO_SMALL ...): any single line is a reply.
                let framing: super::Framing = match &self.what {
                    What::Broadcast(Request::CacheMemlimit { .. }) => mcproto::response_len,
                    _ => mcproto::status_reply_len,
                };
                for &s in &self.servers {
                    let buf = out.call(s, framing, LINE_CAP);
                    match &self.what {
                        What::Replicated(req) | What::Broadcast(req) => req.encode(buf, false),
                        What::DropStale(_) => {
                            buf.extend_from_slice(b"delete ");
                            buf.extend_from_slice(&self.key);
                            buf.extend_from_slice(b"\r\n");
                        }
                    }
                }
                self.stage = Stage::Combine;
            }
            Stage::Combine => {
                self.stage = Stage::Done;
                self.combine(router, reply, fx);
            }
            Stage::Done => {}
        }
    }

    pub(super) fn absorb(&mut self, i: usize, outcome: Result<&[u8], &BackendError>) {
        self.answers[i] = Some(own(outcome));
    }

    fn combine(&mut self, router: &Router, reply: &mut Vec<u8>, fx: &mut Effects) {
        let answers: Vec<Answer> =
            self.answers.iter_mut().map(|a| a.take().unwrap_or(Err(BackendError::Down))).collect();
        let outcome = judge(&answers, router.write_quorum.min(answers.len()));
        match outcome.reply {
            Pick::Answer(i) => reply.extend_from_slice(answers[i].as_ref().expect("an answer")),
            Pick::Failure(i) => router.error_line(self.servers[i], answers[i].as_ref().unwrap_err(), reply),
        }
        let c = &mut fx.counters;
        c.backend_failures += u64::from(outcome.failed && !outcome.acknowledged);
        match &self.what {
            What::Broadcast(req) => {
                if matches!(req, Request::FlushAll { .. }) {
                    c.cmd_flush += 1;
                }
                c.replica_disagreements += u64::from(outcome.disagreed);
            }
            What::DropStale(line) => {
                reply.clear();
                if let Some(line) = line {
                    reply.extend_from_slice(line.as_bytes());
                    reply.extend_from_slice(b"\r\n");
                }
                self.repair(&answers, &outcome, true, router, fx);
            }
            What::Replicated(req) => {
                count(req, reply, c);
                let delete = matches!(req, Request::Delete { .. });
                self.repair(&answers, &outcome, delete, router, fx);
            }
        }
    }

    /// Notes the disagreement and the repairs that make the replicas converge.
    fn repair(&self, answers: &[Answer], outcome: &Judgement, delete: bool, router: &Router, fx: &mut Effects) {
        if router.replication < 2 || !(outcome.failed || outcome.disagreed) {
            return;
        }
        let c = &mut fx.counters;
        if outcome.failed {
            c.replica_write_failures += 1;
        } else {
            c.replica_disagreements += 1;
        }
        for (i, a) in answers.iter().enumerate() {
            // A replica that failed may or may not have applied the write; one
            // that applied it holds what the failed ones may not (unless the
            // write was acknowledged, or it was a delete); when replicas that
            // answered disagree, none of them can be trusted.
            let needs = match a {
                Err(_) => true,
                Ok(raw) => !outcome.acknowledged && !delete && (outcome.disagreed || is_success(raw)),
            };
            if needs {
                fx.repairs.push((self.servers[i], self.key.clone()));
            }
        }
    }
}

/// Which answer the client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// This replica's reply.
    Answer(usize),
    /// This replica's failure.
    Failure(usize),
}

/// How the replicas' answers combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Judgement {
    reply: Pick,
    /// Some replica could not be used.
    failed: bool,
    /// Replicas that answered gave different answers.
    disagreed: bool,
    /// Enough replicas confirmed although others failed.
    acknowledged: bool,
}

/// Combines replicas' answers: the common answer when all agree; the agreed
/// success when at least `quorum` replicas gave it and the others failed;
/// otherwise the first answer that is not a success, in replica order.
fn judge(answers: &[Answer], quorum: usize) -> Judgement {
    let failed = answers.iter().any(Result::is_err);
    let mut replies = answers.iter().enumerate().filter_map(|(i, a)| a.as_ref().ok().map(|r| (i, r)));
    let first = replies.clone().next();
    let disagreed = first.is_some_and(|(_, f)| replies.any(|(_, r)| r != f));
    if let Some((i, raw)) = first {
        let agreeing = answers.iter().filter(|a| a.is_ok()).count();
        if !failed && !disagreed {
            return Judgement { reply: Pick::Answer(i), failed, disagreed, acknowledged: false };
        }
        if failed && !disagreed && agreeing >= quorum.max(1) && is_success(raw) {
            return Judgement { reply: Pick::Answer(i), failed, disagreed, acknowledged: true };
        }
    }
    let bad = answers
        .iter()
        .position(|a| match a {
            Ok(raw) => !is_success(raw),
            Err(_) => true,
        })
        .unwrap_or(0);
    let reply = if answers[bad].is_ok() { Pick::Answer(bad) } else { Pick::Failure(bad) };
    Judgement { reply, failed, disagreed, acknowledged: false }
}

/// Counts a write's outcome in memcached's terms.
fn count(req: &Request, reply: &[u8], c: &mut crate::stats::WorkerCounters) {
    let outcome = |hit: &[u8], hits: &mut u64, misses: &mut u64| {
        if reply.starts_with(hit) {
            *hits += 1;
        } else if reply.starts_with(b"NOT_FOUND") {
            *misses += 1;
        }
    };
    match req {
        Request::Store { .. } => c.cmd_set += 1,
        Request::Delete { .. } => outcome(b"DELETED", &mut c.delete_hits, &mut c.delete_misses),
        Request::Touch { .. } => {
            c.cmd_touch += 1;
            outcome(b"TOUCHED", &mut c.touch_hits, &mut c.touch_misses);
        }
        Request::Arith { kind, .. } => {
            let (hits, misses) = match kind {
                ArithKind::Incr => (&mut c.incr_hits, &mut c.incr_misses),
                ArithKind::Decr => (&mut c.decr_hits, &mut c.decr_misses),
            };
            if reply.first().is_some_and(u8::is_ascii_digit) {
                *hits += 1;
            } else if reply.starts_with(b"NOT_FOUND") {
                *misses += 1;
            }
        }
        _ => {}
    }
}

#[derive(Debug, PartialEq, Eq)]
enum CasStage {
    Primary,
    Decide,
    Copies,
    Done,
}

/// A `cas` in progress: the primary decides, the others get a copy.
#[derive(Debug)]
pub struct CasPlan {
    req: Request,
    replicas: Vec<usize>,
    answers: Vec<Option<Answer>>,
    stage: CasStage,
}

impl CasPlan {
    /// Plans a `cas` request.
    pub fn new(req: Request, router: &Router) -> CasPlan {
        let Request::Store { key, .. } = &req else { unreachable!("cas is a store command") };
        let replicas = router.replicas(key);
        CasPlan { req, answers: vec![None], replicas, stage: CasStage::Primary }
    }

    pub(super) fn round(&mut self, router: &Router, out: &mut Outbox, reply: &mut Vec<u8>, fx: &mut Effects) {
        let Request::Store { key, flags, exptime, data, .. } = &self.req else { unreachable!() };
        match self.stage {
            CasStage::Primary => {
                self.req.encode(out.call(self.replicas[0], mcproto::status_reply_len, LINE_CAP), false);
                self.stage = CasStage::Decide;
            }
            CasStage::Decide => {
                self.stage = CasStage::Done;
                let c = &mut fx.counters;
                c.cmd_set += 1;
                let stored = match self.answers[0].take() {
                    Some(Ok(raw)) => {
                        match raw.as_slice() {
                            b"EXISTS\r\n" => c.cas_badval += 1,
                            b"NOT_FOUND\r\n" => c.cas_misses += 1,
                            b"STORED\r\n" => c.cas_hits += 1,
                            _ => {}
                        }
                        reply.extend_from_slice(&raw);
                        raw == b"STORED\r\n"
                    }
                    other => {
                        let e = other.and_then(Result::err).unwrap_or(BackendError::Down);
                        router.error_line(self.replicas[0], &e, reply);
                        c.backend_failures += 1;
                        if self.replicas.len() > 1 {
                            // The primary may have stored it: it must not keep a value the others lack.
                            fx.repairs.push((self.replicas[0], key.clone()));
                            c.replica_write_failures += 1;
                        }
                        false
                    }
                };
                if stored && self.replicas.len() > 1 {
                    self.answers = vec![None; self.replicas.len() - 1];
                    for &s in &self.replicas[1..] {
                        let buf = out.call(s, mcproto::status_reply_len, LINE_CAP);
                        encode_store_line(buf, StoreKind::Set, key, *flags, *exptime, data.len(), 0, false);
                        buf.extend_from_slice(data);
                        buf.extend_from_slice(b"\r\n");
                    }
                    self.stage = CasStage::Copies;
                }
            }
            CasStage::Copies => {
                self.stage = CasStage::Done;
                let mut diverged = false;
                for (i, a) in self.answers.iter().enumerate() {
                    if !matches!(a, Some(Ok(raw)) if raw == b"STORED\r\n") {
                        fx.repairs.push((self.replicas[i + 1], key.clone()));
                        diverged = true;
                    }
                }
                fx.counters.replica_disagreements += u64::from(diverged);
            }
            CasStage::Done => {}
        }
    }

    pub(super) fn absorb(&mut self, i: usize, outcome: Result<&[u8], &BackendError>) {
        self.answers[i] = Some(own(outcome));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Answer {
        Ok(s.as_bytes().to_vec())
    }

    #[test]
    fn replicas_that_agree_answer_together() {
        let j = judge(&[ok("STORED\r\n"), ok("STORED\r\n")], 2);
        assert_eq!(j, Judgement { reply: Pick::Answer(0), failed: false, disagreed: false, acknowledged: false });
    }

    #[test]
    fn the_first_non_success_answers_a_disagreement() {
        let j = judge(&[ok("STORED\r\n"), ok("NOT_STORED\r\n")], 2);
        assert_eq!(j.reply, Pick::Answer(1));
        assert!(j.disagreed && !j.failed);
    }

    #[test]
    fn a_failed_replica_fails_the_write_unless_the_quorum_confirmed_it() {
        let answers = [ok("STORED\r\n"), Err(BackendError::Timeout), ok("STORED\r\n")];
        let all = judge(&answers, 3);
        assert_eq!(all.reply, Pick::Failure(1));
        assert!(all.failed && !all.acknowledged);
        let two = judge(&answers, 2);
        assert_eq!(two.reply, Pick::Answer(0));
        assert!(two.acknowledged);
        let three_needed = judge(&[ok("STORED\r\n"), Err(BackendError::Down), Err(BackendError::Down)], 2);
        assert_eq!(three_needed.reply, Pick::Failure(1));
        let refused = judge(&[ok("NOT_STORED\r\n"), Err(BackendError::Down)], 1);
        assert_eq!(refused.reply, Pick::Answer(0), "a refusal is never acknowledged as a success");
        assert!(!refused.acknowledged);
    }
}
