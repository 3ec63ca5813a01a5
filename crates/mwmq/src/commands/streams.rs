//! The stream commands (XADD ... XINFO, TYPE, EXISTS, DEL): one call of a
//! database function each (`db/streams.rs`), and the reply as Redis 7.0 shapes
//! it in RESP2 and RESP3.

use tokio_postgres::Row;

use super::{Answer, Core, Outcome, Session};
use crate::command::Command;
use crate::db::streams::{id_arrays, trim_args, X};
use crate::db::{DbError, PgConn};
use crate::resp::Reply;
use crate::streambounds::REPLY_TOO_LARGE;
use crate::xcommand::{AddId, GroupRead, GroupStart, ReadFrom, Sid, XCmd};

use crate::streambounds::MAX_REPLY_ENTRIES;

/// COUNT as the statements take it: at most [`MAX_REPLY_ENTRIES`].
fn capped(count: Option<i64>) -> i64 {
    count.map_or(MAX_REPLY_ENTRIES, |c| c.min(MAX_REPLY_ENTRIES))
}

/// COUNT as a range's statement takes it: one more than a reply may carry
/// when more was asked for (or all), so that [`whole`] sees it would not fit.
fn range_count(count: Option<i64>) -> i64 {
    match count {
        Some(c) if c <= MAX_REPLY_ENTRIES => c,
        _ => MAX_REPLY_ENTRIES + 1,
    }
}

/// A range's rows, or its refusal: a range is answered whole or not at all,
/// so that a client's paging loop never takes a short page for the end (the
/// database refuses one over `max_reply_bytes` itself, see `streambounds.rs`).
fn whole(core: &Core<'_>, rows: Result<Vec<Row>, DbError>) -> Result<Vec<Row>, DbError> {
    let refused = |e| {
        core.shared.stream_replies.refused();
        Err(e)
    };
    match rows {
        Err(DbError::Redis(m)) if m.starts_with(REPLY_TOO_LARGE) => refused(DbError::Redis(m)),
        Ok(rows) if rows.len() as i64 > MAX_REPLY_ENTRIES => refused(DbError::Redis(format!(
            "ERR the reply would carry more than {MAX_REPLY_ENTRIES} entries (mwmq's most per reply): ask for fewer \
             entries with COUNT"
        ))),
        r => r,
    }
}

