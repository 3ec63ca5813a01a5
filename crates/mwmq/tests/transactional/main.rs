//! What the database keeps for applications: enqueue and acknowledge in
//! their own transactions (`sqlsend.rs`, with `sqlsend_app.py` on psycopg),
//! the SQL API under mwmq's rights and bounds, safe from planted objects
//! (`sqlguard.rs`, `sql/0016_sql_bounds.sql`), holding up nothing of RESP's however long they stay
//! open (`sqlstall.rs`), and acknowledged messages kept for a while
//! (`retention.rs`). One test binary for all (each binary is linked on its
//! own).

#[path = "../common/mod.rs"]
mod common;

mod retention;
mod sqlbounds;
mod sqlguard;
mod sqlsend;
mod sqlstall;
