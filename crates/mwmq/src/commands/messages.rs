//! SEND, RECV, POP, PEEK, ACK, NACK, TOUCH: one request at a time, and the
//! batches (many SENDs, ACKs, POPs or single RECVs as one statement).

use std::collections::{HashMap, HashSet};

use super::{Answer, Core, DbFacts, Outcome, Session};
use crate::command::{Command, Recv, Send};
use crate::db::{DbError, LeaseRef, Leased, PgConn, Received, SendRow};
use crate::resp::Reply;

/// A leased message as RECV answers it (`[id, lease, sender, body]`) and the
/// lease its reply carries.
pub fn leased_item(m: Leased) -> (Reply, LeaseRef) {
    let lease = LeaseRef { db: m.db, queue_id: m.queue_id, id: m.id, lease: m.lease };
    (Reply::Array(vec![Reply::Int(m.id), Reply::Int(m.lease), Reply::text(m.sender), Reply::Bulk(m.body)]), lease)
}

/// A message as POP and PEEK answer it: `[id, sender, body]`.
fn message_item(m: crate::db::Message) -> Reply {
    Reply::Array(vec![Reply::Int(m.id), Reply::text(m.sender), Reply::Bulk(m.body)])
}

/// The row a SEND stores, sent by `me` (nobody: "").
fn send_row<'a>(x: &'a Send, me: Option<&'a str>) -> SendRow<'a> {
    SendRow {
        queue: &x.queue,
        sender: me.unwrap_or(""),
        to: x.to.as_deref(),
        body: &x.body,
        delay_ms: x.delay_ms,
        group: x.group.as_deref(),
        priority: x.priority,
    }
}

