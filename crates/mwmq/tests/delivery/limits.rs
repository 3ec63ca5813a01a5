//! Steering deliveries: a paused queue stores SENDs and hands out nothing
//! until it is resumed (parked RECVs wake then); CONCURRENCY and RATE hold
//! across every mwmq process on the database, also when their receivers
//! race (and RATE counts POPs with RECVs); QINFO shows the settings and how often they cut a RECV short.

use std::time::{Duration, Instant};

use crate::common::*;
use mctest::Postgres;
use mwmq::Service;

fn send_n(c: &mut redis::Connection, queue: &str, n: usize) {
    for i in 0..n {
        let _: i64 = q(c, &["SEND", queue, &format!("m{i}")]);
    }
}

#[test]
fn a_paused_queue_stores_and_hands_out_nothing_until_resumed() {
    let pg = Postgres::start().unwrap();
    // Polling once a minute: only QRESUME can wake the parked RECV in time.
    let mut cfg = config(&pg);
    cfg.queues.poll_ms = 60_000;
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut c = connect(addr);
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    let _: i64 = q(&mut c, &["SEND", "jobs", "before"]);
    assert_eq!(q::<String>(&mut c, &["QPAUSE", "jobs"]), "OK");
    let _: i64 = q(&mut c, &["SEND", "jobs", "during"]);
    assert!(recv(&mut c, "jobs", &["COUNT", "10"]).is_empty(), "nothing handed out");
    assert_eq!(q::<Option<(i64, String, Vec<u8>)>>(&mut c, &["POP", "jobs"]), None, "not even by POP");
    let peeked: (i64, String, Vec<u8>) = q(&mut c, &["PEEK", "jobs"]);
    assert_eq!(peeked.2, b"before", "looking is not taking");
    let info = qinfo(&mut c, "jobs");
    assert_eq!((info["paused"].as_str(), info["ready"].as_str()), ("1", "2"));
    let waiter = std::thread::spawn(move || {
        let mut c = connect(addr);
        let got = recv(&mut c, "jobs", &["COUNT", "10", "WAIT", "30000"]);
        (got, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(600));
    assert!(!waiter.is_finished(), "a parked RECV stays parked while paused");
    assert_eq!(q::<String>(&mut c, &["QRESUME", "jobs"]), "OK");
    let resumed = Instant::now();
    let (got, woke) = waiter.join().unwrap();
    assert_eq!(got.len(), 2, "both messages once resumed");
    // Its wait is 30 s, the poll a minute: only QRESUME's wake-up could answer it.
    assert!(woke.duration_since(resumed) < Duration::from_secs(25), "woken by QRESUME, not the end of its wait");
    assert_eq!(qinfo(&mut c, "jobs")["paused"], "0");
    assert_eq!(err(&mut c, &["QPAUSE", "nope"]), "NOQUEUE no such queue 'nope'");
    assert!(err(&mut c, &["QPAUSE"]).contains("wrong number of arguments"));
}

#[test]
fn pausing_takes_the_admin_right() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users =
        vec![user("boss", "boss pass", &["*"], &["*"], &["*"]), user("worker", "work pass", &["*"], &["*"], &[])];
    let mq = start(cfg);
    let mut boss = login(mq.local_addr(), "boss", "boss pass");
    let mut worker = login(mq.local_addr(), "worker", "work pass");
    assert_eq!(q::<String>(&mut boss, &["QCREATE", "jobs"]), "OK");
    assert!(err(&mut worker, &["QPAUSE", "jobs"]).starts_with("NOPERM"));
    assert!(err(&mut worker, &["QALTER", "jobs", "RATE", "1/s"]).starts_with("NOPERM"));
    assert_eq!(q::<String>(&mut boss, &["QPAUSE", "jobs"]), "OK");
    assert!(err(&mut worker, &["QRESUME", "jobs"]).starts_with("NOPERM"));
}

#[test]
fn concurrency_holds_across_processes_and_racing_receivers() {
    let pg = Postgres::start().unwrap();
    let a = start(config(&pg));
    let b = start(config(&pg));
    let mut c = connect(a.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs", "CONCURRENCY", "3"]), "OK");
    // Rounds of eight receivers at once, half on each process, each asking
    // for two; each round's deliveries are acknowledged before the next.
    let addrs = [a.local_addr(), b.local_addr()];
    let mut most = 0;
    send_n(&mut c, "jobs", 60);
    for _ in 0..15 {
        let start_line = std::sync::Arc::new(std::sync::Barrier::new(8));
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let (addr, line) = (addrs[i % 2], start_line.clone());
                std::thread::spawn(move || {
                    let mut c = connect(addr);
                    line.wait();
                    recv(&mut c, "jobs", &["COUNT", "2"])
                })
            })
            .collect();
        let got: Vec<Leased> = racers.into_iter().flat_map(|t| t.join().unwrap()).collect();
        most = most.max(got.len());
        for m in &got {
            assert_eq!(q::<i64>(&mut c, &["ACK", "jobs", &m.0.to_string(), &m.1.to_string()]), 1);
        }
    }
    assert!(most <= 3, "at most 3 leased at once, whoever asks and where: {most} in one round");
    let mut got = Vec::new();
    for _ in 0..4 {
        got.extend(recv(&mut c, "jobs", &["COUNT", "2"]));
    }
    assert_eq!(got.len(), 3);
    let info = qinfo(&mut c, "jobs");
    assert_eq!((info["leased"].as_str(), info["concurrency"].as_str()), ("3", "3"));
    assert!(info["held_by_concurrency"].parse::<i64>().unwrap() >= 2, "{info:?}");
    // An ACK frees a place; an expired lease does too.
    assert_eq!(q::<i64>(&mut c, &["ACK", "jobs", &got[0].0.to_string(), &got[0].1.to_string()]), 1);
    let mut other = connect(b.local_addr());
    // (Leased for 30 s, so that it holds its place during the check, then cut to 300 ms.)
    let third = recv(&mut other, "jobs", &["COUNT", "5", "VT", "30000"]);
    assert_eq!(third.len(), 1);
    assert!(recv(&mut other, "jobs", &[]).is_empty());
    let (id, lease) = (third[0].0.to_string(), third[0].1.to_string());
    assert_eq!(q::<i64>(&mut other, &["TOUCH", "jobs", &id, &lease, "300"]), 1);
    let freed = recv_when_free(&mut other, "jobs", &["COUNT", "5"], "the expired lease's place was free");
    assert_eq!(freed.len(), 1, "the expired lease's place");
    // Lifted: the rest at once (3 of what is left are leased).
    assert_eq!(q::<String>(&mut c, &["QALTER", "jobs", "CONCURRENCY", "0"]), "OK");
    let left: i64 = q(&mut c, &["QLEN", "jobs"]);
    assert_eq!(recv(&mut c, "jobs", &["COUNT", "100"]).len() as i64, left - 3);
    assert_eq!(qinfo(&mut c, "jobs")["concurrency"], "0");
}

