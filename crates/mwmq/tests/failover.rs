//! mwmq in front of a highly available PostgreSQL (`scripts/pg-ha.sh`: a
//! pg_auto_failover monitor, a primary and a synchronous standby): the
//! primary dies under load and nothing acknowledged is lost; a commit whose
//! wait for the standby was cancelled is never answered OK; the standby
//! dies and writes go on; the dead node comes back as the standby.

mod common;

use common::*;
use mctest::{http_get, PgHa};
use mwmq::Service;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// mwmq on the cluster's two-host connection string, with the statement
/// deadline short enough for the drill (`statement_timeout_ms`).
fn mq_on(ha: &PgHa, statement_timeout_ms: u64) -> mwmq::Mq {
    let mut c = config_for(ha.conninfo());
    c.database.statement_timeout_ms = statement_timeout_ms;
    c.database.connect_timeout_ms = 1_000;
    c.stats.admin = Some("127.0.0.1:0".into());
    start(c)
}

/// Runs `f`, panicking with the cluster's state and logs if it fails.
fn or_state<T, E: std::fmt::Display>(ha: &PgHa, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| {
        let log = |f: &str| std::fs::read_to_string(ha.dir().join(f)).unwrap_or_default();
        let tail =
            |t: String| t.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        panic!(
            "{e}\n{}\n--- monitor\n{}\n--- node 1\n{}\n--- node 2\n{}",
            ha.state(),
            tail(log("monitor.log")),
            tail(log("node1.log")),
            tail(log("node2.log"))
        )
    })
}

/// A SEND with KEY until it is answered with an id (a retry of the same
/// KEY gives the first one's id, so none is sent twice), within `limit`:
/// the id, the attempts, and when the attempt that was answered was sent.
fn send_until_answered(
    c: &mut redis::Connection,
    queue: &str,
    key: &str,
    limit: Duration,
) -> Option<(i64, u32, Instant)> {
    send_noting_errors(c, queue, key, limit, &mut Vec::new())
}

/// [`send_until_answered`], adding the errors it was answered to `errors`.
fn send_noting_errors(
    c: &mut redis::Connection,
    queue: &str,
    key: &str,
    limit: Duration,
    errors: &mut Vec<String>,
) -> Option<(i64, u32, Instant)> {
    let t0 = Instant::now();
    let mut tries = 0;
    while t0.elapsed() < limit {
        tries += 1;
        let asked = Instant::now();
        match redis::cmd("SEND").arg(queue).arg(key).arg("KEY").arg(key).query::<i64>(c) {
            Ok(id) => return Some((id, tries, asked)),
            Err(e) => {
                errors.push(e.to_string());
                std::thread::sleep(Duration::from_millis(20))
            }
        }
    }
    None
}

/// A SEND with a KEY, once: its error's text, or None if it was answered with an id.
fn send_error(c: &mut redis::Connection, queue: &str, key: &str) -> Option<String> {
    let r = redis::cmd("SEND").arg(queue).arg(key).arg("KEY").arg(key).query::<i64>(c);
    r.err().map(|e| {
        assert_eq!(e.code(), Some("TRYAGAIN"), "clients retry on TRYAGAIN: {e}");
        e.to_string()
    })
}

/// Whether `e` says what a client needs during a failover: no primary, a
/// promotion awaited (not the standby's bare "database does not allow writes").
fn says_no_primary(e: &str) -> bool {
    e.contains("no primary: ") && e.contains("the primary is gone, and a promotion is awaited")
}

