//! What an SQL caller's open transaction can hold up (schema 14,
//! `sql/0014_sql_quota.sql`): nothing of RESP's. Transactions left open on every
//! counter stripe, each holding a `mwmq.send` or a `mwmq.ack` on a queue
//! with a quota, while RESP SENDs, ACKs, POPs and QALTERs of that queue and
//! SENDs to other queues all go through; the quota's counts exact once the
//! transactions end. A `SET CONSTRAINTS ALL IMMEDIATE` before `mwmq.send`
//! no longer takes the queue's gate early: another role's COMMIT goes
//! through, and the quota is still checked, exactly, at COMMIT.
//!
//! mwmq runs with a statement timeout of a minute and the clients wait 30 s
//! for a reply: a RESP statement that waited on a lock an SQL caller holds
//! fails the test with the client's read timeout, not with a time bound.

use std::collections::BTreeSet;

use crate::common::*;
use crate::sqlsend::{app, as_role, setup};
use mctest::Postgres;
use mwmq::Service;

/// Sessions of `app`, one per `pg_backend_pid() % 16` (the counters'
/// stripes), so that together they cover every stripe.
fn one_per_stripe(pg: &Postgres) -> Vec<postgres::Client> {
    let mut seen = BTreeSet::new();
    let mut kept = Vec::new();
    for _ in 0..2000 {
        let mut db = app(pg);
        let pid: i32 = db.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        if seen.insert(pid % 16) {
            kept.push(db);
            if kept.len() == 16 {
                return kept;
            }
        }
    }
    panic!("2000 connections did not cover the 16 stripes: {seen:?}");
}

/// What the queue holds, as its rows say and as its quota's counters say.
fn held(pg: &Postgres, c: &mut redis::Connection, queue: &str) -> ((i64, i64), (i64, i64)) {
    let r = sql(pg)
        .query_one(
            "SELECT count(*), coalesce(sum(octet_length(m.body)), 0)::bigint
             FROM mwmq_messages m JOIN mwmq_queues q ON q.id = m.queue_id WHERE q.name = $1",
            &[&queue],
        )
        .unwrap();
    let counted = (qinfo_int(c, queue, "counted_messages"), qinfo_int(c, queue, "counted_bytes"));
    ((r.get(0), r.get(1)), counted)
}

/// What RESP must be able to do while the SQL transactions are open: SEND,
/// RECV + ACK and POP on the queue with the quota, SENDs to other queues,
/// a QALTER that changes the quota. Each answers as it should; one that
/// waited for a lock would leave the client without a reply for 30 s.
fn resp_goes_on(c: &mut redis::Connection, round: i64) {
    let id: i64 = q(c, &["SEND", "capped", "from resp"]);
    assert!(id > 0);
    let got = recv(c, "capped", &[]);
    assert_eq!(got.len(), 1, "a committed message to take");
    let acked: i64 = q(c, &["ACK", "capped", &got[0].0.to_string(), &got[0].1.to_string()]);
    assert_eq!(acked, 1);
    let popped: redis::Value = q(c, &["POP", "capped"]);
    assert_ne!(popped, redis::Value::Nil, "POP took one");
    for other in ["orders", "plain"] {
        let id: i64 = q(c, &["SEND", other, "elsewhere"]);
        assert!(id > 0);
    }
    let quota = (1000 + round).to_string();
    assert_eq!(q::<String>(c, &["QALTER", "capped", "MAXMESSAGES", &quota]), "OK");
}

