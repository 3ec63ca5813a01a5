//! Enqueue in the application's own transaction: `mwmq.send` and `mwmq.ack`
//! called on the queue's database by a role granted them, from the
//! `postgres` crate (an application's driver), from psql and from psycopg.
//! A message exists if and only if the caller's transaction commits
//! (commit, rollback, savepoints, a client killed mid-transaction), a
//! waiting RECV wakes at the commit, keys deduplicate as SEND's KEY does,
//! the sender is the calling role, and roles without the grant are refused.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use mctest::Postgres;
use mwmq::Service;

/// A database with mwmq's schema (mwmq started on it), the queue `orders`,
/// an application table, and two roles: `app` granted mwmq's functions,
/// `stranger` not.
pub(crate) fn setup(pg: &Postgres, tweak: impl FnOnce(&mut mwmq::Config)) -> (mwmq::Mq, redis::Connection) {
    let mut cfg = config(pg);
    tweak(&mut cfg);
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "orders"]), "OK");
    sql(pg)
        .batch_execute(
            "CREATE ROLE app LOGIN; CREATE ROLE stranger LOGIN;
             GRANT USAGE ON SCHEMA mwmq TO app; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA mwmq TO app;
             CREATE TABLE orders (id int PRIMARY KEY); GRANT ALL ON orders TO app;",
        )
        .unwrap();
    (mq, c)
}

/// The connection string for `role`.
pub(crate) fn as_role(pg: &Postgres, role: &str) -> String {
    let info = pg.conninfo().replace("user=postgres", &format!("user={role}"));
    assert!(info.contains(&format!("user={role}")), "{info}");
    info
}

pub(crate) fn app(pg: &Postgres) -> postgres::Client {
    postgres::Client::connect(&as_role(pg, "app"), postgres::NoTls).unwrap()
}

pub(crate) fn bodies(messages: &[Leased]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8_lossy(&m.3).into_owned()).collect()
}

/// Runs `script` with psql as `role`: its standard output, or the error it stopped on.
pub(crate) fn psql(pg: &Postgres, role: &str, script: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
        .arg(as_role(pg, role))
        .args(["-c", script])
        .output()
        .expect("psql (make test installs postgresql-client)");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn a_message_sent_in_sql_exists_if_and_only_if_its_transaction_commits() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    let mut db = app(&pg);
    // Commit: invisible until then, then there, sent by the calling role.
    let mut tx = db.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[]).unwrap();
    let id: i64 = tx.query_one("SELECT mwmq.send('orders', 'order 1 placed')", &[]).unwrap().get(0);
    assert!(recv(&mut c, "orders", &[]).is_empty(), "nothing before COMMIT");
    assert_eq!(qinfo_int(&mut c, "orders", "ready"), 0);
    tx.commit().unwrap();
    let got = recv(&mut c, "orders", &[]);
    assert_eq!((got[0].0, got[0].2.as_str(), bodies(&got)), (id, "app", vec!["order 1 placed".to_string()]));
    // Rollback: the order and its message are gone together.
    let mut tx = db.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (2)", &[]).unwrap();
    let lost: i64 = tx.query_one("SELECT mwmq.send('orders', 'order 2 placed')", &[]).unwrap().get(0);
    tx.rollback().unwrap();
    assert!(recv(&mut c, "orders", &["WAIT", "300"]).is_empty(), "nothing after ROLLBACK");
    let left = sql(&pg).query_one("SELECT count(*) FROM mwmq_messages WHERE id = $1", &[&lost]).unwrap();
    assert_eq!(left.get::<_, i64>(0), 0);
    // Savepoints: what was sent after one that is rolled back to is gone, the rest stays.
    let mut tx = db.transaction().unwrap();
    tx.execute("SELECT mwmq.send('orders', 'a')", &[]).unwrap();
    let mut inner = tx.savepoint("s").unwrap();
    inner.execute("SELECT mwmq.send('orders', 'b')", &[]).unwrap();
    inner.rollback().unwrap();
    tx.execute("SELECT mwmq.send('orders', convert_to('c', 'UTF8'))", &[]).unwrap();
    tx.commit().unwrap();
    assert_eq!(bodies(&recv(&mut c, "orders", &["COUNT", "10"])), ["a", "c"]);
    // Bytes, a receiver, a delay, as SEND has them.
    let blob: Vec<u8> = (0u8..=255).collect();
    let to: i64 = db.query_one("SELECT mwmq.send('orders', $1::bytea, NULL, 0, 'worker-7')", &[&blob]).unwrap().get(0);
    let row = sql(&pg).query_one("SELECT receiver, body FROM mwmq_messages WHERE id = $1", &[&to]).unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, Vec<u8>>(1)), ("worker-7".to_string(), blob.clone()));
    db.execute("SELECT mwmq.send('orders', $1::bytea)", &[&blob]).unwrap();
    assert_eq!(recv(&mut c, "orders", &[])[0].3, blob);
    // (Timed from before the send: a look that came back sooner than the
    // delay was made before the message's time, however slow the machine.)
    let sent_at = Instant::now();
    db.execute("SELECT mwmq.send('orders', 'later', delay_ms => 1000)", &[]).unwrap();
    let early = recv(&mut c, "orders", &[]);
    if sent_at.elapsed() < Duration::from_millis(1000) {
        assert!(early.is_empty(), "the delayed one is not due yet");
    }
    let later = if early.is_empty() { recv(&mut c, "orders", &["WAIT", "30000"]) } else { early };
    assert_eq!(bodies(&later), ["later"]);
}