/// While the server behind the connection string takes no writes (as a
/// standby does until it is promoted), requests hear TRYAGAIN saying that
/// there is no primary and a promotion is awaited, both on the connection
/// that was open (SQLSTATE 25006) and on the ones opened after
/// (`target_session_attrs=read-write` refused); then service resumes by
/// itself. A plain PostgreSQL made read-only stands in for the standby: the
/// same SQLSTATE and the same `transaction_read_only = on`, in a second.
#[test]
fn a_database_that_takes_no_writes_is_said_to_have_no_primary() {
    let pg = Postgres::start().unwrap_or_else(|e| panic!("{e:#}"));
    let mq = start(config_for(&format!("{} target_session_attrs=read-write", pg.conninfo())));
    let mut c = connect(mq.local_addr());
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let _: i64 = q(&mut c, &["SEND", "q", "before"]);
    let mut admin = sql(&pg);
    let set_read_only = |admin: &mut postgres::Client, on: bool| {
        let v = if on { "on" } else { "off" };
        // One statement at a time: ALTER SYSTEM runs in no transaction block.
        for sql in [
            "SET default_transaction_read_only = off".to_string(),
            format!("ALTER SYSTEM SET default_transaction_read_only = {v}"),
            "SELECT pg_reload_conf()".to_string(),
        ] {
            admin.batch_execute(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    };
    set_read_only(&mut admin, true);
    // Until a SEND is refused on a connection opened after the change (the
    // reload reaches the open ones' next transaction; the pool engine opens
    // another for the next request, the async engine after its backoff).
    let mut errors = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            errors.extend(send_error(&mut c, "q", &format!("k{}", errors.len())));
            errors.iter().any(|e| !e.contains("no longer takes writes"))
        }),
        "no SEND was refused on a new connection within 30 s: {errors:?}"
    );
    for e in &errors {
        assert!(says_no_primary(e), "{e}");
    }
    set_read_only(&mut admin, false);
    let (id, _, _) = send_until_answered(&mut c, "q", "after", Duration::from_secs(30)).expect("service resumes");
    assert!(id > 0);
    mq.stopper().stop();
    mq.join();
}

