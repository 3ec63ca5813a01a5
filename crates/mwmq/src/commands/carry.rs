//! The one driver of the commands that need the database, whichever
//! engine carries them: where a command's statement runs (its queue's
//! database; QLIST on every database, the answers merged), a creation run
//! again once the user's queues and streams on the other databases are
//! counted (`owned.rs`), a batch's one statement and each request's share
//! of its answer, and how a failure becomes a reply. What a waiting command
//! found is told apart here too ([`Core::looked`]); the engines only wait.
//!
//! The engines supply connections and nothing else ([`Databases`]): the
//! pool engine's workers and the page borrow one from a pool and block on
//! it ([`Pooled`]), the async engine's loops pipeline statements on theirs.

use std::future::Future;

use super::{Answer, Batch, Core, DbFacts, Outcome, Session};
use crate::command::Command;
use crate::db::{DbError, LeaseRef, PgConn, Pools};
use crate::resp::Reply;

/// An engine's connections, as the driver uses them.
#[allow(async_fn_in_trait)] // (the async engine's futures stay on their loop's thread)
pub trait Databases {
    /// How many databases (`[[databases]]`).
    fn count(&self) -> usize;

    /// Runs `f` on a connection of database `d` within the statement
    /// deadline, noting in `db` which database, when it had the connection
    /// and when the database answered; a database that cannot be reached
    /// is [`DbError::Unavailable`].
    async fn on<T>(
        &self,
        d: usize,
        db: &mut DbFacts,
        f: impl AsyncFnOnce(&PgConn, &mut DbFacts) -> Result<T, DbError>,
    ) -> Result<T, DbError>;
}

/// The pools, each connection borrowed for one statement and blocked on
/// (the pool engine's workers, the page): every future of the driver over
/// them is ready at its first poll ([`Pooled::now`]).
pub struct Pooled<'a>(pub &'a Pools);

impl Databases for Pooled<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }

    async fn on<T>(
        &self,
        d: usize,
        db: &mut DbFacts,
        f: impl AsyncFnOnce(&PgConn, &mut DbFacts) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        db.db = d;
        let pool = &self.0[d];
        let r = match pool.get() {
            Err(e) => Err(e),
            Ok(mut pg) => {
                let now = mwstats::clock::now_ns();
                db.t_pool = Some(now);
                db.t_send = Some(now);
                let r = pg.run(async |c| f(c, db).await);
                pool.put(pg);
                r
            }
        };
        db.t_done = Some(mwstats::clock::now_ns());
        r
    }
}

impl Pooled<'_> {
    /// The value of a future of the driver over the pools: each statement
    /// blocks on its connection's own runtime (`DbConn::run`), so nothing
    /// is left pending and one poll finishes it.
    pub fn now<T>(f: impl Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => unreachable!("a statement over the pools blocks until it is answered"),
        }
    }
}

/// A batch's answers.
pub enum Batched {
    /// Each request's reply (in the order of the items) and the leases it carries.
    Answers(Vec<Answer>, Vec<Vec<LeaseRef>>),
    /// Carry them one by one instead: XADDs that would create their stream,
    /// whose user's queues and streams elsewhere must be counted first.
    OneByOne,
}

impl Batched {
    /// Puts each answer and its leases at its request's place among all of
    /// a batch's (`live[i]`: the place of item `i`); `false` when they are
    /// to be carried out one by one instead.
    pub fn place(self, live: &[usize], replies: &mut [Answer], leases: &mut [Vec<LeaseRef>]) -> bool {
        let Batched::Answers(got, got_leases) = self else { return false };
        for ((i, a), l) in live.iter().zip(got).zip(got_leases) {
            replies[*i] = a;
            leases[*i] = l;
        }
        true
    }
}

/// What a look of a waiting command (RECV ... WAIT, XREAD ... BLOCK) found.
pub enum Look {
    /// Its answer.
    Answer(Outcome),
    /// Nothing yet, or no database to ask: it may wait, and look again with
    /// `next` if given (XREAD's `$` resolved); `last` is its answer when
    /// its wait is over.
    Empty {
        /// The command to run next time.
        next: Option<Box<Command>>,
        /// Its answer if it waits no more.
        last: Outcome,
    },
}