#[test]
fn keys_deduplicate_across_transactions_as_send_key_does() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    let first = psql(&pg, "app", "BEGIN; SELECT mwmq.send('orders', 'once', 'order-9'); COMMIT;").unwrap();
    let again = psql(&pg, "app", "SELECT mwmq.send('orders', 'twice', 'order-9')").unwrap();
    assert_eq!(first, again, "the first message's id");
    let resp: i64 = q(&mut c, &["SEND", "orders", "thrice", "KEY", "order-9"]);
    assert_eq!(resp.to_string(), first, "SEND KEY sees the key written in SQL");
    // A key whose transaction rolled back was never taken.
    psql(&pg, "app", "BEGIN; SELECT mwmq.send('orders', 'undone', 'order-10'); ROLLBACK;").unwrap();
    let fresh = psql(&pg, "app", "SELECT mwmq.send('orders', 'done', 'order-10')").unwrap();
    assert_ne!(fresh, first);
    assert_eq!(bodies(&recv(&mut c, "orders", &["COUNT", "10"])), ["once", "done"]);
}

#[test]
fn a_client_killed_mid_transaction_sends_nothing() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    let mut client = Command::new("psql")
        .args(["-X", "-q", "-d"])
        .arg(as_role(&pg, "app"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    client.stdin.as_mut().unwrap().write_all(b"BEGIN;\nSELECT mwmq.send('orders', 'never');\n").unwrap();
    client.stdin.as_mut().unwrap().flush().unwrap();
    let mut admin = sql(&pg);
    let open = "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app' AND state = 'idle in transaction'";
    let sent = eventually(Duration::from_secs(10), || admin.query_one(open, &[]).unwrap().get::<_, i64>(0) == 1);
    assert!(sent, "psql sent inside its transaction");
    client.kill().unwrap();
    client.wait().unwrap();
    let any = "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'";
    assert!(eventually(Duration::from_secs(10), || admin.query_one(any, &[]).unwrap().get::<_, i64>(0) == 0));
    assert!(recv(&mut c, "orders", &["WAIT", "300"]).is_empty());
    let rows = admin.query_one("SELECT count(*) FROM mwmq_messages", &[]).unwrap();
    assert_eq!(rows.get::<_, i64>(0), 0, "the transaction died with its client");
}

#[test]
fn a_waiting_recv_wakes_at_the_commit() {
    let pg = Postgres::start().unwrap();
    // Polling once a minute: only the commit's NOTIFY can wake the RECV in time.
    let (mq, _c) = setup(&pg, |c| c.queues.poll_ms = 60_000);
    let addr = mq.local_addr();
    let (tx_done, done) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut c = connect(addr);
        let got = recv(&mut c, "orders", &["WAIT", "30000"]);
        tx_done.send(Instant::now()).unwrap();
        got
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut db = app(&pg);
    let mut tx = db.transaction().unwrap();
    tx.execute("SELECT mwmq.send('orders', 'wake up')", &[]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(done.try_recv().is_err(), "not woken before the commit");
    tx.commit().unwrap();
    let committed = Instant::now();
    let woke = done.recv_timeout(Duration::from_secs(20)).expect("woken by the commit");
    let got = waiter.join().unwrap();
    assert_eq!(bodies(&got), ["wake up"]);
    assert!(
        woke.duration_since(committed) < Duration::from_secs(10),
        "woken by the commit's notification, not by the minute's poll"
    );
}

#[test]
fn ack_in_the_transaction_that_finished_the_work() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    let _: i64 = q(&mut c, &["SEND", "orders", "ship 1"]);
    let m = recv(&mut c, "orders", &[]).remove(0);
    let mut db = app(&pg);
    let ack = "SELECT mwmq.ack('orders', $1, $2)";
    // The work rolled back: so does the ACK, and the message stays leased.
    let mut tx = db.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[]).unwrap();
    assert!(tx.query_one(ack, &[&m.0, &m.1]).unwrap().get::<_, bool>(0));
    tx.rollback().unwrap();
    assert_eq!(qinfo_int(&mut c, "orders", "leased"), 1);
    // A wrong lease acknowledges nothing; the right one, committed, does.
    assert!(!db.query_one(ack, &[&m.0, &(m.1 ^ 1)]).unwrap().get::<_, bool>(0));
    let mut tx = db.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[]).unwrap();
    assert!(tx.query_one(ack, &[&m.0, &m.1]).unwrap().get::<_, bool>(0));
    tx.commit().unwrap();
    let info = qinfo(&mut c, "orders");
    assert_eq!((info["ready"].as_str(), info["leased"].as_str()), ("0", "0"));
    assert_eq!(q::<i64>(&mut c, &["ACK", "orders", &m.0.to_string(), &m.1.to_string()]), 0, "acknowledged once");
}

