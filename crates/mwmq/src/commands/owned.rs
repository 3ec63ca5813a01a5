//! `max_queues` across databases: the queues and streams a user may have
//! created at once, counted on every database (`[[databases]]`), not per
//! database.
//!
//! On one database the count is the database's (`mwmq_owned`, under a lock
//! per user, so exact). With several, a user's queues and streams live
//! wherever their names hash, so a command that creates one first runs as
//! if the user had none left to create on its database (its allowance 0):
//! if it creates nothing — a stream that already exists, a queue that is
//! there — that is all it costs. If it would create, the engine is told so
//! ([`DbError::CountOwned`]): it counts the user's queues and streams on
//! every other database ([`owned`], a statement on each), and runs the
//! command again with `max_queues` less that count as its allowance on its
//! own database, where the count is taken under the lock as on one. The
//! price is a statement on each database per creation (creations are rare);
//! XADDs batched together that would create their stream run one by one.
//!
//! The race between databases: the count of the other databases is read
//! before the creation commits and without their locks, so creations by one
//! user that overlap in time on different databases do not see each other.
//! Creations one after another, or at once on one database, hold the quota
//! exactly. In all, a user's queues and streams are at most `max_queues +
//! c - 1`, `c` the user's connections creating at the same moment: take the
//! creation that counted last; everything that committed before its count
//! it saw, and what it did not see had counted before and committed after,
//! so was in flight then — at most one per connection (a connection has one
//! request carried out at a time), its own aside.

use super::{Core, Session};
use crate::db::{DbError, PgConn};

/// The queues and streams user `$1` created (and has not dropped or
/// deleted) on one database.
const OWNED: &str = "SELECT (SELECT count(*) FROM mwmq_queues q WHERE q.created_by = $1 AND q.dropped_at IS NULL)
                          + (SELECT count(*) FROM mwmq_streams st WHERE st.created_by = $1)";

/// The queues and streams `user` has on the database of `pg`.
pub async fn owned(pg: &PgConn, user: &str) -> Result<i64, DbError> {
    let r = pg.client().query_one(OWNED, &[&user]).await;
    Ok(pg.checked(r)?.get(0))
}

/// Whether `e` is the refusal of a creation past `max_queues` (the
/// database's words for a stream, `db/pgconn.rs`'s for a queue).
fn past_max_queues(e: &DbError) -> bool {
    match e {
        DbError::Redis(m) => m.starts_with("OVERQUOTA user ") && m.ends_with("(max_queues)"),
        DbError::OverQuota(m) => m.starts_with("user ") && m.ends_with("(max_queues)"),
        _ => false,
    }
}

impl<'a> Core<'a> {
    /// The same commands, knowing that the user whose creation asked
    /// ([`DbError::CountOwned`]) has `n` queues and streams on the other
    /// databases.
    pub fn counted(self, n: i64) -> Core<'a> {
        Core { owned_elsewhere: Some(n), ..self }
    }

    /// Who owns what a command of `s` creates, and how many queues and
    /// streams it may still create on the command's database (`None`s: no
    /// users, no limit). See the module's note.
    pub(super) fn creator<S: Session + ?Sized>(&self, s: &S) -> (Option<String>, Option<i64>) {
        let Some(u) = s.user() else { return (None, None) };
        let cap = i64::try_from(u.max_queues).unwrap_or(i64::MAX);
        let here = match self.owned_elsewhere {
            _ if self.shared.pool.len() == 1 => cap,
            Some(elsewhere) => cap.saturating_sub(elsewhere).max(0),
            None => 0,
        };
        (Some(u.name.clone()), Some(here))
    }

    /// A statement's result as the client sees it: with several databases,
    /// a creation refused for want of an allowance asks for the count of
    /// the other databases (the engine runs it again with it), or, once
    /// counted, is the refusal of the user's `max_queues`.
    pub(super) fn owned_refusal<T, S: Session + ?Sized>(&self, r: Result<T, DbError>, s: &S) -> Result<T, DbError> {
        let counted_here_only = self.shared.pool.len() == 1;
        match (&r, s.user()) {
            (Err(e), Some(u)) if !counted_here_only && u.max_queues > 0 && past_max_queues(e) => {
                Err(match self.owned_elsewhere {
                    None => DbError::CountOwned(u.name.clone()),
                    Some(n) => DbError::OverQuota(format!(
                        "user {} may create at most {} queues (max_queues); {n} of its queues and streams are on \
                         other databases",
                        u.name, u.max_queues
                    )),
                })
            }
            _ => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusals_of_max_queues_are_told_apart() {
        assert!(past_max_queues(&DbError::Redis("OVERQUOTA user u may create at most 0 queues (max_queues)".into())));
        assert!(past_max_queues(&DbError::OverQuota("user u may create at most 3 queues (max_queues)".into())));
        assert!(!past_max_queues(&DbError::Redis("OVERQUOTA stream 's' is full: ...".into())));
        assert!(!past_max_queues(&DbError::OverQuota("queue 'q' is full: ...".into())));
    }
}
