//! Periodic jobs (`QSCHEDULE`, `QUNSCHEDULE`, `QSCHEDULES`): one message
//! per tick across every mwmq process on the database, through a SIGKILL
//! and a PostgreSQL restart; missed ticks as CATCHUP says after every mwmq
//! was down; the refusals (an expression that never fires, a bad time
//! zone, a schedule flood, rights, an option given twice); ticks skipped
//! while the owner may not send them; PRIORITY, GROUP and DELAY on each
//! tick; QSCHEDULES' bound counting only what it shows.
//!
//! Ticks are counted, never timed: each message carries its tick (`{tick}`
//! in the body, to the second), and what must have been sent is read off
//! the database's clock, which the test reads itself before and after.

mod common;

use common::*;
use mwmq::Service;
use std::collections::BTreeMap;
use std::time::Duration;

/// The database's clock, in whole seconds since the epoch (rounded down).
fn db_second(db: &mut postgres::Client) -> i64 {
    db.query_one("SELECT floor(extract(epoch FROM now()))::bigint", &[]).unwrap().get(0)
}

/// Every message of `queue` by its tick (the body is `tick <tick>`, the
/// tick read back as seconds since the epoch): how many times each tick
/// was sent, read with SQL (nothing taken).
fn ticks_in(db: &mut postgres::Client, queue: &str) -> BTreeMap<i64, usize> {
    let rows = db
        .query(
            "SELECT extract(epoch FROM substr(convert_from(m.body, 'UTF8'), 6)::timestamptz)::bigint
             FROM mwmq_messages m JOIN mwmq_queues q ON q.id = m.queue_id
             WHERE q.name = $1 AND q.dropped_at IS NULL",
            &[&queue],
        )
        .unwrap();
    let mut ticks = BTreeMap::new();
    for r in rows {
        *ticks.entry(r.get::<_, i64>(0)).or_insert(0) += 1;
    }
    ticks
}

/// Waits until schedule `name` sent its tick of second `s` (or a later one).
fn until_sent(db: &mut postgres::Client, name: &str, s: i64, what: &str) {
    assert!(
        eventually(Duration::from_secs(30), || {
            let r = db
                .query_opt(
                    "SELECT coalesce(extract(epoch FROM last_tick)::bigint, 0) FROM mwmq_schedules WHERE name = $1",
                    &[&name],
                )
                .unwrap();
            r.is_some_and(|r| r.get::<_, i64>(0) >= s)
        }),
        "{what}: schedule {name} did not send its tick of {s} within 30 s"
    );
}