#[test]
fn only_granted_roles_may_send_and_bad_calls_say_why() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    let refused = psql(&pg, "stranger", "SELECT mwmq.send('orders', 'x')").unwrap_err();
    assert!(refused.contains("permission denied"), "{refused}");
    // Even with the schema, the functions are not PUBLIC's.
    sql(&pg).batch_execute("GRANT USAGE ON SCHEMA mwmq TO stranger").unwrap();
    let refused = psql(&pg, "stranger", "SELECT mwmq.ack('orders', 1, 1)").unwrap_err();
    assert!(refused.contains("permission denied for function ack"), "{refused}");
    // Nor do the functions open the tables to their callers.
    let tables = psql(&pg, "app", "SELECT count(*) FROM mwmq.mwmq_messages").unwrap_err();
    assert!(tables.contains("permission denied"), "{tables}");
    let mut db = app(&pg);
    let code = |db: &mut postgres::Client, call: &str| {
        let e = db.execute(call, &[]).unwrap_err();
        (e.code().map(|c| c.code().to_string()).unwrap_or_default(), e.as_db_error().unwrap().message().to_string())
    };
    let (state, why) = code(&mut db, "SELECT mwmq.send('nope', 'x')");
    assert_eq!((state.as_str(), why.as_str()), ("42704", "mwmq.send: no queue nope"));
    let (state, _) = code(&mut db, "SELECT mwmq.send('orders', 'x', delay_ms => -1)");
    assert_eq!(state, "22023");
    let (state, _) = code(&mut db, "SELECT mwmq.send('orders', NULL::bytea)");
    assert_eq!(state, "22004");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "small", "MAXMESSAGES", "1"]), "OK");
    db.execute("SELECT mwmq.send('small', 'one')", &[]).unwrap();
    let (state, why) = code(&mut db, "SELECT mwmq.send('small', 'two')");
    let full =
        "mwmq.send: queue small is full: 1 messages, 3 bytes with this transaction's (MAXMESSAGES 1, MAXBYTES 0; \
                0 is no limit)";
    assert_eq!((state.as_str(), why.as_str()), ("54000", full), "with the figures RESP's refusal gives");
    assert_eq!(qinfo_int(&mut c, "small", "ready"), 1);
}

