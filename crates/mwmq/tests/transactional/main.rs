//! What the database keeps for applications: enqueue and acknowledge in
//! their own transactions (`sqlsend.rs`, with `sqlsend_app.py` on psycopg),
//! and acknowledged messages kept for a while (`retention.rs`). One test
//! binary for both (each binary is linked on its own).

#[path = "../common/mod.rs"]
mod common;

mod retention;
mod sqlsend;
