//! Every command through a real Redis client (the `redis` crate, and
//! redis-cli where installed) against mwmq over a real PostgreSQL, and the
//! queue's guarantees: leases, delays, order, deduplication, addressing,
//! concurrent receivers, long polls within and across processes.

mod common;

use mctest::http_get;
use mwmq::Service;
use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn every_command_and_its_errors() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    assert_eq!(q::<String>(&mut c, &["PING", "hi"]), "hi");
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    assert_eq!(err(&mut c, &["QCREATE", "jobs"]), "EXISTS queue 'jobs' already exists");
    assert_eq!(q::<Vec<String>>(&mut c, &["QLIST"]), ["jobs"]);
    let a: i64 = q(&mut c, &["SEND", "jobs", "first"]);
    let b: i64 = q(&mut c, &["SEND", "jobs", "second"]);
    assert!(b > a);
    assert_eq!(q::<i64>(&mut c, &["QLEN", "jobs"]), 2);
    // PEEK does not take; RECV leases; a leased message is invisible to others.
    let peeked: (i64, String, Vec<u8>) = q(&mut c, &["PEEK", "jobs"]);
    assert_eq!(peeked, (a, String::new(), b"first".to_vec()));
    let got = recv(&mut c, "jobs", &["COUNT", "10"]);
    assert_eq!(got.iter().map(|m| m.0).collect::<Vec<_>>(), [a, b]);
    assert!(recv(&mut c, "jobs", &[]).is_empty());
    assert_eq!(q::<Option<(i64, String, Vec<u8>)>>(&mut c, &["POP", "jobs"]), None);
    // ACK once; a second ACK of the same lease finds nothing.
    assert_eq!(q::<i64>(&mut c, &["ACK", "jobs", &a.to_string(), &got[0].1.to_string()]), 1);
    assert_eq!(q::<i64>(&mut c, &["ACK", "jobs", &a.to_string(), &got[0].1.to_string()]), 0);
    // NACK makes it visible again, with a new lease next time.
    assert_eq!(q::<i64>(&mut c, &["NACK", "jobs", &b.to_string(), &got[1].1.to_string()]), 1);
    let again = recv(&mut c, "jobs", &[]);
    assert_eq!(again[0].0, b);
    assert_ne!(again[0].1, got[1].1);
    assert_eq!(q::<i64>(&mut c, &["ACK", "jobs", &b.to_string(), &got[1].1.to_string()]), 0, "stale lease");
    assert_eq!(q::<i64>(&mut c, &["ACK", "jobs", &b.to_string(), &again[0].1.to_string()]), 1);
    // POP takes at once.
    let id: i64 = q(&mut c, &["SEND", "jobs", "third"]);
    assert_eq!(q::<(i64, String, Vec<u8>)>(&mut c, &["POP", "jobs"]), (id, String::new(), b"third".to_vec()));
    assert_eq!(q::<i64>(&mut c, &["QLEN", "jobs"]), 0);
    // Errors name what is wrong, and the connection stays usable.
    for (args, want) in [
        (&["SEND", "nope", "x"][..], "NOQUEUE no such queue 'nope'"),
        (&["RECV", "nope"], "NOQUEUE no such queue 'nope'"),
        (&["POP", "nope"], "NOQUEUE no such queue 'nope'"),
        (&["PEEK", "nope"], "NOQUEUE no such queue 'nope'"),
        (&["ACK", "nope", "1", "1"], "NOQUEUE no such queue 'nope'"),
        (&["NACK", "nope", "1", "1"], "NOQUEUE no such queue 'nope'"),
        (&["QLEN", "nope"], "NOQUEUE no such queue 'nope'"),
        (&["QDROP", "nope"], "NOQUEUE no such queue 'nope'"),
        (&["SEND", "jobs"], "ERR wrong number of arguments for 'SEND' command"),
        (&["SEND", "jobs", "x", "SOON", "1"], "ERR syntax error"),
        (&["ACK", "jobs", "x", "1"], "ERR value is not an integer or out of range"),
        (&["FLY", "away"], "ERR unknown command 'FLY'"),
        (&["RECV", "jobs", "COUNT", "0"], "ERR COUNT must be between 1 and 1000"),
    ] {
        let got = err(&mut c, args);
        assert!(got.starts_with(want), "{args:?}: {got}");
    }
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    // QDROP removes the queue and its messages.
    let _: i64 = q(&mut c, &["SEND", "jobs", "left behind"]);
    assert_eq!(q::<String>(&mut c, &["QDROP", "jobs"]), "OK");
    assert!(q::<Vec<String>>(&mut c, &["QLIST"]).is_empty());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["QLEN", "jobs"]), 0, "a new queue of the same name starts empty");
    let info: String = q(&mut c, &["INFO"]);
    assert!(info.contains("mwmq_version:") && info.contains("pool_size:4"), "{info}");
    assert!(q::<i64>(&mut c, &["CLIENT", "ID"]) > 0);
    mq.stopper().stop();
    mq.join();
}

