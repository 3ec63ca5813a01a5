//! A frozen database: every PostgreSQL process is stopped (SIGSTOP) for 10 s
//! or more under load, sockets open and statements in flight. Requests are
//! answered `-TRYAGAIN` in bounded time, mwmq itself keeps answering, a long
//! poll stays parked, nothing acknowledged is lost, and service resumes by
//! itself when the database runs again (SIGCONT).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use mwmq::Service;

/// The postmaster and every process it started.
fn postgres_processes(pg: &Postgres) -> Vec<i32> {
    let pid_file = std::fs::read_to_string(pg.dir().join("data").join("postmaster.pid")).expect("postmaster.pid");
    let master: i32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
    let mut pids = vec![master];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        if after.split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok()) == Some(master) {
            pids.push(pid);
        }
    }
    pids
}

/// Sends SIGCONT to the processes when dropped (also when the test fails).
struct Thaw(Vec<i32>);

impl Drop for Thaw {
    fn drop(&mut self) {
        signal(&self.0, rustix::process::Signal::CONT);
    }
}

fn signal(pids: &[i32], sig: rustix::process::Signal) {
    for &p in pids {
        if let Some(pid) = rustix::process::Pid::from_raw(p) {
            let _ = rustix::process::kill_process(pid, sig);
        }
    }
}

