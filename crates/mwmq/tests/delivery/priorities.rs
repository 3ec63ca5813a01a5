//! Priorities: `SEND q body PRIORITY n` — the highest priority ready is
//! handed out first by RECV, POP and PEEK, in the order sent within a
//! priority; groups keep their order whatever the priorities; dead letters,
//! REDRIVE and the SQL API keep a message's priority; QINFO counts the
//! ready messages of each priority; and receivers racing on two mwmq
//! processes never take a lower priority while a higher one is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use mctest::Postgres;
use mwmq::Service;

fn send(c: &mut redis::Connection, queue: &str, body: &str, priority: u8) -> i64 {
    q(c, &["SEND", queue, body, "PRIORITY", &priority.to_string()])
}

fn body(m: &Leased) -> String {
    String::from_utf8_lossy(&m.3).into_owned()
}

fn popped(c: &mut redis::Connection, cmd: &str, queue: &str) -> Option<String> {
    let m: Option<(i64, String, Vec<u8>)> = q(c, &[cmd, queue]);
    m.map(|m| String::from_utf8_lossy(&m.2).into_owned())
}

/// QINFO's `ready_by_priority` as (priority, count), highest first.
fn ready_by_priority(c: &mut redis::Connection, queue: &str) -> Vec<(u8, i64)> {
    let info: redis::Value = q(c, &["QINFO", queue]);
    let redis::Value::Array(fields) = info else { panic!("QINFO: {info:?}") };
    let at = fields
        .iter()
        .position(|f| matches!(f, redis::Value::BulkString(b) if b == b"ready_by_priority"))
        .expect("QINFO has ready_by_priority");
    let redis::Value::Array(pairs) = &fields[at + 1] else { panic!("{:?}", fields[at + 1]) };
    pairs
        .chunks(2)
        .map(|p| match (&p[0], &p[1]) {
            (redis::Value::BulkString(k), redis::Value::Int(n)) => (String::from_utf8_lossy(k).parse().unwrap(), *n),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn the_highest_priority_goes_first_and_each_priority_in_the_order_sent() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "dlq"]), "OK");
    for (b, p) in [("low1", 0), ("mid1", 5), ("top1", 9), ("mid2", 5), ("low2", 0), ("top2", 9)] {
        send(&mut c, "jobs", b, p);
    }
    q::<i64>(&mut c, &["SEND", "jobs", "plain"]);
    // Through SQL too, in the application's transaction.
    sql(&pg).execute("SELECT mwmq.send('jobs', 'sql7', priority => 7)", &[]).unwrap();
    assert_eq!(ready_by_priority(&mut c, "jobs"), [(9, 2), (7, 1), (5, 2), (0, 3)]);
    assert_eq!(popped(&mut c, "PEEK", "jobs").as_deref(), Some("top1"), "PEEK shows what RECV would take");
    let first: Vec<String> = recv(&mut c, "jobs", &["COUNT", "3"]).iter().map(body).collect();
    assert_eq!(first, ["top1", "top2", "sql7"], "highest first, in the order sent within one");
    assert_eq!(popped(&mut c, "POP", "jobs").as_deref(), Some("mid1"));
    let rest: Vec<String> = recv(&mut c, "jobs", &["COUNT", "10"]).iter().map(body).collect();
    assert_eq!(rest, ["mid2", "low1", "low2", "plain"], "priority 0 is every message sent without one");
    assert_eq!(ready_by_priority(&mut c, "jobs"), []);

    // A group goes in the order sent whatever its priorities: its head, of
    // priority 0, holds its priority-9 successor back; other messages pass.
    q::<i64>(&mut c, &["SEND", "jobs", "g-first", "GROUP", "g", "PRIORITY", "0"]);
    q::<i64>(&mut c, &["SEND", "jobs", "g-second", "GROUP", "g", "PRIORITY", "9"]);
    send(&mut c, "jobs", "other", 3);
    let got: Vec<String> = recv(&mut c, "jobs", &["COUNT", "10"]).iter().map(body).collect();
    assert_eq!(got, ["other", "g-first"], "g-second waits for its group's head");

    // A dead letter keeps its priority, and REDRIVE brings it back with it.
    q::<String>(&mut c, &["QCREATE", "work", "MAXDELIVERIES", "1", "DEADLETTER", "dlq"]);
    send(&mut c, "work", "urgent", 8);
    let m = recv(&mut c, "work", &[]).remove(0);
    assert_eq!(q::<i64>(&mut c, &["NACK", "work", &m.0.to_string(), &m.1.to_string()]), 1);
    send(&mut c, "work", "later", 1);
    assert_eq!(body(&recv(&mut c, "work", &[])[0]), "later", "urgent went to the dead letters on the way");
    assert_eq!(ready_by_priority(&mut c, "dlq"), [(8, 1)]);
    send(&mut c, "work", "normal", 4);
    assert_eq!(q::<i64>(&mut c, &["REDRIVE", "dlq"]), 1);
    assert_eq!(popped(&mut c, "POP", "work").as_deref(), Some("urgent"), "redriven with priority 8, before 4");
}