/// 16 transactions, one per stripe, each with an uncommitted `mwmq.send`
/// to a queue with a quota, then 16 each with an uncommitted `mwmq.ack`:
/// RESP's SEND, ACK, POP and QALTER of that queue and SENDs to others all
/// answer meanwhile; committed or rolled back, the counts equal the rows,
/// and again after the quota is lifted and set anew.
#[test]
fn open_sql_transactions_on_every_stripe_hold_up_no_resp_statement() {
    let pg = Postgres::start().unwrap();
    let (mq, mut c) = setup(&pg, |cfg| cfg.database.statement_timeout_ms = 60_000);
    assert_eq!(q::<String>(&mut c, &["QCREATE", "capped", "MAXMESSAGES", "1000"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "plain"]), "OK");
    for n in 0..40 {
        let _: i64 = q(&mut c, &["SEND", "capped", &format!("before {n}")]);
    }
    let mut sessions = one_per_stripe(&pg);

    // Sends held open on every stripe.
    for (i, db) in sessions.iter_mut().enumerate() {
        db.batch_execute("BEGIN").unwrap();
        let body = format!("held {i}");
        let id: i64 = db.query_one("SELECT mwmq.send('capped', $1::text)", &[&body]).unwrap().get(0);
        assert!(id > 0);
    }
    resp_goes_on(&mut c, 1);
    let mut other = connect(mq.local_addr());
    resp_goes_on(&mut other, 2);
    for (i, db) in sessions.iter_mut().enumerate() {
        db.batch_execute(if i % 2 == 0 { "COMMIT" } else { "ROLLBACK" }).unwrap();
    }
    let (rows, counted) = held(&pg, &mut c, "capped");
    assert_eq!(counted, rows, "the quota's counts after 8 commits and 8 rollbacks");

    // Acknowledgements held open on every stripe.
    let leased = recv(&mut c, "capped", &["COUNT", "16"]);
    assert_eq!(leased.len(), 16);
    for (db, m) in sessions.iter_mut().zip(&leased) {
        db.batch_execute("BEGIN").unwrap();
        let acked: bool = db.query_one("SELECT mwmq.ack('capped', $1, $2)", &[&m.0, &m.1]).unwrap().get(0);
        assert!(acked);
    }
    resp_goes_on(&mut c, 3);
    for (i, db) in sessions.iter_mut().enumerate() {
        db.batch_execute(if i % 2 == 0 { "COMMIT" } else { "ROLLBACK" }).unwrap();
    }
    let (rows, counted) = held(&pg, &mut c, "capped");
    assert_eq!(counted, rows, "the quota's counts after the acknowledgements");
    let gone: i64 = sql(&pg)
        .query_one(
            "SELECT count(*) FROM mwmq_messages WHERE id = ANY($1)",
            &[&leased.iter().map(|m| m.0).collect::<Vec<_>>()],
        )
        .unwrap()
        .get(0);
    assert_eq!(gone, 8, "the 8 rolled-back acknowledgements left their messages");
    // The recount leaves the SQL stripes as they are and still comes out right.
    assert_eq!(q::<String>(&mut c, &["QALTER", "capped", "MAXMESSAGES", "0"]), "OK");
    assert_eq!(held(&pg, &mut c, "capped").1, (0, 0), "no quota, nothing counted");
    assert_eq!(q::<String>(&mut c, &["QALTER", "capped", "MAXMESSAGES", "5000"]), "OK");
    let (rows, counted) = held(&pg, &mut c, "capped");
    assert_eq!(counted, rows, "a quota set again counts what the queue holds");
}

/// `SET CONSTRAINTS ALL IMMEDIATE; SELECT mwmq.send(...)` left open took
/// the queue's gate at the send and kept it: another role's COMMIT to the
/// queue waited as long as that session stayed open. Now the check still
/// runs at COMMIT: the other COMMIT goes through (it would fail after its
/// 30-s lock_timeout if it waited), and the first, committing last, finds
/// the quota full. A SET CONSTRAINTS after the sends runs the check then;
/// RESP does not wait for it either.
#[test]
fn set_constraints_immediate_before_a_send_neither_holds_the_gate_nor_moves_the_check() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |cfg| cfg.database.statement_timeout_ms = 60_000);
    assert_eq!(q::<String>(&mut c, &["QCREATE", "two", "MAXMESSAGES", "2"]), "OK");
    let mut early = app(&pg);
    early.batch_execute("BEGIN; SET CONSTRAINTS ALL IMMEDIATE").unwrap();
    early.execute("SELECT mwmq.send('two', 'early')", &[]).unwrap();
    let mut other = postgres::Client::connect(&as_role(&pg, "app"), postgres::NoTls).unwrap();
    other.batch_execute("SET lock_timeout = '30s'").unwrap();
    let mut tx = other.transaction().unwrap();
    tx.execute("SELECT mwmq.send('two', 'other 1')", &[]).unwrap();
    tx.execute("SELECT mwmq.send('two', 'other 2')", &[]).unwrap();
    tx.commit().expect("another role's COMMIT does not wait for the open session");
    let e = early.batch_execute("COMMIT").unwrap_err();
    let why = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    assert_eq!(e.code().map(|c| c.code()), Some("54000"), "{e:?}");
    assert!(why.contains("two is full at commit"), "{why}");
    let (rows, counted) = held(&pg, &mut c, "two");
    assert_eq!((rows.0, counted), (2, rows), "the quota held, exactly");

    // After the sends: PostgreSQL runs the check at the SET CONSTRAINTS,
    // and the gate stays taken; RESP never takes it.
    assert_eq!(q::<String>(&mut c, &["QCREATE", "three", "MAXMESSAGES", "3"]), "OK");
    early.batch_execute("BEGIN").unwrap();
    early.execute("SELECT mwmq.send('three', 'sql')", &[]).unwrap();
    early.batch_execute("SET CONSTRAINTS ALL IMMEDIATE").unwrap();
    let id: i64 = q(&mut c, &["SEND", "three", "resp"]);
    assert!(id > 0);
    early.batch_execute("COMMIT").unwrap();
    let (rows, counted) = held(&pg, &mut c, "three");
    assert_eq!((rows.0, counted), (2, rows));
}