#[test]
fn delays_leases_order_keys_and_addresses() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let addr = mq.local_addr();
    let mut alice = connect_as(addr, "alice");
    let mut bob = connect_as(addr, "bob");
    let mut carol = connect_as(addr, "carol");
    let _: String = q(&mut alice, &["QCREATE", "q"]);

    // A delayed message is invisible until its time, then visible. (Timed
    // from before the SEND: a look that came back sooner than the delay was
    // made before the message's time, however slow the machine.)
    let sent_at = Instant::now();
    let d: i64 = q(&mut alice, &["SEND", "q", "later", "DELAY", "1000"]);
    let mut m = recv(&mut bob, "q", &["VT", "300"]);
    if sent_at.elapsed() < Duration::from_millis(1000) {
        assert!(m.is_empty(), "a delayed message is invisible until its time");
    }
    if m.is_empty() {
        assert!(
            eventually(Duration::from_secs(30), || {
                m = recv(&mut bob, "q", &["VT", "300"]);
                !m.is_empty()
            }),
            "the delayed message never came"
        );
    }
    assert_eq!((m[0].0, m[0].2.as_str()), (d, "alice"));
    // Its lease expires: redelivered with a new lease; the stale ACK is refused.
    std::thread::sleep(Duration::from_millis(400));
    let m2 = recv(&mut carol, "q", &[]);
    assert_eq!(m2[0].0, d);
    assert_ne!(m2[0].1, m[0].1);
    assert_eq!(q::<i64>(&mut bob, &["ACK", "q", &d.to_string(), &m[0].1.to_string()]), 0);
    assert_eq!(q::<i64>(&mut carol, &["ACK", "q", &d.to_string(), &m2[0].1.to_string()]), 1);

    // One sender's messages arrive in the order sent, also to many receivers in turn.
    let sent: Vec<i64> = (0..30).map(|i| q(&mut alice, &["SEND", "q", &format!("m{i}")])).collect();
    let mut seen = Vec::new();
    for i in 0..10 {
        let who = if i % 2 == 0 { &mut bob } else { &mut carol };
        for m in recv(who, "q", &["COUNT", "3"]) {
            seen.push(m.0);
            assert_eq!(m.3, format!("m{}", sent.iter().position(|s| *s == m.0).unwrap()).into_bytes());
        }
    }
    assert_eq!(seen, sent);

    // A retried SEND with the same KEY stores one message.
    let k1: i64 = q(&mut alice, &["SEND", "q", "once", "KEY", "order-17"]);
    let k2: i64 = q(&mut alice, &["SEND", "q", "once", "KEY", "order-17"]);
    assert_eq!(k1, k2);
    let one = recv(&mut bob, "q", &["COUNT", "10"]);
    assert_eq!(one.len(), 1);

    // Addressing: a message TO bob is bob's alone; FROM picks a sender.
    let to_bob: i64 = q(&mut alice, &["SEND", "q", "for bob", "TO", "bob"]);
    let from_carol: i64 = q(&mut carol, &["SEND", "q", "from carol"]);
    assert_eq!(q::<Vec<String>>(&mut carol, &["QLIST", "PENDING"]), ["q"]);
    let c = recv(&mut carol, "q", &["FROM", "alice"]);
    assert!(c.is_empty(), "carol may not take bob's message: {c:?}");
    let b = recv(&mut bob, "q", &["FROM", "carol"]);
    assert_eq!(b[0].0, from_carol);
    let b = recv(&mut bob, "q", &[]);
    assert_eq!((b[0].0, b[0].3.as_slice()), (to_bob, &b"for bob"[..]));
    assert!(q::<Vec<String>>(&mut carol, &["QLIST", "PENDING"]).is_empty());
    let mut anon = connect(addr);
    let _: i64 = q(&mut alice, &["SEND", "q", "for dave", "TO", "dave"]);
    assert!(recv(&mut anon, "q", &[]).is_empty(), "an unnamed client only takes unaddressed messages");
    mq.stopper().stop();
    mq.join();
}

