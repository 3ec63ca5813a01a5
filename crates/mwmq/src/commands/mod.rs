//! What every command does, whichever engine runs it: the rights it needs,
//! the statement(s) it becomes, which requests may share one statement, and
//! its reply. The engines only move bytes and requests: the pool engine's
//! workers block on these functions, the async engine awaits them.
//!
//! One file per family: `connection.rs` (PING, QUIT, CLIENT, SELECT,
//! COMMAND, INFO, HELLO, AUTH: answered without the database), `messages.rs`
//! (SEND, RECV, POP, PEEK, ACK, NACK, TOUCH, and their batches), `queues.rs`
//! (QCREATE, QALTER, QPAUSE, QRESUME, QDROP, QLEN, QINFO, QLIST, QARCHIVE,
//! QDEAD, REDRIVE), `streams.rs` and `stream_rules.rs` (the stream
//! commands; their rights and limits), `owned.rs` (`max_queues` over
//! several databases), `schedules.rs` (QSCHEDULE, QUNSCHEDULE, QSCHEDULES).
//!
//! **Adding a command.** (1) `command.rs`: its variant of [`Command`] (a
//! stream command: of `XCmd`, in `xcommand.rs`, and its name in
//! `min_args`), its arm in `parse`, its line in `EVERY_COMMAND`, and its
//! number in the unit test's `variant` (count `COMMANDS` up). (2) Build with
//! the tests (`cargo clippy --all-targets`): every match that must decide
//! about it has no wildcard arm, so the compiler names each place — its
//! class, queue and wait (`Command::op`, `queue`, `wait`; `XCmd::op`,
//! `first_key`, `keys`, `block_ms`, and `one_stream!` if it names one
//! stream and never waits), its right ([`Core::gate`]; a stream command's
//! `right_of`), whether it batches ([`Batch::of`]), what its reply may
//! weigh (`output.rs`'s `Bounds::of`), and what it does: an arm in
//! [`Core::statement`] and one in [`Core::local`]'s list of database
//! commands (a command answered without the database: the other way round,
//! and into `local_command!`); a stream command: `Core::stream`. (3) Its
//! function in its family's file. A new statement is a `-- statement: NAME`
//! block in `crates/mwmq/sql/statements.sql`, its name in
//! `db/statements.rs`'s `statements!()` list, and a method of `PgConn`
//! (`db/pgconn.rs`); a new database function is a new numbered file in
//! `crates/mwmq/sql/` listed in `db/migrations.rs` (a stream function also
//! gets its line in `db/streams.rs`'s `STATEMENTS` and its `X`, in the same
//! order). (4) Its words in docs/mwmq.md and, for a right, in `users.rs`'s
//! `Right`. Tests hold the recipe: `command.rs`'s
//! `every_command_is_listed_parses_and_has_a_class_and_a_home` fails until
//! the command has its line, `db/statements.rs`'s test until the statement
//! is in both places, and `tests/auth.rs`'s
//! `a_user_without_rights_is_refused_every_command_that_reaches_a_queue_or_stream`
//! sends every line as a user without rights.

use crate::command::local_command;
use crate::command::{Command, Recv};
use crate::db::{DbError, LeaseRef, PgConn};
use crate::resp::Reply;
use crate::shared::Shared;
use crate::users::Right;
use crate::xcommand::one_stream;
use crate::xcommand::{AddId, GroupRead, XCmd};

pub mod carry;
pub mod connection;
pub mod messages;
pub mod owned;
pub mod queues;
pub mod schedules;
pub mod stream_rules;
pub mod streams;

pub use crate::session::Session;
pub use crate::telemetry::DbFacts;
pub use carry::{Batched, Databases, Look, Pooled};

/// The database's refusals as a Redis user reads them (the database layer
/// builds no replies).
impl DbError {
    /// The reply a client gets.
    pub fn reply(&self) -> Reply {
        match self {
            DbError::Unavailable(m) => Reply::Error(format!("TRYAGAIN {m}")),
            DbError::NoQueue(q) => Reply::Error(format!("NOQUEUE no such queue '{q}'")),
            DbError::Exists(q) => Reply::Error(format!("EXISTS queue '{q}' already exists")),
            DbError::OverQuota(m) => Reply::Error(format!("OVERQUOTA {m}")),
            DbError::Failed(m) => Reply::err(format!("database: {m}")),
            DbError::Redis(m) => Reply::Error(m.clone()),
            // (The engines count and run the command again: a client never sees it.)
            DbError::CountOwned(u) => Reply::Error(format!(
                "TRYAGAIN the queues and streams of user {u} on the other databases are not counted"
            )),
        }
    }
}