#[test]
fn refusals_rights_and_the_listing() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    let mut small = user("small", "small-pw", &["*"], &["*"], &["small.*"]);
    small.max_schedules = 3;
    small.max_body = Some(100);
    cfg.users = vec![
        user("owner", "owner-pw", &["*"], &["*"], &["*"]),
        small,
        user("reader", "reader-pw", &[], &["small.*"], &[]),
    ];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut owner = login(addr, "owner", "owner-pw");
    let mut small = login(addr, "small", "small-pw");
    let mut reader = login(addr, "reader", "reader-pw");
    for queue in ["small.a", "small.b", "other"] {
        let _: String = q(&mut owner, &["QCREATE", queue]);
    }

    // What a client gets wrong is named.
    let refused = |c: &mut redis::Connection, args: &[&str]| err(c, args);
    assert!(
        refused(&mut small, &["QSCHEDULE", "s", "small.a", "0 0 30 2 *", "b"]).contains("never fires"),
        "February 30th"
    );
    assert_eq!(
        refused(&mut small, &["QSCHEDULE", "s", "small.a", "@daily", "b", "TZ", "Europe/Atlantis"]),
        "ERR unknown time zone 'Europe/Atlantis' (an IANA name such as Europe/Berlin or UTC)"
    );
    assert!(refused(&mut small, &["QSCHEDULE", "s", "small.a", "61 * * * *", "b"])
        .starts_with("ERR cron expression '61 * * * *'"));
    assert!(refused(&mut small, &["QSCHEDULE", "s", "small.a", "every day", "b"]).contains("has 2 fields"));
    assert_eq!(
        refused(&mut small, &["QSCHEDULE", "s", "small.a", "@daily", "b", "CATCHUP", "most"]),
        "ERR CATCHUP must be none, one or all"
    );
    assert_eq!(
        refused(&mut small, &["QSCHEDULE", "s", "small.a", "@daily"]),
        "ERR wrong number of arguments for 'QSCHEDULE' command"
    );
    assert_eq!(
        refused(&mut small, &["QSCHEDULE", "s", "small.none", "@daily", "b"]),
        "NOQUEUE no such queue 'small.none'"
    );
    // Rights: the admin right on the queue.
    assert_eq!(
        refused(&mut small, &["QSCHEDULE", "s", "other", "@daily", "b"]),
        "NOPERM User small has no permissions to administer queue 'other'"
    );
    assert!(refused(&mut small, &["QSCHEDULE", "s", "small.a", "@daily", &"x".repeat(101)]).contains("(max_body)"));
    // Each message carries its tick where the body says `{tick}`: 60 bytes
    // that send 200 are over a max_body of 100 too.
    assert!(refused(&mut small, &["QSCHEDULE", "s", "small.a", "@daily", &"{tick}".repeat(10)])
        .contains("a body of 200 bytes (with {tick} replaced) is over user small's limit of 100 bytes (max_body)"));

    // A flood: max_schedules 3.
    for i in 0..3 {
        let _: String = q(&mut small, &["QSCHEDULE", &format!("s{i}"), "small.a", "@hourly", "b"]);
    }
    assert_eq!(
        refused(&mut small, &["QSCHEDULE", "s3", "small.b", "@hourly", "b"]),
        "OVERQUOTA user small may have at most 3 schedules (max_schedules)"
    );
    // Replacing one of its own is no new schedule.
    let _: String =
        q(&mut small, &["QSCHEDULE", "s0", "small.b", "*/5 * * * *", "b", "TZ", "Asia/Tokyo", "CATCHUP", "all"]);
    // The owner's schedule to a queue small does not administer: small may
    // neither replace nor remove it.
    let _: String = q(&mut owner, &["QSCHEDULE", "o", "other", "@daily", "b"]);
    assert_eq!(
        refused(&mut small, &["QSCHEDULE", "o", "small.a", "@daily", "b"]),
        "NOPERM User small has no permissions to administer the queue schedule 'o' sends to"
    );
    assert_eq!(
        refused(&mut small, &["QUNSCHEDULE", "o"]),
        "NOPERM User small has no permissions to administer the queue schedule 'o' sends to"
    );
    assert_eq!(q::<i64>(&mut small, &["QUNSCHEDULE", "nothing"]), 0);
    // Two schedules with one KEY prefix on one queue would take each other's
    // ticks for their own (the second's were counted sent, never sent).
    let _: String = q(&mut owner, &["QSCHEDULE", "k1", "other", "@daily", "one", "KEY", "same:"]);
    assert_eq!(
        refused(&mut owner, &["QSCHEDULE", "k2", "other", "@daily", "two", "KEY", "same:"]),
        "ERR another schedule of queue 'other' has the KEY prefix 'same:': give this one a KEY of its own"
    );
    let _: String = q(&mut owner, &["QSCHEDULE", "k1", "other", "@hourly", "one again", "KEY", "same:"]);
    assert_eq!(q::<i64>(&mut owner, &["QUNSCHEDULE", "k1"]), 1);

    // QSCHEDULES: those of the queues the user may see, by name.
    let names = |c: &mut redis::Connection| -> Vec<(String, String)> {
        let all: Vec<std::collections::HashMap<String, redis::Value>> = q(c, &["QSCHEDULES"]);
        all.iter()
            .map(|m| {
                let text = |k: &str| match &m[k] {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => format!("{other:?}"),
                };
                (text("name"), text("queue"))
            })
            .collect()
    };
    let all = names(&mut owner);
    assert_eq!(all.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["o", "s0", "s1", "s2"]);
    assert_eq!(all[1].1, "small.b", "s0 replaced");
    assert_eq!(names(&mut reader).len(), 3, "reader sees small.* only");
    let listed: Vec<std::collections::HashMap<String, redis::Value>> = q(&mut reader, &["QSCHEDULES"]);
    let s0 = &listed[0];
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => *i,
        other => panic!("{other:?}"),
    };
    assert_eq!(s0["tz"], redis::Value::BulkString(b"Asia/Tokyo".to_vec()));
    assert_eq!(s0["catchup"], redis::Value::BulkString(b"all".to_vec()));
    assert_eq!(s0["created_by"], redis::Value::BulkString(b"small".to_vec()));
    assert_eq!(s0["last_run_ms"], redis::Value::Nil);
    let next = int(&s0["next_run_ms"]);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!(next > now_ms - 5_000 && next <= now_ms + 5 * 60_000 + 5_000, "next run of */5: {next} vs {now_ms}");
    assert_eq!(next % 300_000, 0, "on a five-minute mark");
    // Removing one frees a place.
    assert_eq!(q::<i64>(&mut small, &["QUNSCHEDULE", "s1"]), 1);
    let _: String = q(&mut small, &["QSCHEDULE", "s3", "small.b", "@hourly", "b"]);
    mq.stopper().stop();
    mq.join();
}

