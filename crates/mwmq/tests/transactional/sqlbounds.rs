//! Schema 16 (`sql/0016_sql_bounds.sql`): `mwmq.send`'s receiver, key and message
//! group are bounded as SEND's TO, KEY and GROUP are, and a quota set or
//! lifted while an SQL transaction that sent to the queue is open counts
//! that transaction's messages right once it commits.

use std::sync::mpsc;

use crate::common::*;
use crate::sqlsend::{app, setup};
use mctest::Postgres;

/// The SQLSTATE and message of a failed statement.
fn failure(e: postgres::Error) -> (String, String) {
    let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
    (code, e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string()))
}

/// Messages and deduplication keys stored for `queue`.
fn stored(pg: &Postgres, queue: &str) -> (i64, i64) {
    let r = sql(pg)
        .query_one(
            "SELECT (SELECT count(*) FROM mwmq.mwmq_messages m WHERE m.queue_id = q.id),
                    (SELECT count(*) FROM mwmq.mwmq_keys k WHERE k.queue_id = q.id)
             FROM mwmq.mwmq_queues q WHERE q.name = $1 AND q.dropped_at IS NULL",
            &[&queue],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// The issue's row: a receiver of 96 MB was stored by a role allowed
/// 1,000-byte bodies. Each of receiver, key and message_group over 200
/// bytes, empty, or with a space or a control character is refused with
/// SEND's words and nothing is stored; at 200 bytes it is taken.
#[test]
fn mwmq_send_bounds_receiver_key_and_group_as_send_does() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |cfg| cfg.server.max_body = 1000);
    let mut db = app(&pg);
    let send = |db: &mut postgres::Client, param: &str, value: &str| {
        db.query_one(&format!("SELECT mwmq.send('orders', 'x', {param} => $1)"), &[&value])
            .map(|r| r.get::<_, i64>(0))
            .map_err(failure)
    };
    let e = db
        .query_one(
            "SELECT mwmq.send('orders', 'x', receiver => (SELECT string_agg(md5(i::text), '')
                                                         FROM generate_series(1, 30000) i))",
            &[],
        )
        .unwrap_err();
    let (code, why) = failure(e);
    assert_eq!((code.as_str(), why.ends_with("not 960000 bytes")), ("54000", true), "{why}");
    assert_eq!(stored(&pg, "orders"), (0, 0));
    for param in ["receiver", "key", "message_group"] {
        let (code, why) = send(&mut db, param, &"r".repeat(201)).unwrap_err();
        assert_eq!(
            (code.as_str(), why),
            (
                "54000",
                format!(
                    "mwmq.send: {param} must be 1 to 200 bytes without spaces or control characters, not 201 bytes"
                )
            )
        );
        // Bytes, not characters: 100 two-byte characters and one more.
        let (code, _) = send(&mut db, param, &format!("{}r", "é".repeat(100))).unwrap_err();
        assert_eq!(code, "54000");
        let (code, why) = send(&mut db, param, "").unwrap_err();
        assert_eq!((code.as_str(), why.ends_with("not empty")), ("22023", true), "{why}");
        for bad in ["a b", "a\tb", "a\u{7f}b", "a\u{a0}b", "a\u{2028}b", "a\u{3000}b", "a\u{85}b"] {
            let (code, why) = send(&mut db, param, bad).unwrap_err();
            assert_eq!((code.as_str(), why.ends_with("and has one")), ("22023", true), "{param} {bad:?}: {why}");
        }
        assert_eq!(stored(&pg, "orders"), (0, 0), "nothing stored for a refused {param}");
    }
    // At the bound, and what SEND takes beside it (non-ASCII, punctuation).
    for param in ["receiver", "key", "message_group"] {
        send(&mut db, param, &"r".repeat(200)).unwrap();
        send(&mut db, param, &format!("{}r", "é".repeat(99))).unwrap();
    }
    assert_eq!(stored(&pg, "orders"), (6, 2));
    // SEND over RESP draws the same line.
    let long = "r".repeat(201);
    assert!(err(&mut c, &["SEND", "orders", "x", "TO", &long]).contains("must be 1 to 200 bytes"));
    let at = "r".repeat(200);
    assert!(q::<i64>(&mut c, &["SEND", "orders", "x", "TO", &at]) > 0);
}

/// What a session of `app` in another thread does next.
enum Step {
    Commit,
}