/// How many replies the rows of index -1 say were cut.
fn cuts(rows: &[Row]) -> u64 {
    rows.iter().filter(|r| r.get::<_, i32>(0) == -1).count() as u64
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn sid(r: &Row, ms: usize) -> Sid {
    Sid { ms: r.get(ms), seq: r.get(ms + 1) }
}

/// An entry as Redis replies it: `[id, [field, value, ...]]` (a deleted one: `[id, nil]`).
fn entry(id: Sid, fields: Option<Vec<Vec<u8>>>) -> Reply {
    let fields = match fields {
        Some(f) => Reply::Array(f.into_iter().map(Reply::Bulk).collect()),
        None => Reply::NilArray,
    };
    Reply::Array(vec![id.reply(), fields])
}

fn entries(rows: &[Row], at: usize) -> Vec<Reply> {
    rows.iter().map(|r| entry(sid(r, at), r.get(at + 2))).collect()
}

/// Rows of (index from 1, ms, seq, fields) as the entries of each of `n`
/// streams or requests (index 0, a marker, is skipped).
fn by_index(rows: &[Row], n: usize) -> Vec<Vec<Reply>> {
    let mut parts = vec![Vec::new(); n];
    for r in rows {
        let i: i32 = r.get(0);
        if i > 0 {
            parts[i as usize - 1].push(entry(sid(r, 1), r.get(3)));
        }
    }
    parts
}

fn int(r: &Row, i: usize) -> Reply {
    Reply::Int(r.get(i))
}

fn ok(r: Reply) -> Result<Outcome, DbError> {
    Ok(Outcome::ok(r))
}

/// Streams and the entries read from each, as XREAD / XREADGROUP reply:
/// a map in RESP3, pairs in RESP2 (`Reply::Map` is either).
fn per_stream(names: Vec<String>, parts: Vec<Vec<Reply>>, keep_empty: &[bool]) -> Reply {
    let pairs: Vec<(Reply, Reply)> = names
        .into_iter()
        .zip(parts)
        .zip(keep_empty)
        .filter(|((_, p), keep)| !p.is_empty() || **keep)
        .map(|((n, p), _)| (Reply::text(n), Reply::Array(p)))
        .collect();
    if pairs.is_empty() {
        Reply::NilArray
    } else {
        Reply::Map(pairs)
    }
}

/// XREAD's and XREADGROUP's map in RESP2 is an array of pairs, not a flat array.
fn as_stream_pairs(r: Reply, resp3: bool) -> Reply {
    match r {
        Reply::Map(pairs) if !resp3 => Reply::Array(pairs.into_iter().map(|(k, v)| Reply::Array(vec![k, v])).collect()),
        other => other,
    }
}

impl Core<'_> {
    /// Carries out a stream command.
    pub(crate) async fn stream<S: Session + ?Sized>(&self, pg: &PgConn, x: &XCmd, s: &S) -> Result<Outcome, DbError> {
        let keys = x.keys();
        if let [first, _, ..] = keys.as_slice() {
            let home = self.shared.pool.home(first);
            if keys.iter().any(|k| self.shared.pool.home(k) != home) {
                return Ok(Outcome::Reply(
                    Reply::Error(
                        "CROSSSLOT Keys in request don't hash to the same slot (database); give them one hash tag"
                            .into(),
                    ),
                    Vec::new(),
                    "client_error",
                ));
            }
        }
        match x {
            XCmd::Add { key, nomkstream, trim, id, fields } => {
                let (mode, ms, seq) = match id {
                    AddId::Auto => (0i32, 0i64, 0i64),
                    AddId::AtMs(ms) => (1, *ms, 0),
                    AddId::Exact(id) => (2, id.ms, id.seq),
                };
                let (kind, maxlen, min, lim) = trim_args(trim.as_ref());
                let (who, cap) = self.creator(s);
                let rows = pg
                    .x(
                        X::Add,
                        &[
                            key,
                            &mode,
                            &ms,
                            &seq,
                            fields,
                            &!nomkstream,
                            &kind,
                            &maxlen,
                            &min.ms,
                            &min.seq,
                            &lim,
                            &who,
                            &cap,
                        ],
                    )
                    .await?;
                match rows.first() {
                    Some(r) => {
                        self.sent(key);
                        ok(sid(r, 0).reply())
                    }
                    None => ok(Reply::Nil),
                }
            }
            XCmd::Len(key) => ok(int(&pg.x(X::Len, &[key]).await?[0], 0)),
            XCmd::Range { key, start, end, count, rev } => {
                if *count == Some(0) || start > end {
                    // As Redis: a missing stream [], a queue WRONGTYPE, COUNT 0 the null array.
                    return match pg.x(X::Type, &[key]).await?[0].get::<_, &str>(0) {
                        "stream" if *count == Some(0) => ok(Reply::NilArray),
                        "queue" => Err(DbError::Redis(WRONGTYPE.into())),
                        _ => ok(Reply::Array(Vec::new())),
                    };
                }
                let count = range_count(*count);
                let maxb = self.max_reply();
                let rows = pg.x(X::Range, &[key, &start.ms, &start.seq, &end.ms, &end.seq, &count, rev, &maxb]).await;
                ok(Reply::Array(entries(&whole(self, rows)?, 0)))
            }
            XCmd::Read { count, block, streams, bad } => self.xread(pg, count, *block, streams, bad, s).await,
            XCmd::Del { key, ids } => {
                let (mss, seqs) = id_arrays(ids);
                ok(int(&pg.x(X::Del, &[key, &mss, &seqs]).await?[0], 0))
            }
            XCmd::Trim { key, trim } => {
                let (kind, maxlen, min, lim) = trim_args(Some(trim));
                ok(int(&pg.x(X::Trim, &[key, &kind, &maxlen, &min.ms, &min.seq, &lim]).await?[0], 0))
            }
            XCmd::GroupCreate { key, group, start, mkstream, entries_read } => {
                let (last, id, bad) = group_start(start);
                let er = entries_read.filter(|n| *n >= 0);
                let (who, cap) = self.creator(s);
                pg.x(X::GroupCreate, &[key, group, &last, &id.ms, &id.seq, mkstream, &er, &bad, &who, &cap]).await?;
                ok(Reply::Simple("OK"))
            }
            XCmd::GroupSetId { key, group, start, entries_read } => {
                let (last, id, bad) = group_start(start);
                let er = entries_read.filter(|n| *n >= 0);
                pg.x(X::GroupSetId, &[key, group, &last, &id.ms, &id.seq, &er, &bad]).await?;
                ok(Reply::Simple("OK"))
            }
            XCmd::GroupDeadLetter { key, group, max, target } => {
                if let Some(t) = target {
                    if let Some(refusal) = self.apart(key, t, "the dead-letter stream") {
                        return Ok(refusal);
                    }
                }
                let (who, cap) = self.creator(s);
                pg.x(X::GroupDeadLetter, &[key, group, max, target, &who, &cap]).await?;
                ok(Reply::Simple("OK"))
            }
            XCmd::GroupDestroy { key, group } => ok(int(&pg.x(X::GroupDestroy, &[key, group]).await?[0], 0)),
            XCmd::CreateConsumer { key, group, consumer } => {
                ok(int(&pg.x(X::GroupConsumer, &[key, group, consumer, &false]).await?[0], 0))
            }
            XCmd::DelConsumer { key, group, consumer } => {
                ok(int(&pg.x(X::GroupConsumer, &[key, group, consumer, &true]).await?[0], 0))
            }
            XCmd::ReadGroup { group, consumer, count, noack, streams, bad, .. } => {
                let names: Vec<String> = streams.iter().map(|(k, _)| k.clone()).collect();
                let hist: Vec<bool> = streams.iter().map(|(_, r)| matches!(r, GroupRead::History(_))).collect();
                let after: Vec<Sid> = streams
                    .iter()
                    .map(|(_, r)| match r {
                        GroupRead::History(id) => *id,
                        GroupRead::New => Sid::ZERO,
                    })
                    .collect();
                let (mss, seqs) = id_arrays(&after);
                let count = capped(*count);
                let maxb = self.max_reply();
                let rows = pg
                    .x(X::ReadGroup, &[&names, group, consumer, &hist, &mss, &seqs, &count, noack, bad, &maxb])
                    .await?;
                self.shared.stream_replies.cut(cuts(&rows));
                let parts = by_index(&rows, names.len());
                let reply = per_stream(names, parts, &hist);
                if matches!(reply, Reply::NilArray) {
                    return Ok(Outcome::Nothing(None));
                }
                ok(as_stream_pairs(reply, s.resp3()))
            }
            XCmd::Ack { key, group, ids, invalid } => {
                let (mss, seqs) = id_arrays(ids);
                ok(int(&pg.x(X::Ack, &[key, group, &mss, &seqs, invalid]).await?[0], 0))
            }
            XCmd::Pending { key, group, range: None } => {
                let rows = pg.x(X::Pending, &[key, group]).await?;
                let total: i64 = rows.iter().map(|r| r.get::<_, i64>(1)).sum();
                if total == 0 {
                    return ok(Reply::Array(vec![Reply::Int(0), Reply::Nil, Reply::Nil, Reply::NilArray]));
                }
                let min = rows.iter().map(|r| sid(r, 2)).min().unwrap_or_default();
                let max = rows.iter().map(|r| sid(r, 4)).max().unwrap_or_default();
                let consumers = rows
                    .iter()
                    .map(|r| {
                        Reply::Array(vec![
                            Reply::text(r.get::<_, String>(0)),
                            Reply::text(r.get::<_, i64>(1).to_string()),
                        ])
                    })
                    .collect();
                ok(Reply::Array(vec![Reply::Int(total), min.reply(), max.reply(), Reply::Array(consumers)]))
            }
            XCmd::Pending { key, group, range: Some(p) } => {
                if p.count == 0 || p.start > p.end {
                    // (Redis still checks the group first.)
                    let z = 0i64;
                    pg.x(X::PendingRange, &[key, group, &p.idle, &z, &z, &z, &z, &z, &p.consumer, &z]).await?;
                    return ok(Reply::Array(Vec::new()));
                }
                // A range like XRANGE's: whole or refused (`sql/0015_reply_bounds.sql`).
                let rows = pg
                    .x(
                        X::PendingRange,
                        &[
                            key,
                            group,
                            &p.idle,
                            &p.start.ms,
                            &p.start.seq,
                            &p.end.ms,
                            &p.end.seq,
                            &range_count(Some(p.count)),
                            &p.consumer,
                            &self.max_reply(),
                        ],
                    )
                    .await;
                let rows = whole(self, rows)?;
                ok(Reply::Array(
                    rows.iter()
                        .map(|r| {
                            Reply::Array(vec![
                                sid(r, 0).reply(),
                                Reply::text(r.get::<_, String>(2)),
                                int(r, 3),
                                int(r, 4),
                            ])
                        })
                        .collect(),
                ))
            }
            XCmd::Claim(c) => {
                let (mss, seqs) = id_arrays(&c.ids);
                let (l_ms, l_seq) = (c.lastid.map(|l| l.ms), c.lastid.map(|l| l.seq));
                let rows = pg
                    .x(
                        X::Claim,
                        &[
                            &c.key,
                            &c.group,
                            &c.consumer,
                            &c.min_idle,
                            &mss,
                            &seqs,
                            &c.idle,
                            &c.time,
                            &c.retry,
                            &c.force,
                            &c.justid,
                            &l_ms,
                            &l_seq,
                            &c.bad,
                            &self.max_reply(),
                        ],
                    )
                    .await?;
                // (A last row without an id: the reply was cut by its bytes.)
                let claimed: Vec<&Row> = rows.iter().filter(|r| r.get::<_, Option<i64>>(0).is_some()).collect();
                self.shared.stream_replies.cut((rows.len() - claimed.len()) as u64);
                ok(Reply::Array(
                    claimed
                        .into_iter()
                        .map(|r| if c.justid { sid(r, 0).reply() } else { entry(sid(r, 0), r.get(2)) })
                        .collect(),
                ))
            }
            XCmd::AutoClaim { key, group, consumer, min_idle, start, count, justid } => {
                let rows = pg
                    .x(
                        X::AutoClaim,
                        &[
                            key,
                            group,
                            consumer,
                            min_idle,
                            &start.ms,
                            &start.seq,
                            &capped(Some(*count)),
                            justid,
                            &self.max_reply(),
                        ],
                    )
                    .await?;
                let (mut claimed, mut deleted, mut cursor) = (Vec::new(), Vec::new(), Sid::ZERO);
                for r in &rows {
                    let kind = r.get::<_, i32>(0);
                    let id = if kind == 3 { Sid::ZERO } else { sid(r, 1) };
                    match kind {
                        0 if *justid => claimed.push(id.reply()),
                        0 => claimed.push(entry(id, r.get(3))),
                        1 => deleted.push(id.reply()),
                        // (The reply was cut by its bytes: the cursor is where.)
                        3 => self.shared.stream_replies.cut(1),
                        _ => cursor = id,
                    }
                }
                ok(Reply::Array(vec![cursor.reply(), Reply::Array(claimed), Reply::Array(deleted)]))
            }
            XCmd::InfoStream { key, full } => self.xinfo_stream(pg, key, *full).await,
            XCmd::InfoGroups(key) => {
                let rows = pg.x(X::InfoGroups, &[key]).await?;
                let t = Reply::text;
                ok(Reply::Array(
                    rows.iter()
                        .map(|r| {
                            let opt = |i: usize| r.get::<_, Option<i64>>(i).map(Reply::Int).unwrap_or(Reply::Nil);
                            let mut m = vec![
                                (t("name"), Reply::text(r.get::<_, String>(0))),
                                (t("consumers"), int(r, 1)),
                                (t("pending"), int(r, 2)),
                                (t("last-delivered-id"), sid(r, 3).reply()),
                                (t("entries-read"), opt(5)),
                                (t("lag"), opt(6)),
                            ];
                            // (mwmq's extension, shown only where it is on.)
                            if let Some(target) = r.get::<_, Option<String>>(8) {
                                m.push((t("max-deliveries"), opt(7)));
                                m.push((t("dead-letter"), Reply::text(target)));
                            }
                            Reply::Map(m)
                        })
                        .collect(),
                ))
            }
            XCmd::InfoConsumers { key, group } => {
                let rows = pg.x(X::InfoConsumers, &[key, group, &self.max_reply()]).await?;
                let t = Reply::text;
                ok(Reply::Array(
                    rows.iter()
                        .map(|r| {
                            Reply::Map(vec![
                                (t("name"), Reply::text(r.get::<_, String>(0))),
                                (t("pending"), int(r, 1)),
                                (t("idle"), Reply::Int(r.get::<_, i64>(2).max(0))),
                            ])
                        })
                        .collect(),
                ))
            }
            XCmd::Type(key) => {
                let rows = pg.x(X::Type, &[key]).await?;
                ok(Reply::Simple(match rows[0].get::<_, &str>(0) {
                    "stream" => "stream",
                    "queue" => "queue",
                    _ => "none",
                }))
            }
            XCmd::Exists(keys) => ok(int(&pg.x(X::Exists, &[keys]).await?[0], 0)),
            XCmd::DelKeys(keys) => ok(int(&pg.x(X::DelKeys, &[keys]).await?[0], 0)),
        }
    }

    /// XREAD: a `$` is resolved to the stream's last id first, so that a
    /// read that waits looks for what came after the command arrived.
    async fn xread<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        count: &Option<i64>,
        block: Option<u64>,
        streams: &[(String, ReadFrom)],
        bad: &[Option<String>],
        s: &S,
    ) -> Result<Outcome, DbError> {
        let names: Vec<String> = streams.iter().map(|(k, _)| k.clone()).collect();
        let mut resolved: Vec<(String, ReadFrom)> = streams.to_vec();
        if streams.iter().any(|(_, f)| *f == ReadFrom::Last) {
            let rows = pg.x(X::Last, &[&names, &bad]).await?;
            for (slot, r) in resolved.iter_mut().zip(&rows) {
                if slot.1 == ReadFrom::Last {
                    slot.1 = ReadFrom::After(sid(r, 0));
                }
            }
        }
        let after: Vec<Sid> = resolved
            .iter()
            .map(|(_, f)| match f {
                ReadFrom::After(id) => *id,
                ReadFrom::Last => Sid::MAX,
            })
            .collect();
        let (mss, seqs) = id_arrays(&after);
        let rows = pg.x(X::Read, &[&names, &mss, &seqs, &capped(*count), &bad, &self.max_reply()]).await?;
        self.shared.stream_replies.cut(cuts(&rows).min(1));
        let parts = by_index(&rows, names.len());
        let keep = vec![false; names.len()];
        match per_stream(names, parts, &keep) {
            Reply::NilArray => {
                let again = (resolved.as_slice() != streams).then(|| {
                    Box::new(Command::Stream(XCmd::Read { count: *count, block, streams: resolved, bad: bad.to_vec() }))
                });
                Ok(Outcome::Nothing(again))
            }
            reply => ok(as_stream_pairs(reply, s.resp3())),
        }
    }

    async fn xinfo_stream(&self, pg: &PgConn, key: &str, full: Option<i64>) -> Result<Outcome, DbError> {
        // (mwmq's extension, shown only where QALTER set a limit.)
        let limits = |r: &Row| {
            let (max_entries, max_bytes) = (r.get::<_, Option<i64>>(15), r.get::<_, Option<i64>>(16));
            let t = Reply::text;
            match (max_entries, max_bytes) {
                (None, None) => Vec::new(),
                _ => vec![
                    (t("max-messages"), Reply::Int(max_entries.unwrap_or(0))),
                    (t("max-bytes"), Reply::Int(max_bytes.unwrap_or(0))),
                    (t("bytes"), int(r, 17)),
                ],
            }
        };
        let rows = pg.x(X::InfoStream, &[&key]).await?;
        let r = &rows[0];
        let t = Reply::text;
        let length: i64 = r.get(0);
        let nodes = (length + 99) / 100;
        let edge = |at: usize| match r.get::<_, Option<i64>>(at) {
            Some(_) => entry(sid(r, at), r.get(at + 2)),
            None => Reply::Nil,
        };
        let mut m = vec![
            (t("length"), Reply::Int(length)),
            (t("radix-tree-keys"), Reply::Int(nodes)),
            (t("radix-tree-nodes"), Reply::Int(nodes + 1)),
            (t("last-generated-id"), sid(r, 1).reply()),
            (t("max-deleted-entry-id"), sid(r, 3).reply()),
            (t("entries-added"), int(r, 5)),
            (t("recorded-first-entry-id"), sid(r, 6).reply()),
        ];
        if let Some(count) = full {
            // (Read statement by statement: a view of moments apart under
            // load.) The whole reply weighs at most `max_reply_bytes`: the
            // entries first, then each group's part with what is left.
            let cnt = Some(capped((count > 0).then_some(count)));
            let maxb = self.max_reply();
            let entries_cnt = Some(range_count((count > 0).then_some(count)));
            let all = pg.x(X::Range, &[&key, &0i64, &0i64, &i64::MAX, &i64::MAX, &entries_cnt, &false, &maxb]).await;
            let all = whole(self, all)?;
            let mut used: i64 =
                all.iter().map(|r| crate::streamrules::entry_weight(&r.get::<_, Vec<Vec<u8>>>(2)) as i64).sum();
            m.push((t("entries"), Reply::Array(entries(&all, 0))));
            let mut groups = Vec::new();
            for g in pg.x(X::InfoGroups, &[&key]).await? {
                let name: String = g.get(0);
                let opt = |i: usize| g.get::<_, Option<i64>>(i).map(Reply::Int).unwrap_or(Reply::Nil);
                let left = maxb - used;
                let rows =
                    if left > 0 { pg.x(X::InfoFullGroup, &[&key, &name, &cnt, &left]).await? } else { Vec::new() };
                let (mut pending, mut consumers) = (Vec::new(), Vec::new());
                let mut own: Vec<Reply> = Vec::new();
                let mut consumer: Option<Vec<(Reply, Reply)>> = None;
                let mut close = |consumer: &mut Option<Vec<(Reply, Reply)>>, own: &mut Vec<Reply>| {
                    if let Some(mut c) = consumer.take() {
                        c.push((t("pending"), Reply::Array(std::mem::take(own))));
                        consumers.push(Reply::Map(c));
                    }
                };
                for p in &rows {
                    used += p.get::<_, i64>(6);
                    let row = |name: bool| {
                        let mut v = vec![sid(p, 1).reply()];
                        if name {
                            v.push(Reply::text(p.get::<_, String>(3)));
                        }
                        v.extend([int(p, 4), int(p, 5)]);
                        Reply::Array(v)
                    };
                    match p.get::<_, i32>(0) {
                        0 => pending.push(row(true)),
                        1 => {
                            close(&mut consumer, &mut own);
                            consumer = Some(vec![
                                (t("name"), Reply::text(p.get::<_, String>(3))),
                                (t("seen-time"), int(p, 4)),
                                (t("pel-count"), int(p, 5)),
                            ]);
                        }
                        _ => own.push(row(false)),
                    }
                }
                close(&mut consumer, &mut own);
                groups.push(Reply::Map(vec![
                    (t("name"), Reply::text(name)),
                    (t("last-delivered-id"), sid(&g, 3).reply()),
                    (t("entries-read"), opt(5)),
                    (t("lag"), opt(6)),
                    (t("pel-count"), int(&g, 2)),
                    (t("pending"), Reply::Array(pending)),
                    (t("consumers"), Reply::Array(consumers)),
                ]));
            }
            m.push((t("groups"), Reply::Array(groups)));
            m.extend(limits(r));
            return ok(Reply::Map(m));
        }
        m.push((t("groups"), int(r, 8)));
        m.push((t("first-entry"), edge(9)));
        m.push((t("last-entry"), edge(12)));
        m.extend(limits(r));
        ok(Reply::Map(m))
    }
}