/// The ticks of schedule `every` (each second) from `from` to `to`: each
/// sent exactly once; none before `never_before`; none sent twice ever.
fn each_once(ticks: &BTreeMap<i64, usize>, never_before: i64, from: i64, to: i64, what: &str) {
    let doubled: Vec<_> = ticks.iter().filter(|(_, n)| **n != 1).collect();
    assert!(doubled.is_empty(), "{what}: ticks sent more than once: {doubled:?}");
    let early: Vec<_> = ticks.keys().filter(|t| **t <= never_before).collect();
    assert!(early.is_empty(), "{what}: ticks from before the schedule was made: {early:?}");
    let lost: Vec<i64> = (from..=to).filter(|t| !ticks.contains_key(t)).collect();
    assert!(lost.is_empty(), "{what}: ticks lost: {lost:?} (of {from}..={to}; sent {:?})", ticks.keys());
}

#[test]
fn one_message_per_tick_across_three_processes_through_sigkill_and_a_postgres_restart() {
    let pg = Postgres::start().unwrap();
    let mut procs: Vec<MqProcess> = (0..3).map(|_| MqProcess::start(&pg, 0, &[])).collect();
    let mut c = connect(procs[0].addr);
    let _: String = q(&mut c, &["QCREATE", "ticks"]);
    let mut db = sql(&pg);
    // Ticks up to `before` came before the schedule; from `first` on it owes each.
    let before = db_second(&mut db);
    let _: String = q(&mut c, &["QSCHEDULE", "every", "ticks", "* * * * * *", "tick {tick}"]);
    let first = db_second(&mut db) + 1;
    until_sent(&mut db, "every", first + 1, "three processes");

    // SIGKILL two of them, one after the other, each at an arbitrary moment
    // of its ticker's passes, started again after a tick went by.
    for victim in [1, 0] {
        let port = procs[victim].addr.port();
        procs[victim].kill();
        let now = db_second(&mut db);
        until_sent(&mut db, "every", now + 1, "after a SIGKILL");
        procs[victim] = MqProcess::start(&pg, port, &[]);
    }

    // PostgreSQL restarts (immediate: in-flight transactions are lost).
    let now = db_second(&mut db);
    until_sent(&mut db, "every", now + 1, "before the restart");
    pg.restart("immediate").unwrap();
    let mut db = sql(&pg);
    let now = db_second(&mut db);
    until_sent(&mut db, "every", now + 2, "after the restart");

    let last = db_second(&mut db);
    until_sent(&mut db, "every", last, "at the end");
    let ticks = ticks_in(&mut db, "ticks");
    each_once(&ticks, before, first, last, "three processes, SIGKILLs, a restart");
    assert!(last - first >= 5, "ran for {} s", last - first);
    // QSCHEDULES says the same (a pool's connections from before the
    // restart answer -TRYAGAIN once).
    let mut c = connect(procs[2].addr);
    let mut listed: Vec<std::collections::HashMap<String, redis::Value>> = Vec::new();
    assert!(eventually(Duration::from_secs(30), || {
        redis::cmd("QSCHEDULES").query(&mut c).map(|l| listed = l).is_ok()
    }));
    let sent = match listed[0]["sent"] {
        redis::Value::Int(n) => n as usize,
        ref other => panic!("{other:?}"),
    };
    assert!(sent >= ticks.range(..=last).count(), "sent {sent}");
    for p in &mut procs {
        p.kill();
    }
}

