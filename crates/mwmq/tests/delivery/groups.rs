//! Ordered groups: `SEND q body GROUP g` — a group's messages are handed out
//! one at a time, in the order sent; the next only once the one before is
//! acknowledged or dead-lettered; a NACKed or expired one stays first;
//! different groups and ungrouped messages go in parallel, also to racing
//! receivers on two mwmq processes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use mctest::Postgres;
use mwmq::Service;

fn send(c: &mut redis::Connection, queue: &str, body: &str, group: Option<&str>) -> i64 {
    match group {
        Some(g) => q(c, &["SEND", queue, body, "GROUP", g]),
        None => q(c, &["SEND", queue, body]),
    }
}

fn bodies(ms: &[Leased]) -> Vec<String> {
    let mut b: Vec<String> = ms.iter().map(|m| String::from_utf8_lossy(&m.3).into_owned()).collect();
    b.sort();
    b
}

fn ack(c: &mut redis::Connection, queue: &str, m: &Leased) {
    assert_eq!(q::<i64>(c, &["ACK", queue, &m.0.to_string(), &m.1.to_string()]), 1);
}

#[test]
fn a_group_goes_one_at_a_time_in_the_order_sent() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    for (body, group) in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b"), ("a3", "a")] {
        send(&mut c, "jobs", body, Some(group));
    }
    send(&mut c, "jobs", "u1", None);
    send(&mut c, "jobs", "u2", None);
    // One per group, and the ungrouped ones (leased for 30 s: b1's lease must
    // not end before it is made short below).
    let first = recv(&mut c, "jobs", &["COUNT", "10", "VT", "30000"]);
    assert_eq!(bodies(&first), ["a1", "b1", "u1", "u2"]);
    assert!(recv(&mut c, "jobs", &["COUNT", "10"]).is_empty(), "each group's next waits for its head");
    let peeked: Option<(i64, String, Vec<u8>)> = q(&mut c, &["PEEK", "jobs"]);
    assert!(peeked.is_none(), "PEEK shows what RECV would get: nothing");
    let by_body: HashMap<String, Leased> =
        first.into_iter().map(|m| (String::from_utf8_lossy(&m.3).into_owned(), m)).collect();
    for done in ["a1", "u1", "u2"] {
        ack(&mut c, "jobs", &by_body[done]);
    }
    let next = recv(&mut c, "jobs", &["COUNT", "10"]);
    assert_eq!(bodies(&next), ["a2"], "a1 acknowledged: a2, and b waits for b1's lease");
    // A NACK keeps the group's order: a2 again, not a3.
    assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &next[0].0.to_string(), &next[0].1.to_string()]), 1);
    let again = recv(&mut c, "jobs", &["COUNT", "10"]);
    assert_eq!(bodies(&again), ["a2"]);
    // An expired lease too: b1, its lease cut to 300 ms, comes back before b2.
    let b1 = &by_body["b1"];
    assert_eq!(q::<i64>(&mut c, &["TOUCH", "jobs", &b1.0.to_string(), &b1.1.to_string(), "300"]), 1);
    let b = recv_when_free(&mut c, "jobs", &["COUNT", "10"], "b1 came back after its lease's end");
    assert_eq!(bodies(&b), ["b1"]);
    ack(&mut c, "jobs", &again[0]);
    ack(&mut c, "jobs", &b[0]);
    // POP takes a group's head only.
    let popped: Vec<(i64, String, Vec<u8>)> = ["a3", "b2"].iter().map(|_| q(&mut c, &["POP", "jobs"])).collect();
    let mut got: Vec<String> = popped.iter().map(|p| String::from_utf8_lossy(&p.2).into_owned()).collect();
    got.sort();
    assert_eq!(got, ["a3", "b2"]);
    assert!(err(&mut c, &["SEND", "jobs", "x", "GROUP"]).contains("wrong number of arguments"));
}

#[test]
fn a_dead_lettered_head_lets_its_group_go_on() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "dlq"]), "OK");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs", "MAXDELIVERIES", "1", "DEADLETTER", "dlq"]), "OK");
    send(&mut c, "jobs", "g1", Some("g"));
    send(&mut c, "jobs", "g2", Some("g"));
    let m = recv(&mut c, "jobs", &[]).remove(0);
    assert_eq!(m.3, b"g1");
    assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &m.0.to_string(), &m.1.to_string()]), 1);
    let mut next = Vec::new();
    for _ in 0..3 {
        next = recv(&mut c, "jobs", &[]);
        if !next.is_empty() {
            break;
        }
    }
    assert_eq!(bodies(&next), ["g2"], "g1 went to the dead letters, g2 is next");
    let dead: (i64, String, Vec<u8>) = q(&mut c, &["PEEK", "dlq"]);
    assert_eq!(dead.2, b"g1");
}

#[test]
fn pipelined_sends_of_a_group_keep_their_order() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    let mut pipe = redis::pipe();
    for i in 0..30 {
        pipe.cmd("SEND").arg("jobs").arg(format!("{i}")).arg("GROUP").arg("only");
    }
    let _: Vec<i64> = pipe.query(&mut c).unwrap();
    // Through SQL too, in the application's transaction.
    sql(&pg).execute("SELECT mwmq.send('jobs', '30', message_group => 'only')", &[]).unwrap();
    for i in 0..31 {
        let got = recv(&mut c, "jobs", &["COUNT", "5"]);
        assert_eq!(bodies(&got), [i.to_string()], "one at a time, in order");
        ack(&mut c, "jobs", &got[0]);
    }
}

