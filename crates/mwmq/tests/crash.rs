//! Nothing acknowledged is lost: a total-queue check in the manner of
//! Jepsen's. Four senders and four receivers (RECV, then ACK) run while mwmq
//! is killed with SIGKILL and restarted, while PostgreSQL restarts, and while
//! the pool's backends are terminated. Afterwards the queue is drained, and
//! the history must show that every SEND that returned an id was received
//! and acknowledged, that no ACK succeeded twice for one message, and that
//! nothing was received that nobody sent. Dead-lettering is on: receivers
//! never acknowledge one message in ten (a poison message), which after three
//! deliveries moves to the dead-letter queue — every message must end either
//! acknowledged or there, never both. Also: SIGTERM finishes what is in
//! flight and leaves no lease behind.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

#[derive(Default)]
struct History {
    /// Body -> id, for SENDs that returned an id.
    sent: HashMap<String, i64>,
    /// Bodies of SENDs whose outcome is unknown (an error or a lost connection).
    maybe_sent: HashSet<String>,
    /// (id, body) of every message received.
    received: Vec<(i64, String)>,
    /// Ids whose ACK returned 1.
    acked: Vec<i64>,
    /// Ids whose ACK's outcome is unknown.
    maybe_acked: HashSet<i64>,
}

fn try_connect(addr: std::net::SocketAddr) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://{addr}/")).ok()?;
    let c = client.get_connection_with_timeout(Duration::from_millis(500)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    Some(c)
}