/// A schedule's counters as QSCHEDULES shows them.
fn counters(c: &mut redis::Connection, name: &str) -> (i64, i64) {
    let listed: Vec<std::collections::HashMap<String, redis::Value>> = q(c, &["QSCHEDULES"]);
    let m = listed
        .iter()
        .find(|m| m["name"] == redis::Value::BulkString(name.as_bytes().to_vec()))
        .unwrap_or_else(|| panic!("{name} listed"));
    let int = |k: &str| match m[k] {
        redis::Value::Int(n) => n,
        ref other => panic!("{k}: {other:?}"),
    };
    (int("sent"), int("missed"))
}

#[test]
fn missed_ticks_follow_catchup_after_every_mwmq_was_down() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.queues.schedule_grace_ms = 2000;
    let mq = start(cfg.clone());
    let mut c = connect(mq.local_addr());
    let mut db = sql(&pg);
    let policies = ["none", "one", "all"];
    let before = db_second(&mut db);
    for p in policies {
        let _: String = q(&mut c, &["QCREATE", p]);
        let _: String = q(&mut c, &["QSCHEDULE", p, p, "* * * * * *", "tick {tick}", "CATCHUP", p]);
    }
    let first = db_second(&mut db) + 1;
    for p in policies {
        until_sent(&mut db, p, first + 1, "before the stop");
    }
    // Every mwmq down for 6 s, three times the grace.
    mq.stopper().stop();
    mq.join();
    let sent_before: Vec<BTreeMap<i64, usize>> = policies.iter().map(|p| ticks_in(&mut db, p)).collect();
    std::thread::sleep(Duration::from_secs(6));
    let up = db_second(&mut db);
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    for p in policies {
        until_sent(&mut db, p, up + 2, "after the start");
    }
    let end = db_second(&mut db);
    for p in policies {
        until_sent(&mut db, p, end, "at the end");
    }
    let mut first_new = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let ticks = ticks_in(&mut db, p);
        let last_before = *sent_before[i].keys().last().unwrap();
        let new: Vec<i64> = ticks.keys().copied().filter(|t| *t > last_before).collect();
        // Whatever the policy: each tick once, and from the first sent after
        // the start on, every one (none missed while a process runs).
        each_once(&ticks, before, first, last_before, p);
        each_once(&ticks, before, new[0], end, p);
        first_new.push(new[0]);
        let (_, missed) = counters(&mut c, p);
        assert_eq!(
            missed,
            new[0] - last_before - 1,
            "{p}: the ticks not sent are counted as missed ({last_before} then {new:?})"
        );
        if *p == "all" {
            assert_eq!(new[0], last_before + 1, "all: every missed tick sent");
        } else {
            assert!(
                new[0] > last_before + 1,
                "{p}: ticks older than the grace were skipped: {last_before} then {new:?}"
            );
        }
    }
    // The three were due in one pass, on one clock: `one` sent the latest
    // missed tick, the one before the first that `none` sent on time.
    assert_eq!(first_new[1], first_new[0] - 1, "one: the latest missed tick, then those on time");
    mq.stopper().stop();
    mq.join();
}

/// A tick as messages carry it (`2026-11-27T19:30:00Z`), from seconds since the epoch.
fn tick_text(db: &mut postgres::Client, s: i64) -> String {
    db.query_one("SELECT to_char(to_timestamp($1::bigint) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')", &[&s])
        .unwrap()
        .get(0)
}

#[test]
fn a_sender_cannot_forge_a_schedules_ticks_by_their_keys() {
    // A user who may only send to the queue reads the KEY prefix in
    // QSCHEDULES, so every future tick's KEY: its SENDs with those keys
    // must not stand in for the schedule's messages.
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![user("owner", "owner-pw", &["*"], &["*"], &["*"]), user("mallory", "m-pw", &["jobs"], &[], &[])];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut owner = login(addr, "owner", "owner-pw");
    let mut mallory = login(addr, "mallory", "m-pw");
    let mut db = sql(&pg);
    let _: String = q(&mut owner, &["QCREATE", "jobs"]);
    let start = db_second(&mut db);
    let forged: Vec<i64> = (start + 6..start + 10).collect();
    for s in &forged {
        let key = format!("beat@{}", tick_text(&mut db, *s));
        let _: i64 = q(&mut mallory, &["SEND", "jobs", "forged", "KEY", &key]);
    }
    let _: String = q(&mut owner, &["QSCHEDULE", "beat", "jobs", "* * * * * *", "tick {tick}"]);
    let made = db_second(&mut db);
    let ticks: Vec<i64> = forged.iter().copied().filter(|s| *s > made).collect();
    assert!(!ticks.is_empty(), "QSCHEDULE took more than 6 s");
    until_sent(&mut db, "beat", *forged.last().unwrap(), "forged keys");
    for s in ticks {
        let body = format!("tick {}", tick_text(&mut db, s));
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM mwmq_messages m JOIN mwmq_queues q ON q.id = m.queue_id
                 WHERE q.name = 'jobs' AND m.sender = 'owner' AND m.body = convert_to($1, 'UTF8')",
                &[&body],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "the schedule's own message for tick {s}, not mallory's");
    }
    mq.stopper().stop();
    mq.join();
}