/// What carrying out a command led to.
pub enum Outcome {
    /// Answer with this reply; the leases travel in it.
    Reply(Reply, Vec<LeaseRef>, &'static str),
    /// The RECV (XREAD...) found nothing and may wait (the wake-up number
    /// when it looked; the command to run next time, if not the same).
    Park(u64, Option<Box<Command>>),
    /// An XREAD or XREADGROUP found nothing: it may wait; the command to run
    /// when it looks again, if not the same (XREAD's `$` resolved). Its
    /// reply, when the wait is over, is the null array.
    Nothing(Option<Box<Command>>),
    /// A login whose password must be checked (off the event loop or worker).
    Verify,
}

impl Outcome {
    /// A successful reply without leases.
    pub fn ok(r: Reply) -> Outcome {
        Outcome::Reply(r, Vec::new(), "ok")
    }
}

/// Requests that may be carried out together, as one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Batch {
    /// SENDs without a KEY, to any queues.
    Send,
    /// ACKs, of any queues.
    Ack,
    /// POPs of one queue by one receiver with one FROM.
    Pop {
        /// Queue.
        queue: String,
        /// Receiver.
        me: Option<String>,
        /// Sender asked for.
        from: Option<String>,
    },
    /// RECVs of one message each (no COUNT, no WAIT), of one queue with
    /// one FROM and one lease length, by any receivers.
    Recv {
        /// The request (its COUNT is 1).
        r: Recv,
    },
    /// XADDs with `*` (no NOMKSTREAM, no trim) to one stream by one user
    /// (a stream they create is that user's, counted in its `max_queues`).
    XAdd {
        /// Stream.
        key: String,
        /// The user logged in (`None`: no users).
        user: Option<String>,
    },
    /// XACKs of one stream's group.
    XAck {
        /// Stream.
        key: String,
        /// Group.
        group: String,
    },
    /// XREADGROUPs of new entries (`>`) of one stream and group, with one
    /// COUNT and NOACK, without BLOCK, by any consumers.
    XReadGroup {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// COUNT (0: none given).
        count: i64,
        /// NOACK
        noack: bool,
    },
}

/// The batch an XREADGROUP may join.
fn read_group_batch(x: &XCmd) -> Option<Batch> {
    match x {
        XCmd::ReadGroup { group, count, block: None, noack, streams, bad, .. }
            if streams.len() == 1 && streams[0].1 == GroupRead::New && bad[0].is_none() =>
        {
            Some(Batch::XReadGroup {
                key: streams[0].0.clone(),
                group: group.clone(),
                count: count.unwrap_or(0),
                noack: *noack,
            })
        }
        _ => None,
    }
}

impl Batch {
    /// The batch `c` of `s` may join, if any.
    pub fn of<S: Session + ?Sized>(c: &Command, s: &S) -> Option<Batch> {
        match c {
            Command::Send(x) if x.key.is_none() => Some(Batch::Send),
            Command::Ack { .. } => Some(Batch::Ack),
            Command::Pop { queue, from } => {
                Some(Batch::Pop { queue: queue.clone(), me: s.identity(), from: from.clone() })
            }
            // (A RECV that may wait is parked when it finds nothing: it goes alone.)
            Command::Recv(r) if r.count == 1 && r.wait_ms == 0 => Some(Batch::Recv { r: r.clone() }),
            Command::Stream(XCmd::Add { key, nomkstream: false, trim: None, id: AddId::Auto, .. }) => {
                Some(Batch::XAdd { key: key.clone(), user: s.user().map(|u| u.name.clone()) })
            }
            Command::Stream(XCmd::Ack { key, group, invalid: false, .. }) => {
                Some(Batch::XAck { key: key.clone(), group: group.clone() })
            }
            Command::Stream(x @ XCmd::ReadGroup { .. }) => read_group_batch(x),
            Command::Stream(one_stream!() | XCmd::Read { .. } | XCmd::Exists(_) | XCmd::DelKeys(_)) => None,
            // One statement each.
            Command::Send(_)
            | Command::Recv(_)
            | Command::Peek { .. }
            | Command::Nack { .. }
            | Command::Touch { .. }
            | Command::Create(..)
            | Command::Alter(..)
            | Command::Pause(..)
            | Command::Archive { .. }
            | Command::DeadLetters { .. }
            | Command::QueueInfo(_)
            | Command::Redrive { .. }
            | Command::Drop(_)
            | Command::Len(_)
            | Command::List { .. }
            | Command::Schedule(_)
            | Command::Unschedule(_)
            | Command::Schedules => None,
            // Answered without the database.
            local_command!() => None,
        }
    }