#[test]
fn pops_count_against_the_rate_with_recvs() {
    let pg = Postgres::start().unwrap();
    let a = start(config(&pg));
    let b = start(config(&pg));
    let mut c = connect(a.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "mail", "RATE", "10/s"]), "OK");
    // POPs of an empty queue spend nothing: a burst's worth is there when messages come.
    for _ in 0..30 {
        assert_eq!(q::<Option<(i64, String, Vec<u8>)>>(&mut c, &["POP", "mail"]), None);
    }
    send_n(&mut c, "mail", 200);
    // What the bucket gives from here on: its 10, then 10 a second (a slow
    // burst leaves tokens earned meanwhile for the race below).
    let from_full = Instant::now();
    let burst = (0..10).filter(|_| q::<Option<(i64, String, Vec<u8>)>>(&mut c, &["POP", "mail"]).is_some()).count();
    assert_eq!(burst, 10, "the bucket was full");
    // POPs on one process and RECVs on the other, as fast as they can for 2 s.
    let began = Instant::now();
    let popper = std::thread::spawn({
        let addr = a.local_addr();
        move || {
            let mut c = connect(addr);
            let mut n = 0;
            while began.elapsed() < Duration::from_secs(2) {
                n += usize::from(q::<Option<(i64, String, Vec<u8>)>>(&mut c, &["POP", "mail"]).is_some());
            }
            n
        }
    });
    let receiver = std::thread::spawn({
        let addr = b.local_addr();
        move || {
            let mut c = connect(addr);
            let mut n = 0;
            while began.elapsed() < Duration::from_secs(2) {
                n += recv(&mut c, "mail", &["COUNT", "5"]).len();
            }
            n
        }
    });
    let (popped, received) = (popper.join().unwrap(), receiver.join().unwrap());
    let secs = from_full.elapsed().as_secs_f64();
    let most = 10.0 + 10.0 * secs + 1.0;
    assert!(
        ((burst + popped + received) as f64) <= most,
        "{burst} + {popped} popped + {received} received in {secs:.2} s from a full bucket (at most {most:.0})"
    );
    assert!(popped >= 1 && received >= 1, "both had some: {popped} popped, {received} received");
    assert!(qinfo(&mut c, "mail")["held_by_rate"].parse::<i64>().unwrap() > 0);
    // Lifted: the rest at once.
    assert_eq!(q::<String>(&mut c, &["QALTER", "mail", "RATE", "0"]), "OK");
    let left = 200 - 10 - popped - received;
    let rest = (0..left).filter(|_| q::<Option<(i64, String, Vec<u8>)>>(&mut c, &["POP", "mail"]).is_some()).count();
    assert_eq!(rest, left);
}

