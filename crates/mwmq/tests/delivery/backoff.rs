//! Retry backoff: `QALTER q BACKOFF base_ms max_ms [JITTER pct]` — a
//! message whose lease runs out, or that is NACKed without DELAY, is
//! visible again only after min(max, base × 2^(deliveries−1)) ± jitter. The
//! waits are read as the database stores them (`visible_at`, and
//! `lease_until` for the lease's end) and compared with the formula within
//! the database clock's own readings before and after each command: no
//! test here waits for a backoff to pass.

use std::time::{Duration, SystemTime};

use crate::common::*;
use mctest::Postgres;
use mwmq::policies::Backoff;
use mwmq::Service;

/// The database's clock.
fn db_now(db: &mut postgres::Client) -> SystemTime {
    db.query_one("SELECT now()", &[]).unwrap().get(0)
}

/// A message's `visible_at` and `lease_until`.
fn stored(db: &mut postgres::Client, id: i64) -> (SystemTime, Option<SystemTime>) {
    let r = db.query_one("SELECT visible_at, lease_until FROM mwmq_messages WHERE id = $1", &[&id]).unwrap();
    (r.get(0), r.get(1))
}

/// `t` lies within [from + lo, to + hi] (ms; 1 ms of rounding either side).
fn within(t: SystemTime, from: SystemTime, to: SystemTime, (lo, hi): (f64, f64), what: &str) {
    let lo = from + Duration::from_secs_f64((lo - 1.0).max(0.0) / 1000.0);
    let hi = to + Duration::from_secs_f64((hi + 1.0) / 1000.0);
    assert!(lo <= t && t <= hi, "{what}: {t:?} not within [{lo:?}, {hi:?}]");
}

/// Makes a message visible now, as if its wait were over (the test's clock).
fn wait_over(db: &mut postgres::Client, id: i64) {
    db.execute("UPDATE mwmq_messages SET visible_at = now() WHERE id = $1", &[&id]).unwrap();
}

fn ids(ms: &[Leased]) -> Vec<i64> {
    ms.iter().map(|m| m.0).collect()
}

#[test]
fn each_return_waits_its_doubled_backoff_and_the_last_goes_to_the_dead_letters() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let mut db = sql(&pg);
    let policy = Backoff::new(400, 3000, 25).unwrap();
    assert_eq!(q::<String>(&mut c, &["QCREATE", "dlq"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs", "MAXDELIVERIES", "6", "DEADLETTER", "dlq"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QALTER", "jobs", "BACKOFF", "400", "3000", "JITTER", "25"]), "OK");
    let info = qinfo(&mut c, "jobs");
    assert_eq!(
        (info["backoff_base_ms"].as_str(), info["backoff_max_ms"].as_str(), info["backoff_jitter_pct"].as_str()),
        ("400", "3000", "25")
    );
    let id: i64 = q(&mut c, &["SEND", "jobs", "flaky", "PRIORITY", "3"]);
    let vt = 200.0;
    // Deliveries 1 to 5 come back (odd: the lease runs out; even: NACK), each
    // after its backoff; the 6th is the last MAXDELIVERIES allows.
    for d in 1..=6u32 {
        let t0 = db_now(&mut db);
        let m = recv(&mut c, "jobs", &["VT", "200"]);
        let t1 = db_now(&mut db);
        assert_eq!(ids(&m), [id], "delivery {d}");
        let (visible, until) = stored(&mut db, id);
        if d == 6 {
            assert_eq!(until, None, "the last lease is followed by no backoff");
            within(visible, t0, t1, (vt, vt), "the last lease's end");
        } else {
            let (lo, hi) = policy.bounds_ms(d);
            within(until.expect("a lease with a backoff after it"), t0, t1, (vt, vt), "the lease's end");
            within(visible, t0, t1, (vt + lo, vt + hi), &format!("visible again after delivery {d}"));
        }
        if d % 2 == 0 {
            let t0 = db_now(&mut db);
            assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &m[0].0.to_string(), &m[0].1.to_string()]), 1);
            let t1 = db_now(&mut db);
            let (visible, until) = stored(&mut db, id);
            assert_eq!(until, None);
            if d == 6 {
                assert!(visible <= t1, "NACKed after its last delivery: visible at once, to be dead-lettered");
            } else {
                within(visible, t0, t1, policy.bounds_ms(d), &format!("NACKed after delivery {d}"));
            }
        }
        wait_over(&mut db, id);
    }
    assert!(recv(&mut c, "jobs", &[]).is_empty(), "six deliveries: no seventh");
    let dead: (i64, String, Vec<u8>) = q(&mut c, &["PEEK", "dlq"]);
    assert_eq!(dead.0, id);
    let p: i16 = db.query_one("SELECT priority FROM mwmq_messages WHERE id = $1", &[&id]).unwrap().get(0);
    assert_eq!(p, 3, "the dead letter keeps its priority");
}

