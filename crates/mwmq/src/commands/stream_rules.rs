//! Streams under queues' rules, on the commands' side: the right each
//! stream command needs (Redis's ACL categories guide it: what reads
//! entries or names needs receive, what removes entries or moves a stream's
//! ids where every later `*` must follow needs admin), `max_body` over a
//! whole XADD, and QALTER's MAXMESSAGES / MAXBYTES on a stream. Who a stream
//! a command creates belongs to is `owned.rs`'s; the database's side is
//! `streamrules.rs` and `streambounds.rs`; docs/mwmq.md has the table of
//! rights.

use super::{Core, Outcome};
use crate::command::QueueOptions;
use crate::db::streams::X;
use crate::db::{DbError, PgConn};
use crate::resp::Reply;
use crate::streamrules::xadd_size;
use crate::users::{Right, User};
use crate::xcommand::{AddId, Sid, XCmd};

/// The right a stream command needs on each stream it names.
pub fn right_of(x: &XCmd) -> Right {
    match x {
        XCmd::Add { .. } => Right::Send,
        // Entries, pending entries, group and consumer names: reads.
        XCmd::Read { .. }
        | XCmd::ReadGroup { .. }
        | XCmd::Range { .. }
        | XCmd::Ack { .. }
        | XCmd::Claim(_)
        | XCmd::AutoClaim { .. }
        | XCmd::Pending { .. }
        | XCmd::InfoStream { .. }
        | XCmd::InfoGroups(_)
        | XCmd::InfoConsumers { .. } => Right::Receive,
        // A count or a kind, as QLEN.
        XCmd::Len(_) | XCmd::Type(_) | XCmd::Exists(_) => Right::See,
        // What removes entries or changes groups.
        XCmd::Del { .. }
        | XCmd::Trim { .. }
        | XCmd::GroupCreate { .. }
        | XCmd::GroupSetId { .. }
        | XCmd::GroupDeadLetter { .. }
        | XCmd::GroupDestroy { .. }
        | XCmd::CreateConsumer { .. }
        | XCmd::DelConsumer { .. }
        | XCmd::DelKeys(_) => Right::Admin,
    }
}

/// How far ahead of the server's clock (ms) the id of an XADD by a user
/// without the admin right may be. An id sets the stream's last id, which
/// every later `*` id follows: `9223372036854775807-9223372036854775806`
/// ended the stream for everyone, `4102444800000-0` dated every later entry
/// 2100. Ids of the past and the present stay a sender's (idempotent
/// producers, copies of another stream); this margin covers the clocks of
/// producers that make ids of their own.
pub const SENDER_ID_AHEAD_MS: i64 = 10_000;

/// Milliseconds since the Unix epoch, by this server's clock.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// QINFO of a stream: its length, bytes (as MAXBYTES counts them), limits
/// (0: none), groups, last id and entries ever added.
const STREAM_INFO: &str = "SELECT st.length, st.bytes, coalesce(st.max_entries, 0), coalesce(st.max_bytes, 0),
        (SELECT count(*) FROM mwmq_stream_groups g WHERE g.stream_id = st.id), st.last_ms, st.last_seq, st.added
 FROM mwmq_streams st WHERE st.name = $1";

/// A user's refusal of `right` on stream `key`.
fn refusal(user: &User, right: Right, key: &str) -> Reply {
    Reply::Error(format!("NOPERM User {} has no permissions to {} stream '{key}'", user.name, right.verb()))
}