#[test]
fn an_application_on_psycopg_enqueues_in_its_transactions() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(python.exists(), "{} is missing: make test-deps installs psycopg there", python.display());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/transactional/sqlsend_app.py");
    let out = Command::new(&python).arg(&script).arg(as_role(&pg, "app")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("rolled back"), "{said}");
    // What the application committed arrived, in order; what it rolled back did not.
    assert_eq!(bodies(&recv(&mut c, "orders", &["COUNT", "10"])), ["order 1", "order 3", "invoice 3"]);
    let rows = sql(&pg).query("SELECT id FROM orders ORDER BY id", &[]).unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>(), [1, 3]);
}

/// A caller cannot make the functions, which run with their owner's rights,
/// use objects of its own: a schema first on its search_path with its own
/// `mwmq_queues`, `mwmq_messages` and `mwmq_room` changes nothing.
#[test]
fn a_callers_search_path_cannot_redirect_the_functions() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    assert_eq!(q::<String>(&mut c, &["QCREATE", "small", "MAXMESSAGES", "1"]), "OK");
    let warm: i64 = q(&mut c, &["SEND", "orders", "warm"]);
    sql(&pg).batch_execute("CREATE SCHEMA trap AUTHORIZATION app").unwrap();
    let mut db = app(&pg);
    db.batch_execute(
        "CREATE TABLE trap.mwmq_queues (id bigint, name text, dropped_at timestamptz, max_messages bigint,
                                        max_bytes bigint);
         INSERT INTO trap.mwmq_queues VALUES (1, 'orders', NULL, NULL, NULL), (2, 'small', NULL, NULL, NULL);
         CREATE TABLE trap.mwmq_messages (queue_id bigint, id bigint, sender text, receiver text, body bytea,
                                          visible_at timestamptz, counted boolean, grp text);
         CREATE FUNCTION trap.mwmq_room(bigint, bigint, bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         CREATE FUNCTION trap.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';
         SET search_path = trap, public, pg_catalog;",
    )
    .unwrap_or_else(|e| panic!("{:?}", e.as_db_error()));
    let id: i64 = db.query_one("SELECT mwmq.send('orders', 'real')", &[]).unwrap().get(0);
    assert!(id > warm, "the real sequence, not the caller's nextval (1)");
    let got = recv(&mut c, "orders", &["COUNT", "5"]);
    assert!(got.iter().any(|m| m.0 == id && m.3 == b"real"), "the real queue got it: {got:?}");
    db.execute("SELECT mwmq.send('small', 'one')", &[]).unwrap();
    let full = db.execute("SELECT mwmq.send('small', 'two')", &[]).unwrap_err();
    assert_eq!(full.code().map(|c| c.code()), Some("54000"), "the real quota check, not the caller's mwmq_room");
    let trapped: i64 = db.query_one("SELECT count(*) FROM trap.mwmq_messages", &[]).unwrap().get(0);
    assert_eq!(trapped, 0);
}
