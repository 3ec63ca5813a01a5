//! A churning queue stays cheap: receivers do not step over the messages
//! under lease to find a ready one, and mwmq vacuums its messages table
//! when dead rows pile up between autovacuum's visits.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mwmq::Service;

/// Rows fetched through the messages table's indexes so far (as the
/// statistics have them: a backend reports them when it goes idle).
fn index_fetches(db: &mut postgres::Client) -> i64 {
    db.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    db.query_one("SELECT idx_tup_fetch FROM pg_stat_user_tables WHERE relname = 'mwmq_messages'", &[]).unwrap().get(0)
}

/// The counter once it has moved by at least `least` and then stood still
/// for 11 s (an idle backend that reported less than a second ago reports
/// again 10 s later).
fn settled_fetches(db: &mut postgres::Client, before: i64, least: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut last, mut since) = (index_fetches(db), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = index_fetches(db);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if now - before >= least && since.elapsed() >= Duration::from_secs(11) {
            return now;
        }
        assert!(Instant::now() < deadline, "statistics did not settle: {before} -> {now}");
    }
}

#[test]
fn leased_messages_do_not_slow_receivers_and_dead_rows_are_vacuumed() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.queues.vacuum_s = 1;
    cfg.queues.vacuum_min_dead = 500;
    let mq = start(cfg);
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
    let start = index_fetches(&mut db);
    let before = settled_fetches(&mut db, start, 0);
    // Each RECV finds the next ready message without visiting the leased ones.
    let rounds = 20;
    for i in 0..rounds {
        let m = recv(&mut c, "q", &[]);
        assert_eq!(m[0].0, ids[2_000 + i], "the oldest ready message, in order");
        assert_eq!(q::<i64>(&mut c, &["ACK", "q", &m[0].0.to_string(), &m[0].1.to_string()]), 1);
    }
    let after = settled_fetches(&mut db, before, 2 * rounds as i64);
    let per_request = (after - before) as f64 / (2 * rounds) as f64;
    eprintln!("index fetches per request: {per_request:.1}");
    assert!(
        per_request < 20.0,
        "a RECV or ACK fetched {per_request:.1} rows through the indexes (2,000 are under lease)"
    );

    // Dead rows (leases are new row versions, ACKs delete) are vacuumed by mwmq itself.
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