/// Runs the workload while `chaos` runs, drains, and checks the history.
fn check_under(name: &str, args: &[&str], chaos: impl FnOnce(&Postgres, &mut Option<MqProcess>, u16)) {
    let pg = Postgres::start().unwrap();
    let port = mctest::free_port();
    let mut mq = Some(MqProcess::start(&pg, port, args));
    let addr = mq.as_ref().unwrap().addr;
    let mut c = connect(addr);
    let _: String = q(&mut c, &["QCREATE", "dlq"]);
    let _: String = q(&mut c, &["QCREATE", "q", "MAXDELIVERIES", "3", "DEADLETTER", "dlq"]);
    let history = Arc::new(Mutex::new(History::default()));
    let sending = Arc::new(AtomicBool::new(true));
    let receiving = Arc::new(AtomicBool::new(true));
    let mut senders = Vec::new();
    let mut threads = Vec::new();
    for t in 0..4 {
        let (h, go) = (history.clone(), sending.clone());
        senders.push(std::thread::spawn(move || {
            let mut conn = None;
            let mut n = 0;
            while go.load(Ordering::Relaxed) {
                if conn.is_none() {
                    conn = try_connect(addr);
                }
                let Some(c) = conn.as_mut() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let body = format!("s{t}-{n}");
                n += 1;
                match redis::cmd("SEND").arg("q").arg(&body).query::<i64>(c) {
                    Ok(id) => {
                        h.lock().unwrap().sent.insert(body, id);
                    }
                    Err(e) => {
                        h.lock().unwrap().maybe_sent.insert(body);
                        if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                            conn = None;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        }));
    }
    for _ in 0..4 {
        let (h, go) = (history.clone(), receiving.clone());
        threads.push(std::thread::spawn(move || {
            let mut conn = None;
            while go.load(Ordering::Relaxed) {
                if conn.is_none() {
                    conn = try_connect(addr);
                }
                let Some(c) = conn.as_mut() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let got: Result<Vec<Leased>, _> =
                    redis::cmd("RECV").arg("q").arg("COUNT").arg(5).arg("VT").arg(1500).arg("WAIT").arg(100).query(c);
                let msgs = match got {
                    Ok(m) => m,
                    Err(_) => {
                        conn = None;
                        continue;
                    }
                };
                for (id, lease, _, body) in msgs {
                    let body = String::from_utf8(body).unwrap();
                    let poison = body.ends_with('7');
                    h.lock().unwrap().received.push((id, body));
                    if poison {
                        continue; // the receiver "crashes" on it: its lease expires
                    }
                    match redis::cmd("ACK").arg("q").arg(id).arg(lease).query::<i64>(c) {
                        Ok(1) => h.lock().unwrap().acked.push(id),
                        Ok(_) => {} // the lease expired: someone else has it now
                        Err(e) => {
                            h.lock().unwrap().maybe_acked.insert(id);
                            if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                                conn = None;
                                break;
                            }
                        }
                    }
                }
            }
        }));
    }
    // Traffic before the chaos and after it, counted rather than timed (a
    // busy machine sends fewer in a given time): 100 acknowledged SENDs
    // each, waited for up to 30 s.
    let sent_at_least = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while history.lock().unwrap().sent.len() < n {
            assert!(Instant::now() < deadline, "{name}: fewer than {n} SENDs acknowledged in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    sent_at_least(100);
    chaos(&pg, &mut mq, port);
    let after = history.lock().unwrap().sent.len() + 100;
    sent_at_least(after);
    sending.store(false, Ordering::Relaxed);
    // No SEND is in flight from here on: what the drain leaves is a loss.
    for t in senders {
        t.join().unwrap();
    }
    // Drain: leases of killed connections expire after 1.5 s and are redelivered.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut check = None;
    loop {
        let c = check.get_or_insert_with(|| connect(addr));
        match redis::cmd("QLEN").arg("q").query::<i64>(c) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => check = None,
        }
        assert!(Instant::now() < deadline, "{name}: the queue did not drain");
        std::thread::sleep(Duration::from_millis(100));
    }
    receiving.store(false, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    // What was dead-lettered: drained from the dead-letter queue.
    let mut dead = HashSet::new();
    let c = check.get_or_insert_with(|| connect(addr));
    while let Some((id, _, _)) = redis::cmd("POP").arg("dlq").query::<Option<(i64, String, Vec<u8>)>>(c).unwrap() {
        assert!(dead.insert(id), "{name}: message {id} dead-lettered twice");
    }
    let h = history.lock().unwrap();
    let mut once = HashSet::new();
    for id in &h.acked {
        assert!(once.insert(*id), "{name}: message {id} was acknowledged twice");
    }
    let acked: HashSet<i64> = h.acked.iter().copied().collect();
    let both: Vec<&i64> = acked.intersection(&dead).collect();
    assert!(both.is_empty(), "{name}: acknowledged and dead-lettered: {both:?}");
    let mut lost = Vec::new();
    for (body, id) in &h.sent {
        if body.ends_with('7') {
            assert!(dead.contains(id), "{name}: poison message {body} ({id}) is not in the dead-letter queue");
        } else if !acked.contains(id) && !h.maybe_acked.contains(id) && !dead.contains(id) {
            lost.push((body.clone(), *id));
        }
    }
    assert!(lost.is_empty(), "{name}: acknowledged SENDs never received and acknowledged: {lost:?}");
    for (id, body) in &h.received {
        match h.sent.get(body) {
            Some(sent_id) => assert_eq!(sent_id, id, "{name}: {body} came back under another id"),
            None => assert!(h.maybe_sent.contains(body), "{name}: received {body}, which nobody sent"),
        }
    }
    let redelivered = h.received.len() - h.received.iter().map(|r| r.0).collect::<HashSet<_>>().len();
    eprintln!(
        "{name}: {} SENDs acknowledged, {} unknown, {} received ({redelivered} redeliveries), {} ACKs, {} unknown, \
         {} dead-lettered",
        h.sent.len(),
        h.maybe_sent.len(),
        h.received.len(),
        h.acked.len(),
        h.maybe_acked.len(),
        dead.len()
    );
    let rows: i64 = sql(&pg).query_one("SELECT count(*) FROM mwmq_messages", &[]).unwrap().get(0);
    assert_eq!(rows, 0, "{name}: messages left in the table");
}

#[test]
fn sigkill_of_mwmq_under_load_loses_nothing_acknowledged() {
    check_under("SIGKILL", &["--db-pool", "6"], |pg, mq, port| {
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(400));
            mq.as_mut().unwrap().kill();
            *mq = Some(MqProcess::start(pg, port, &["--db-pool", "6"]));
        }
    });
}

#[test]
fn postgres_restarts_under_load_lose_nothing_acknowledged() {
    check_under("PostgreSQL restart", &["--db-pool", "6"], |pg, _, _| {
        for mode in ["fast", "immediate", "fast"] {
            std::thread::sleep(Duration::from_millis(500));
            pg.restart(mode).unwrap();
        }
    });
}

#[test]
fn terminated_backends_under_load_lose_nothing_acknowledged() {
    // Batched SENDs and ACKs: one statement for several requests.
    check_under("pg_terminate_backend, batch 8", &["--batch", "8"], |pg, _, _| {
        let mut admin = sql(pg);
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(300));
            let n: i64 = admin
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = 'mwmq' AND pid <> pg_backend_pid()",
                    &[],
                )
                .unwrap()
                .get(0);
            assert!(n > 0, "no mwmq backend to terminate");
        }
    });
}