/// A schedule's state as the database has it: ticks sent, ticks skipped,
/// and why it is suspended.
fn state(db: &mut postgres::Client, name: &str) -> (i64, i64, Option<String>) {
    let r = db.query_one("SELECT sent, skipped, suspended FROM mwmq_schedules WHERE name = $1", &[&name]).unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// Waits until schedule `name` skipped `n` more ticks than `from`, for a reason containing `why`.
fn until_skipped(db: &mut postgres::Client, name: &str, from: i64, n: i64, why: &str) -> (i64, i64, Option<String>) {
    let mut last = state(db, name);
    assert!(
        eventually(Duration::from_secs(30), || {
            last = state(db, name);
            last.1 >= from + n && last.2.as_deref().is_some_and(|r| r.contains(why))
        }),
        "{name}: not {n} ticks skipped for {why:?} within 30 s: {last:?}"
    );
    last
}

/// QSCHEDULES' map of schedule `name`.
fn listed_one(c: &mut redis::Connection, name: &str) -> std::collections::HashMap<String, redis::Value> {
    let listed: Vec<std::collections::HashMap<String, redis::Value>> = q(c, &["QSCHEDULES"]);
    listed
        .into_iter()
        .find(|m| m["name"] == redis::Value::BulkString(name.as_bytes().to_vec()))
        .unwrap_or_else(|| panic!("{name} listed"))
}

/// A configuration file holding `users` (mode 0600: it holds password hashes).
fn users_file(pg: &Postgres, users: &[mwmq::users::UserConfig]) -> std::path::PathBuf {
    let mut doc = toml::Table::new();
    doc.insert("users".into(), toml::Value::try_from(users).unwrap());
    let file = pg.dir().join("users.toml");
    std::fs::write(&file, toml::to_string(&doc).unwrap()).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    file
}

/// A schedule sends as its creator, whose rights live in each process's
/// configuration: it went on sending after mwmq was restarted with a
/// configuration that took the admin right from its owner, or dropped the
/// owner. Now the process holding a tick checks the owner with its own
/// users: the tick is skipped (counted, not sent), the schedule shown
/// suspended with why, a warning logged once; it sends again once the
/// owner may.
#[test]
fn a_schedule_whose_owner_lost_the_right_skips_its_ticks_and_says_why() {
    let pg = Postgres::start().unwrap();
    let mut db = sql(&pg);
    let owner = user("owner", "owner-pw", &["*"], &["*"], &["*"]);
    let alice = user("alice", "alice-pw", &["jobs"], &[], &["jobs"]);
    let mut cfg = config(&pg);
    cfg.users = vec![owner.clone(), alice.clone()];
    let mq = start(cfg.clone());
    let mut a = login(mq.local_addr(), "alice", "alice-pw");
    let _: String = q(&mut a, &["QCREATE", "jobs"]);
    let _: String = q(&mut a, &["QSCHEDULE", "beat", "jobs", "* * * * * *", "tick {tick}"]);
    let first = db_second(&mut db) + 1;
    until_sent(&mut db, "beat", first + 1, "alice's schedule");
    mq.stopper().stop();
    mq.join();
    let sent_before = ticks_in(&mut db, "jobs");
    let last_before = *sent_before.keys().last().unwrap();
    let (sent, skipped, why) = state(&mut db, "beat");
    assert_eq!((skipped, why), (0, None));

    // Restarted with alice's admin right gone (she may still send).
    let mut no_admin = cfg.clone();
    no_admin.users[1].admin.clear();
    let mq = start(no_admin);
    let (_, skipped, _) =
        until_skipped(&mut db, "beat", 0, 1, "its owner alice has no permissions to administer queue 'jobs'");
    let mut o = login(mq.local_addr(), "owner", "owner-pw");
    let shown = listed_one(&mut o, "beat");
    assert_eq!(shown["state"], redis::Value::BulkString(b"suspended".to_vec()));
    assert_eq!(
        shown["reason"],
        redis::Value::BulkString(b"its owner alice has no permissions to administer queue 'jobs'".to_vec())
    );
    assert!(matches!(shown["skipped"], redis::Value::Int(n) if n >= 1), "{:?}", shown["skipped"]);
    mq.stopper().stop();
    mq.join();

    // Another process, whose configuration has no alice at all: it warns once.
    let log = pg.dir().join("ticker.log");
    let file = users_file(&pg, std::slice::from_ref(&owner));
    let mut p = MqProcess::start_with(
        &pg,
        0,
        &["--config", file.to_str().unwrap()],
        std::fs::File::create(&log).unwrap().into(),
    );
    let (_, gone, _) = until_skipped(&mut db, "beat", skipped, 1, "its owner alice is not one of this mwmq's users");
    // (More passes, each skipping: still one warning.)
    until_skipped(&mut db, "beat", gone, 2, "not one of");
    p.kill();
    let warnings: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("schedule suspended"))
        .map(str::to_string)
        .collect();
    assert_eq!(warnings.len(), 1, "one warning for one schedule and reason: {warnings:?}");
    assert!(warnings[0].contains("beat") && warnings[0].contains("alice is not one of"), "{warnings:?}");
    let (still_sent, _, _) = state(&mut db, "beat");
    assert_eq!(still_sent, sent, "skipped ticks are not counted as sent");
    let during = ticks_in(&mut db, "jobs");
    assert_eq!(during, sent_before, "no tick sent while alice may not: {during:?}");

    // alice's right back: it sends again, each tick once.
    let mq = start(cfg);
    let now = db_second(&mut db);
    until_sent(&mut db, "beat", now + 1, "alice's right back");
    assert_eq!(state(&mut db, "beat").2, None, "no longer suspended");
    let mut o = login(mq.local_addr(), "owner", "owner-pw");
    let shown = listed_one(&mut o, "beat");
    assert_eq!(
        (&shown["state"], &shown["reason"]),
        (&redis::Value::BulkString(b"active".to_vec()), &redis::Value::Nil)
    );
    let after = ticks_in(&mut db, "jobs");
    assert!(after.values().all(|n| *n == 1), "each tick once: {after:?}");
    assert!(after.keys().any(|t| *t > last_before + 1), "sent again: {after:?}");
    mq.stopper().stop();
    mq.join();
}

