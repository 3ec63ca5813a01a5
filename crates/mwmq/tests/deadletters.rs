//! Dead letters, lease extension and what a queue holds: a message handed
//! out MAXDELIVERIES times without an ACK (lease expiries and NACKs) moves to
//! the dead-letter queue, or is dropped and counted without one; REDRIVE
//! moves it back; TOUCH keeps a message from a second receiver; QINFO's
//! figures against a queue whose contents are known.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use mwmq::Service;

fn info(c: &mut redis::Connection, queue: &str) -> HashMap<String, redis::Value> {
    let flat: Vec<redis::Value> = q(c, &["QINFO", queue]);
    flat.chunks(2).map(|kv| (redis::from_redis_value::<String>(&kv[0]).unwrap(), kv[1].clone())).collect()
}

fn int(m: &HashMap<String, redis::Value>, k: &str) -> i64 {
    redis::from_redis_value(&m[k]).unwrap_or_else(|e| panic!("{k}: {e}"))
}

#[test]
fn poison_messages_move_to_the_dead_letter_queue_and_back() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs-dlq"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs", "MAXDELIVERIES", "2", "DEADLETTER", "jobs-dlq"]), "OK");
    assert_eq!(err(&mut c, &["QCREATE", "x", "DEADLETTER", "x"]), "ERR a queue cannot be its own dead-letter queue");
    assert!(err(&mut c, &["QCREATE", "x", "MAXDELIVERIES", "-1"]).contains("MAXDELIVERIES must be between"));
    let poison: i64 = q(&mut c, &["SEND", "jobs", "poison"]);
    // Two deliveries without an ACK: a lease that expires, then a NACK.
    let first = recv(&mut c, "jobs", &["VT", "100"]);
    assert_eq!(first[0].0, poison);
    std::thread::sleep(Duration::from_millis(150));
    // (Sent after the lease ran out, so it is visible later than the poison
    // message: receivers take messages in the order they became visible.)
    let fine: i64 = q(&mut c, &["SEND", "jobs", "fine"]);
    let second = recv(&mut c, "jobs", &[]);
    assert_eq!(second[0].0, poison, "redelivered after its lease expired");
    assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &poison.to_string(), &second[0].1.to_string()]), 1);
    // The third time it is not handed out: it moves, and the next message comes instead.
    let third = recv(&mut c, "jobs", &[]);
    assert_eq!(third.iter().map(|m| m.0).collect::<Vec<_>>(), [fine]);
    let jobs = info(&mut c, "jobs");
    assert_eq!((int(&jobs, "dead_lettered"), int(&jobs, "dropped"), int(&jobs, "leased")), (1, 0, 1));
    let dlq = info(&mut c, "jobs-dlq");
    assert_eq!((int(&dlq, "ready"), int(&dlq, "dead_letters_held")), (1, 1));
    let dead: (i64, String, Vec<u8>) = q(&mut c, &["PEEK", "jobs-dlq"]);
    assert_eq!((dead.0, dead.2.as_slice()), (poison, &b"poison"[..]), "the same message, the same id");
    let row = sql(&pg)
        .query_one("SELECT deliveries, dead_from, dead_reason FROM mwmq_messages WHERE id = $1", &[&poison])
        .unwrap();
    assert_eq!(
        (row.get::<_, i32>(0), row.get::<_, String>(1), row.get::<_, String>(2)),
        (2, "jobs".into(), "max_deliveries".into()),
        "its delivery count and the reason go with it"
    );
    // REDRIVE sends it back where it came from, delivered afresh.
    assert_eq!(q::<i64>(&mut c, &["REDRIVE", "jobs-dlq"]), 1);
    assert_eq!(q::<i64>(&mut c, &["QLEN", "jobs-dlq"]), 0);
    let back = recv(&mut c, "jobs", &[]);
    assert_eq!(back[0].0, poison);
    assert_eq!(q::<i64>(&mut c, &["ACK", "jobs", &poison.to_string(), &back[0].1.to_string()]), 1);
    assert_eq!(err(&mut c, &["REDRIVE", "nope"]), "NOQUEUE no such queue 'nope'");
    assert_eq!(err(&mut c, &["REDRIVE", "jobs-dlq", "TO", "nope"]), "NOQUEUE no such queue 'nope'");

    // Without a dead-letter queue the message is dropped, and counted.
    assert_eq!(q::<String>(&mut c, &["QALTER", "jobs", "MAXDELIVERIES", "1", "NODEADLETTER"]), "OK");
    let doomed: i64 = q(&mut c, &["SEND", "jobs", "doomed"]);
    let got = recv(&mut c, "jobs", &["COUNT", "10"]);
    assert_eq!(got.iter().map(|m| m.0).collect::<Vec<_>>(), [doomed]);
    assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &doomed.to_string(), &got[0].1.to_string()]), 1);
    assert!(recv(&mut c, "jobs", &[]).is_empty());
    let jobs = info(&mut c, "jobs");
    assert_eq!((int(&jobs, "dropped"), int(&jobs, "max_deliveries")), (1, 1));
    assert_eq!(jobs["dead_letter"], redis::Value::Nil);
    assert_eq!(err(&mut c, &["QALTER", "nope", "MAXDELIVERIES", "1"]), "NOQUEUE no such queue 'nope'");
}