#[test]
fn concurrent_pops_and_recvs_never_share_a_message() {
    for batch in [1, 16] {
        pops_and_recvs(batch);
    }
}

fn pops_and_recvs(batch: usize) {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.server.workers = 8;
    cfg.server.batch = batch;
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut c = connect(addr);
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let total = 1600;
    // Eight senders at once (batched SENDs when batch > 1), one body each.
    let senders: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = connect(addr);
                (0..total / 8)
                    .map(|i| (q::<i64>(&mut c, &["SEND", "q", &format!("{t}-{i}")]), format!("{t}-{i}")))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut sent = HashSet::new();
    let mut bodies = HashSet::new();
    for t in senders {
        for (id, body) in t.join().unwrap() {
            assert!(sent.insert(id), "batch {batch}: id {id} given to two SENDs");
            bodies.insert(body);
        }
    }
    assert_eq!(sent.len(), total);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = connect(addr);
                let mut got = Vec::new();
                loop {
                    if t % 2 == 0 {
                        match q::<Option<(i64, String, Vec<u8>)>>(&mut c, &["POP", "q"]) {
                            Some(m) => got.push(m.0),
                            None => break,
                        }
                    } else {
                        let ms = recv(&mut c, "q", &["COUNT", "7"]);
                        if ms.is_empty() {
                            break;
                        }
                        for m in ms {
                            assert_eq!(q::<i64>(&mut c, &["ACK", "q", &m.0.to_string(), &m.1.to_string()]), 1);
                            got.push(m.0);
                        }
                    }
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().unwrap());
    }
    let unique: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "batch {batch}: a message was handed out twice");
    assert_eq!(unique, sent, "batch {batch}");
    mq.stopper().stop();
    mq.join();
}

/// One worker (pool engine), or one loop with one database connection
/// (async engine); the admin endpoint, whose /metrics shows what waits for
/// them while they are held; no maintenance pass (only requests' statements
/// touch the messages table).
fn one_carrier(pg: &Postgres) -> mwmq::Config {
    let mut cfg = config(pg);
    cfg.server.workers = 1;
    cfg.server.threads = 1;
    cfg.server.loop_db = 1;
    cfg.stats.admin = Some("127.0.0.1:0".into());
    cfg.queues.maintenance_s = 3600;
    cfg
}

