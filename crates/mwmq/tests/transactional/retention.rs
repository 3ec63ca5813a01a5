//! Retention: a queue with RETAIN keeps what is acknowledged (ACK, batched
//! ACKs, POP, `mwmq.ack` in SQL) in the archive, readable with QARCHIVE;
//! the purge thread deletes it once kept long enough, when retention is
//! lifted, and when the queue is dropped; a queue without RETAIN keeps nothing.

use std::time::{Duration, Instant};

use crate::common::*;
use mctest::Postgres;
use mwmq::Service;

/// QARCHIVE's rows: (id, sender, body, deliveries, acked_at_ms, acked_by).
type Kept = (i64, String, Vec<u8>, i64, i64, Option<String>);

fn live_rows(pg: &Postgres) -> i64 {
    sql(pg).query_one("SELECT count(*) FROM mwmq_messages", &[]).unwrap().get(0)
}

#[test]
fn a_retaining_queue_keeps_what_is_acknowledged_every_way() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "orders", "RETAIN", "3600000"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "plain"]), "OK");
    for body in ["acked", "popped", "in sql"] {
        let _: i64 = q(&mut c, &["SEND", "orders", body]);
    }
    let before = mwstats_now_ms();
    let m = recv(&mut c, "orders", &[]).remove(0);
    assert_eq!(q::<i64>(&mut c, &["ACK", "orders", &m.0.to_string(), &m.1.to_string()]), 1);
    let popped: (i64, String, Vec<u8>) = q(&mut c, &["POP", "orders"]);
    assert_eq!(popped.2, b"popped");
    let last = recv(&mut c, "orders", &[]).remove(0);
    let acked: bool = sql(&pg).query_one("SELECT mwmq.ack('orders', $1, $2)", &[&last.0, &last.1]).unwrap().get(0);
    assert!(acked);
    let kept: Vec<Kept> = q(&mut c, &["QARCHIVE", "orders"]);
    let bodies: Vec<&[u8]> = kept.iter().map(|k| k.2.as_slice()).collect();
    assert_eq!(bodies, [&b"in sql"[..], b"popped", b"acked"], "newest first");
    assert!(kept.iter().all(|k| k.3 == 1 && k.4 >= before - 1000), "{kept:?}");
    assert_eq!(kept[2].0, m.0);
    assert_eq!(live_rows(&pg), 0, "the live table holds none of them");
    let info = qinfo(&mut c, "orders");
    assert_eq!((info["retain_ms"].as_str(), info["archived"].as_str()), ("3600000", "3"));
    let one: Vec<Kept> = q(&mut c, &["QARCHIVE", "orders", "COUNT", "1"]);
    assert_eq!(one.len(), 1);
    // A queue without RETAIN keeps nothing.
    let _: i64 = q(&mut c, &["SEND", "plain", "x"]);
    let m = recv(&mut c, "plain", &[]).remove(0);
    assert_eq!(q::<i64>(&mut c, &["ACK", "plain", &m.0.to_string(), &m.1.to_string()]), 1);
    assert!(q::<Vec<Kept>>(&mut c, &["QARCHIVE", "plain"]).is_empty());
    assert_eq!(qinfo_int(&mut c, "plain", "archived"), 0);
    assert!(err(&mut c, &["QARCHIVE", "nope"]).starts_with("NOQUEUE"));
    assert!(err(&mut c, &["QARCHIVE", "orders", "COUNT", "0"]).contains("COUNT must be between 1"));
    assert!(err(&mut c, &["QALTER", "orders", "RETAIN", "-5"]).contains("RETAIN"));
}

/// Milliseconds since 1970 now.
fn mwstats_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn pipelined_acks_are_kept_too() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "orders", "RETAIN", "3600000"]), "OK");
    for i in 0..60 {
        let _: i64 = q(&mut c, &["SEND", "orders", &format!("m{i}")]);
    }
    let got = recv(&mut c, "orders", &["COUNT", "60"]);
    let mut pipe = redis::pipe();
    for m in &got {
        pipe.cmd("ACK").arg("orders").arg(m.0).arg(m.1);
    }
    let acked: Vec<i64> = pipe.query(&mut c).unwrap();
    assert_eq!(acked.iter().sum::<i64>(), 60);
    assert_eq!(qinfo_int(&mut c, "orders", "archived"), 60);
}

#[test]
fn housekeeping_deletes_what_was_kept_long_enough() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    // The purge thread's work (every purge_ms, here a tenth of a second, so
    // that its first passes come long before short's 1.5 s are up), not the
    // hourly maintenance's.
    cfg.queues.maintenance_s = 3600;
    cfg.queues.purge_ms = 100;
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "short", "RETAIN", "1500"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "long", "RETAIN", "3600000"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "lifted", "RETAIN", "3600000"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "dropped", "RETAIN", "3600000"]), "OK");
    // (short's messages are archived after this, and kept at least 1.5 s from it.)
    let archived = Instant::now();
    for queue in ["short", "long", "lifted", "dropped"] {
        for i in 0..3 {
            let _: i64 = q(&mut c, &["SEND", queue, &format!("{queue}{i}")]);
            let _: (i64, String, Vec<u8>) = q(&mut c, &["POP", queue]);
        }
    }
    assert_eq!(qinfo_int(&mut c, "short", "archived"), 3);
    assert_eq!(q::<String>(&mut c, &["QALTER", "lifted", "RETAIN", "0"]), "OK");
    let _: String = q(&mut c, &["QDROP", "dropped"]);
    let mut db = sql(&pg);
    let kept = |db: &mut postgres::Client, queue: &str| -> i64 {
        db.query_one(
            "SELECT count(*) FROM mwmq_archive a JOIN mwmq_queues q ON q.id = a.queue_id WHERE q.name = $1",
            &[&queue],
        )
        .unwrap()
        .get(0)
    };
    assert!(
        eventually(Duration::from_secs(30), || kept(&mut db, "lifted") == 0 && kept(&mut db, "dropped") == 0),
        "lifted and dropped: deleted at the next pass"
    );
    // Counted before 1.5 s from `archived` had passed: none of short's can be due.
    let short = kept(&mut db, "short");
    if archived.elapsed() < Duration::from_millis(1500) {
        assert_eq!(short, 3, "not yet kept long enough");
    }
    assert!(eventually(Duration::from_secs(30), || kept(&mut db, "short") == 0), "then deleted");
    assert_eq!(kept(&mut db, "long"), 3);
}