/// QSCHEDULES refused a reader with two schedules to see when the database
/// held more schedules than a reply holds, counting those of queues the
/// reader may not see. Now the database leaves those out before the count.
#[test]
fn qschedules_counts_only_the_schedules_the_caller_sees() {
    use mwmq::commands::schedules::LISTED_SCHEDULE;
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.server.max_body = 1024;
    cfg.server.max_reply_bytes = 3 * LISTED_SCHEDULE;
    cfg.users =
        vec![user("owner", "owner-pw", &["*"], &["*"], &["*"]), user("reader", "reader-pw", &[], &["mine.*"], &[])];
    let mq = start(cfg);
    let mut owner = login(mq.local_addr(), "owner", "owner-pw");
    let mut reader = login(mq.local_addr(), "reader", "reader-pw");
    for queue in ["mine.a", "other"] {
        let _: String = q(&mut owner, &["QCREATE", queue]);
    }
    for i in 0..4 {
        let _: String = q(&mut owner, &["QSCHEDULE", &format!("o{i}"), "other", "@yearly", "x"]);
    }
    for name in ["m1", "m2"] {
        let _: String = q(&mut owner, &["QSCHEDULE", name, "mine.a", "@yearly", "x"]);
    }
    let listed: Vec<std::collections::HashMap<String, redis::Value>> = q(&mut reader, &["QSCHEDULES"]);
    let names: Vec<&redis::Value> = listed.iter().map(|m| &m["name"]).collect();
    assert_eq!(
        names,
        [&redis::Value::BulkString(b"m1".to_vec()), &redis::Value::BulkString(b"m2".to_vec())],
        "the reader's two, whatever the others"
    );
    assert_eq!(
        err(&mut owner, &["QSCHEDULES"]),
        format!(
            "ERR QSCHEDULES would list more than 3 schedules, more than a reply may hold (max_reply_bytes / \
             {LISTED_SCHEDULE})"
        ),
        "six to show: over the bound"
    );
    mq.stopper().stop();
    mq.join();
}