    /// Whether `c` of `s` may join a batch of this kind: `Batch::of(c) ==
    /// self`, without copying anything; the identity is looked at only once
    /// the command matches.
    pub fn matches<S: Session + ?Sized>(&self, c: &Command, s: &S) -> bool {
        let me = |who: &Option<String>| s.identity() == *who;
        // (By the batch: a new kind must say which commands join it.)
        match self {
            Batch::Send => matches!(c, Command::Send(x) if x.key.is_none()),
            Batch::Ack => matches!(c, Command::Ack { .. }),
            Batch::Pop { queue, me: who, from } => {
                matches!(c, Command::Pop { queue: q, from: f } if q == queue && f == from && me(who))
            }
            // (`r` has COUNT 1 and no WAIT, so equal arguments are batchable too.)
            Batch::Recv { r } => matches!(c, Command::Recv(x) if x == r),
            Batch::XAdd { key, user } => matches!(
                c,
                Command::Stream(XCmd::Add { key: k, nomkstream: false, trim: None, id: AddId::Auto, .. })
                    if k == key && s.user().map(|u| u.name.clone()) == *user
            ),
            Batch::XAck { key, group } => matches!(
                c,
                Command::Stream(XCmd::Ack { key: k, group: g, invalid: false, .. }) if k == key && g == group
            ),
            Batch::XReadGroup { .. } => {
                matches!(c, Command::Stream(x) if read_group_batch(x).as_ref() == Some(self))
            }
        }
    }
}

/// One reply of a batch: the reply, its status and messages it got.
pub type Answer = Option<(Reply, &'static str, u64)>;

/// The commands of one process: what they need from the shared state.
#[derive(Clone, Copy)]
pub struct Core<'a> {
    /// The process's shared state.
    pub shared: &'a Shared,
    /// With several databases: the queues and streams, on the other
    /// databases, of the user whose creation this runs again (`owned.rs`).
    owned_elsewhere: Option<i64>,
    /// With several databases: the schedules, on the other databases, of
    /// the user whose QSCHEDULE this runs (`schedules.rs`).
    schedules_elsewhere: i64,
}

