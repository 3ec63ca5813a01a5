//! Queues spread over several PostgreSQL databases (`[[databases]]`): each
//! queue lives on the one rendezvous hashing of its name picks, every
//! command finds it there, QLIST asks them all, queues that exchange
//! messages must share a database (hash tags), and a database that goes
//! down takes only its own queues with it.

mod common;

use common::*;
use mwmq::config::DatabaseEntry;
use mwmq::placement::Placement;
use mwmq::Service;
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn spread_over(pgs: &[&Postgres]) -> mwmq::Config {
    let mut c = config_for("");
    c.databases = pgs
        .iter()
        .enumerate()
        .map(|(i, pg)| DatabaseEntry { name: format!("db{i}"), url: pg.conninfo().to_string(), drain: false })
        .collect();
    c
}

/// The schedules a database holds, and their queues.
fn schedules_in(pg: &Postgres) -> HashSet<(String, String)> {
    let mut c = sql(pg);
    c.query("SELECT s.name, q.name FROM mwmq_schedules s JOIN mwmq_queues q ON q.id = s.queue_id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The queues (not dropped) a database holds.
fn queues_in(pg: &Postgres) -> HashSet<String> {
    let mut c = sql(pg);
    c.query("SELECT name FROM mwmq_queues WHERE dropped_at IS NULL", &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

#[test]
fn queues_are_spread_over_three_databases_and_every_command_finds_its_own() {
    let (a, b, c3) = (Postgres::start().unwrap(), Postgres::start().unwrap(), Postgres::start().unwrap());
    let pgs = [&a, &b, &c3];
    let mq = start(spread_over(&pgs));
    let addr = mq.local_addr();
    let mut c = connect(addr);
    assert_eq!(info_field(&mut c, "databases"), 3);
    let placement = Placement::new(vec!["db0".into(), "db1".into(), "db2".into()]);
    let names: Vec<String> = (0..30).map(|i| format!("q{i}")).collect();
    for name in &names {
        let _: String = q(&mut c, &["QCREATE", name]);
    }
    // Each queue is in the database placement names, and only there.
    for (i, pg) in pgs.iter().enumerate() {
        let held = queues_in(pg);
        let expected: HashSet<String> = names.iter().filter(|q| placement.home(q) == i).cloned().collect();
        assert_eq!(held, expected, "database {i}");
        assert!(!held.is_empty(), "every database holds some of 30 queues");
    }
    // QLIST asks them all (sorted, as one).
    let mut listed: Vec<String> = q(&mut c, &["QLIST"]);
    let mut all = names.clone();
    all.sort();
    assert_eq!(listed, all);
    listed.dedup();
    assert_eq!(listed.len(), 30);

    // Concurrent SENDs to queues of every database (the engines gather them
    // into statements per database), then each message received once.
    let senders: Vec<_> = (0..4)
        .map(|t| {
            let names = names.clone();
            std::thread::spawn(move || {
                let mut c = connect(addr);
                let mut sent = Vec::new();
                for n in 0..60 {
                    let name = &names[(t * 7 + n) % names.len()];
                    let id: i64 = q(&mut c, &["SEND", name, &format!("{t}-{n}")]);
                    sent.push((name.clone(), id));
                }
                sent
            })
        })
        .collect();
    let sent: Vec<(String, i64)> = senders.into_iter().flat_map(|s| s.join().unwrap()).collect();
    let mut got = Vec::new();
    for name in &names {
        loop {
            let batch = recv(&mut c, name, &["COUNT", "50"]);
            if batch.is_empty() {
                break;
            }
            for (id, lease, _, _) in &batch {
                assert_eq!(q::<i64>(&mut c, &["ACK", name, &id.to_string(), &lease.to_string()]), 1);
                got.push((name.clone(), *id));
            }
        }
        assert_eq!(q::<i64>(&mut c, &["QLEN", name]), 0);
    }
    let want: HashSet<_> = sent.iter().cloned().collect();
    let have: HashSet<_> = got.iter().cloned().collect();
    assert_eq!(sent.len(), 240);
    assert_eq!(got.len(), 240, "each message once");
    assert_eq!(want, have);

    // POP, PEEK, QINFO, TOUCH, NACK on a queue of each database.
    for i in 0..3 {
        let name = names.iter().find(|n| placement.home(n) == i).unwrap();
        let id: i64 = q(&mut c, &["SEND", name, "x", "KEY", "k1"]);
        assert_eq!(q::<i64>(&mut c, &["SEND", name, "x", "KEY", "k1"]), id, "the key is found on {name}'s database");
        let info: Vec<redis::Value> = q(&mut c, &["QINFO", name]);
        assert!(!info.is_empty());
        let (got_id, lease, _, _) = recv(&mut c, name, &["VT", "60000"]).pop().expect("the message");
        assert_eq!(got_id, id);
        assert_eq!(q::<i64>(&mut c, &["TOUCH", name, &id.to_string(), &lease.to_string(), "60000"]), 1);
        assert_eq!(q::<i64>(&mut c, &["NACK", name, &id.to_string(), &lease.to_string()]), 1);
        let popped: Option<(i64, String, Vec<u8>)> = q(&mut c, &["POP", name]);
        assert_eq!(popped.map(|p| p.0), Some(id));
    }

    // A long poll on a queue of the last database, woken by a SEND.
    let q2 = names.iter().find(|q| placement.home(q) == 2).unwrap().clone();
    let waiter = {
        let q2 = q2.clone();
        std::thread::spawn(move || {
            let mut c = connect(addr);
            recv(&mut c, &q2, &["WAIT", "30000"])
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let id: i64 = q(&mut c, &["SEND", &q2, "wake"]);
    // Before the end of its wait (which answers nothing).
    let got = waiter.join().unwrap();
    assert_eq!(got.first().map(|m| m.0), Some(id), "the waiting RECV got the SEND");

    // QDROP removes it from its database only.
    let _: String = q(&mut c, &["QDROP", &q2]);
    assert!(!queues_in(pgs[2]).contains(&q2));
    assert_eq!(q::<Vec<String>>(&mut c, &["QLIST"]).len(), 29);
    mq.stopper().stop();
    mq.join();
}

/// A queue and its dead-letter queue must live on one database (a RECV
/// moves dead letters in its own statement): names placed apart are
/// refused with the way out, a hash tag; with one, dead letters flow.
#[test]
fn dead_letters_stay_with_their_queue() {
    let (a, b) = (Postgres::start().unwrap(), Postgres::start().unwrap());
    let mq = start(spread_over(&[&a, &b]));
    let mut c = connect(mq.local_addr());
    let placement = Placement::new(vec!["db0".into(), "db1".into()]);
    let (jq, dlq) = (0..100)
        .map(|i| (format!("jobs{i}"), format!("dead{i}")))
        .find(|(q, d)| placement.home(q) != placement.home(d))
        .expect("two names placed apart");
    let _: String = q(&mut c, &["QCREATE", &dlq]);
    let e = err(&mut c, &["QCREATE", &jq, "MAXDELIVERIES", "1", "DEADLETTER", &dlq]);
    assert!(e.contains("hash tag") && e.contains(&format!("'{{{jq}}}.")), "{e}");
    let _: String = q(&mut c, &["QCREATE", &jq]);
    let e = err(&mut c, &["QALTER", &jq, "DEADLETTER", &dlq]);
    assert!(e.contains("hash tag"), "{e}");
    let e = err(&mut c, &["REDRIVE", &dlq, "TO", &jq]);
    assert!(e.contains("hash tag"), "{e}");

    // With a hash tag they live together, and a poison message moves over.
    let (jobs, dead) = ("{orders}.jobs", "{orders}.dead");
    assert_eq!(placement.home(jobs), placement.home(dead));
    let _: String = q(&mut c, &["QCREATE", dead]);
    let _: String = q(&mut c, &["QCREATE", jobs, "MAXDELIVERIES", "1", "DEADLETTER", dead]);
    let id: i64 = q(&mut c, &["SEND", jobs, "poison"]);
    assert_eq!(recv(&mut c, jobs, &["VT", "50"]).len(), 1);
    std::thread::sleep(Duration::from_millis(100));
    assert!(recv(&mut c, jobs, &[]).is_empty(), "delivered once too often: dead-lettered");
    let moved: Option<(i64, String, Vec<u8>)> = q(&mut c, &["POP", dead]);
    assert_eq!(moved.map(|m| m.2), Some(b"poison".to_vec()), "message {id} is in the dead-letter queue");
    mq.stopper().stop();
    mq.join();
}

/// One database down: its queues answer -TRYAGAIN, the others' go on; back
/// up, its queues work again.
#[test]
fn a_database_down_takes_only_its_own_queues() {
    let (a, b) = (Postgres::start().unwrap(), Postgres::start().unwrap());
    let mq = start(spread_over(&[&a, &b]));
    let mut c = connect(mq.local_addr());
    let placement = Placement::new(vec!["db0".into(), "db1".into()]);
    let on = |i: usize| (0..100).map(|n| format!("q{n}")).find(|q| placement.home(q) == i).unwrap();
    let (qa, qb) = (on(0), on(1));
    let _: String = q(&mut c, &["QCREATE", &qa]);
    let _: String = q(&mut c, &["QCREATE", &qb]);
    b.stop().unwrap();
    let e = err(&mut c, &["SEND", &qb, "x"]);
    assert!(e.starts_with("TRYAGAIN"), "{e}");
    let id: i64 = q(&mut c, &["SEND", &qa, "still served"]);
    assert!(id > 0);
    assert_eq!(info_field(&mut c, "db_up"), 0);
    b.restart("fast").unwrap();
    let t0 = Instant::now();
    loop {
        match redis::cmd("SEND").arg(&qb).arg("back").query::<i64>(&mut c) {
            Ok(_) => break,
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(20), "{qb} is not served again: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(q::<i64>(&mut c, &["QLEN", &qa]), 1);
    assert_eq!(q::<i64>(&mut c, &["QLEN", &qb]), 1);
    mq.stopper().stop();
    mq.join();
}

/// A database added to the list: the queues that placement now puts on it
/// stay served where they are (INFO counts them), `mwmq rebalance` moves
/// them while a sender keeps sending (KEYs included), and afterwards every
/// message answered with an id is received, a retried KEY finds its id, and
/// each database holds exactly its own queues.
#[test]
fn a_database_added_and_rebalanced_while_serving_loses_nothing() {
    let (a, b, c3) = (Postgres::start().unwrap(), Postgres::start().unwrap(), Postgres::start().unwrap());
    let names: Vec<String> = (0..24).map(|i| format!("q{i}")).collect();
    // Two databases: the queues, and messages in them.
    let mut sent: Vec<(String, i64)> = Vec::new();
    {
        let mq = start(spread_over(&[&a, &b]));
        let mut c = connect(mq.local_addr());
        for name in &names {
            let _: String = q(&mut c, &["QCREATE", name]);
            for n in 0..5 {
                let id: i64 = q(&mut c, &["SEND", name, &format!("before-{n}"), "KEY", &format!("{name}-k{n}")]);
                sent.push((name.clone(), id));
            }
        }
        mq.stopper().stop();
        mq.join();
    }
    // Three: a third of the queues belong on the new one, not moved yet.
    let cfg = spread_over(&[&a, &b, &c3]);
    let placement = Placement::new(vec!["db0".into(), "db1".into(), "db2".into()]);
    let moving: Vec<&String> = names.iter().filter(|q| placement.home(q) == 2).collect();
    assert!(!moving.is_empty());
    let mq = start(cfg.clone());
    let addr = mq.local_addr();
    let mut c = connect(addr);
    assert_eq!(info_field(&mut c, "queues_not_moved"), moving.len() as u64);
    for name in &names {
        assert_eq!(q::<i64>(&mut c, &["QLEN", name]), 5, "{name} is served where it is");
    }
    assert_eq!(q::<Vec<String>>(&mut c, &["QLIST"]).len(), names.len());
    // A sender keeps sending to every queue while they move.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (names, stop) = (names.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut c = connect(addr);
            let mut sent = Vec::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = &names[n % names.len()];
                let key = format!("during-{n}");
                // A KEY retried until answered: an error may have committed.
                let t0 = Instant::now();
                loop {
                    match redis::cmd("SEND").arg(name).arg(&key).arg("KEY").arg(&key).query::<i64>(&mut c) {
                        Ok(id) => {
                            sent.push((name.clone(), id));
                            break;
                        }
                        Err(e) => {
                            assert!(t0.elapsed() < Duration::from_secs(20), "SEND {name} {key}: {e}");
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            sent
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let report = mwmq::rebalance::run(&cfg, false, Duration::from_millis(1_500)).expect("rebalance");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sent.extend(sender.join().unwrap());
    assert_eq!(report.lines().filter(|l| l.starts_with("moved ")).count(), moving.len(), "{report}");
    // Each database holds exactly its own queues now; nothing left to move.
    for (i, pg) in [&a, &b, &c3].iter().enumerate() {
        let expected: HashSet<String> = names.iter().filter(|q| placement.home(q) == i).cloned().collect();
        assert_eq!(queues_in(pg), expected, "database {i}");
    }
    assert!(mwmq::rebalance::plan(&cfg).unwrap().is_empty());
    // mwmq's directory thread (every second) sees them where they are now.
    assert!(
        eventually(Duration::from_secs(30), || info_field(&mut c, "queues_not_moved") == 0),
        "queues_not_moved still {} 30 s after the rebalance",
        info_field(&mut c, "queues_not_moved")
    );
    // A KEY sent before the move finds its message's id on the new database.
    let name = moving[0];
    let first = sent.iter().find(|(q, _)| q == name).unwrap().1;
    assert_eq!(q::<i64>(&mut c, &["SEND", name, "again", "KEY", &format!("{name}-k0")]), first);
    // Every message answered with an id is received.
    let mut got: HashSet<(String, i64)> = HashSet::new();
    for name in &names {
        loop {
            let batch = recv(&mut c, name, &["COUNT", "100"]);
            if batch.is_empty() {
                break;
            }
            for (id, lease, _, _) in batch {
                let _: i64 = q(&mut c, &["ACK", name, &id.to_string(), &lease.to_string()]);
                got.insert((name.clone(), id));
            }
        }
    }
    let lost: Vec<_> = sent.iter().filter(|s| !got.contains(s)).collect();
    assert!(lost.is_empty(), "{} of {} answered SENDs not received: {lost:?}", lost.len(), sent.len());
    assert!(sent.len() > names.len() * 5, "the sender sent during the move");
    mq.stopper().stop();
    mq.join();
}

/// Removing a database: `drain = true` places nothing on it, its queues are
/// served where they are, and `mwmq rebalance` moves them to the others,
/// with their settings (a backoff) and their messages' priorities.
#[test]
fn a_drained_database_is_emptied_by_rebalance() {
    let (a, b) = (Postgres::start().unwrap(), Postgres::start().unwrap());
    let names: Vec<String> = (0..16).map(|i| format!("q{i}")).collect();
    let (mut sent, mut archived) = (Vec::new(), Vec::new());
    {
        let mq = start(spread_over(&[&a, &b]));
        let mut c = connect(mq.local_addr());
        for name in &names {
            // Each retains what is acknowledged and has a backoff: one
            // message acknowledged, two waiting (the later of a higher priority).
            let _: String = q(&mut c, &["QCREATE", name, "RETAIN", "600000", "BACKOFF", "500", "9000", "JITTER", "5"]);
            let _: i64 = q(&mut c, &["SEND", name, "acked"]);
            let got = recv(&mut c, name, &[]);
            let _: i64 = q(&mut c, &["ACK", name, &got[0].0.to_string(), &got[0].1.to_string()]);
            archived.push((name.clone(), got[0].0));
            let _: i64 = q(&mut c, &["SEND", name, "low"]);
            let id: i64 = q(&mut c, &["SEND", name, "kept", "PRIORITY", "2"]);
            sent.push((name.clone(), id));
            let _: String = q(
                &mut c,
                &["QSCHEDULE", &format!("s-{name}"), name, "@yearly", "x", "PRIORITY", "4", "GROUP", "g", "DELAY", "5"],
            );
        }
        // A schedule lives with its queue; its name is one on every database.
        for pg in [&a, &b] {
            let want: HashSet<(String, String)> = queues_in(pg).into_iter().map(|q| (format!("s-{q}"), q)).collect();
            assert_eq!(schedules_in(pg), want);
        }
        let on_b = names.iter().find(|n| queues_in(&b).contains(*n)).unwrap();
        let on_a = names.iter().find(|n| queues_in(&a).contains(*n)).unwrap();
        let e = err(&mut c, &["QSCHEDULE", &format!("s-{on_b}"), on_a, "@daily", "x"]);
        assert!(e.contains(&format!("schedule 's-{on_b}' exists on database 'db1'")), "{e}");
        let listed: Vec<Vec<redis::Value>> = q(&mut c, &["QSCHEDULES"]);
        assert_eq!(listed.len(), 16, "QSCHEDULES asks both databases");
        let _: String = q(&mut c, &["QSCHEDULE", "gone", on_b, "@daily", "x"]);
        assert_eq!(q::<i64>(&mut c, &["QUNSCHEDULE", "gone"]), 1, "QUNSCHEDULE finds it where it is");
        mq.stopper().stop();
        mq.join();
    }
    assert!(!queues_in(&b).is_empty());
    let mut cfg = spread_over(&[&a, &b]);
    cfg.databases[1].drain = true;
    let mq = start(cfg.clone());
    let mut c = connect(mq.local_addr());
    for name in &names {
        assert_eq!(q::<i64>(&mut c, &["QLEN", name]), 2, "{name} is served where it is");
    }
    for i in 0..10 {
        let _: String = q(&mut c, &["QCREATE", &format!("new{i}")]);
    }
    assert!(queues_in(&b).iter().all(|q| q.starts_with('q')), "nothing new is placed on a drained database");
    let report = mwmq::rebalance::run(&cfg, false, Duration::from_millis(1_200)).expect("rebalance");
    assert!(queues_in(&b).is_empty(), "{report}");
    // Served on the database they moved to once mwmq's directory thread
    // (every second) has seen them there.
    assert!(
        eventually(Duration::from_secs(30), || info_field(&mut c, "queues_not_moved") == 0),
        "queues_not_moved still {} 30 s after the rebalance",
        info_field(&mut c, "queues_not_moved")
    );
    for (name, id) in &sent {
        let got = recv(&mut c, name, &[]);
        assert_eq!(got.first().map(|m| m.0), Some(*id), "{name}: its priority moved with it");
        assert_eq!(qinfo(&mut c, name)["backoff_base_ms"], "500", "{name}: its backoff moved with it");
    }
    // The archives moved with their queues.
    for (name, id) in &archived {
        let rows: Vec<Vec<redis::Value>> = q(&mut c, &["QARCHIVE", name]);
        let kept: Vec<(i64, Vec<u8>)> = rows
            .iter()
            .map(|r| (redis::from_redis_value(&r[0]).unwrap(), redis::from_redis_value(&r[2]).unwrap()))
            .collect();
        assert_eq!(kept, [(*id, b"acked".to_vec())], "{name}");
    }
    let left: i64 = sql_at(b.conninfo()).query_one("SELECT count(*) FROM mwmq_archive", &[]).unwrap().get(0);
    assert_eq!(left, 0, "nothing archived is left on the drained database");
    // The schedules moved with their queues.
    assert!(schedules_in(&b).is_empty(), "no schedule left on the drained database");
    let want: HashSet<(String, String)> = names.iter().map(|q| (format!("s-{q}"), q.clone())).collect();
    assert_eq!(schedules_in(&a), want);
    let options: Vec<(i16, Option<String>, i64)> = sql_at(a.conninfo())
        .query("SELECT priority, grp, delay_ms FROM mwmq_schedules", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(options.iter().all(|o| *o == (4, Some("g".into()), 5)), "PRIORITY, GROUP and DELAY moved: {options:?}");
    mq.stopper().stop();
    mq.join();
}

#[test]
fn streams_live_where_their_names_hash_and_commands_across_databases_are_refused() {
    let (a, b) = (Postgres::start().unwrap(), Postgres::start().unwrap());
    let cfg = spread_over(&[&a, &b]);
    let placement = Placement::of(&cfg);
    let mq = common::start(cfg);
    let mut c = connect(mq.local_addr());
    // Two names placed apart, and two kept together by a hash tag.
    let names: Vec<String> = (0..64).map(|i| format!("s{i}")).collect();
    let first = &names[0];
    let other = names.iter().find(|n| placement.home(n) != placement.home(first)).expect("a name placed elsewhere");
    for n in [first, other] {
        let _: String = q(&mut c, &["XADD", n, "*", "k", "v"]);
        let db = if placement.home(n) == 0 { &a } else { &b };
        let rows: i64 = sql(db).query_one("SELECT count(*) FROM mwmq_streams WHERE name = $1", &[n]).unwrap().get(0);
        assert_eq!(rows, 1, "{n} is on the database its name hashes to");
    }
    let e = err(&mut c, &["XREAD", "STREAMS", first, other, "0", "0"]);
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    let (t1, t2) = ("{orders}.in", "{orders}.retry");
    let _: String = q(&mut c, &["XADD", t1, "*", "k", "v"]);
    let _: String = q(&mut c, &["XADD", t2, "*", "k", "v"]);
    let r: redis::Value = redis::cmd("XREAD").arg(&["STREAMS", t1, t2, "0", "0"]).query(&mut c).unwrap();
    assert!(matches!(&r, redis::Value::Array(s) if s.len() == 2), "{r:?}");
}