#[test]
fn sigterm_answers_everything_in_flight_and_leaves_no_lease_behind() {
    let pg = Postgres::start().unwrap();
    let mut mq = MqProcess::start(&pg, 0, &["--max-body", "2m"]);
    let addr = mq.addr;
    let mut c = connect(addr);
    let _: String = q(&mut c, &["QCREATE", "big"]);
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let body = "b".repeat(1 << 20);
    for _ in 0..20 {
        let _: i64 = q(&mut c, &["SEND", "big", &body]);
    }
    // A client asks for 20 MiB of messages and never reads the reply: the
    // reply stops at max_reply_bytes (16 MiB), so it takes 15 of them.
    let mut deaf = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut deaf, b"*4\r\n$4\r\nRECV\r\n$3\r\nbig\r\n$5\r\nCOUNT\r\n$2\r\n20\r\n").unwrap();
    // A client waits for messages; another keeps sending.
    let waiter = std::thread::spawn(move || {
        let mut w = connect(addr);
        let t0 = Instant::now();
        let got = recv(&mut w, "q", &["WAIT", "60000"]);
        (got.len(), t0.elapsed())
    });
    let sending = Arc::new(AtomicBool::new(true));
    let go = sending.clone();
    let sends = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = sends.clone();
    let sender = std::thread::spawn(move || {
        let mut s = connect_as(addr, "sender");
        let mut ok = Vec::new();
        while go.load(Ordering::Relaxed) {
            match redis::cmd("SEND").arg("other").arg("x").query::<i64>(&mut s) {
                Ok(id) => {
                    ok.push(id);
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.code() == Some("NOQUEUE") => {
                    let _: redis::RedisResult<String> = redis::cmd("QCREATE").arg("other").query(&mut s);
                }
                Err(_) => break,
            }
        }
        ok
    });
    let mut db = sql(&pg);
    let mut leased: i64 = 0;
    let took = eventually(Duration::from_secs(30), || {
        leased = db.query_one("SELECT count(*) FROM mwmq_messages WHERE lease IS NOT NULL", &[]).unwrap().get(0);
        leased == 15
    });
    assert!(took, "the deaf client's RECV leased what fits in max_reply_bytes: {leased} leased, not 15");
    // The waiter parked and the sender sending before the stop.
    assert!(eventually(Duration::from_secs(30), || info_field(&mut c, "blocked_clients") >= 1), "the waiter parked");
    assert!(eventually(Duration::from_secs(30), || sends.load(Ordering::Relaxed) >= 1), "the sender sent");
    let t0 = Instant::now();
    let status = mq.terminate();
    assert!(status.success(), "mwmq exited with {status}");
    // Far from the parked RECV's 60 s: it did not wait for it.
    assert!(t0.elapsed() < Duration::from_secs(30), "stopping took {:?}", t0.elapsed());
    sending.store(false, Ordering::Relaxed);
    let (n, waited) = waiter.join().unwrap();
    assert_eq!(n, 0);
    assert!(waited < Duration::from_secs(30), "the parked RECV was answered at shutdown, not after its 60 s wait");
    let sent = sender.join().unwrap();
    assert!(!sent.is_empty());
    let mut db = sql(&pg);
    let stored: i64 = db.query_one("SELECT count(*) FROM mwmq_messages WHERE id = ANY($1)", &[&sent]).unwrap().get(0);
    assert_eq!(stored as usize, sent.len(), "every acknowledged SEND is in the table");
    let leased: i64 = db.query_one("SELECT count(*) FROM mwmq_messages WHERE lease IS NOT NULL", &[]).unwrap().get(0);
    assert_eq!(leased, 0, "leases of a reply that never reached its client were given back");
    drop(deaf);
}

#[test]
fn a_stalled_database_gets_tryagain_and_service_resumes() {
    let pg = Postgres::start().unwrap();
    let dir = std::env::temp_dir().join(format!("mwmq-stall-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("mq.toml");
    std::fs::write(&cfg, "[database]\nstatement_timeout_ms = 300\npool_wait_ms = 300\n").unwrap();
    let mq = MqProcess::start(&pg, 0, &["-c", cfg.to_str().unwrap()]);
    let mut c = connect(mq.addr);
    let _: String = q(&mut c, &["QCREATE", "q"]);
    // Another session holds the messages table: every statement on it waits.
    let mut admin = sql(&pg);
    let mut tx = admin.transaction().unwrap();
    tx.batch_execute("LOCK TABLE mwmq_messages IN ACCESS EXCLUSIVE MODE").unwrap();
    // Unfixed, the SEND waited for the lock (held until the rollback below):
    // the client's 30 s read timeout would end it with an error of its own.
    let e = err(&mut c, &["SEND", "q", "blocked"]);
    assert!(e.starts_with("TRYAGAIN"), "the stall was not cut short: {e}");
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG", "mwmq itself keeps answering");
    tx.rollback().unwrap();
    let id: i64 = q(&mut c, &["SEND", "q", "after"]);
    assert!(id > 0);
    assert_eq!(q::<i64>(&mut c, &["QLEN", "q"]), 1, "the refused SEND left nothing");
    std::fs::remove_dir_all(dir).unwrap();
}