impl<'a> Core<'a> {
    /// Over `shared`.
    pub fn new(shared: &'a Shared) -> Core<'a> {
        Core { shared, owned_elsewhere: None, schedules_elsewhere: 0 }
    }

    /// With users configured: the refusal of a command this connection may
    /// not run (not logged in, or no right on the queue), as Redis words it.
    pub fn gate<S: Session + ?Sized>(&self, c: &Command, s: &S) -> Option<Reply> {
        if !self.shared.users.enabled() {
            return match c {
                Command::Stream(x) => self.entry_too_large(x, None),
                _ => None,
            };
        }
        let Some(user) = s.user() else {
            return match c {
                Command::Auth(_) | Command::Ping(_) | Command::Quit | Command::Hello { auth: Some(_), .. } => None,
                Command::Hello { .. } => Some(Reply::Error(
                    "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> \
                     AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol \
                     version at the same time"
                        .into(),
                )),
                _ => Some(Reply::Error("NOAUTH Authentication required.".into())),
            };
        };
        let need =
            |right: Right, queue: &str| (!user.may(right, queue)).then(|| Reply::Error(user.refusal(right, queue)));
        match c {
            Command::Send(x) => need(Right::Send, &x.queue).or_else(|| match user.max_body {
                Some(max) if x.body.len() > max => Some(Reply::Error(format!(
                    "OVERQUOTA a body of {} bytes is over user {}'s limit of {max} bytes (max_body)",
                    x.body.len(),
                    user.name
                ))),
                _ => None,
            }),
            Command::Recv(r) => need(Right::Receive, &r.queue),
            Command::Pop { queue, .. } | Command::Peek { queue, .. } => need(Right::Receive, queue),
            // On a delivery: its receiver's, or any for an admin of the queue (see `holder`).
            Command::Ack { queue, .. } | Command::Nack { queue, .. } | Command::Touch { queue, .. } => {
                need(Right::Receive, queue).filter(|_| !user.may(Right::Admin, queue))
            }
            // Dead letters are sends into the target: its send right too.
            Command::Create(q, o) | Command::Alter(q, o) => need(Right::Admin, q).or_else(|| match &o.dead_letter {
                Some(Some(target)) => need(Right::Send, target),
                _ => None,
            }),
            // The archive and dead letters hold bodies.
            Command::Drop(q)
            | Command::Pause(q, _)
            | Command::Archive { queue: q, .. }
            | Command::DeadLetters { queue: q, .. } => need(Right::Admin, q),
            Command::Redrive { queue, to, .. } => {
                need(Right::Admin, queue).or_else(|| to.as_deref().and_then(|t| need(Right::Admin, t)))
            }
            Command::Len(q) | Command::QueueInfo(q) => need(Right::See, q),
            // A schedule sends as its creator: its messages' bodies (`{tick}`
            // replaced) within the user's max_body too.
            Command::Schedule(x) => need(Right::Admin, &x.queue).or_else(|| match user.max_body {
                Some(max) if x.sent_len() > max => Some(Reply::Error(format!(
                    "OVERQUOTA a body of {} bytes (with {{tick}} replaced) is over user {}'s limit of {max} bytes \
                     (max_body)",
                    x.sent_len(),
                    user.name
                ))),
                _ => None,
            }),
            // Checked against each schedule's queue (`schedules.rs`).
            Command::Unschedule(_) | Command::Schedules => None,
            Command::Stream(x) => self.stream_rights(x, &user).or_else(|| self.entry_too_large(x, Some(&user))),
            // Lists only the queues the user may see (or receive from).
            Command::List { .. } => None,
            // Anyone logged in: the connection's own affairs.
            local_command!() => None,
        }
    }

    /// Whose delivery an ACK, NACK or TOUCH of `queue` by this connection
    /// may act on: with users, the connection's own (the receiver a lease
    /// went to) unless it is an admin of the queue; `None`: any delivery
    /// whose id and lease it names (no users: identities are only names).
    pub fn holder<S: Session + ?Sized>(&self, s: &S, queue: &str) -> Option<String> {
        if !self.shared.users.enabled() {
            return None;
        }
        let user = s.user()?;
        (!user.may(Right::Admin, queue)).then(|| user.name.clone())
    }

    /// The database a command's statement runs on: its queue's; `None` for
    /// QLIST, which runs on each ([`Core::merge_lists`]).
    pub fn home(&self, c: &Command) -> Option<usize> {
        c.queue().map(|q| self.shared.pool.home(q))
    }

    /// QLIST's answers from every database as one (names sorted, as each is).
    pub fn merge_lists(&self, answers: Vec<Result<Outcome, DbError>>) -> Result<Outcome, DbError> {
        let mut names = Vec::new();
        for a in answers {
            match a? {
                Outcome::Reply(Reply::Array(items), _, _) => names.extend(items),
                other => return Ok(other),
            }
        }
        names.sort_by(|a, b| match (a, b) {
            (Reply::Bulk(x), Reply::Bulk(y)) => x.cmp(y),
            _ => std::cmp::Ordering::Equal,
        });
        // (A queue being moved exists on two databases for a moment.)
        names.dedup();
        if names.len() > self.most_listed() {
            return Ok(self.too_many_listed());
        }
        Ok(Outcome::ok(Reply::Array(names)))
    }

    /// With several databases: the refusal of a queue that must live with
    /// `queue` (its dead-letter queue, a REDRIVE target) but is placed on
    /// another database.
    pub(crate) fn apart(&self, queue: &str, other: &str, what: &str) -> Option<Outcome> {
        let pools = &self.shared.pool;
        (pools.home(queue) != pools.home(other)).then(|| {
            let msg = format!(
                "{what} '{other}' is placed on database '{}' and '{queue}' on '{}': queues that exchange messages \
                 must live together; give both names the same hash tag, e.g. '{{{tag}}}.{queue}' and '{{{tag}}}.{other}'",
                pools.placement.name(pools.home(other)),
                pools.placement.name(pools.home(queue)),
                tag = crate::placement::key(queue),
            );
            Outcome::Reply(Reply::err(msg), Vec::new(), "client_error")
        })
    }

    /// A message may be there for `queue`'s waiting RECVs (a SEND committed, a NACK).
    pub fn sent(&self, queue: &str) {
        self.shared.waiters.sent(&self.shared.queue, queue);
    }

    /// Carries out a command that needs the database.
    pub async fn statement<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        c: &Command,
        s: &S,
        db: &mut DbFacts,
    ) -> Result<Outcome, DbError> {
        db.statements = 1;
        let r = match c {
            Command::Send(x) => self.send(pg, x, s).await,
            Command::Recv(r) => self.recv(pg, r, s, db).await,
            Command::Pop { queue, from } => self.pop_or_peek(pg, queue, from.as_deref(), true, s, db).await,
            Command::Peek { queue, from } => self.pop_or_peek(pg, queue, from.as_deref(), false, s, db).await,
            Command::Ack { queue, id, lease } => self.ack(pg, queue, *id, *lease, s).await,
            Command::Nack { queue, id, lease, delay_ms } => self.nack(pg, queue, *id, *lease, *delay_ms, s).await,
            Command::Touch { queue, id, lease, ms } => self.touch(pg, queue, *id, *lease, *ms, s).await,
            Command::Create(q, o) => self.create(pg, q, o, s).await,
            Command::Alter(q, o) => self.alter(pg, q, o).await,
            Command::Pause(q, on) => self.pause(pg, q, *on).await,
            Command::Archive { queue, count } => self.archive(pg, queue, *count).await,
            Command::DeadLetters { queue, count } => self.dead_letters(pg, queue, *count).await,
            Command::Redrive { queue, to, count } => self.redrive(pg, queue, to.as_deref(), *count).await,
            Command::QueueInfo(q) => self.queue_info(pg, q).await,
            Command::Drop(q) => self.drop_queue(pg, q).await,
            Command::Len(q) => Ok(Outcome::ok(Reply::Int(pg.len(q).await?))),
            Command::List { pending } => self.list(pg, *pending, s).await,
            Command::Schedule(x) => self.schedule(pg, x, s).await,
            Command::Unschedule(name) => self.unschedule(pg, name, s).await,
            Command::Schedules => self.schedules(pg, s).await,
            Command::Stream(x) => self.stream(pg, x, s).await,
            local_command!() => unreachable!("{:?} is answered without the database (Core::local)", c.op()),
        };
        self.owned_refusal(r, s)
    }