#[test]
fn rate_holds_across_processes() {
    let pg = Postgres::start().unwrap();
    let a = start(config(&pg));
    let b = start(config(&pg));
    let mut c = connect(a.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "mail"]), "OK");
    send_n(&mut c, "mail", 100);
    assert_eq!(q::<String>(&mut c, &["QALTER", "mail", "RATE", "10/s"]), "OK");
    let began = Instant::now();
    // Two receivers, one on each process, asking as fast as they can for 2 s.
    let hammer = |addr| {
        std::thread::spawn(move || {
            let mut c = connect(addr);
            let mut n = 0;
            while began.elapsed() < Duration::from_secs(2) {
                n += recv(&mut c, "mail", &["COUNT", "10"]).len();
            }
            n
        })
    };
    let (x, y) = (hammer(a.local_addr()), hammer(b.local_addr()));
    let delivered = x.join().unwrap() + y.join().unwrap();
    let secs = began.elapsed().as_secs_f64();
    // A burst of one second's worth, then 10 a second.
    let most = 10.0 + 10.0 * secs + 1.0;
    assert!((delivered as f64) <= most, "{delivered} delivered in {secs:.2} s (at most {most:.0})");
    assert!(delivered > 10, "more than the burst: the bucket refilled; {delivered} delivered in {secs:.2} s");
    let info = qinfo(&mut c, "mail");
    assert_eq!(info["rate_per_sec"], "10");
    assert!(info["held_by_rate"].parse::<i64>().unwrap() > 0, "{info:?}");
    assert_eq!(q::<String>(&mut c, &["QALTER", "mail", "RATE", "90/min"]), "OK");
    assert_eq!(qinfo(&mut c, "mail")["rate_per_sec"], "1.5");
    assert_eq!(q::<String>(&mut c, &["QALTER", "mail", "RATE", "0"]), "OK");
    assert_eq!(recv(&mut c, "mail", &["COUNT", "100"]).len(), 100 - delivered, "lifted: the rest at once");
}