impl Core<'_> {
    /// XADDs with `*` to one stream, as one statement.
    pub(super) async fn xadd_batch<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        key: &str,
        items: &[(&Command, &S)],
        replies: &mut [Answer],
    ) -> Result<(), DbError> {
        let (mut counts, mut fields) = (Vec::with_capacity(items.len()), Vec::new());
        for (c, _) in items {
            let Command::Stream(XCmd::Add { fields: f, .. }) = c else { unreachable!("an XADD batch holds XADDs") };
            counts.push(f.len() as i32);
            fields.extend(f.iter().map(Vec::as_slice));
        }
        // (One user's: a batch is of one user, see `Batch::XAdd`.)
        let (who, cap) = self.creator(items[0].1);
        let rows = pg.x(X::AddMany, &[&key, &counts, &fields, &who, &cap]).await;
        let rows = self.owned_refusal(rows, items[0].1)?;
        // A row per entry added, in order; then, if the rest did not fit, why.
        let added = rows.iter().take_while(|r| r.get::<_, Option<i64>>(0).is_some()).count();
        let refusal: Option<String> = rows.get(added).map(|r| r.get(2));
        if added > 0 {
            self.sent(key);
        }
        for (i, slot) in replies.iter_mut().enumerate() {
            *slot = Some(match rows.get(i).filter(|_| i < added) {
                Some(r) => (sid(r, 0).reply(), "ok", 0),
                None => (Reply::Error(refusal.clone().unwrap_or_else(|| "ERR no id".into())), "client_error", 0),
            });
        }
        Ok(())
    }

    /// XACKs of one group, as one statement.
    pub(super) async fn xack_batch<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        key: &str,
        group: &str,
        items: &[(&Command, &S)],
        replies: &mut [Answer],
    ) -> Result<(), DbError> {
        let (mut idx, mut mss, mut seqs) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (c, _)) in items.iter().enumerate() {
            let Command::Stream(XCmd::Ack { ids, .. }) = c else { unreachable!("an XACK batch holds XACKs") };
            for id in ids {
                idx.push(i as i32 + 1);
                mss.push(id.ms);
                seqs.push(id.seq);
            }
        }
        let rows = pg.x(X::AckFast, &[&key, &group, &idx, &mss, &seqs]).await?;
        let mut n = vec![0i64; items.len()];
        for r in &rows {
            match r.get::<_, i32>(0) {
                0 if r.get::<_, i64>(1) == 0 => {
                    // No stream by that name: a queue's is WRONGTYPE.
                    if pg.x(X::Type, &[&key]).await?[0].get::<_, &str>(0) == "queue" {
                        return Err(DbError::Redis(WRONGTYPE.into()));
                    }
                }
                0 => {}
                i => n[i as usize - 1] = r.get(1),
            }
        }
        for (slot, n) in replies.iter_mut().zip(n) {
            *slot = Some((Reply::Int(n), "ok", n as u64));
        }
        Ok(())
    }

    /// XREADGROUPs of new entries by several consumers of one group, as one statement.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn xreadgroup_batch<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        key: &str,
        group: &str,
        count: i64,
        noack: bool,
        items: &[(&Command, &S)],
        replies: &mut [Answer],
    ) -> Result<(), DbError> {
        let consumers: Vec<&str> = items
            .iter()
            .map(|(c, _)| match c {
                Command::Stream(XCmd::ReadGroup { consumer, .. }) => consumer.as_str(),
                _ => unreachable!("an XREADGROUP batch holds XREADGROUPs"),
            })
            .collect();
        // (Without COUNT each takes all there is: the first gets it, the others nothing.)
        let each = capped((count > 0).then_some(count));
        let maxb = self.max_reply();
        let mut rows = pg.x(X::ReadGroupFast, &[&key, &group, &consumers, &each, &noack, &maxb]).await?;
        if !rows.iter().any(|r| r.get::<_, i32>(0) == 0) {
            // Not the common case (tombstones, an unknown entries-read, no such group, a
            // new consumer, a reply to cut by its bytes): the general function.
            match pg.x(X::ReadGroupMany, &[&key, &group, &consumers, &each, &noack, &maxb, &0i64]).await {
                Ok(r) => rows = r,
                // A new consumer one too many for its group: each on its own, so
                // that only the new ones are refused.
                Err(DbError::Redis(m)) if m.starts_with("OVERQUOTA") => {
                    for ((slot, who), (_, s)) in replies.iter_mut().zip(&consumers).zip(items) {
                        let one = [*who];
                        *slot = Some(
                            match pg.x(X::ReadGroupMany, &[&key, &group, &&one[..], &each, &noack, &maxb, &0i64]).await
                            {
                                Ok(rows) => {
                                    self.shared.stream_replies.cut(cuts(&rows));
                                    group_reply(key, by_index(&rows, 1).remove(0), s.resp3())
                                }
                                Err(DbError::Redis(m)) => (Reply::Error(m), "client_error", 0),
                                Err(e) => return Err(e),
                            },
                        );
                    }
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
            self.shared.stream_replies.cut(cuts(&rows));
        }
        let parts = by_index(&rows, items.len());
        for ((slot, part), (_, s)) in replies.iter_mut().zip(parts).zip(items) {
            *slot = Some(group_reply(key, part, s.resp3()));
        }
        Ok(())
    }
}

/// One XREADGROUP's answer in a batch: the entries it got from `key`, or the null array.
fn group_reply(key: &str, part: Vec<Reply>, resp3: bool) -> (Reply, &'static str, u64) {
    let n = part.len() as u64;
    let reply = if part.is_empty() {
        Reply::NilArray
    } else {
        as_stream_pairs(Reply::Map(vec![(Reply::text(key), Reply::Array(part))]), resp3)
    };
    (reply, "ok", n)
}

fn group_start(g: &GroupStart) -> (bool, Sid, Option<&str>) {
    match g {
        GroupStart::Last => (true, Sid::ZERO, None),
        GroupStart::At(id) => (false, *id, None),
        GroupStart::Bad(why) => (false, Sid::ZERO, Some(why.as_str())),
    }
}