/// QSCHEDULE took no PRIORITY, GROUP or DELAY, and an option given twice
/// (`TZ a TZ b`, QALTER's `BACKOFF ... BACKOFF ...`) silently took the last.
/// Now each tick's message carries the schedule's PRIORITY, GROUP and DELAY
/// as a SEND's would, refused as SEND refuses them, and an option given
/// twice is refused.
#[test]
fn ticks_carry_priority_group_and_delay_and_an_option_given_twice_is_refused() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let mut db = sql(&pg);
    for queue in ["jobs", "later"] {
        let _: String = q(&mut c, &["QCREATE", queue]);
    }
    let low: i64 = q(&mut c, &["SEND", "jobs", "low"]);
    let _: String =
        q(&mut c, &["QSCHEDULE", "hi", "jobs", "* * * * * *", "tick {tick}", "PRIORITY", "7", "GROUP", "g"]);
    let _: String = q(&mut c, &["QSCHEDULE", "late", "later", "* * * * * *", "tick {tick}", "DELAY", "3600000"]);
    let first = db_second(&mut db) + 1;
    until_sent(&mut db, "hi", first, "PRIORITY 7");
    until_sent(&mut db, "late", first, "DELAY");
    // The tick passes the message sent before it without a priority.
    let got = recv(&mut c, "jobs", &[]);
    assert_ne!(got[0].0, low, "a tick of priority 7 first");
    assert!(got[0].3.starts_with(b"tick "), "{:?}", String::from_utf8_lossy(&got[0].3));
    let ticks: Vec<(i16, Option<String>)> = db
        .query(
            "SELECT m.priority, m.grp FROM mwmq_messages m JOIN mwmq_queues q ON q.id = m.queue_id
             WHERE q.name = 'jobs' AND m.body <> 'low'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(!ticks.is_empty() && ticks.iter().all(|t| *t == (7, Some("g".into()))), "{ticks:?}");
    // DELAY: visible an hour after the pass that sent it.
    assert!(recv(&mut c, "later", &[]).is_empty(), "not visible yet");
    let delays: Vec<bool> = db
        .query(
            "SELECT m.visible_at = m.sent_at + interval '1 hour' FROM mwmq_messages m
             JOIN mwmq_queues q ON q.id = m.queue_id WHERE q.name = 'later'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!delays.is_empty() && delays.iter().all(|d| *d), "{delays:?}");
    let shown = listed_one(&mut c, "hi");
    assert_eq!(
        (&shown["priority"], &shown["group"], &shown["delay_ms"]),
        (&redis::Value::Int(7), &redis::Value::BulkString(b"g".to_vec()), &redis::Value::Int(0))
    );
    assert_eq!(listed_one(&mut c, "late")["delay_ms"], redis::Value::Int(3_600_000));

    // Refused as SEND refuses them.
    let e = |c: &mut redis::Connection, extra: &[&str]| {
        err(c, &[&["QSCHEDULE", "x", "jobs", "@daily", "b"][..], extra].concat())
    };
    assert_eq!(e(&mut c, &["PRIORITY", "10"]), err(&mut c, &["SEND", "jobs", "b", "PRIORITY", "10"]));
    assert_eq!(e(&mut c, &["PRIORITY", "10"]), "ERR PRIORITY must be between 0 and 9 (higher is handed out first)");
    assert_eq!(e(&mut c, &["PRIORITY", "high"]), "ERR value is not an integer or out of range");
    assert_eq!(e(&mut c, &["DELAY", "-1"]), err(&mut c, &["SEND", "jobs", "b", "DELAY", "-1"]));
    assert_eq!(e(&mut c, &["GROUP", "a b"]), err(&mut c, &["SEND", "jobs", "b", "GROUP", "a b"]));
    // An option given twice.
    assert_eq!(e(&mut c, &["TZ", "UTC", "TZ", "Europe/Paris"]), "ERR syntax error: TZ is given more than once");
    assert_eq!(e(&mut c, &["CATCHUP", "one", "catchup", "all"]), "ERR syntax error: CATCHUP is given more than once");
    assert_eq!(
        err(&mut c, &["QALTER", "jobs", "BACKOFF", "100", "1000", "BACKOFF", "200", "2000"]),
        "ERR syntax error: BACKOFF is given more than once"
    );
    assert_eq!(
        err(&mut c, &["QALTER", "jobs", "NOBACKOFF", "BACKOFF", "200", "2000"]),
        "ERR syntax error: NOBACKOFF and BACKOFF together"
    );
    assert_eq!(qinfo(&mut c, "jobs")["backoff_base_ms"], "0", "nothing changed");
    let _: i64 = q(&mut c, &["QUNSCHEDULE", "hi"]);
    let _: i64 = q(&mut c, &["QUNSCHEDULE", "late"]);
    mq.stopper().stop();
    mq.join();
}