#[test]
fn limits_refuse_what_is_not_a_limit() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs", "CONCURRENCY", "2", "RATE", "5/s"]), "OK");
    let info = qinfo(&mut c, "jobs");
    assert_eq!((info["concurrency"].as_str(), info["rate_per_sec"].as_str()), ("2", "5"));
    assert!(err(&mut c, &["QALTER", "jobs", "CONCURRENCY", "-1"]).contains("CONCURRENCY must be between 0"));
    assert!(err(&mut c, &["QALTER", "jobs", "RATE", "5/fortnight"]).contains("per second, minute or hour"));
    assert!(err(&mut c, &["QALTER", "jobs", "RATE", "0.001/h"]).contains("at least 3.6/h"));
    assert!(err(&mut c, &["QALTER", "jobs", "RATE"]).contains("syntax"));
}

#[test]
fn a_paused_queue_shows_on_metrics_of_every_process() {
    let pg = Postgres::start().unwrap();
    let with_admin = || {
        let mut cfg = config(&pg);
        cfg.stats.admin = Some("127.0.0.1:0".into());
        cfg.queues.maintenance_s = 1;
        cfg.queues.public_queues = vec!["*".into()];
        start(cfg)
    };
    let (a, b) = (with_admin(), with_admin());
    let mut c = connect(a.local_addr());
    for queue in ["jobs", "mail"] {
        assert_eq!(q::<String>(&mut c, &["QCREATE", queue]), "OK");
    }
    let paused = |mq: &mwmq::Mq| {
        let (_, page) = mctest::http_get(mq.admin_addr().unwrap(), "/metrics");
        let count = page.lines().find(|l| l.starts_with("mwmq_queues_paused ")).map(str::to_string);
        let named: Vec<String> =
            page.lines().filter(|l| l.starts_with("mwmq_queue_paused{")).map(str::to_string).collect();
        (count.unwrap_or_default(), named)
    };
    assert_eq!(paused(&a).0, "mwmq_queues_paused 0");
    assert_eq!(q::<String>(&mut c, &["QPAUSE", "jobs"]), "OK");
    assert_eq!(paused(&a), ("mwmq_queues_paused 1".into(), vec!["mwmq_queue_paused{queue=\"jobs\"} 1".to_string()]));
    assert!(eventually(Duration::from_secs(10), || paused(&b).0 == "mwmq_queues_paused 1"), "the other process too");
    let mut other = connect(b.local_addr());
    assert_eq!(q::<String>(&mut other, &["QRESUME", "jobs"]), "OK");
    assert_eq!(paused(&b).0, "mwmq_queues_paused 0");
    assert!(eventually(Duration::from_secs(10), || paused(&a).0 == "mwmq_queues_paused 0"));
}

/// A limited queue's RECVs go straight to its own statement once it is known
/// not to be plain: one statement a RECV, not the plain one first.
#[test]
fn a_limited_queues_recvs_skip_the_plain_statement() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs", "CONCURRENCY", "100"]), "OK");
    send_n(&mut c, "jobs", 20);
    let before = info_field(&mut c, "db_statements");
    let t0 = Instant::now();
    for _ in 0..10 {
        assert_eq!(recv(&mut c, "jobs", &[]).len(), 1);
    }
    let took = t0.elapsed();
    let used = info_field(&mut c, "db_statements") - before;
    // The first RECV tries the plain statement, then the queue's own; the
    // nine after it only the latter while it is remembered (a second; a RECV
    // after that tries the plain one again, and is remembered from there, so
    // one more for every whole second the RECVs took); and the INFO itself.
    // (Without the memory: 2 a RECV.)
    let remembered = mwmq::queues::NOT_PLAIN_FOR;
    let extra = (took.as_nanos() / remembered.as_nanos()) as u64;
    assert!(used <= 12 + extra, "{used} statements for 10 RECVs in {took:?}");
    // Lifted, it is plain again within a second.
    assert_eq!(q::<String>(&mut c, &["QALTER", "jobs", "CONCURRENCY", "0"]), "OK");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(recv(&mut c, "jobs", &["COUNT", "10"]).len(), 10, "the rest");
}