#[test]
fn touch_keeps_a_message_from_a_second_receiver() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut a = connect(mq.local_addr());
    let mut b = connect(mq.local_addr());
    let _: String = q(&mut a, &["QCREATE", "work"]);
    let id: i64 = q(&mut a, &["SEND", "work", "long job"]);
    // Leased for 300 ms, touched for 30 s (the lease is current however late
    // that comes: nobody else has received it); past the first 300 ms it is
    // still held, however slowly the commands come.
    let got = recv(&mut a, "work", &["VT", "300"]);
    let lease = got[0].1.to_string();
    let touch = |c: &mut redis::Connection, ms: &str| q::<i64>(c, &["TOUCH", "work", &id.to_string(), &lease, ms]);
    assert_eq!(touch(&mut a, "30000"), 1, "still mine");
    std::thread::sleep(Duration::from_millis(400));
    assert!(recv(&mut b, "work", &[]).is_empty(), "nobody else gets it while it is touched");
    assert_eq!(touch(&mut a, "30000"), 1, "still mine");
    assert!(recv(&mut b, "work", &[]).is_empty(), "nobody else gets it while it is touched");
    // Touched for 300 ms more and no more: it expires and goes to the next
    // receiver; the old lease is dead.
    assert_eq!(touch(&mut a, "300"), 1, "still mine");
    let mut other = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            other = recv(&mut b, "work", &[]);
            !other.is_empty()
        }),
        "the message did not come back within 30 s of its lease's end"
    );
    assert_eq!(other[0].0, id);
    assert_eq!(q::<i64>(&mut a, &["TOUCH", "work", &id.to_string(), &lease, "300"]), 0, "not current any more");
    assert_eq!(err(&mut a, &["TOUCH", "nope", "1", "1", "10"]), "NOQUEUE no such queue 'nope'");
    assert_eq!(err(&mut a, &["TOUCH", "work", "1", "1"]), "ERR wrong number of arguments for 'TOUCH' command");
}