#[test]
fn racing_receivers_on_two_processes_keep_every_group_in_order() {
    let pg = Postgres::start().unwrap();
    let a = start(config(&pg));
    let b = start(config(&pg));
    let mut c = connect(a.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    let (groups, per) = (4, 12);
    for i in 0..per {
        for g in 0..groups {
            send(&mut c, "jobs", &format!("{g}:{i}"), Some(&format!("g{g}")));
        }
    }
    // Each receiver notes what it holds: never two of one group at once.
    let holding: Arc<Mutex<HashSet<String>>> = Arc::default();
    let done: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let most_groups = Arc::new(Mutex::new(0usize));
    let addrs = [a.local_addr(), b.local_addr()];
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let (holding, done, most) = (holding.clone(), done.clone(), most_groups.clone());
            let addr = addrs[w % 2];
            std::thread::spawn(move || {
                let mut c = connect(addr);
                let mut idle = 0;
                while idle < 20 {
                    let got = recv(&mut c, "jobs", &["COUNT", "2"]);
                    if got.is_empty() {
                        idle += 1;
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    idle = 0;
                    for m in &got {
                        let text = String::from_utf8_lossy(&m.3).into_owned();
                        let (g, i) = text.split_once(':').unwrap();
                        let mut h = holding.lock().unwrap();
                        assert!(h.insert(g.to_string()), "two messages of group {g} handed out at once");
                        let mut most = most.lock().unwrap();
                        *most = (*most).max(h.len());
                        done.lock().unwrap().push((g.to_string(), i.parse().unwrap()));
                    }
                    std::thread::sleep(Duration::from_millis(3));
                    for m in &got {
                        let text = String::from_utf8_lossy(&m.3).into_owned();
                        holding.lock().unwrap().remove(text.split_once(':').unwrap().0);
                        ack(&mut c, "jobs", m);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let done = done.lock().unwrap();
    assert_eq!(done.len(), groups * per, "every message once");
    for g in 0..groups {
        let order: Vec<usize> = done.iter().filter(|(x, _)| *x == g.to_string()).map(|(_, i)| *i).collect();
        assert_eq!(order, (0..per).collect::<Vec<_>>(), "group {g} in the order sent");
    }
    assert!(*most_groups.lock().unwrap() >= 2, "different groups in parallel");
}

/// Grouped SENDs waiting for the database go as one statement, like any
/// SENDs: each gets its id and keeps its group.
#[test]
fn waiting_grouped_sends_are_batched_and_keep_their_groups() {
    use std::io::{Read, Write};
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    (cfg.server.workers, cfg.server.threads, cfg.server.loop_db) = (1, 1, 1);
    // /metrics shows what waits while the carrier is held; no maintenance
    // pass (only requests' statements touch the messages table).
    cfg.stats.admin = Some("127.0.0.1:0".into());
    cfg.queues.maintenance_s = 3600;
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    let before = info_field(&mut c, "db_statements");
    // The only carrier waits on a lock while eight SENDs queue up behind it.
    let mut db = sql(&pg);
    let mut lock = db.transaction().unwrap();
    lock.batch_execute("LOCK TABLE mwmq_messages IN ACCESS EXCLUSIVE MODE").unwrap();
    let groups = ["a", "b", "a", "", "b", "a", "c", ""];
    // Each SEND is written once mwmq has taken in the one before: the first
    // waits for the lock, each other for the worker (pool) or in the loop
    // (async), in the order written.
    let admin = mq.admin_addr().unwrap();
    let base = metric(admin, "mwmq_received_bytes_total");
    let mut written = 0;
    let mut socks: Vec<std::net::TcpStream> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut s = std::net::TcpStream::connect(mq.local_addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let body = format!("m{i}");
            let cmd = if g.is_empty() {
                format!("*3\r\n$4\r\nSEND\r\n$4\r\njobs\r\n${}\r\n{body}\r\n", body.len())
            } else {
                format!("*5\r\n$4\r\nSEND\r\n$4\r\njobs\r\n${}\r\n{body}\r\n$5\r\nGROUP\r\n$1\r\n{g}\r\n", body.len())
            };
            s.write_all(cmd.as_bytes()).unwrap();
            written += cmd.len();
            if i == 0 {
                until_a_statement_waits_for_the_lock(&mut lock);
            } else {
                until_taken_in(admin, i, base, written);
            }
            s
        })
        .collect();
    lock.commit().unwrap();
    let mut ids = Vec::new();
    for s in &mut socks {
        let mut reply = Vec::new();
        let mut buf = [0u8; 64];
        while !reply.ends_with(b"\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed");
            reply.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&reply).to_string();
        assert!(text.starts_with(':'), "an id: {text:?}");
        ids.push(text[1..].trim().parse::<i64>().unwrap());
    }
    let used = info_field(&mut c, "db_statements") - before;
    assert!(used <= 4, "{used} statements for 8 SENDs");
    // Ids in the order the SENDs came.
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "ids in arrival order");
    for (id, g) in ids.iter().zip(groups) {
        let row = sql(&pg).query_one("SELECT grp, body FROM mwmq_messages WHERE id = $1", &[id]).unwrap();
        let (grp, body): (Option<String>, Vec<u8>) = (row.get(0), row.get(1));
        assert_eq!(grp.as_deref(), (!g.is_empty()).then_some(g), "message {id}");
        assert!(body.starts_with(b"m"));
    }
    // Each group still goes one at a time: a, b and c's heads and the two ungrouped.
    let first = recv(&mut c, "jobs", &["COUNT", "8"]);
    assert_eq!(first.len(), 5, "{:?}", bodies(&first));
}