#[test]
fn a_delay_wins_touch_keeps_the_backoff_and_nobackoff_turns_it_off() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let mut db = sql(&pg);
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs", "BACKOFF", "60000", "60000"]), "OK");
    let id: i64 = q(&mut c, &["SEND", "jobs", "x"]);
    // NACK ... DELAY: the DELAY, not the backoff; DELAY 0 is at once.
    let m = recv(&mut c, "jobs", &[]).remove(0);
    let t0 = db_now(&mut db);
    assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &id.to_string(), &m.1.to_string(), "DELAY", "5000"]), 1);
    let t1 = db_now(&mut db);
    within(stored(&mut db, id).0, t0, t1, (5000.0, 5000.0), "NACK DELAY 5000");
    wait_over(&mut db, id);
    let m = recv(&mut c, "jobs", &[]).remove(0);
    assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &id.to_string(), &m.1.to_string(), "DELAY", "0"]), 1);
    assert_eq!(ids(&recv(&mut c, "jobs", &[])), [id], "DELAY 0: handed out again at once");
    wait_over(&mut db, id);
    // TOUCH moves the lease's end and keeps the backoff after it.
    let m = recv(&mut c, "jobs", &["VT", "100"]).remove(0);
    let t0 = db_now(&mut db);
    assert_eq!(q::<i64>(&mut c, &["TOUCH", "jobs", &id.to_string(), &m.1.to_string(), "5000"]), 1);
    let t1 = db_now(&mut db);
    let (visible, until) = stored(&mut db, id);
    within(until.unwrap(), t0, t1, (5000.0, 5000.0), "the touched lease's end");
    within(visible, t0, t1, (65000.0, 65000.0), "the backoff after it");
    // NOBACKOFF: a NACK is visible at once again.
    assert_eq!(q::<String>(&mut c, &["QALTER", "jobs", "NOBACKOFF"]), "OK");
    assert_eq!(qinfo(&mut c, "jobs")["backoff_base_ms"], "0");
    assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &id.to_string(), &m.1.to_string()]), 1);
    assert_eq!(ids(&recv(&mut c, "jobs", &[])), [id], "no backoff: at once");
}

/// A lease whose time is over no longer holds a place of CONCURRENCY, and
/// QINFO counts it as waiting (`delayed`), not `leased`, during its backoff.
#[test]
fn a_lease_past_its_end_frees_its_place_during_the_backoff() {
    let pg = Postgres::start().unwrap();
    let a = start(config(&pg));
    let b = start(config(&pg));
    let mut c = connect(a.local_addr());
    let mut other = connect(b.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs", "CONCURRENCY", "1", "BACKOFF", "600000", "600000"]), "OK");
    let first: i64 = q(&mut c, &["SEND", "jobs", "a"]);
    let second: i64 = q(&mut c, &["SEND", "jobs", "b"]);
    assert_eq!(ids(&recv(&mut c, "jobs", &["VT", "300"])), [first]);
    // Held by the limit while the lease lasts (if it already ended, the next step holds anyway).
    let got = recv_when_free(&mut other, "jobs", &["VT", "60000"], "the place freed by the lease's end");
    assert_eq!(ids(&got), [second], "the first waits out its backoff, the second takes its place");
    let info = qinfo(&mut c, "jobs");
    assert_eq!((info["leased"].as_str(), info["delayed"].as_str(), info["ready"].as_str()), ("1", "1", "0"));
}

#[test]
fn a_bad_backoff_is_refused_clearly_and_only_an_admin_sets_one() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![
        user("ops", "ops-pw", &[], &[], &["*"]),
        user("app", "app-pw", &["jobs"], &["jobs"], &[]),
        user("rival", "rival-pw", &["jobs"], &[], &[]),
    ];
    let mq = start(cfg);
    let mut ops = login(mq.local_addr(), "ops", "ops-pw");
    assert_eq!(q::<String>(&mut ops, &["QCREATE", "jobs"]), "OK");
    for (args, want) in [
        (&["BACKOFF", "0", "100"][..], "ERR BACKOFF's base must be between 1 and 86400000 ms, not 0"),
        (
            &["BACKOFF", "500", "100"],
            "ERR BACKOFF's max (100 ms) must be at least its base (500 ms) and at most 86400000 ms",
        ),
        (
            &["BACKOFF", "100", "90000000"],
            "ERR BACKOFF's max (90000000 ms) must be at least its base (100 ms) and at most 86400000 ms",
        ),
        (&["BACKOFF", "100", "200", "JITTER", "150"], "ERR JITTER must be between 0 and 100 (percent), not 150"),
        (&["BACKOFF", "100"], "ERR BACKOFF takes base_ms and max_ms (and JITTER pct): BACKOFF 500 60000"),
        (&["BACKOFF", "100", "200", "JITTER"], "ERR syntax error"),
        (&["BACKOFF", "fast", "200"], "ERR value is not an integer or out of range"),
    ] {
        let mut cmd = vec!["QALTER", "jobs"];
        cmd.extend_from_slice(args);
        assert_eq!(err(&mut ops, &cmd), want, "{args:?}");
    }
    assert_eq!(qinfo(&mut ops, "jobs")["backoff_base_ms"], "0", "nothing set by a refusal");
    // The backoff is the queue's admin's: a sender or receiver is refused.
    let mut app = login(mq.local_addr(), "app", "app-pw");
    let e = err(&mut app, &["QALTER", "jobs", "BACKOFF", "100", "200"]);
    assert!(e.starts_with("NOPERM") && e.contains("administer queue 'jobs'"), "{e}");
    assert!(err(&mut app, &["QALTER", "jobs", "NOBACKOFF"]).starts_with("NOPERM"));
    // A sender may give any priority (SEND is its right), and reorders
    // nothing already sent: its message goes before lower priorities only.
    let mut rival = login(mq.local_addr(), "rival", "rival-pw");
    q::<i64>(&mut app, &["SEND", "jobs", "app-urgent", "PRIORITY", "9"]);
    q::<i64>(&mut rival, &["SEND", "jobs", "rival", "PRIORITY", "9"]);
    q::<i64>(&mut app, &["SEND", "jobs", "app-low", "PRIORITY", "1"]);
    let order: Vec<String> =
        recv(&mut app, "jobs", &["COUNT", "3"]).iter().map(|m| String::from_utf8_lossy(&m.3).into_owned()).collect();
    assert_eq!(order, ["app-urgent", "rival", "app-low"], "first sent first within priority 9");
    assert!(err(&mut rival, &["PEEK", "jobs"]).starts_with("NOPERM"), "sending is not receiving");
}