    /// Carries out a batch (`items`: the requests of `live`) as one
    /// statement; each request's answer goes to `replies`, the leases its
    /// reply carries to `leases`. The statements run.
    pub async fn batch_statement<S: Session + ?Sized>(
        &self,
        pg: &PgConn,
        kind: &Batch,
        items: &[(&Command, &S)],
        replies: &mut [Answer],
        leases: &mut [Vec<LeaseRef>],
    ) -> Result<u64, DbError> {
        match kind {
            Batch::Send => self.send_batch(pg, items, replies).await.map(|()| 1),
            Batch::Ack => self.ack_batch(pg, items, replies).await.map(|()| 1),
            Batch::Pop { queue, me, from } => {
                self.pop_batch(pg, queue, me.as_deref(), from.as_deref(), replies).await.map(|()| 1)
            }
            Batch::Recv { r } => self.recv_batch(pg, r, items, replies, leases).await,
            Batch::XAdd { key, .. } => self.xadd_batch(pg, key, items, replies).await.map(|()| 1),
            Batch::XAck { key, group } => self.xack_batch(pg, key, group, items, replies).await.map(|()| 1),
            Batch::XReadGroup { key, group, count, noack } => {
                self.xreadgroup_batch(pg, key, group, *count, *noack, items, replies).await.map(|()| 1)
            }
        }
    }
}