impl Core<'_> {
    /// Before a SEND with a PRIORITY to `queue`: marks the queue
    /// prioritized in a statement of its own unless it is known to be, so
    /// that the SEND's own update of the mark takes no lock; the refusal when another
    /// transaction is marking it and has not ended (it would wait for that
    /// one: `policies.rs`).
    async fn before_priority(&self, pg: &PgConn, queue: &str) -> Result<Option<DbError>, DbError> {
        if self.shared.prioritized.is(queue) {
            return Ok(None);
        }
        // (Refused again without asking for a second after the database said so.)
        if !self.shared.being_marked.is(queue) {
            if pg.prioritize(queue).await? {
                self.shared.prioritized.found(queue);
                return Ok(None);
            }
            self.shared.being_marked.found(queue);
        }
        Ok(Some(DbError::Redis(format!(
            "TRYAGAIN queue '{queue}' is getting its first message with a priority in a transaction that has not \
             ended (an application's mwmq.send): a SEND with a PRIORITY to it is refused until that one ends, \
             rather than wait for it"
        ))))
    }

    pub(super) async fn send<S: Session + ?Sized>(&self, pg: &PgConn, x: &Send, s: &S) -> Result<Outcome, DbError> {
        if x.priority > 0 {
            if let Some(refused) = self.before_priority(pg, &x.queue).await? {
                return Err(refused);
            }
        }
        let me = s.identity();
        let id = pg.send(&send_row(x, me.as_deref()), x.key.as_deref()).await?;
        if x.priority > 0 {
            self.shared.prioritized.found(&x.queue);
        }
        self.sent(&x.queue);
        self.shared.queues.add(&x.queue, |c| c.sent += 1);
        Ok(Outcome::ok(Reply::Int(id)))
    }

    pub(super) async fn recv<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        r: &Recv,
        s: &S,
        db: &mut DbFacts,
    ) -> Result<Outcome, DbError> {
        let me = s.identity();
        let msgs = self.lease(pg, r, me.as_deref(), r.count, 1, self.max_reply(), &mut db.statements).await?;
        let n = msgs.len() as u64;
        self.shared.queues.add(&r.queue, |c| c.received += n);
        db.hits = n;
        let (items, leases) = msgs.into_iter().map(leased_item).unzip();
        Ok(Outcome::Reply(Reply::Array(items), leases, "ok"))
    }

    pub(super) async fn pop_or_peek<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        queue: &str,
        from: Option<&str>,
        take: bool,
        s: &S,
        db: &mut DbFacts,
    ) -> Result<Outcome, DbError> {
        let me = s.identity();
        let (found, prioritized) =
            pg.first(queue, me.as_deref(), from, take, self.shared.prioritized.is(queue)).await?;
        if prioritized {
            self.shared.prioritized.found(queue);
        }
        Ok(Outcome::ok(match found {
            Some(m) => {
                db.hits = 1;
                if take {
                    self.shared.queues.add(queue, |c| c.received += 1);
                }
                message_item(m)
            }
            None => Reply::Nil,
        }))
    }

    pub(super) async fn ack<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        queue: &str,
        id: i64,
        lease: i64,
        s: &S,
    ) -> Result<Outcome, DbError> {
        let done = pg.ack(queue, id, lease, self.holder(s, queue).as_deref()).await?;
        if done {
            self.shared.queues.add(queue, |c| c.acked += 1);
        }
        Ok(Outcome::ok(Reply::Int(i64::from(done))))
    }

    pub(super) async fn nack<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        queue: &str,
        id: i64,
        lease: i64,
        delay_ms: Option<u64>,
        s: &S,
    ) -> Result<Outcome, DbError> {
        let done = pg.nack(queue, id, lease, delay_ms, self.holder(s, queue).as_deref()).await?;
        if done {
            self.shared.queues.add(queue, |c| c.nacked += 1);
        }
        if done && delay_ms.unwrap_or(0) == 0 {
            self.sent(queue);
        }
        Ok(Outcome::ok(Reply::Int(i64::from(done))))
    }

    pub(super) async fn touch<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        queue: &str,
        id: i64,
        lease: i64,
        ms: u64,
        s: &S,
    ) -> Result<Outcome, DbError> {
        let held = pg.touch(queue, id, lease, ms, self.holder(s, queue).as_deref()).await?;
        Ok(Outcome::ok(Reply::Int(i64::from(held))))
    }

    /// Counts what a RECV dead-lettered.
    fn dead_lettered(&self, queue: &str, got: &Received) {
        if got.dead_lettered + got.dropped > 0 {
            self.shared.queues.add(queue, |c| {
                c.dead_lettered += got.dead_lettered;
                c.dropped += got.dropped;
            });
        }
    }

    /// Leases up to `count` messages of `queue`. When the statement met only
    /// dead letters at the front (moved or dropped in the same statement)
    /// and leased fewer than `enough`, it runs again, at most 8 more times,
    /// so that a poison message does not send receivers away empty-handed.
    /// The messages of one statement weigh at most `maxb` (the first
    /// always: `max_reply_bytes` for a RECV's reply). `statements` counts
    /// the statements run.
    #[allow(clippy::too_many_arguments)]
    async fn lease(
        &self,
        pg: &PgConn,
        r: &Recv,
        me: Option<&str>,
        count: u32,
        enough: usize,
        maxb: i64,
        statements: &mut u64,
    ) -> Result<Vec<Leased>, DbError> {
        let mut msgs = Vec::new();
        for again in 0..=8 {
            if again > 0 {
                *statements += 1;
            }
            let plain_first = !self.shared.not_plain.is(&r.queue);
            let want = count - msgs.len() as u32;
            let ranked = self.shared.prioritized.is(&r.queue);
            let got = pg.recv(&r.queue, me, r.from.as_deref(), want, r.vt_ms, plain_first, maxb, ranked).await?;
            if got.prioritized {
                self.shared.prioritized.found(&r.queue);
            }
            // (One statement is counted already: the request's, or the retry's above.)
            *statements += got.statements - 1;
            if got.not_plain && plain_first {
                self.shared.not_plain.found(&r.queue);
            }
            self.dead_lettered(&r.queue, &got);
            let moved = got.dead_lettered + got.dropped;
            msgs.extend(got.messages);
            if msgs.len() >= enough || moved == 0 {
                break;
            }
        }
        Ok(msgs)
    }

    /// Hands one of `msgs` (taken from `queue`) to each request in turn;
    /// those left without one get `empty`.
    fn deal<M>(
        &self,
        queue: &str,
        msgs: Vec<M>,
        replies: &mut [Answer],
        empty: Reply,
        mut reply: impl FnMut(usize, M) -> Reply,
    ) {
        let n = msgs.len() as u64;
        self.shared.queues.add(queue, |c| c.received += n);
        let mut msgs = msgs.into_iter();
        for (i, slot) in replies.iter_mut().enumerate() {
            *slot = Some(match msgs.next() {
                Some(m) => (reply(i, m), "ok", 1),
                None => (empty.clone(), "ok", 0),
            });
        }
    }

    pub(super) async fn send_batch<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        items: &[(&Command, &S)],
        replies: &mut [Answer],
    ) -> Result<(), DbError> {
        let names: Vec<Option<String>> = items.iter().map(|(_, s)| s.identity()).collect();
        let rows: Vec<SendRow<'_>> = items
            .iter()
            .zip(&names)
            .map(|((c, _), me)| match c {
                Command::Send(x) => send_row(x, me.as_deref()),
                _ => unreachable!("a SEND batch holds SENDs"),
            })
            .collect();
        let mut refused: HashMap<&str, Reply> = HashMap::new();
        for row in rows.iter().filter(|r| r.priority > 0) {
            if !refused.contains_key(row.queue) {
                if let Some(e) = self.before_priority(pg, row.queue).await? {
                    refused.insert(row.queue, e.reply());
                }
            }
        }
        // (Those of priority 0 to such a queue go: they mark nothing.)
        let refusal = |r: &SendRow<'_>| if r.priority > 0 { refused.get(r.queue) } else { None };
        let going: Vec<SendRow<'_>> = rows.iter().filter(|r| refusal(r).is_none()).copied().collect();
        let mut ids = if going.is_empty() { Vec::new() } else { pg.send_many(&going).await? }.into_iter();
        let mut woken = HashSet::new();
        for (slot, row) in replies.iter_mut().zip(&rows) {
            if let Some(r) = refusal(row) {
                *slot = Some((r.clone(), "client_error", 0));
                continue;
            }
            let id = ids.next().flatten();
            *slot = Some(match id {
                Some(id) => {
                    if woken.insert(row.queue) {
                        self.sent(row.queue);
                    }
                    if row.priority > 0 {
                        self.shared.prioritized.found(row.queue);
                    }
                    self.shared.queues.add(row.queue, |c| c.sent += 1);
                    (Reply::Int(id), "ok", 0)
                }
                None => (pg.not_sent(row.queue).await?.reply(), "client_error", 0),
            });
        }
        Ok(())
    }

    pub(super) async fn ack_batch<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        items: &[(&Command, &S)],
        replies: &mut [Answer],
    ) -> Result<(), DbError> {
        let holders: Vec<Option<String>> = items
            .iter()
            .map(|(c, s)| match c {
                Command::Ack { queue, .. } => self.holder(*s, queue),
                _ => unreachable!("an ACK batch holds ACKs"),
            })
            .collect();
        let acks: Vec<(&str, i64, i64, Option<&str>)> = items
            .iter()
            .zip(&holders)
            .map(|((c, _), holder)| match c {
                Command::Ack { queue, id, lease } => (queue.as_str(), *id, *lease, holder.as_deref()),
                _ => unreachable!("an ACK batch holds ACKs"),
            })
            .collect();
        let done = pg.ack_many(&acks).await?;
        let mut exists = HashMap::new();
        for ((slot, ok), a) in replies.iter_mut().zip(done).zip(&acks) {
            let known = ok
                || match exists.get(a.0) {
                    Some(e) => *e,
                    None => {
                        let e = pg.queue_exists(a.0).await?;
                        exists.insert(a.0, e);
                        e
                    }
                };
            if ok {
                self.shared.queues.add(a.0, |c| c.acked += 1);
            }
            *slot = Some(if known {
                (Reply::Int(i64::from(ok)), "ok", 0)
            } else {
                (DbError::NoQueue(a.0.to_string()).reply(), "client_error", 0)
            });
        }
        Ok(())
    }

    pub(super) async fn pop_batch(
        &self,
        pg: &PgConn,
        queue: &str,
        me: Option<&str>,
        from: Option<&str>,
        replies: &mut [Answer],
    ) -> Result<(), DbError> {
        let (msgs, prioritized) =
            pg.first_n(queue, me, from, true, replies.len(), self.shared.prioritized.is(queue)).await?;
        if prioritized {
            self.shared.prioritized.found(queue);
        }
        self.deal(queue, msgs, replies, Reply::Nil, |_, m| message_item(m));
        Ok(())
    }

    /// One statement leases a message for each RECV, whoever the
    /// receivers are; the statements run. Receivers left without one while
    /// the statement may not have seen everything (it looked at as many
    /// messages as it could), or when it does not serve the queue (one with
    /// a delivery limit, or none), look again, each name on its own.
    pub(super) async fn recv_batch<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        r: &Recv,
        items: &[(&Command, &S)],
        replies: &mut [Answer],
        leases: &mut [Vec<LeaseRef>],
    ) -> Result<u64, DbError> {
        let names: Vec<Option<String>> = items.iter().map(|(_, s)| s.identity()).collect();
        let receivers: Vec<Option<&str>> = names.iter().map(Option::as_deref).collect();
        // Receivers of one name can take any message the statement locks:
        // it locks no more than they take (a row locked and left would be
        // skipped by a concurrent receiver, who would take one behind it, of
        // a lower priority). Of several names, each may find its own
        // messages among twice as many.
        let one_name = receivers.iter().all(|r| *r == receivers[0]);
        let limit = if one_name { receivers.len() } else { 2 * receivers.len() };
        // A queue lately found not plain: straight to its own statement.
        let skip = self.shared.not_plain.is(&r.queue);
        let (got, looked, served) = if skip {
            (Vec::new(), 0, false)
        } else {
            let ranked = self.shared.prioritized.is(&r.queue);
            let (got, looked, served, prioritized) =
                pg.recv_many(&r.queue, &receivers, r.from.as_deref(), limit, r.vt_ms, ranked).await?;
            if !served {
                self.shared.not_plain.found(&r.queue);
            }
            if prioritized {
                self.shared.prioritized.found(&r.queue);
            }
            (got, looked, served)
        };
        let mut statements = u64::from(!skip);
        let n = got.len() as u64;
        self.shared.queues.add(&r.queue, |c| c.received += n);
        for (i, m) in got {
            let (item, lease) = leased_item(m);
            leases[i] = vec![lease];
            replies[i] = Some((Reply::Array(vec![item]), "ok", 1));
        }
        let left: Vec<usize> = (0..replies.len()).filter(|i| replies[*i].is_none()).collect();
        if left.is_empty() {
            return Ok(statements);
        }
        if !served || looked as usize >= limit {
            // Each name on its own, as many as it has requests.
            let mut by_name: Vec<(Option<&str>, Vec<usize>)> = Vec::new();
            for i in left {
                match by_name.iter_mut().find(|(name, _)| *name == receivers[i]) {
                    Some((_, is)) => is.push(i),
                    None => by_name.push((receivers[i], vec![i])),
                }
            }
            for (me, is) in by_name {
                statements += 1;
                let k = is.len();
                // (One message a reply: no bound on them together.)
                let msgs = self.lease(pg, r, me, k as u32, k, i64::MAX, &mut statements).await?;
                let n = msgs.len() as u64;
                self.shared.queues.add(&r.queue, |c| c.received += n);
                let mut msgs = msgs.into_iter();
                for i in is {
                    replies[i] = Some(match msgs.next() {
                        Some(m) => {
                            let (item, lease) = leased_item(m);
                            leases[i] = vec![lease];
                            (Reply::Array(vec![item]), "ok", 1)
                        }
                        None => (Reply::Array(Vec::new()), "ok", 0),
                    });
                }
            }
        } else {
            for i in left {
                replies[i] = Some((Reply::Array(Vec::new()), "ok", 0));
            }
        }
        Ok(statements)
    }
}