/// `app` sends `n` messages to `queue` in a transaction (after `then`, if
/// any, runs in it), says so, and commits when told: the COMMIT's outcome.
fn open_sender(
    pg: &Postgres,
    queue: &str,
    n: i32,
    then: Option<&'static str>,
) -> (mpsc::Receiver<()>, mpsc::Sender<Step>, std::thread::JoinHandle<Result<(), postgres::Error>>) {
    let (sent_tx, sent) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    let mut db = app(pg);
    let queue = queue.to_string();
    let h = std::thread::spawn(move || {
        db.batch_execute("BEGIN").unwrap();
        let k: i64 = db
            .query_one("SELECT count(mwmq.send($1, 'x')) FROM generate_series(1, $2) i", &[&queue, &n])
            .unwrap()
            .get(0);
        assert_eq!(k, i64::from(n));
        if let Some(sql) = then {
            db.batch_execute(sql).unwrap();
        }
        sent_tx.send(()).unwrap();
        let Ok(Step::Commit) = go_rx.recv() else { panic!("told nothing") };
        db.batch_execute("COMMIT")
    });
    (sent, go, h)
}

/// The issue's row: 50 messages sent in SQL to a queue without a quota,
/// `QALTER ... MAXMESSAGES 10` while the transaction is open, then COMMIT:
/// they were stored uncounted (QINFO: 0 held, QLEN 50) and the queue took
/// more SENDs. Now they are counted at COMMIT and the quota refuses what
/// comes next, over RESP and in SQL; a quota lifted while a transaction is
/// open leaves nothing counted; a transaction that ran its checks early
/// (`SET CONSTRAINTS ALL IMMEDIATE`) makes the QALTER answer TRYAGAIN, and
/// the QALTER run again once it ended counts right.
#[test]
fn a_quota_set_or_lifted_while_an_sql_transaction_is_open_counts_its_messages() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    let counts = |c: &mut redis::Connection, queue: &str| {
        (qinfo_int(c, queue, "counted_messages"), q::<i64>(c, &["QLEN", queue]))
    };
    assert_eq!(q::<String>(&mut c, &["QCREATE", "orders.drift"]), "OK");
    let (sent, go, h) = open_sender(&pg, "orders.drift", 50, None);
    sent.recv().unwrap();
    assert_eq!(q::<String>(&mut c, &["QALTER", "orders.drift", "MAXMESSAGES", "10"]), "OK");
    go.send(Step::Commit).unwrap();
    h.join().unwrap().expect("what was sent before the quota commits");
    assert_eq!(counts(&mut c, "orders.drift"), (50, 50), "counted as held");
    assert!(err(&mut c, &["SEND", "orders.drift", "x"]).starts_with("OVERQUOTA"));
    let (code, why) = failure(app(&pg).execute("SELECT mwmq.send('orders.drift', 'x')", &[]).unwrap_err());
    assert_eq!(code, "54000", "{why}");
    assert_eq!(counts(&mut c, "orders.drift"), (50, 50));

    // Lifted while open: nothing counted once committed.
    assert_eq!(q::<String>(&mut c, &["QCREATE", "orders.lift", "MAXMESSAGES", "100"]), "OK");
    let (sent, go, h) = open_sender(&pg, "orders.lift", 5, None);
    sent.recv().unwrap();
    assert_eq!(q::<String>(&mut c, &["QALTER", "orders.lift", "MAXMESSAGES", "0"]), "OK");
    go.send(Step::Commit).unwrap();
    h.join().unwrap().unwrap();
    assert_eq!(counts(&mut c, "orders.lift"), (0, 5));
    assert_eq!(q::<String>(&mut c, &["QALTER", "orders.lift", "MAXMESSAGES", "5"]), "OK");
    assert_eq!(counts(&mut c, "orders.lift"), (5, 5));
    assert!(err(&mut c, &["SEND", "orders.lift", "x"]).starts_with("OVERQUOTA"));

    // The checks run early: the QALTER cannot wait for them, says so, and
    // counts right when run again after the COMMIT.
    assert_eq!(q::<String>(&mut c, &["QCREATE", "orders.early"]), "OK");
    let (sent, go, h) = open_sender(&pg, "orders.early", 3, Some("SET CONSTRAINTS ALL IMMEDIATE"));
    sent.recv().unwrap();
    let why = err(&mut c, &["QALTER", "orders.early", "MAXMESSAGES", "3"]);
    assert!(why.starts_with("TRYAGAIN the quota of queue 'orders.early' is changed"), "{why}");
    go.send(Step::Commit).unwrap();
    h.join().unwrap().unwrap();
    assert_eq!(q::<String>(&mut c, &["QALTER", "orders.early", "MAXMESSAGES", "3"]), "OK");
    assert_eq!(counts(&mut c, "orders.early"), (3, 3));
    assert!(err(&mut c, &["SEND", "orders.early", "x"]).starts_with("OVERQUOTA"));
}