#[test]
fn a_frozen_database_gets_tryagain_in_bounded_time_and_service_resumes() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.database.statement_timeout_ms = 300;
    cfg.database.pool_wait_ms = 300;
    cfg.database.connect_timeout_ms = 300;
    // What mwmq promises while the database is frozen: a request is answered
    // within a statement deadline (the statement timeout and a second), a
    // pool wait and a connection attempt (its connect timeout and a
    // statement deadline), 3.2 s here, after a turn behind at most one such
    // request.
    let deadline = cfg.statement_deadline().expect("a statement deadline");
    let promise = deadline
        + Duration::from_millis(cfg.database.pool_wait_ms)
        + Duration::from_millis(cfg.database.connect_timeout_ms)
        + deadline;
    // The test's own connection, opened before mwmq's: mwmq tells its
    // sockets apart as the one new socket to the database in its process
    // (`deadline.rs`), and this test runs mwmq in its own process, where a
    // connection opened while mwmq reconnects after the thaw was once taken
    // for mwmq's and cut.
    let mut db = sql(&pg);
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut c = connect(addr);
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let _: String = q(&mut c, &["QCREATE", "idle"]);
    // A long poll parked before the freeze, on a queue nobody sends to yet;
    // its wait (two minutes) outlasts the whole test.
    let poller = std::thread::spawn(move || {
        let mut p = connect(addr);
        p.set_read_timeout(Some(Duration::from_secs(150))).unwrap();
        let t = Instant::now();
        let got = recv(&mut p, "idle", &["WAIT", "120000"]);
        (got.len(), t.elapsed())
    });
    let go = Arc::new(AtomicBool::new(true));
    let stats = Arc::new(Mutex::new((Vec::<i64>::new(), 0u64, Duration::ZERO)));
    let senders: Vec<_> = (0..4)
        .map(|t| {
            let (go, stats) = (go.clone(), stats.clone());
            std::thread::spawn(move || {
                let mut s = connect(addr);
                let mut n = 0;
                while go.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let r = redis::cmd("SEND").arg("q").arg(format!("{t}-{n}")).query::<i64>(&mut s);
                    let took = t0.elapsed();
                    n += 1;
                    let mut st = stats.lock().unwrap();
                    st.2 = st.2.max(took);
                    match r {
                        Ok(id) => st.0.push(id),
                        Err(e) => {
                            assert_eq!(e.code(), Some("TRYAGAIN"), "{e}");
                            st.1 += 1;
                            drop(st);
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // The bound on every answer from here on: the promise, its turn, and a
    // margin for this machine's load now (ten times the slowest SEND so far,
    // at least a second, at most ten).
    let calm = std::mem::take(&mut stats.lock().unwrap().2);
    let bound = 2 * promise + (10 * calm).clamp(Duration::from_secs(1), Duration::from_secs(10));
    // The freeze lasts longer than the bound (10 s at least): a request that
    // waited for the database would sit it out, and cross the bound.
    let freeze = Duration::from_secs(10).max(bound + Duration::from_secs(3));
    let pids = postgres_processes(&pg);
    assert!(pids.len() > 3, "the postmaster and its backends: {pids:?}");
    let thaw = Thaw(pids.clone());
    let stopped = Instant::now();
    signal(&pids, rustix::process::Signal::STOP);
    std::thread::sleep(Duration::from_millis(1000));
    // Frozen: mwmq itself answers, once a worker is free (each is held at
    // most the statement deadline, 1.3 s) — while the database stays frozen
    // (it is thawed only after this answer).
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    let frozen = stats.lock().unwrap().1;
    std::thread::sleep(Duration::from_millis(9000).max(freeze.saturating_sub(stopped.elapsed())));
    let during = stats.lock().unwrap().1 - frozen;
    assert!(during > 0, "requests were answered -TRYAGAIN while the database was frozen");
    drop(thaw);
    // Service resumes by itself.
    let resumed = Instant::now();
    let mut ok_after = false;
    while resumed.elapsed() < Duration::from_secs(30) {
        if redis::cmd("SEND").arg("q").arg("after").query::<i64>(&mut c).is_ok() {
            ok_after = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ok_after, "SENDs succeed again after the freeze");
    go.store(false, Ordering::Relaxed);
    for s in senders {
        s.join().unwrap();
    }
    let (sent, tryagain, slowest) = stats.lock().unwrap().clone();
    eprintln!(
        "frozen database: {} SENDs acknowledged, {tryagain} TRYAGAIN, slowest answer {slowest:?} \
         (before the freeze {calm:?}; bound {bound:?}, freeze {freeze:?})",
        sent.len()
    );
    assert!(
        slowest < bound,
        "every request was answered in bounded time: {slowest:?}, bound {bound:?} ({promise:?} promised, \
         the slowest SEND before the freeze {calm:?}), frozen {freeze:?}"
    );
    // The long poll stayed parked through the freeze and still gets its message.
    let _: i64 = q(&mut c, &["SEND", "idle", "wake"]);
    let (got, waited) = poller.join().unwrap();
    assert_eq!(got, 1, "the parked RECV got the message sent after the freeze ({waited:?})");
    let stored: i64 = db.query_one("SELECT count(*) FROM mwmq_messages WHERE id = ANY($1)", &[&sent]).unwrap().get(0);
    assert_eq!(stored as usize, sent.len(), "every acknowledged SEND is in the table");
    let info: String = q(&mut c, &["INFO"]);
    assert!(info.contains("statements_cut:"), "{info}");
}

/// Whether `pid` has a handler for SIGHUP (`SigCgt` of /proc/<pid>/status).
fn catches_sighup(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).map(str::trim).unwrap_or("0");
    u64::from_str_radix(mask, 16).unwrap_or(0) & 1 != 0
}

#[test]
fn a_sighup_while_mwmq_starts_is_a_reload_not_its_end() {
    // The database is frozen, so mwmq's start waits on it (schema first,
    // then the port): the signals must be caught already. (They were caught
    // only once it listened: a SIGHUP sent as soon as the port opened, or a
    // reload while a slow database held the start, killed it.)
    let pg = Postgres::start().unwrap();
    let pids = postgres_processes(&pg);
    signal(&pids, rustix::process::Signal::STOP);
    let thaw = Thaw(pids);
    let mut mq = MqProcess::spawn(&pg, 0, &[], std::process::Stdio::inherit());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !catches_sighup(mq.child.id()) {
        assert!(mq.child.try_wait().unwrap().is_none(), "mwmq exited while starting");
        assert!(Instant::now() < deadline, "mwmq does not catch SIGHUP while it starts");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = rustix::process::Pid::from_raw(mq.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    drop(thaw);
    mq.wait_listening();
    let mut c = connect(mq.addr);
    let _: String = q(&mut c, &["QCREATE", "q"]);
    assert!(q::<i64>(&mut c, &["SEND", "q", "after"]) > 0);
}