/// RECVs waiting for a worker are carried out as one statement (the default
/// `batch`): each gets a message of its own, with a lease of its own.
#[test]
fn waiting_recvs_are_leased_together_one_message_each() {
    use std::io::{Read, Write};
    let pg = Postgres::start().unwrap();
    let mq = start(one_carrier(&pg));
    let mut c = connect(mq.local_addr());
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let sent: HashSet<i64> = (0..8).map(|i| q::<i64>(&mut c, &["SEND", "q", &format!("m{i}")])).collect();
    let before = info_field(&mut c, "db_statements");
    // The only worker waits on a lock while eight RECVs queue up behind it.
    let mut db = sql(&pg);
    let mut lock = db.transaction().unwrap();
    lock.batch_execute("LOCK TABLE mwmq_messages IN ACCESS EXCLUSIVE MODE").unwrap();
    let mut socks: Vec<std::net::TcpStream> = (0..8)
        .map(|_| {
            let s = std::net::TcpStream::connect(mq.local_addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s
        })
        .collect();
    // The first RECV waits for the lock, then the other seven are taken in.
    let admin = mq.admin_addr().unwrap();
    let base = metric(admin, "mwmq_received_bytes_total");
    let frame = b"*2\r\n$4\r\nRECV\r\n$1\r\nq\r\n";
    socks[0].write_all(frame).unwrap();
    until_a_statement_waits_for_the_lock(&mut lock);
    for s in &mut socks[1..] {
        s.write_all(frame).unwrap();
    }
    until_taken_in(admin, 7, base, 8 * frame.len());
    lock.commit().unwrap();
    let mut got = HashSet::new();
    for s in &mut socks {
        // *1 *4 :id :lease $0 (no sender name) "" $2 mN: eight lines.
        let mut reply = Vec::new();
        let mut buf = [0u8; 512];
        while reply.iter().filter(|b| **b == b'\n').count() < 8 {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed");
            reply.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&reply).to_string();
        assert!(text.starts_with("*1\r\n*4\r\n:"), "one message each: {text:?}");
        let id: i64 = text[9..].split("\r\n").next().unwrap().parse().unwrap();
        assert!(got.insert(id), "message {id} handed to two RECVs");
    }
    assert_eq!(got, sent);
    let used = info_field(&mut c, "db_statements") - before;
    // The first RECV alone (it was waiting on the lock), the other seven
    // together (async: the first two, each alone; the other six together),
    // and the INFO itself.
    assert!(used <= 4, "{used} statements for 8 RECVs");
}

/// Pipelined requests (a client writes many before reading): served one
/// at a time, in order, none forgotten — the net thread holds the rest of a
/// connection's input while its request is with a worker, and the worker
/// tells it when it is done.
#[test]
fn pipelined_requests_are_all_answered_in_order() {
    let pg = Postgres::start().unwrap();
    for batch in [1, 16] {
        let mut cfg = config(&pg);
        cfg.server.batch = batch;
        let mq = start(cfg);
        let addr = mq.local_addr();
        let mut c = connect(addr);
        let queue = format!("p{batch}");
        let _: String = q(&mut c, &["QCREATE", &queue]);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let queue = queue.clone();
                std::thread::spawn(move || {
                    let mut c = connect(addr);
                    let mut ids = Vec::new();
                    for round in 0..20 {
                        let mut p = redis::pipe();
                        for i in 0..50 {
                            p.cmd("SEND").arg(&queue).arg(format!("{t}-{round}-{i}"));
                            p.cmd("PING");
                        }
                        let replies: Vec<redis::Value> = p.query(&mut c).expect("pipeline");
                        assert_eq!(replies.len(), 100);
                        for pair in replies.chunks(2) {
                            match (&pair[0], &pair[1]) {
                                (redis::Value::Int(id), redis::Value::SimpleString(pong)) if pong == "PONG" => {
                                    ids.push(*id)
                                }
                                other => panic!("batch {batch}: replies out of order: {other:?}"),
                            }
                        }
                    }
                    ids
                })
            })
            .collect();
        let mut all = HashSet::new();
        for t in threads {
            let ids = t.join().unwrap();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "batch {batch}: one sender's ids go up");
            all.extend(ids);
        }
        assert_eq!(all.len(), 4 * 20 * 50);
        assert_eq!(q::<i64>(&mut c, &["QLEN", &queue]), 4000);
        mq.stopper().stop();
        mq.join();
    }
}

#[test]
fn long_polls_wake_on_a_send_here_and_in_another_process() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    // Polling alone would take a minute: within the RECVs' 30 s waits only
    // wake-ups can answer (without them a RECV ends empty).
    cfg.queues.poll_ms = 60_000;
    let a = start(cfg.clone());
    let b = start(cfg);
    let (aa, ba) = (a.local_addr(), b.local_addr());
    let mut c = connect(aa);
    let _: String = q(&mut c, &["QCREATE", "q"]);
    for (sender_addr, what) in [(aa, "same process"), (ba, "other process")] {
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut s = connect(sender_addr);
            q::<i64>(&mut s, &["SEND", "q", "wake up"])
        });
        let got = recv(&mut c, "q", &["WAIT", "30000"]);
        let id = t.join().unwrap();
        assert_eq!(got.len(), 1, "{what}: woken by the SEND");
        assert_eq!(got[0].0, id);
        let _: i64 = q(&mut c, &["ACK", "q", &got[0].0.to_string(), &got[0].1.to_string()]);
    }
    // Nothing comes: an empty answer after the wait.
    let start = Instant::now();
    assert!(recv(&mut c, "q", &["WAIT", "300"]).is_empty());
    let took = start.elapsed();
    // At the end of its wait: not before it, and not at the next poll (a minute).
    assert!(took >= Duration::from_millis(280) && took < Duration::from_secs(30), "{took:?}");
    // Parked RECVs do not hold workers: more waiters than workers, and others
    // are still served while every one of them waits.
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            std::thread::spawn(move || {
                let mut w = connect(aa);
                recv(&mut w, "q", &["WAIT", "25000"]).len()
            })
        })
        .collect();
    let blocked = || q::<String>(&mut connect(aa), &["INFO"]).contains("blocked_clients:10\r");
    assert!(eventually(Duration::from_secs(20), blocked), "the 10 RECVs wait");
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    let _: i64 = q(&mut c, &["QLEN", "q"]);
    assert!(waiters.iter().all(|w| !w.is_finished()), "served while all 10 waited");
    for i in 0..10 {
        let _: i64 = q(&mut c, &["SEND", "q", &format!("for waiter {i}")]);
    }
    let got: usize = waiters.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(got, 10, "each waiter woken by a SEND");
    a.stopper().stop();
    b.stopper().stop();
    a.join();
    b.join();
}