/// PostgreSQL turns a cancelled wait for the synchronous standby into a
/// local commit with a WARNING: mwmq answers such a SEND `-TRYAGAIN`, never
/// its id; the retry with the same KEY finds the message (now replicated).
/// With the standby frozen longer than the statement deadline, the SEND is
/// not answered OK either.
#[test]
fn a_commit_the_standby_did_not_confirm_is_never_answered_ok() {
    // pg_auto_failover's own timeouts: the monitor takes 20 s to declare the
    // frozen standby dead and let the primary commit alone (which would end
    // the wait with an OK, as it should), longer than this test.
    let ha = PgHa::start_with(&["timeouts=default"]).unwrap_or_else(|e| panic!("{e:#}"));
    let mq = mq_on(&ha, 800);
    let mut c = connect(mq.local_addr());
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let first: i64 = q(&mut c, &["SEND", "q", "before", "KEY", "before"]);
    let mut primary = sql_at(&ha.node_conninfo(1));
    let stored = |p: &mut postgres::Client, key: &str| -> i64 {
        p.query_one(
            "SELECT count(*) FROM mwmq_messages m JOIN mwmq_keys k ON k.queue_id = m.queue_id AND k.message_id = m.id WHERE k.key = $1",
            &[&key],
        )
        .map(|r| r.get(0))
        .unwrap_or_else(|e| panic!("count {key}: {e}"))
    };
    assert_eq!(stored(&mut primary, "before"), 1, "message {first} is stored");

    // 1. The standby frozen; the commit waits for it; an operator (or a
    // tool) cancels the wait.
    or_state(&ha, ha.freeze(2));
    let addr = mq.local_addr();
    let sender = std::thread::spawn(move || {
        let mut c = connect(addr);
        redis::cmd("SEND").arg("q").arg("cancelled").arg("KEY").arg("cancelled").query::<i64>(&mut c)
    });
    let t0 = Instant::now();
    let waiting = loop {
        let pids: Vec<i32> = primary
            .query("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if let Some(p) = pids.first() {
            break *p;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the SEND never waited for the standby");
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = primary.execute("SELECT pg_cancel_backend($1)", &[&waiting]).unwrap();
    let answer = sender.join().unwrap();
    let e = answer.expect_err("a SEND whose wait for the standby was cancelled must not be answered with an id");
    assert_eq!(e.code(), Some("TRYAGAIN"), "{e}");
    assert!(e.to_string().contains("synchronous standby"), "{e}");
    // It did commit, locally: the case is real, not a failed INSERT.
    assert_eq!(stored(&mut primary, "cancelled"), 1, "the cancelled wait left a local commit");

    // 2. The standby frozen longer than statement_timeout_ms (800 ms; the
    // statement deadline is 1.8 s): PostgreSQL's statement_timeout does not
    // reach a commit's wait, mwmq's deadline does, and says TRYAGAIN.
    let t0 = Instant::now();
    let r = redis::cmd("SEND").arg("q").arg("frozen").arg("KEY").arg("frozen").query::<i64>(&mut c);
    let e = r.expect_err("a SEND the standby never confirmed must not be answered with an id");
    assert_eq!(e.code(), Some("TRYAGAIN"), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(800), "answered after {:?}", t0.elapsed());
    or_state(&ha, ha.thaw(2));

    // The client retries with the same KEYs: each message once, with one id.
    let mut c = connect(mq.local_addr());
    for key in ["cancelled", "frozen"] {
        let (id, _, _) = send_until_answered(&mut c, "q", key, Duration::from_secs(20)).expect("answered once thawed");
        assert!(id > first);
        assert_eq!(stored(&mut primary, key), 1, "{key}: stored once");
    }
    let got: Vec<Leased> = recv(&mut c, "q", &["COUNT", "10"]);
    let bodies: HashSet<Vec<u8>> = got.iter().map(|m| m.3.clone()).collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(bodies.len(), 3);
    mq.stopper().stop();
    mq.join();
}

/// What the drill's clients saw.
#[derive(Default)]
struct Seen {
    /// Message id -> when the SEND that was answered with it was sent, and when it was answered.
    sent: HashMap<i64, (Instant, Instant)>,
    /// SEND attempts answered with an error (retried with the same KEY).
    send_errors: u64,
    /// Their errors' texts, each with how many times it was heard.
    send_error_texts: HashMap<String, u64>,
    /// Every delivery: message id and when the RECV that got it was sent.
    received: Vec<(i64, Instant)>,
    /// Message id -> when an ACK of it was answered 1.
    acked: HashMap<i64, Instant>,
}

/// The drill: 4 senders (SEND with KEY) and 4 receivers (RECV, ACK) on
/// mwmq; the primary's machine dies (keeper and PostgreSQL SIGKILLed) at a
/// random moment; pg_auto_failover promotes the standby. Then: every SEND
/// answered with an id is received, no message whose ACK was answered 1 is
/// delivered again, /readyz said 503 while no primary answered, INFO counts
/// the failover. The dead node comes back as the standby; then the standby
/// dies and the primary goes on taking writes once the monitor drops
/// synchronous replication.
#[test]
fn the_primary_dies_and_nothing_acknowledged_is_lost() {
    // MWMQ_DRILL_TIMEOUTS=default: pg_auto_failover's own timeouts (a drill of about a minute).
    let timeouts = std::env::var("MWMQ_DRILL_TIMEOUTS").unwrap_or_else(|_| "fast".into());
    let ha = PgHa::start_with(&[&format!("timeouts={timeouts}")]).unwrap_or_else(|e| panic!("{e:#}"));
    let mq = mq_on(&ha, 2_000);
    let addr = mq.local_addr();
    let admin = mq.admin_addr().unwrap();
    let mut c = connect(addr);
    let _: String = q(&mut c, &["QCREATE", "drill"]);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop_sending = Arc::new(AtomicBool::new(false));
    let stop_receiving = Arc::new(AtomicBool::new(false));

    let senders: Vec<_> = (0..4)
        .map(|t| {
            let (seen, stop) = (seen.clone(), stop_sending.clone());
            std::thread::spawn(move || {
                let mut c = connect(addr);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("s{t}-{n}");
                    // Each key until it is answered: a TRYAGAIN may have committed.
                    let mut errors = Vec::new();
                    match send_noting_errors(&mut c, "drill", &key, Duration::from_secs(120), &mut errors) {
                        Some((id, tries, asked)) => {
                            let answered = Instant::now();
                            let mut s = seen.lock().unwrap();
                            s.sent.insert(id, (asked, answered));
                            s.send_errors += u64::from(tries - 1);
                            for e in errors {
                                *s.send_error_texts.entry(e).or_default() += 1;
                            }
                        }
                        None => panic!("SEND {key} never answered within 120 s"),
                    }
                    n += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        })
        .collect();
    let receivers: Vec<_> = (0..4)
        .map(|_| {
            let (seen, stop) = (seen.clone(), stop_receiving.clone());
            std::thread::spawn(move || {
                let mut c = connect(addr);
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let got: Vec<Leased> = match redis::cmd("RECV")
                        .arg("drill")
                        .arg("COUNT")
                        .arg(10)
                        .arg("VT")
                        .arg(5_000)
                        .arg("WAIT")
                        .arg(200)
                        .query(&mut c)
                    {
                        Ok(got) => got,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                    };
                    seen.lock().unwrap().received.extend(got.iter().map(|m| (m.0, asked)));
                    for (id, lease, _, _) in got {
                        let r = redis::cmd("ACK").arg("drill").arg(id).arg(lease).query::<i64>(&mut c);
                        if r == Ok(1) {
                            seen.lock().unwrap().acked.insert(id, Instant::now());
                        }
                    }
                }
            })
        })
        .collect();
    // /readyz, every 100 ms.
    let probe_stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let stop = probe_stop.clone();
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let (status, _) = http_get(admin, "/readyz");
                statuses.push((Instant::now(), status.contains(" 200")));
                std::thread::sleep(Duration::from_millis(100));
            }
            statuses
        })
    };

    // A long poll parked on an empty queue across the failover.
    let _: String = q(&mut c, &["QCREATE", "parked"]);
    let parked = std::thread::spawn(move || {
        let mut c = connect(addr);
        c.set_read_timeout(Some(Duration::from_secs(150))).unwrap();
        let t0 = Instant::now();
        let got: Vec<Leased> =
            redis::cmd("RECV").arg("parked").arg("WAIT").arg(120_000).query(&mut c).expect("the parked RECV");
        (got, t0.elapsed())
    });
    // The primary dies at a random moment 1-2.5 s into the load.
    let jitter = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() % 1_500;
    std::thread::sleep(Duration::from_millis(1_000 + u64::from(jitter)));
    let before_kill = seen.lock().unwrap().sent.len();
    assert!(before_kill > 0, "SENDs were answered before the kill");
    or_state(&ha, ha.kill(1));
    // (The script signals last: the processes are dead when it returns.)
    let killed = Instant::now();
    // Until a SEND sent after the kill is answered, and 2 s more of load.
    let back = loop {
        let first_after = seen.lock().unwrap().sent.values().filter(|(asked, _)| *asked > killed).map(|t| t.1).min();
        if let Some(t) = first_after {
            break t;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(120),
            "no SEND answered within 120 s of the kill\n{}",
            ha.state()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(2));
    stop_sending.store(true, Ordering::Relaxed);
    for s in senders {
        s.join().unwrap();
    }
    // The receivers drain what was sent.
    let t0 = Instant::now();
    loop {
        let s = seen.lock().unwrap();
        let got: HashSet<i64> = s.received.iter().map(|r| r.0).collect();
        if s.sent.keys().all(|id| got.contains(id)) || t0.elapsed() > Duration::from_secs(30) {
            break;
        }
        drop(s);
        std::thread::sleep(Duration::from_millis(100));
    }
    stop_receiving.store(true, Ordering::Relaxed);
    for r in receivers {
        r.join().unwrap();
    }
    probe_stop.store(true, Ordering::Relaxed);
    let probes = probe.join().unwrap();
    // The long poll parked before the kill is served by the new primary.
    let mut c = connect(addr);
    let woke: i64 = q(&mut c, &["SEND", "parked", "after the failover"]);
    let (got, waited) = parked.join().unwrap();
    assert_eq!(got.first().map(|m| (m.0, m.3.clone())), Some((woke, b"after the failover".to_vec())));
    assert!(waited > killed.elapsed().min(Duration::from_secs(2)), "it waited through the failover: {waited:?}");

    let s = seen.lock().unwrap();
    let got: HashSet<i64> = s.received.iter().map(|r| r.0).collect();
    let lost: Vec<i64> = s.sent.keys().filter(|id| !got.contains(id)).copied().collect();
    let again: Vec<i64> =
        s.received.iter().filter(|(id, asked)| s.acked.get(id).is_some_and(|t| t < asked)).map(|r| r.0).collect();
    let duplicates = s.received.len() - got.len();
    let gap = {
        let mut times: Vec<Instant> = s.sent.values().map(|t| t.1).collect();
        times.sort();
        times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    };
    eprintln!(
        "drill: {} SENDs answered ({} before the kill), {} retried after an error; {} deliveries of {} messages \
         ({} duplicates), {} lost, {} acknowledged and delivered again; kill -> first SEND answered {:.2} s, \
         longest time without an answered SEND {:.2} s",
        s.sent.len(),
        before_kill,
        s.send_errors,
        s.received.len(),
        got.len(),
        duplicates,
        lost.len(),
        again.len(),
        (back - killed).as_secs_f64(),
        gap.as_secs_f64()
    );
    for (e, n) in &s.send_error_texts {
        eprintln!("  {n} x {e}");
    }
    assert!(lost.is_empty(), "SENDs answered with an id but never received: {lost:?}");
    assert!(again.is_empty(), "messages delivered again after an ACK answered 1: {again:?}");
    assert!(s.sent.len() > before_kill, "SENDs were answered after the failover");
    // What the senders heard while there was no primary: that, not the
    // standby's "database does not allow writes".
    assert!(
        s.send_error_texts.keys().any(|e| says_no_primary(e)),
        "no SEND heard that the primary is gone: {:?}",
        s.send_error_texts
    );
    assert!(!s.send_error_texts.keys().any(|e| e.contains("does not allow writes")), "{:?}", s.send_error_texts);
    // /readyz: 503 while no primary answered, 200 at the end.
    assert!(probes.iter().any(|(t, ok)| *t > killed && !ok), "/readyz never said 503 after the kill");
    assert!(probes.last().is_some_and(|p| p.1), "/readyz is 200 again");
    drop(s);
    assert_eq!(info_field(&mut c, "db_failovers"), 1, "INFO counts the failover");
    assert!(info_field(&mut c, "db_outages") >= 1);
    let info: String = q(&mut c, &["INFO"]);
    let node2 = ha.node_conninfo(2);
    let port2 = node2.split_whitespace().find_map(|w| w.strip_prefix("port=")).unwrap();
    assert!(info.contains(&format!("db_server:127.0.0.1:{port2}")), "{info}");
    let without: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix("db_seconds_without_primary:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(without > 0.5 && without < 120.0, "{without}");

    // `pg-ha.sh state` as docs/mwmq.md shows it: the dead node keeps its
    // last report (primary); the monitor assigned it `demoted` and finds it bad.
    let state = ha.state();
    let words = |node: &str| -> Vec<String> {
        let line = state.lines().find(|l| l.starts_with(node)).unwrap_or_default();
        line.split_whitespace().skip(2).map(String::from).collect()
    };
    assert!(state.starts_with("node    address          reported          assigned          health\n"), "{state}");
    assert_eq!(words("node_1"), ["primary", "demoted", "bad"], "{state}");
    assert_eq!(words("node_2"), ["wait_primary", "wait_primary", "good"], "{state}");

    // The old primary comes back: as the standby.
    or_state(&ha, ha.revive(1));
    or_state(&ha, ha.wait("secondary", "primary", 60));
    let (id, _, _) = send_until_answered(&mut c, "drill", "after-rejoin", Duration::from_secs(20)).expect("SEND");
    assert!(id > 0);

    // The standby dies: writes wait for it until the monitor drops
    // synchronous replication, then go on.
    let killed = Instant::now();
    or_state(&ha, ha.kill(1));
    let (_, tries, _) =
        send_until_answered(&mut c, "drill", "standby-dead", Duration::from_secs(60)).expect("writes go on");
    eprintln!("standby killed: a SEND answered after {:.2} s ({} attempts)", killed.elapsed().as_secs_f64(), tries);
    or_state(&ha, ha.wait("-", "wait_primary", 30));
    mq.stopper().stop();
    mq.join();
}