/// Six receivers on two mwmq processes take messages of 8 priorities
/// (random, 12 each) and keep them; they stop after about half. Whatever the
/// interleaving, what was handed out is then the top of the queue: no
/// message left is of a higher priority than one taken, and within the
/// lowest priority taken, the ones taken are the first sent.
#[test]
fn racing_receivers_on_two_processes_never_pass_a_higher_priority() {
    let pg = Postgres::start().unwrap();
    let a = start(config(&pg));
    let b = start(config(&pg));
    let mut c = connect(a.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    let mut levels: Vec<u8> = (0..8).flat_map(|p| std::iter::repeat_n(p, 12)).collect();
    // A fixed shuffle (xorshift): the priorities arrive mixed.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..levels.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        levels.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut sent = Vec::new();
    let mut pipe = redis::pipe();
    for (i, p) in levels.iter().enumerate() {
        pipe.cmd("SEND").arg("jobs").arg(format!("{p}:{i}")).arg("PRIORITY").arg(p);
    }
    let ids: Vec<i64> = pipe.query(&mut c).unwrap();
    sent.extend(ids.into_iter().zip(levels.iter().copied()));
    let taken: Arc<Mutex<Vec<(i64, u8)>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let half = sent.len() / 2;
    let addrs = [a.local_addr(), b.local_addr()];
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let (taken, count) = (taken.clone(), count.clone());
            let addr = addrs[w % 2];
            std::thread::spawn(move || {
                let mut c = connect(addr);
                while count.load(Ordering::SeqCst) < half {
                    // Pipelined, so that each process batches RECVs of several connections too.
                    let got: Vec<Vec<Leased>> = redis::pipe()
                        .cmd("RECV")
                        .arg("jobs")
                        .arg("VT")
                        .arg(600_000)
                        .cmd("RECV")
                        .arg("jobs")
                        .arg("VT")
                        .arg(600_000)
                        .query(&mut c)
                        .unwrap();
                    for m in got.into_iter().flatten() {
                        let p: u8 = body(&m).split_once(':').unwrap().0.parse().unwrap();
                        count.fetch_add(1, Ordering::SeqCst);
                        taken.lock().unwrap().push((m.0, p));
                        // Some acknowledged at once: gone, and still counted as handed out.
                        if m.0 % 2 == 0 {
                            assert_eq!(q::<i64>(&mut c, &["ACK", "jobs", &m.0.to_string(), &m.1.to_string()]), 1);
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let taken = taken.lock().unwrap();
    let mut ids: Vec<i64> = taken.iter().map(|t| t.0).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), taken.len(), "no message handed out twice");
    let left: Vec<(i64, u8)> = sent.iter().copied().filter(|s| !ids.contains(&s.0)).collect();
    let lowest_taken = taken.iter().map(|t| t.1).min().unwrap();
    let highest_left = left.iter().map(|l| l.1).max().unwrap();
    assert!(
        highest_left <= lowest_taken,
        "{} handed out, the lowest of priority {lowest_taken}, while one of priority {highest_left} was left",
        taken.len()
    );
    // Within the boundary priority, first sent first taken.
    let last_taken = taken.iter().filter(|t| t.1 == lowest_taken).map(|t| t.0).max().unwrap();
    assert!(
        left.iter().filter(|l| l.1 == lowest_taken).all(|l| l.0 > last_taken),
        "within priority {lowest_taken}, a message sent earlier was left behind one taken"
    );
    // What is left is counted per priority, and handed out in order.
    let mut by_level: Vec<(u8, i64)> = Vec::new();
    for p in (0..8).rev() {
        let n = left.iter().filter(|l| l.1 == p).count() as i64;
        if n > 0 {
            by_level.push((p, n));
        }
    }
    assert_eq!(ready_by_priority(&mut c, "jobs"), by_level);
    let rest = recv(&mut c, "jobs", &["COUNT", "1000"]);
    let order: Vec<u8> = rest.iter().map(|m| body(m).split_once(':').unwrap().0.parse().unwrap()).collect();
    assert!(order.windows(2).all(|w| w[0] >= w[1]), "{order:?}");
    assert_eq!(order.len(), left.len());
}

#[test]
fn a_priority_out_of_range_is_refused_clearly() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    for bad in ["10", "-1", "99999999999"] {
        assert_eq!(
            err(&mut c, &["SEND", "jobs", "x", "PRIORITY", bad]),
            "ERR PRIORITY must be between 0 and 9 (higher is handed out first)",
            "{bad}"
        );
    }
    assert_eq!(err(&mut c, &["SEND", "jobs", "x", "PRIORITY", "high"]), "ERR value is not an integer or out of range");
    let e = sql(&pg).execute("SELECT mwmq.send('jobs', 'x', priority => 12)", &[]).unwrap_err();
    let db = e.as_db_error().unwrap();
    assert_eq!(db.code().code(), "22023");
    assert_eq!(db.message(), "mwmq.send: priority must be between 0 and 9 (higher is handed out first), not 12");
    assert_eq!(q::<i64>(&mut c, &["QLEN", "jobs"]), 0, "nothing stored");
}

/// A database at schema 16 whose application role was granted the old
/// `mwmq.send`: after the upgrade the role may call the new one, with a
/// priority or without.
#[test]
fn the_roles_granted_the_old_send_may_call_the_new_one() {
    let pg = Postgres::start().unwrap();
    let cfg = config(&pg);
    mwmq::db::migrate_with(&cfg, &mwmq::db::MIGRATIONS[..16]).unwrap();
    let mut db = sql(&pg);
    db.batch_execute(
        "CREATE ROLE app LOGIN;
         GRANT USAGE ON SCHEMA mwmq TO app;
         GRANT EXECUTE ON FUNCTION mwmq.send(text, bytea, text, bigint, text, text),
                                   mwmq.send(text, text, text, bigint, text, text) TO app;
         INSERT INTO mwmq.mwmq_queues (name) VALUES ('orders');",
    )
    .unwrap();
    let mq = start(cfg);
    let app_url = format!("{} user=app", pg.conninfo().replace("user=postgres", ""));
    let mut app = postgres::Client::connect(&app_url, postgres::NoTls).unwrap();
    app.execute("SELECT mwmq.send('orders', 'plain')", &[]).unwrap();
    app.execute("SELECT mwmq.send('orders', '\\x01'::bytea, priority => 6)", &[]).unwrap();
    let mut c = connect(mq.local_addr());
    assert_eq!(ready_by_priority(&mut c, "orders"), [(6, 1), (0, 1)]);
    // Marked by SQL alone, the queue's priorities are walked by RECV.
    assert_eq!(recv(&mut c, "orders", &[])[0].3, b"\x01", "priority 6 before the one sent first");
}

/// Whether queue `name` is marked as holding priorities.
fn marked(db: &mut postgres::Client, name: &str) -> bool {
    db.query_one("SELECT prioritized FROM mwmq.mwmq_queues WHERE name = $1 AND dropped_at IS NULL", &[&name])
        .unwrap()
        .get(0)
}

/// Every way a message of a priority comes into a queue marks the queue in
/// its transaction (statements.sql's `send`: no trigger does it), and the
/// message is handed out by a process that has never seen the queue: a SEND,
/// a SEND with a KEY, SENDs served together, the SQL API, a dead letter, a
/// REDRIVE and a schedule's tick. Messages of priority 0 leave a queue as it
/// was.
#[test]
fn every_way_a_priority_comes_in_marks_its_queue() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let mut db = sql(&pg);
    let names = ["by-send", "by-key", "by-many", "by-sql", "by-dead", "by-redrive", "by-tick", "plain"];
    for n in names {
        assert_eq!(q::<String>(&mut c, &["QCREATE", n]), "OK");
    }
    q::<String>(&mut c, &["QCREATE", "src", "MAXDELIVERIES", "1", "DEADLETTER", "by-dead"]);
    q::<String>(&mut c, &["QCREATE", "dead2"]);
    for n in ["plain", "by-send"] {
        q::<i64>(&mut c, &["SEND", n, "zero"]);
        send(&mut c, n, "zero again", 0);
    }
    assert!(!marked(&mut db, "plain") && !marked(&mut db, "by-send"), "priority 0 marks nothing");

    send(&mut c, "by-send", "p", 5);
    q::<i64>(&mut c, &["SEND", "by-key", "p", "KEY", "k1", "PRIORITY", "5"]);
    // Several connections' SENDs at once are served by one statement.
    std::thread::scope(|s| {
        for i in 0..6 {
            let addr = mq.local_addr();
            s.spawn(move || {
                let mut c = connect(addr);
                let mut p = redis::pipe();
                for j in 0..4 {
                    p.cmd("SEND").arg("by-many").arg(format!("p{i}-{j}")).arg("PRIORITY").arg(if j == 3 {
                        5
                    } else {
                        0
                    });
                }
                let _: Vec<i64> = p.query(&mut c).unwrap();
            });
        }
    });
    db.execute("SELECT mwmq.send('by-sql', 'p', priority => 5)", &[]).unwrap();
    send(&mut c, "src", "p", 5);
    let m = recv(&mut c, "src", &[]).remove(0);
    assert_eq!(q::<i64>(&mut c, &["NACK", "src", &m.0.to_string(), &m.1.to_string()]), 1);
    q::<Vec<redis::Value>>(&mut c, &["RECV", "src"]); // moves it to the dead letters
                                                      // A dead letter of priority 5 in dead2, redriven into by-redrive.
    db.execute(
        "INSERT INTO mwmq.mwmq_messages (queue_id, id, sender, body, visible_at, counted, dead_from, priority)
         SELECT id, nextval('mwmq.mwmq_message_ids'), 'x', 'p', now(), false, 'by-redrive', 5
         FROM mwmq.mwmq_queues WHERE name = 'dead2'",
        &[],
    )
    .unwrap();
    assert_eq!(q::<i64>(&mut c, &["REDRIVE", "dead2"]), 1);
    q::<String>(&mut c, &["QSCHEDULE", "tick", "by-tick", "* * * * * *", "p", "PRIORITY", "5"]);
    assert!(eventually(Duration::from_secs(30), || q::<i64>(&mut c, &["QLEN", "by-tick"]) > 0), "a tick");
    q::<i64>(&mut c, &["QUNSCHEDULE", "tick"]);

    for n in names {
        assert_eq!(marked(&mut db, n), n != "plain", "{n}");
    }
    // A process that has not seen these queues hands the messages out.
    let other = start(config(&pg));
    let mut o = connect(other.local_addr());
    for n in names {
        let held = q::<i64>(&mut o, &["QLEN", n]);
        let got = recv(&mut o, n, &["COUNT", "100"]);
        assert_eq!(
            got.len() as i64,
            held,
            "{n}: all handed out, priorities first: {:?}",
            got.iter().map(body).collect::<Vec<_>>()
        );
    }
}

/// A queue's first message with a priority marks the queue, in that
/// message's transaction. An application's transaction that sent it with
/// `mwmq.send(..., priority => n)` and stayed open held the queue's row, and
/// every RESP SEND with a priority to that queue waited for it, each holding
/// one of mwmq's database connections until the statement timeout (six of
/// them held every other queue's requests for ten seconds). Now such a SEND
/// is answered at once, refused with -TRYAGAIN saying why (a SEND without a
/// priority, and SENDs to other queues batched with it, go), and goes once
/// the transaction has ended.
#[test]
fn a_send_with_a_priority_does_not_wait_for_an_application_marking_the_queue() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    // (A SEND that waits would still be waiting when the test gives up on it.)
    cfg.database.statement_timeout_ms = 120_000;
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut c = connect(addr);
    for queue in ["fresh", "other"] {
        let _: String = q(&mut c, &["QCREATE", queue]);
    }
    sql(&pg)
        .batch_execute(
            "CREATE ROLE app LOGIN; GRANT USAGE ON SCHEMA mwmq TO app;
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA mwmq TO app",
        )
        .unwrap();
    let app_url = format!("{} user=app", pg.conninfo().replace("user=postgres", ""));
    let mut app = postgres::Client::connect(&app_url, postgres::NoTls).unwrap();
    let mut open = app.transaction().unwrap();
    open.execute("SELECT mwmq.send('fresh', 'from the app', priority => 5)", &[]).unwrap();

    let refused = err(&mut c, &["SEND", "fresh", "x", "PRIORITY", "3"]);
    assert!(
        refused.starts_with("TRYAGAIN queue 'fresh' is getting its first message with a priority in a transaction"),
        "{refused}"
    );
    let _: i64 = q(&mut c, &["SEND", "fresh", "plain"]);
    // Clients at once (their SENDs batched together on the async engine).
    let answers: Vec<(String, i64)> = std::thread::scope(|s| {
        let senders: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(move || {
                    let mut c = connect(addr);
                    let refused = err(&mut c, &["SEND", "fresh", "y", "PRIORITY", "2"]);
                    (refused, q::<i64>(&mut c, &["SEND", "other", "z", "PRIORITY", "4"]))
                })
            })
            .collect();
        senders.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(answers.iter().all(|(e, _)| e.starts_with("TRYAGAIN queue 'fresh'")), "{answers:?}");
    assert_eq!(q::<i64>(&mut c, &["QLEN", "other"]), 6, "the other queue's SENDs went");

    open.commit().unwrap();
    assert!(
        eventually(std::time::Duration::from_secs(30), || {
            redis::cmd("SEND").arg("fresh").arg("x").arg("PRIORITY").arg("3").query::<i64>(&mut c).is_ok()
        }),
        "a SEND with a priority goes once the application's transaction has ended"
    );
    let got: Vec<String> = recv(&mut c, "fresh", &["COUNT", "3"]).iter().map(body).collect();
    assert_eq!(got, ["from the app", "x", "plain"]);
    mq.stopper().stop();
    mq.join();
}