/// Lookups of the due schedules so far (the scans of their `next_at`
/// index: each pass of a ticker makes one, and one to find the next tick).
fn due_lookups(db: &mut postgres::Client) -> i64 {
    db.query_one("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'mwmq_schedules_due'", &[])
        .unwrap()
        .get(0)
}

/// The latest tick schedule `name` sent, in seconds since the epoch.
fn last_tick(db: &mut postgres::Client, name: &str) -> i64 {
    db.query_one(
        "SELECT coalesce(extract(epoch FROM last_tick)::bigint, 0) FROM mwmq_schedules WHERE name = $1",
        &[&name],
    )
    .unwrap()
    .get(0)
}

/// A pass of the ticker was one transaction for every schedule due: a tick
/// that waited for a lock (here an application's transaction that sent the
/// tick's KEY with `mwmq.send` and stays open) failed the pass at the
/// statement timeout, every pass, and no schedule of the database was sent
/// while it stayed open. And a schedule held by another process (its pass
/// under way) woke every other ticker at once, again and again: thousands
/// of empty passes a second. Now the waiting tick holds back no other
/// schedule and is sent once the lock is gone (each tick once), and a
/// ticker sleeps while another holds a schedule.
#[test]
fn a_tick_waiting_for_a_lock_holds_back_no_other_schedule_and_no_ticker_spins() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let mut db = sql(&pg);
    db.batch_execute(
        "CREATE ROLE app LOGIN; GRANT USAGE ON SCHEMA mwmq TO app; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA mwmq TO app",
    )
    .unwrap();
    let made = db_second(&mut db);
    for name in ["held", "free"] {
        let _: String = q(&mut c, &["QCREATE", name]);
        let _: String = q(&mut c, &["QSCHEDULE", name, name, "* * * * * *", "tick {tick}"]);
    }

    // Another transaction holds `held` (as another process's pass does).
    let mut other = sql(&pg);
    let mut holder = other.transaction().unwrap();
    holder.query_one("SELECT name FROM mwmq_schedules WHERE name = 'held' FOR UPDATE", &[]).unwrap();
    let (from, lookups) = (db_second(&mut db), due_lookups(&mut db));
    until_sent(&mut db, "free", from + 3, "while another holds a schedule");
    let looked = due_lookups(&mut db) - lookups;
    // (About two a tick; thousands a tick when a ticker does not sleep.)
    assert!(looked <= 100, "{looked} lookups of the schedules due over 3 ticks: the ticker did not sleep");
    assert!(last_tick(&mut db, "held") <= from, "a schedule another transaction holds sends nothing");
    holder.rollback().unwrap();

    // An application's transaction sends the KEY of one of `held`'s ticks, and stays open.
    let tick = db_second(&mut db) + 3;
    let key = format!("held@{}", tick_text(&mut db, tick));
    let as_app = pg.conninfo().replace("user=postgres", "user=app");
    let mut app = postgres::Client::connect(&as_app, postgres::NoTls).unwrap();
    let mut open = app.transaction().unwrap();
    open.query_one("SELECT mwmq.send('held', 'not the tick', key => $1)", &[&key]).unwrap();
    until_sent(&mut db, "free", tick + 2, "while a transaction holds the key of another schedule's tick");
    assert_eq!(last_tick(&mut db, "held"), tick - 1, "held waits at its tick, neither sent nor skipped");
    open.rollback().unwrap();
    until_sent(&mut db, "held", tick + 1, "after the transaction ended");
    let last = last_tick(&mut db, "held");
    each_once(&ticks_in(&mut db, "held"), made, made + 2, last, "held");
    each_once(&ticks_in(&mut db, "free"), made, made + 2, last_tick(&mut db, "free"), "free");
    mq.stopper().stop();
    mq.join();
}
