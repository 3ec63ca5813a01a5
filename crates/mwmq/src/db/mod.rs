//! PostgreSQL: the schema, the statements behind every command, the
//! connections and their pools.
//!
//! A statement is one round trip and one short transaction (autocommit): a
//! SEND's id is only returned after its INSERT committed. Most commands are
//! one statement; a few run more, each committed alone (QCREATE and QALTER
//! of a queue with limits recount it, QARCHIVE and QDEAD ask whether an
//! empty answer's queue exists, a RECV batch leases for each receiver).
//! Receivers that run at the same time never take the same message: RECV
//! and POP pick their rows with `FOR UPDATE SKIP LOCKED`, oldest visible
//! first (`visible_at`, then id), so a receiver sees one sender's messages
//! in the order they were sent. A RECV leases what it takes: a new random lease token, the
//! receiver it went to and a visibility deadline on the row; ACK deletes the
//! row only while the lease is the current one and, with users, only for the
//! receiver it went to or an admin of the queue; NACK makes it visible again. See docs/mwmq.md.
//!
//! The pool engine's workers and the page borrow connections from a pool
//! per database (`pools.rs`); the async engine's loops keep their own,
//! pipelined. A pool holds at most `pool` connections. A worker that finds
//! none free waits (the wait is measured) up to `pool_wait_ms`; a connection that fails
//! is dropped, and so are the idle ones (after a database restart they are
//! all dead), and new ones are opened on demand with exponential backoff
//! between failed attempts. A request caught by a failure gets `-TRYAGAIN`.
//!
//! Under the commands, the engines and the shared state: it imports only
//! the commands' data (`command.rs`, `xcommand.rs`), the configuration,
//! the placement of queues and the deadline watch, and nothing above
//! reaches around it to the database. Its files: `migrations.rs` (the schema versions in
//! `crates/mwmq/sql/` and how they are applied), `statements.rs` (the
//! statements every connection prepares), `pgconn.rs` (one connection and
//! a method per statement), `streams.rs` (the stream commands' statements
//! and their rows), `connect.rs` (opening connections, blocking and
//! asynchronous), `pools.rs` (the pools, one per database, and failover),
//! `rows.rs` (what the statements return), `schedules.rs` (periodic
//! jobs' statements: the commands' and the ticker's), `tls.rs` and `pgpass.rs` (TLS
//! to PostgreSQL and the password file, as libpq understands them).

mod connect;
mod migrations;
mod pgconn;
pub mod pgpass;
mod pools;
mod rows;
pub mod schedules;
pub mod statements;
pub mod streams;
pub mod tls;

pub use connect::{connect, servers, session_settings, DbConn, Driver};
pub use migrations::{migrate, migrate_with, MIGRATIONS, SCHEMA};
pub use pgconn::{within, PgConn, UNREPLICATED};
pub use pools::{Pool, PoolCounters, Pools, PrimaryWatch};
pub use rows::*;

use postgres::error::SqlState;

/// Why a command could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbError {
    /// The database cannot be reached or was lost mid-request: try again (`-TRYAGAIN`).
    Unavailable(String),
    /// `-NOQUEUE no such queue 'q'`
    NoQueue(String),
    /// `-EXISTS queue 'q' already exists`
    Exists(String),
    /// `-OVERQUOTA ...`: a queue's or a user's quota.
    OverQuota(String),
    /// Anything else the database refused (`-ERR database: ...`).
    Failed(String),
    /// Redis's own refusal, as Redis words it (the stream commands).
    Redis(String),
    /// With several databases, a command would create a queue or stream
    /// for this user: its queues and streams on the other databases must be
    /// counted, and the command run again (`commands/owned.rs`).
    CountOwned(String),
}

/// What a request hears when the servers of the connection string that
/// answer are all read-only: during a failover the primary is gone and its
/// standby answers, read-only until the monitor has it promoted (and then
/// until the old primary is known to be down). Said as what happened, not as
/// the standby's refusal ("database does not allow writes"), which reads as
/// if the database had been set read-only. After `TRYAGAIN`, on which
/// clients retry.
pub(crate) const NO_PRIMARY: &str =
    "no primary: the database servers that answer do not take writes (standbys); the primary is gone, and a \
     promotion is awaited";

/// The same, for a connection whose server stopped taking writes under it.
pub(crate) const NO_LONGER_PRIMARY: &str =
    "no primary: the database server no longer takes writes (it is a standby now, or a failover is under way); \
     the primary is gone, and a promotion is awaited";

/// A connection could not be opened (`e`, as `connect` says it): try again.
pub(crate) fn unavailable(e: &str) -> DbError {
    if e.starts_with("no primary:") {
        DbError::Unavailable(e.to_string())
    } else {
        DbError::Unavailable(format!("the database is unavailable: {e}"))
    }
}

/// Whether an error means the server cannot take writes: a standby, or a
/// primary being failed over (pg_auto_failover makes the new primary
/// read-only until the old one is known to be down). The connection is
/// given up so that the next one finds the host that accepts writes.
pub(crate) fn read_only(e: &postgres::Error) -> bool {
    e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION)
}

/// Whether an error means the connection cannot be used any more.
pub(crate) fn connection_lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // A parameter or column mwmq could not convert is its own mistake,
        // not the connection's (which stays usable).
        None if client_side(e) => false,
        None => true, // an I/O error, not an answer from the server
        Some(c) => {
            c.code().starts_with("08")
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
        }
    }
}

/// Whether an error without an SQLSTATE arose in this process (converting a
/// parameter or a column), not on the connection.
fn client_side(e: &postgres::Error) -> bool {
    let text = e.to_string();
    text.starts_with("error serializing") || text.starts_with("error deserializing")
}

fn classify(e: postgres::Error) -> DbError {
    if connection_lost(&e) {
        return DbError::Unavailable(format!(
            "database connection lost ({e}); the request may or may not have taken effect"
        ));
    }
    if read_only(&e) {
        return DbError::Unavailable(NO_LONGER_PRIMARY.into());
    }
    match e.code() {
        Some(c) if *c == SqlState::QUERY_CANCELED => {
            DbError::Unavailable("the database did not answer in time (statement_timeout)".into())
        }
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED => {
            DbError::Unavailable(format!("the database aborted the transaction ({e})"))
        }
        _ => DbError::Failed(e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string())),
    }
}