impl Core<'_> {
    /// Carries out `c` of `s`: its statement on `home`, the database of its
    /// queue as the caller placed it ([`Core::home`]; `None`, QLIST,
    /// QUNSCHEDULE, QSCHEDULES: on each, the answers merged); a creation that
    /// must count the user's queues and streams on the other databases runs
    /// again once they are; a QSCHEDULE with several databases counts the
    /// user's schedules on the others first.
    pub async fn carry<S: Session + ?Sized, D: Databases>(
        &self,
        dbs: &D,
        home: Option<usize>,
        c: &Command,
        s: &S,
        db: &mut DbFacts,
    ) -> Result<Outcome, DbError> {
        let Some(home) = home else {
            let mut answers = Vec::new();
            for d in 0..dbs.count() {
                answers.push(dbs.on(d, db, async |pg, db| self.statement(pg, c, s, db).await).await);
            }
            return self.merge(c, answers);
        };
        let core = match c {
            Command::Schedule(x) if dbs.count() > 1 => match self.before_schedule(dbs, x, s, home).await? {
                Ok(core) => core,
                Err(refused) => return Ok(refused),
            },
            _ => *self,
        };
        match dbs.on(home, db, async |pg, db| core.statement(pg, c, s, db).await).await {
            Err(DbError::CountOwned(user)) => {
                let n = self.owned_elsewhere(dbs, &user, home).await?;
                let core = self.counted(n);
                dbs.on(home, db, async |pg, db| core.statement(pg, c, s, db).await).await
            }
            r => r,
        }
    }

    /// The queues and streams `user` has on every database but `home`.
    async fn owned_elsewhere<D: Databases>(&self, dbs: &D, user: &str, home: usize) -> Result<i64, DbError> {
        let mut n = 0;
        for d in (0..dbs.count()).filter(|d| *d != home) {
            let mut facts = DbFacts::default();
            n += dbs.on(d, &mut facts, async |pg, _| super::owned::owned(pg, user).await).await?;
        }
        Ok(n)
    }

    /// Carries out `items`, requests of one `kind` whose queues live on
    /// database `d`, as one statement.
    pub async fn carry_batch<S: Session + ?Sized, D: Databases>(
        &self,
        dbs: &D,
        d: usize,
        kind: &Batch,
        items: &[(&Command, &S)],
        db: &mut DbFacts,
    ) -> Batched {
        let mut got: Vec<Answer> = vec![None; items.len()];
        let mut leases: Vec<Vec<LeaseRef>> = vec![Vec::new(); items.len()];
        let r = dbs.on(d, db, async |pg, _| self.batch_statement(pg, kind, items, &mut got, &mut leases).await).await;
        match r {
            Ok(statements) => {
                db.statements = statements;
                Batched::Answers(got, leases)
            }
            Err(DbError::CountOwned(_)) => Batched::OneByOne,
            Err(e) => {
                db.statements = u64::from(db.t_send.is_some());
                let status = db.failed_with(&e);
                Batched::Answers(items.iter().map(|_| Some((e.reply(), status, 0))).collect(), leases)
            }
        }
    }

    /// A request's outcome from what [`Core::carry`] gave: a failure
    /// becomes its reply (and is noted in `db`).
    pub fn settled(&self, r: Result<Outcome, DbError>, db: &mut DbFacts) -> Outcome {
        r.unwrap_or_else(|e| {
            if db.t_send.is_none() {
                db.statements = 0;
            }
            let status = db.failed_with(&e);
            Outcome::Reply(e.reply(), Vec::new(), status)
        })
    }

    /// What a look of a command that may wait found (its outcome, as
    /// [`Core::settled`] made it): an empty answer, or a database that could
    /// not answer, is nothing yet (it waits on for its database); anything
    /// else is its answer.
    pub fn looked(&self, o: Outcome, db: &DbFacts) -> Look {
        match o {
            Outcome::Reply(Reply::Array(items), _, _) if items.is_empty() => {
                Look::Empty { next: None, last: Outcome::ok(Reply::Array(items)) }
            }
            Outcome::Nothing(next) => Look::Empty { next, last: Outcome::ok(Reply::NilArray) },
            o if db.unavailable => Look::Empty { next: None, last: o },
            o => Look::Answer(o),
        }
    }
}
