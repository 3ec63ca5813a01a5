//! A churning queue stays cheap: receivers do not step over the messages
//! under lease to find a ready one, and mwmq vacuums its messages table
//! when dead rows pile up between autovacuum's visits.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mwmq::{Mq, Service};

/// Rows fetched through the messages table's indexes so far (as the
/// statistics have them: a backend reports them when it goes idle).
fn index_fetches(db: &mut postgres::Client) -> i64 {
    db.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    db.query_one("SELECT idx_tup_fetch FROM pg_stat_user_tables WHERE relname = 'mwmq_messages'", &[]).unwrap().get(0)
}

/// The counter once every backend that moved it has reported: mwmq is
/// stopped first (a backend that exits reports its statistics at once; a
/// running one only when it has been idle a while, up to 10 s later).
fn fetches_after_stop(db: &mut postgres::Client, mq: Mq) -> i64 {
    mq.stopper().stop();
    mq.join();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = index_fetches(db);
    // The exits' reports land within moments; read until two reads agree.
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = index_fetches(db);
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

#[test]
fn leased_messages_do_not_slow_receivers_and_dead_rows_are_vacuumed() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.queues.vacuum_s = 1;
    cfg.queues.vacuum_min_dead = 500;
    let mq = start(cfg.clone());
    let mut c = connect(mq.local_addr());
    let mut db = sql(&pg);
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let mut pipe = redis::pipe();
    for i in 0..3_000 {
        pipe.cmd("SEND").arg("q").arg(format!("m{i}"));
    }
    let ids: Vec<i64> = pipe.query(&mut c).unwrap();
    // 2,000 messages under lease at the head of the queue.
    for _ in 0..2 {
        assert_eq!(recv(&mut c, "q", &["COUNT", "1000", "VT", "600000"]).len(), 1_000);
    }
    drop(c);
    let before = fetches_after_stop(&mut db, mq);
    // A new mwmq on the same database (the leases stay), then each RECV finds
    // the next ready message without visiting the leased ones.
    let mq = start(cfg.clone());
    let mut c = connect(mq.local_addr());
    let rounds = 20;
    for i in 0..rounds {
        let m = recv(&mut c, "q", &[]);
        assert_eq!(m[0].0, ids[2_000 + i], "the oldest ready message, in order");
        assert_eq!(q::<i64>(&mut c, &["ACK", "q", &m[0].0.to_string(), &m[0].1.to_string()]), 1);
    }
    drop(c);
    let after = fetches_after_stop(&mut db, mq);
    assert!(after - before >= 2 * rounds as i64, "the statistics saw the requests: {before} -> {after}");
    let per_request = (after - before) as f64 / (2 * rounds) as f64;
    eprintln!("index fetches per request: {per_request:.1}");
    assert!(
        per_request < 20.0,
        "a RECV or ACK fetched {per_request:.1} rows through the indexes (2,000 are under lease)"
    );

    // Dead rows (leases are new row versions, ACKs delete) are vacuumed by mwmq itself.
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    for _ in 0..10 {
        for m in recv(&mut c, "q", &["COUNT", "100"]) {
            assert_eq!(q::<i64>(&mut c, &["ACK", "q", &m.0.to_string(), &m.1.to_string()]), 1);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(40);
    while info_field(&mut c, "vacuums") == 0 {
        assert!(Instant::now() < deadline, "no vacuum after 40 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    let vacuumed: i64 = db
        .query_one("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'mwmq_messages'", &[])
        .unwrap()
        .get(0);
    assert!(vacuumed >= 1, "the database counts the vacuum too");
    drop(c);
    mq.stopper().stop();
    mq.join();
}