impl Core<'_> {
    /// The refusal of stream command `x` by `user`, if it lacks a right:
    /// the command's on every stream it names; XADD's trimming (MAXLEN,
    /// MINID) also the admin right, as XTRIM, and so does an XADD id more
    /// than [`SENDER_ID_AHEAD_MS`] ahead of the clock; XGROUP DEADLETTER the
    /// send right on its target, which it writes to.
    pub(super) fn stream_rights(&self, x: &XCmd, user: &User) -> Option<Reply> {
        let right = right_of(x);
        if let Some(k) = x.keys().into_iter().find(|k| !user.may(right, k)) {
            return Some(refusal(user, right, k));
        }
        match x {
            XCmd::Add { key, trim: Some(_), .. } if !user.may(Right::Admin, key) => Some(Reply::Error(format!(
                "NOPERM User {} has no permissions to administer stream '{key}': XADD with MAXLEN or MINID removes \
                 entries, as XTRIM does",
                user.name
            ))),
            XCmd::Add { key, id: AddId::AtMs(ms) | AddId::Exact(Sid { ms, .. }), .. }
                if *ms > now_ms().saturating_add(SENDER_ID_AHEAD_MS) && !user.may(Right::Admin, key) =>
            {
                Some(Reply::Error(format!(
                    "NOPERM User {} has no permissions to administer stream '{key}': an XADD id more than {} s ahead \
                     of the server's clock moves the id every later '*' follows; use '*' or an id up to now",
                    user.name,
                    SENDER_ID_AHEAD_MS / 1000
                )))
            }
            XCmd::GroupDeadLetter { target: Some(t), .. } if !user.may(Right::Send, t) => {
                Some(refusal(user, Right::Send, t))
            }
            _ => None,
        }
    }

    /// An XADD larger than `max_body` (the user's, else the server's) in
    /// all: fields, values and id. Refused before anything is stored.
    pub(super) fn entry_too_large(&self, x: &XCmd, user: Option<&User>) -> Option<Reply> {
        let XCmd::Add { id, fields, .. } = x else { return None };
        let max = user.and_then(|u| u.max_body).unwrap_or(self.shared.config.server.max_body);
        let size = xadd_size(id, fields);
        (size > max).then(|| {
            // (The user's own limit, else the server's: the refusal names whose.)
            let whose = match user.and_then(|u| u.max_body.map(|_| &u.name)) {
                Some(name) => format!("user {name}'s"),
                None => "the server's".to_string(),
            };
            Reply::Error(format!(
                "OVERQUOTA an entry of {size} bytes (fields, values and id) is over {whose} limit of {max} bytes \
                 (max_body)"
            ))
        })
    }

    /// `max_reply_bytes`, as the database functions take it.
    pub(super) fn max_reply(&self) -> i64 {
        i64::try_from(self.shared.config.server.max_reply_bytes).unwrap_or(i64::MAX)
    }

    /// QINFO of `name`, which is no queue: a stream's counts and limits
    /// (no entry: QINFO needs any right, XINFO STREAM the receive right),
    /// `-NOQUEUE` if it is no stream either.
    pub(super) async fn stream_info(&self, pg: &PgConn, name: &str) -> Result<Outcome, DbError> {
        let r = pg.client().query_opt(STREAM_INFO, &[&name]).await;
        let Some(row) = pg.checked(r)? else { return Err(DbError::NoQueue(name.to_string())) };
        let t = Reply::text;
        let last = crate::xcommand::Sid { ms: row.get(5), seq: row.get(6) };
        Ok(Outcome::ok(Reply::Map(vec![
            (t("type"), t("stream")),
            (t("length"), Reply::Int(row.get(0))),
            (t("bytes"), Reply::Int(row.get(1))),
            (t("max_messages"), Reply::Int(row.get(2))),
            (t("max_bytes"), Reply::Int(row.get(3))),
            (t("groups"), Reply::Int(row.get(4))),
            (t("last_id"), last.reply()),
            (t("entries_added"), Reply::Int(row.get(7))),
        ])))
    }

    /// QALTER of `name`, which is no queue: a stream's MAXMESSAGES (entries)
    /// and MAXBYTES (bytes of fields and values), 0 lifting either;
    /// `-NOQUEUE` if it is no stream either.
    pub(super) async fn alter_stream(&self, pg: &PgConn, name: &str, o: &QueueOptions) -> Result<Outcome, DbError> {
        let others = o.max_deliveries.is_some()
            || o.dead_letter.is_some()
            || o.concurrency.is_some()
            || o.rate_milli.is_some()
            || o.retain_ms.is_some()
            || o.backoff.is_some();
        if others || (o.max_messages.is_none() && o.max_bytes.is_none()) {
            if pg.x(X::Type, &[&name]).await?[0].get::<_, &str>(0) == "stream" {
                return Err(DbError::Redis(format!(
                    "ERR '{name}' is a stream: QALTER takes MAXMESSAGES and MAXBYTES only on a stream"
                )));
            }
            return Err(DbError::NoQueue(name.to_string()));
        }
        let as_i64 = |v: Option<u64>| v.map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX));
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&name, &o.max_messages.is_some(), &as_i64(o.max_messages), &o.max_bytes.is_some(), &as_i64(o.max_bytes)];
        if pg.x(X::Limit, &params).await?.is_empty() {
            return Err(DbError::NoQueue(name.to_string()));
        }
        Ok(Outcome::ok(Reply::Simple("OK")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xcommand::{Trim, Trimming};

    #[test]
    fn what_reads_entries_or_names_needs_receive() {
        let info = XCmd::InfoStream { key: "s".into(), full: None };
        assert_eq!(right_of(&info), Right::Receive);
        assert_eq!(right_of(&XCmd::InfoGroups("s".into())), Right::Receive);
        assert_eq!(right_of(&XCmd::Len("s".into())), Right::See);
        let trim = Trimming { trim: Trim::MaxLen(0), approx: false, limit: None };
        assert_eq!(right_of(&XCmd::Trim { key: "s".into(), trim }), Right::Admin);
        let add = XCmd::Add {
            key: "s".into(),
            nomkstream: false,
            trim: Some(trim),
            id: AddId::Exact(Sid { ms: 1, seq: 0 }),
            fields: vec![],
        };
        assert_eq!(right_of(&add), Right::Send, "and admin for its trim (stream_rights)");
    }
}