#[test]
fn results_files_and_admin_endpoint() {
    let pg = Postgres::start().unwrap();
    let dir = std::env::temp_dir().join(format!("mwmq-results-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = config(&pg);
    cfg.stats.out = Some(dir.to_string_lossy().into_owned());
    cfg.stats.trace_every = 1;
    cfg.stats.admin = Some("127.0.0.1:0".into());
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    let _: String = q(&mut c, &["QCREATE", "q"]);
    for i in 0..50 {
        let _: i64 = q(&mut c, &["SEND", "q", &i.to_string()]);
    }
    for _ in 0..25 {
        let _: Option<(i64, String, Vec<u8>)> = q(&mut c, &["POP", "q"]);
    }
    let admin = mq.admin_addr().unwrap();
    let (_, metrics) = http_get(admin, "/metrics");
    assert!(metrics.contains("mwmq_pool_size 4"), "{metrics}");
    // /readyz asks the database itself: 503 while it is down, 200 once it is
    // back; /healthz (liveness) stays 200 throughout.
    let (status, ready) = http_get(admin, "/readyz");
    assert!(status.contains("200") && ready.contains("database up"), "{status} {ready}");
    pg.stop().unwrap();
    // (A readiness check's answer is served again for READY_FOR.)
    std::thread::sleep(mwserve::http::READY_FOR);
    let (status, ready) = http_get(admin, "/readyz");
    assert!(status.contains("503") && ready.contains("database down"), "{status} {ready}");
    let (status, live) = http_get(admin, "/healthz");
    assert!(status.contains("200") && live.starts_with("ok"), "the process itself serves: {status} {live}");
    pg.restart("fast").unwrap();
    std::thread::sleep(mwserve::http::READY_FOR);
    let (status, _) = http_get(admin, "/readyz");
    assert!(status.contains("200"), "{status}");
    mq.stopper().stop();
    mq.join();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["source"], "mwmq");
    assert_eq!(summary["ops"]["send"]["count"], 50);
    assert_eq!(summary["ops"]["pop"]["count"], 25);
    assert_eq!(summary["ops"]["pop"]["hits"], 25);
    let mw = &summary["middleware"];
    assert_eq!(mw["backends"]["postgres"]["requests"], 76);
    assert!(mw["pool_us"]["count"].as_u64().unwrap() >= 76);
    assert_eq!(mw["database"]["pool_size"], 4);
    let trace = std::fs::read_to_string(dir.join("trace.csv")).unwrap();
    assert!(trace.lines().count() > 70, "one row per request");
    assert!(trace.lines().nth(1).unwrap().contains(",queue,") || trace.contains(",send,"));
    let windows = std::fs::read_to_string(dir.join("windows.jsonl")).unwrap();
    let sends: u64 = windows
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["ops"]["send"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(sends, 50, "windows add up to the summary");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn redis_cli_speaks_to_it() {
    let Ok(out) = std::process::Command::new("redis-cli").arg("--version").output() else {
        panic!("redis-cli is not installed (make test installs redis-tools)");
    };
    assert!(out.status.success());
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let port = mq.local_addr().port().to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli").args(["-p", &port]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(cli(&["QCREATE", "q"]), "OK");
    assert_eq!(cli(&["SEND", "q", "hello world"]), "1");
    assert_eq!(cli(&["QLEN", "q"]), "1");
    assert_eq!(cli(&["POP", "q"]), "1\n\nhello world");
    assert_eq!(cli(&["POP", "q"]), "");
    assert!(cli(&["SEND", "q"]).contains("wrong number of arguments"));
    mq.stopper().stop();
    mq.join();
}

/// RECVs of receivers with different names share one statement too, and
/// each gets only what it may take: a message addressed to it, or to no
/// one; never one addressed to somebody else. A queue with a delivery limit
/// is served the same way (each name on its own statement).
#[test]
fn recvs_of_different_receivers_share_a_statement_and_get_only_theirs() {
    use std::io::{Read, Write};
    let pg = Postgres::start().unwrap();
    let mq = start(one_carrier(&pg));
    let mut c = connect(mq.local_addr());
    for (queue, extra) in [("q", &[][..]), ("limited", &["MAXDELIVERIES", "3"][..])] {
        let mut create = vec!["QCREATE", queue];
        create.extend_from_slice(extra);
        let _: String = q(&mut c, &create);
        // For a: two addressed to it; for nobody in particular: three; for z (not here): two.
        for (body, to) in [("a1", "a"), ("z1", "z"), ("any1", ""), ("a2", "a"), ("any2", ""), ("z2", "z"), ("any3", "")]
        {
            let mut args = vec!["SEND", queue, body];
            if !to.is_empty() {
                args.extend_from_slice(&["TO", to]);
            }
            let _: i64 = q(&mut c, &args);
        }
        let before = info_field(&mut c, "db_statements");
        let mut db = sql(&pg);
        let mut lock = db.transaction().unwrap();
        lock.batch_execute("LOCK TABLE mwmq_messages IN ACCESS EXCLUSIVE MODE").unwrap();
        // Receivers a, a, b, b and two without a name.
        let names = ["a", "a", "b", "b", "", ""];
        let mut socks: Vec<(std::net::TcpStream, &str)> = names
            .iter()
            .map(|name| {
                let mut s = std::net::TcpStream::connect(mq.local_addr()).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                if !name.is_empty() {
                    let frame = format!("*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n${}\r\n{name}\r\n", name.len());
                    s.write_all(frame.as_bytes()).unwrap();
                    let mut ok = [0u8; 5];
                    s.read_exact(&mut ok).unwrap();
                    assert_eq!(&ok, b"+OK\r\n");
                }
                (s, *name)
            })
            .collect();
        // The first RECV waits for the lock, then the other five are taken in.
        let admin = mq.admin_addr().unwrap();
        let base = metric(admin, "mwmq_received_bytes_total");
        let frame = format!("*2\r\n$4\r\nRECV\r\n${}\r\n{queue}\r\n", queue.len());
        socks[0].0.write_all(frame.as_bytes()).unwrap();
        until_a_statement_waits_for_the_lock(&mut lock);
        for (s, _) in &mut socks[1..] {
            s.write_all(frame.as_bytes()).unwrap();
        }
        until_taken_in(admin, socks.len() - 1, base, socks.len() * frame.len());
        lock.commit().unwrap();
        let mut got = Vec::new();
        for (s, name) in &mut socks {
            let mut reply = Vec::new();
            let mut buf = [0u8; 512];
            while !(reply.starts_with(b"*0\r\n") || reply.iter().filter(|b| **b == b'\n').count() >= 8) {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "connection closed");
                reply.extend_from_slice(&buf[..n]);
            }
            let text = String::from_utf8_lossy(&reply).to_string();
            let body = text.trim_end().rsplit("\r\n").next().unwrap().to_string();
            if text.starts_with("*0") {
                continue;
            }
            if name.is_empty() || *name == "b" {
                assert!(body.starts_with("any"), "{name:?} got {body}");
            } else {
                assert!(body.starts_with('a'), "{name:?} got {body} (its own or anyone's)");
            }
            got.push(body);
        }
        let unique: HashSet<&String> = got.iter().collect();
        assert_eq!(unique.len(), got.len(), "a message went to two receivers: {got:?}");
        // Four receivers may only take the three messages for anyone: all
        // three are taken, and a gets one of its own at least.
        for m in ["any1", "any2", "any3", "a1"] {
            assert!(got.iter().any(|b| b == m), "{m} was not received: {got:?}");
        }
        assert!(got.iter().all(|b| !b.starts_with('z')), "{got:?}");
        let used = info_field(&mut c, "db_statements") - before;
        if queue == "q" {
            // The first RECV or two alone (waiting on the lock), the rest together.
            assert!(used <= 4, "{used} statements for 6 RECVs of 3 names");
        }
    }
}