#[test]
fn qinfo_reports_ready_delayed_leased_and_the_oldest_age() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let _: String = q(&mut c, &["QCREATE", "known"]);
    for i in 0..5 {
        let _: i64 = q(&mut c, &["SEND", "known", &format!("ready {i}")]);
    }
    for _ in 0..2 {
        let _: i64 = q(&mut c, &["SEND", "known", "later", "DELAY", "60000"]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let leased = recv(&mut c, "known", &["COUNT", "3"]);
    assert_eq!(leased.len(), 3);
    let _: i64 = q(&mut c, &["ACK", "known", &leased[0].0.to_string(), &leased[0].1.to_string()]);
    let m = info(&mut c, "known");
    assert_eq!((int(&m, "ready"), int(&m, "delayed"), int(&m, "leased")), (2, 2, 2));
    assert!(int(&m, "oldest_ready_ms") >= 250, "{}", int(&m, "oldest_ready_ms"));
    assert_eq!((int(&m, "sent"), int(&m, "received"), int(&m, "acked")), (7, 3, 1));
    assert_eq!(err(&mut c, &["QINFO", "nope"]), "NOQUEUE no such queue 'nope'");
    // The same counters per queue on /metrics.
    drop(mq);
    let mut cfg = config(&pg);
    cfg.stats.admin = Some("127.0.0.1:0".into());
    cfg.queues.public_queues = vec!["*".into()];
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    let _: i64 = q(&mut c, &["SEND", "known", "one more"]);
    let (_, page) = mctest::http_get(mq.admin_addr().unwrap(), "/metrics");
    assert!(page.contains("mwmq_queue_sent_total{queue=\"known\"} 1"), "{page}");
}

#[test]
fn qdead_lists_a_queues_dead_letters_wherever_they_are_held() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users =
        vec![user("boss", "boss pass", &["*"], &["*"], &["*"]), user("worker", "work pass", &["*"], &["*"], &[])];
    let mq = start(cfg);
    let mut c = login(mq.local_addr(), "boss", "boss pass");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "dlq"]), "OK");
    for queue in ["a", "b"] {
        assert_eq!(q::<String>(&mut c, &["QCREATE", queue, "MAXDELIVERIES", "1", "DEADLETTER", "dlq"]), "OK");
    }
    // Dead letters: two of a, one of b (each NACKed after its one delivery, then moved).
    let mut ids = HashMap::new();
    for (queue, body) in [("a", "a1"), ("b", "b1"), ("a", "a2")] {
        let id: i64 = q(&mut c, &["SEND", queue, body]);
        let got = recv(&mut c, queue, &[]);
        let _: i64 = q(&mut c, &["NACK", queue, &id.to_string(), &got[0].1.to_string()]);
        assert!(recv(&mut c, queue, &[]).is_empty());
        ids.insert(body, id);
    }
    type Dead = (i64, String, String, String, i64, String, i64, Vec<u8>);
    let of_a: Vec<Dead> = q(&mut c, &["QDEAD", "a"]);
    assert_eq!(of_a.iter().map(|d| d.0).collect::<Vec<_>>(), [ids["a2"], ids["a1"]], "a's, last moved first");
    let d = &of_a[0];
    assert_eq!(
        (d.1.as_str(), d.2.as_str(), d.3.as_str(), d.4, d.5.as_str()),
        ("dlq", "a", "max_deliveries", 1, "boss")
    );
    assert_eq!(d.7, b"a2");
    assert!(d.6 > 1_700_000_000_000, "sent at, ms since 1970: {}", d.6);
    // The dead-letter queue lists all it holds; COUNT cuts.
    let held: Vec<Dead> = q(&mut c, &["QDEAD", "dlq", "COUNT", "2"]);
    assert_eq!(held.iter().map(|d| d.0).collect::<Vec<_>>(), [ids["a2"], ids["b1"]]);
    let of_b: Vec<Dead> = q(&mut c, &["QDEAD", "b"]);
    assert_eq!(of_b.iter().map(|d| d.0).collect::<Vec<_>>(), [ids["b1"]], "b's only");
    assert_eq!(err(&mut c, &["QDEAD", "nope"]), "NOQUEUE no such queue 'nope'");
    assert!(err(&mut c, &["QDEAD", "a", "COUNT", "0"]).contains("COUNT must be between 1 and"));
    assert!(err(&mut c, &["QDEAD"]).contains("wrong number of arguments"));
    // Bodies: the admin right only.
    let mut worker = login(mq.local_addr(), "worker", "work pass");
    assert!(err(&mut worker, &["QDEAD", "a"]).starts_with("NOPERM"));
}
