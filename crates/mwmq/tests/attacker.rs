//! mwmq as an attacker on the network would try it, with real clients (the
//! `redis` crate): another user's deliveries, guessed leases, dead-letter
//! queues outside one's rights. Each test failed on the code before the fix
//! it names.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mwmq::users::user_table;
use mwmq::Service;

/// Leases were a global sequence: a receiver who knew its own lease found a
/// neighbour's within 125 TOUCH tries and could hide or delete the message.
/// Now a lease is a random 64-bit token, and ACK, NACK and TOUCH act only on
/// a delivery the caller holds (or, for an admin of the queue, any).
#[test]
fn another_users_delivery_cannot_be_guessed_nor_acted_on() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![
        user("bob", "bob-pw", &["work"], &["work"], &[]),
        user("mallory", "mallory-pw", &["work"], &["work"], &[]),
        user("ops", "ops-pw", &[], &[], &["work"]),
    ];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut ops = login(addr, "ops", "ops-pw");
    assert_eq!(q::<String>(&mut ops, &["QCREATE", "work"]), "OK");
    let mut bob = login(addr, "bob", "bob-pw");
    let mut mallory = login(addr, "mallory", "mallory-pw");
    for i in 0..300 {
        let _: i64 = q(&mut bob, &["SEND", "work", &format!("m{i}")]);
    }

    // Leases are random: no two in a row are neighbours, and they spread
    // over the whole 64-bit range.
    let bobs = recv(&mut bob, "work", &["COUNT", "100", "VT", "60000"]);
    let mine = recv(&mut mallory, "work", &["COUNT", "100", "VT", "60000"]);
    assert_eq!((bobs.len(), mine.len()), (100, 100));
    let mut leases: Vec<i64> = bobs.iter().chain(&mine).map(|m| m.1).collect();
    leases.sort_unstable();
    let closest = leases.windows(2).map(|w| w[1].abs_diff(w[0])).min().unwrap();
    assert!(closest > 1 << 32, "leases 2^32 apart at least (200 random 64-bit tokens): {closest}");
    let high = leases.iter().filter(|l| l.unsigned_abs() > 1 << 60).count();
    assert!(high > 100, "most tokens use the high bits: {high} of 200");

    // Guessing from one's own lease, as the old attack did: nothing.
    let (victim, victim_lease) = (bobs[0].0, bobs[0].1);
    let (_, my_lease) = (mine[0].0, mine[0].1);
    let id = victim.to_string();
    let mut hits = 0;
    for d in -200i64..200 {
        let guess = my_lease.wrapping_add(d).to_string();
        hits += q::<i64>(&mut mallory, &["TOUCH", "work", &id, &guess, "86400000"]);
    }
    assert_eq!(hits, 0, "no guessed lease is current");

    // Even bob's real (id, lease), leaked to mallory: not hers to act on.
    let lease = victim_lease.to_string();
    assert_eq!(q::<i64>(&mut mallory, &["TOUCH", "work", &id, &lease, "86400000"]), 0);
    assert_eq!(q::<i64>(&mut mallory, &["NACK", "work", &id, &lease]), 0);
    assert_eq!(q::<i64>(&mut mallory, &["ACK", "work", &id, &lease]), 0);
    // ACKs batched together in one statement check each one's holder too.
    let mut pipe = redis::pipe();
    for m in &bobs[1..20] {
        pipe.cmd("ACK").arg("work").arg(m.0).arg(m.1);
    }
    let acked: Vec<i64> = pipe.query(&mut mallory).unwrap();
    assert_eq!(acked, vec![0; 19], "a pipeline of stolen ACKs");
    // ... while bob's own ACK works, and an admin of the queue may act on any delivery.
    assert_eq!(q::<i64>(&mut bob, &["TOUCH", "work", &id, &lease, "60000"]), 1);
    assert_eq!(q::<i64>(&mut bob, &["ACK", "work", &id, &lease]), 1);
    let (id2, lease2) = (bobs[20].0.to_string(), bobs[20].1.to_string());
    assert_eq!(q::<i64>(&mut ops, &["NACK", "work", &id2, &lease2]), 1, "an admin releases a stuck delivery");
    let mut pipe = redis::pipe();
    for m in &bobs[21..40] {
        pipe.cmd("ACK").arg("work").arg(m.0).arg(m.1);
    }
    let acked: Vec<i64> = pipe.query(&mut bob).unwrap();
    assert_eq!(acked, vec![1; 19], "bob's pipelined ACKs");
    assert_eq!(q::<i64>(&mut ops, &["QLEN", "work"]), 300 - 20);
    let leased_to: Vec<Option<String>> = sql(&pg)
        .query("SELECT DISTINCT leased_to FROM mwmq_messages WHERE lease IS NOT NULL ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(leased_to, [Some("bob".to_string()), Some("mallory".to_string())]);
}

/// An admin of `carol.*` could set `DEADLETTER secret` and so send into a
/// queue it may not send to; a dead-letter queue that did not exist was
/// accepted. Now the target needs the send right and must exist.
#[test]
fn dead_letters_go_only_where_the_admin_may_send() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![
        user("root", "root-pw", &["*"], &["*"], &["*"]),
        user("carol", "carol-pw", &["carol.*"], &["carol.*"], &["carol.*"]),
    ];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut root = login(addr, "root", "root-pw");
    assert_eq!(q::<String>(&mut root, &["QCREATE", "secret"]), "OK");
    let mut carol = login(addr, "carol", "carol-pw");
    assert_eq!(
        err(&mut carol, &["QCREATE", "carol.jobs", "MAXDELIVERIES", "1", "DEADLETTER", "secret"]),
        "NOPERM User carol has no permissions to send to queue 'secret'"
    );
    assert_eq!(
        err(&mut carol, &["QCREATE", "carol.jobs", "DEADLETTER", "carol.nope"]),
        "NOQUEUE no such queue 'carol.nope'",
        "a dead-letter queue that does not exist"
    );
    assert_eq!(q::<String>(&mut carol, &["QCREATE", "carol.jobs", "MAXDELIVERIES", "1"]), "OK");
    assert_eq!(
        err(&mut carol, &["QALTER", "carol.jobs", "DEADLETTER", "secret"]),
        "NOPERM User carol has no permissions to send to queue 'secret'"
    );
    assert_eq!(
        err(&mut carol, &["QALTER", "carol.jobs", "DEADLETTER", "carol.nope"]),
        "NOQUEUE no such queue 'carol.nope'"
    );
    assert_eq!(q::<String>(&mut carol, &["QCREATE", "carol.dlq"]), "OK");
    assert_eq!(q::<String>(&mut carol, &["QALTER", "carol.jobs", "DEADLETTER", "carol.dlq"]), "OK");
    // Nothing reached `secret`.
    let _: i64 = q(&mut carol, &["SEND", "carol.jobs", "poison"]);
    let got = recv(&mut carol, "carol.jobs", &[]);
    assert_eq!(q::<i64>(&mut carol, &["NACK", "carol.jobs", &got[0].0.to_string(), &got[0].1.to_string()]), 1);
    assert!(recv(&mut carol, "carol.jobs", &[]).is_empty());
    assert_eq!(q::<i64>(&mut root, &["QLEN", "secret"]), 0);
    assert_eq!(q::<i64>(&mut carol, &["QLEN", "carol.dlq"]), 1);
}

fn info_of(c: &mut redis::Connection, field: &str) -> u64 {
    let info: String = q(c, &["INFO"]);
    info.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).unwrap().trim().parse().unwrap()
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap()))
        .unwrap();
    kib / 1024.0
}

/// Sends a RESP command on a raw socket and reads one reply line.
fn raw_call(s: &mut std::net::TcpStream, args: &[&str]) -> std::io::Result<String> {
    use std::io::{BufRead, Write};
    let mut frame = format!("*{}\r\n", args.len());
    for a in args {
        frame.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(frame.as_bytes())?;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line)?;
    Ok(line)
}

/// 100 failed logins from 16 connections took mwmq from 64 MB to 1.74 GB
/// (argon2's 19 MiB per hashing worker, kept by the allocator), and 16
/// unauthenticated connections raised a logged-in client's SEND median from
/// 0.7 to 94 ms: passwords were hashed by the workers. Now they are hashed on
/// one login thread with one memory block, failures are throttled per
/// connection and per address, and workers never hash.
#[test]
fn failed_logins_cost_bounded_memory_and_leave_logged_in_clients_alone() {
    let pg = Postgres::start().unwrap();
    let dir = std::env::temp_dir().join(format!("mwmq-attacker-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = user_table("app", b"app-pw", &["*".into()], &["*".into()], &["*".into()]).unwrap();
    let file = dir.join("mwmq.toml");
    // The address may fail often here (all clients are 127.0.0.1): the
    // per-connection throttle and the login thread are what is measured.
    std::fs::write(&file, format!("[auth]\naddress_burst = 100000\nuser_burst = 100000\n\n{table}")).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mq = MqProcess::start(&pg, 0, &["--config", file.to_str().unwrap()]);
    let pid = mq.child.id();
    let mut app = login(mq.addr, "app", "app-pw");
    assert_eq!(q::<String>(&mut app, &["QCREATE", "work"]), "OK");
    let send_times = |c: &mut redis::Connection, n: usize| {
        let mut t: Vec<Duration> = (0..n)
            .map(|_| {
                let t0 = std::time::Instant::now();
                let _: i64 = q(c, &["SEND", "work", "x"]);
                t0.elapsed()
            })
            .collect();
        t.sort();
        t
    };
    let quiet = send_times(&mut app, 200);
    let before = rss_mib(pid);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attackers: Vec<_> = (0..16)
        .map(|i| {
            let (addr, stop) = (mq.addr, stop.clone());
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut tries = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && tries < 400 {
                    let reply = raw_call(&mut s, &["AUTH", "app", &format!("guess-{i}-{tries}")]).unwrap();
                    let throttled = reply.starts_with("-ERR too many failed logins on this connection; retry in ");
                    assert!(reply.starts_with("-WRONGPASS") || reply.starts_with("-TRYAGAIN") || throttled, "{reply}");
                    tries += 1;
                }
                tries
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let attacked = send_times(&mut app, 200);
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let tries: u32 = attackers.into_iter().map(|a| a.join().unwrap()).sum();
    let failures = info_of(&mut app, "auth_failures");
    let after = rss_mib(pid);
    let (p50, p99) = (attacked[100], attacked[197]);
    eprintln!(
        "quiet SEND p50 {:?} p99 {:?}; under attack p50 {p50:?} p99 {p99:?}; {tries} tries, {failures} failures; \
         RSS {before:.0} -> {after:.0} MiB",
        quiet[100], quiet[197]
    );
    assert!(failures >= 100, "at least 100 failed logins: {failures}");
    assert!(after - before < 50.0, "RSS {before:.0} -> {after:.0} MiB after {failures} failed logins");
    // Against the same client's median before the attack, on the same
    // machine: hashing on the workers made it 0.7 -> 94 ms; the login thread
    // only takes its share of the CPU.
    let bound = quiet[100] * 5 + Duration::from_millis(20);
    assert!(p50 < bound, "a logged-in client's SEND median under attack: {p50:?} (quiet: {:?})", quiet[100]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Failed logins per source address: past the burst, even the right
/// password is refused unchecked until the address earns an attempt back —
/// and told so (it heard `WRONGPASS`, which sends people hunting for a typo).
#[test]
fn an_address_that_fails_too_often_is_refused_unchecked() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![user("app", "app-pw", &["*"], &["*"], &["*"])];
    cfg.auth.address_burst = 5;
    // (One attempt earned back every 5 s: the five checks below take far less.)
    cfg.auth.address_per_sec = 0.2;
    let mq = start(cfg);
    let addr = mq.local_addr();
    for i in 0..5 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        assert!(raw_call(&mut s, &["AUTH", "app", &format!("wrong{i}")]).unwrap().starts_with("-WRONGPASS"));
    }
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let locked = raw_call(&mut s, &["AUTH", "app", "app-pw"]).unwrap();
    assert!(
        locked.starts_with("-ERR too many failed logins from 127.0.0.1; retry in "),
        "locked out, and told so: {locked}"
    );
    assert!(
        eventually(Duration::from_secs(30), || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            raw_call(&mut s, &["AUTH", "app", "app-pw"]).unwrap() == "+OK\r\n"
        }),
        "an attempt earned back"
    );
    let mut app = login(addr, "app", "app-pw");
    assert!(info_of(&mut app, "auth_throttled") >= 1);
}

/// Connections that never started TLS held a slot forever: with
/// `--max-connections 50`, 50 silent sockets locked out a client with a
/// valid certificate. Now a handshake not done within
/// `handshake_timeout_secs` is closed, past `max_handshaking` the oldest
/// handshake makes room, and a connection that never logs in is closed after
/// `login_timeout_secs`.
#[test]
fn silent_sockets_and_connections_that_never_log_in_are_closed() {
    use std::io::Read;
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    let (certs, plain) = with_tls(&mut cfg, "silent");
    cfg.tls.handshake_timeout_secs = 1;
    cfg.tls.max_handshaking = 8;
    cfg.server.max_connections = 50;
    cfg.auth.login_timeout_secs = 2;
    cfg.users = vec![user("app", "app-pw", &["*"], &["*"], &["*"])];
    let mq = start(cfg);
    let port = mq.local_addr().port();
    let silent: Vec<std::net::TcpStream> =
        (0..50).map(|_| std::net::TcpStream::connect(mq.local_addr()).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--no-auth-warning", "--tls", "--cacert"])
        .arg(&certs.ca)
        .args(["--user", "app", "--pass", "app-pw", "PING"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "PONG", "{}", String::from_utf8_lossy(&out.stderr));
    // Every silent socket is closed (unfixed, never: a generous wait tells the
    // two apart on a busy machine; the counters below say what closed them).
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 16];
        let r = s.read(&mut buf);
        assert!(
            matches!(r, Ok(0)) || r.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "closed: {r:?}"
        );
    }
    // A plaintext connection that never logs in: closed after 2 s.
    let mut idle = std::net::TcpStream::connect(format!("127.0.0.1:{plain}")).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 16];
    assert!(matches!(idle.read(&mut buf), Ok(0)), "closed for not logging in");
    let mut app = login(format!("127.0.0.1:{plain}").parse().unwrap(), "app", "app-pw");
    let (refused, timeouts) = (info_of(&mut app, "handshake_refused"), info_of(&mut app, "handshake_timeouts"));
    assert!(refused >= 40 && refused + timeouts >= 50, "refused {refused}, timeouts {timeouts}");
    assert_eq!(info_of(&mut app, "login_timeouts"), 1);
    std::fs::remove_dir_all(certs.ca.parent().unwrap()).ok();
}

/// /metrics named every queue, and grew with them. Now only the queues
/// `[queues] metrics_queues` names have series of their own, at most
/// `metrics_max_queues`; the rest are added up as `_other`.
#[test]
fn metrics_name_only_the_queues_configured_and_a_bounded_number() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.stats.admin = Some("127.0.0.1:0".into());
    cfg.queues.metrics_queues = vec!["public.*".into()];
    cfg.queues.public_queues = vec!["*".into()];
    cfg.queues.metrics_max_queues = 2;
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    for q in ["public.a", "public.b", "public.c", "payroll"] {
        assert_eq!(common::q::<String>(&mut c, &["QCREATE", q]), "OK");
        let _: i64 = common::q(&mut c, &["SEND", q, "x"]);
    }
    let (_, page) = mctest::http_get(mq.admin_addr().unwrap(), "/metrics");
    let sent: Vec<&str> = page.lines().filter(|l| l.starts_with("mwmq_queue_sent_total{")).collect();
    assert_eq!(
        sent,
        [
            "mwmq_queue_sent_total{queue=\"public.a\"} 1",
            "mwmq_queue_sent_total{queue=\"public.b\"} 1",
            "mwmq_queue_sent_total{queue=\"_other\"} 2"
        ],
        "{page}"
    );
    assert!(!page.contains("payroll"));
}

/// `RECV q COUNT 1000` of 5 KB bodies over TLS stalled in 2 of 5 runs with
/// the end of its reply unsent until the client sent something else, and the
/// messages stayed leased. Now each arrives whole (redis-cli over TLS).
#[test]
fn a_large_recv_over_tls_arrives_whole() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    let (certs, plain) = with_tls(&mut cfg, "large-tls");
    let mq = start(cfg);
    let mut c = connect(format!("127.0.0.1:{plain}").parse().unwrap());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "big"]), "OK");
    let body = "b".repeat(5000);
    for _ in 0..3 {
        let mut pipe = redis::pipe();
        for _ in 0..1000 {
            pipe.cmd("SEND").arg("big").arg(&body);
        }
        let _: Vec<i64> = pipe.query(&mut c).unwrap();
    }
    for run in 0..3 {
        let out = std::process::Command::new("timeout")
            .args(["20", "redis-cli", "-p", &mq.local_addr().port().to_string(), "--tls", "--cacert"])
            .arg(&certs.ca)
            .args(["RECV", "big", "COUNT", "1000", "VT", "60000"])
            .output()
            .unwrap();
        assert!(out.status.success(), "run {run}: redis-cli waited for the end of the reply ({:?})", out.status);
        let bodies = String::from_utf8_lossy(&out.stdout).matches(body.as_str()).count();
        assert_eq!(bodies, 1000, "run {run}");
    }
    std::fs::remove_dir_all(certs.ca.parent().unwrap()).ok();
}

/// No quotas: a send-only user wrote 95 MB/s of 4 MiB bodies and created
/// 3,000 queues in a second. Now a queue holds at most MAXMESSAGES messages
/// and MAXBYTES bytes (`-OVERQUOTA` on SEND), a user creates at most
/// `max_queues` queues and sends bodies of at most `max_body` bytes.
#[test]
fn quotas_per_queue_and_per_user() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    let mut small = user("small", "small-pw", &["*"], &["*"], &["small.*"]);
    small.max_queues = 3;
    small.max_body = Some(100);
    cfg.users = vec![user("ops", "ops-pw", &["*"], &["*"], &["*"]), small];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut ops = login(addr, "ops", "ops-pw");

    // A queue's messages and bytes.
    assert_eq!(q::<String>(&mut ops, &["QCREATE", "capped", "MAXMESSAGES", "3", "MAXBYTES", "1000"]), "OK");
    for _ in 0..3 {
        let _: i64 = q(&mut ops, &["SEND", "capped", "x"]);
    }
    let full = err(&mut ops, &["SEND", "capped", "x"]);
    assert!(full.starts_with("OVERQUOTA queue 'capped' is full: 3 messages"), "{full}");
    let got = recv(&mut ops, "capped", &[]);
    assert_eq!(q::<i64>(&mut ops, &["ACK", "capped", &got[0].0.to_string(), &got[0].1.to_string()]), 1);
    let _: i64 = q(&mut ops, &["SEND", "capped", "x"]);
    assert!(err(&mut ops, &["SEND", "capped", "y", "KEY", "k1"]).starts_with("OVERQUOTA"), "with a KEY too");
    // Pipelined SENDs (carried out together): the ones past the quota are refused.
    assert_eq!(q::<String>(&mut ops, &["QALTER", "capped", "MAXMESSAGES", "6"]), "OK");
    let replies = {
        use std::io::{BufRead, Write};
        let mut raw = std::net::TcpStream::connect(addr).unwrap();
        assert_eq!(raw_call(&mut raw, &["AUTH", "ops", "ops-pw"]).unwrap(), "+OK\r\n");
        raw.write_all(&b"*3\r\n$4\r\nSEND\r\n$6\r\ncapped\r\n$1\r\np\r\n".repeat(5)).unwrap();
        let mut lines = std::io::BufReader::new(raw).lines();
        (0..5).map(|_| lines.next().unwrap().unwrap()).collect::<Vec<_>>()
    };
    let refused = replies.iter().filter(|r| r.starts_with("-OVERQUOTA")).count();
    assert!((2..=4).contains(&refused), "3 fit, the rest are refused: {replies:?}");
    // Bytes.
    assert_eq!(q::<String>(&mut ops, &["QALTER", "capped", "MAXMESSAGES", "0"]), "OK");
    let big = "b".repeat(600);
    let _: i64 = q(&mut ops, &["SEND", "capped", &big]);
    assert!(err(&mut ops, &["SEND", "capped", &big]).starts_with("OVERQUOTA"), "1000 bytes at most");
    // A quota set on a queue that already holds messages counts them.
    assert_eq!(q::<String>(&mut ops, &["QCREATE", "later"]), "OK");
    for _ in 0..5 {
        let _: i64 = q(&mut ops, &["SEND", "later", "m"]);
    }
    assert_eq!(q::<String>(&mut ops, &["QALTER", "later", "MAXMESSAGES", "5"]), "OK");
    assert!(err(&mut ops, &["SEND", "later", "m"]).starts_with("OVERQUOTA"));
    let info: std::collections::HashMap<String, redis::Value> = q(&mut ops, &["QINFO", "later"]);
    assert_eq!(redis::from_redis_value::<i64>(&info["counted_messages"]).unwrap(), 5);
    assert_eq!(redis::from_redis_value::<i64>(&info["max_messages"]).unwrap(), 5);
    let popped: (i64, String, Vec<u8>) = q(&mut ops, &["POP", "later"]);
    assert_eq!(popped.2, b"m");
    let _: i64 = q(&mut ops, &["SEND", "later", "m"]);
    // Only the messages of queues with a quota are counted: the others pay nothing.
    let counted = |pg: &Postgres, queue: &str| -> i64 {
        sql(pg)
            .query_one(
                "SELECT count(*) FROM mwmq_messages m JOIN mwmq_queues q ON q.id = m.queue_id
                 WHERE q.name = $1 AND m.counted",
                &[&queue],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(counted(&pg, "later"), 5);
    assert_eq!(q::<String>(&mut ops, &["QCREATE", "free"]), "OK");
    let _: i64 = q(&mut ops, &["SEND", "free", "x"]);
    assert_eq!(counted(&pg, "free"), 0);
    assert_eq!(q::<String>(&mut ops, &["QALTER", "later", "MAXMESSAGES", "0"]), "OK");
    assert_eq!(counted(&pg, "later"), 0, "a quota lifted: no more counting");
    for _ in 0..3 {
        let _: i64 = q(&mut ops, &["SEND", "later", "m"]);
    }
    assert_eq!(q::<String>(&mut ops, &["QCREATE", "again", "MAXMESSAGES", "1"]), "OK");
    let _: i64 = q(&mut ops, &["SEND", "again", "one"]);
    assert!(err(&mut ops, &["SEND", "again", "two"]).starts_with("OVERQUOTA"));

    // A user's queues and bodies.
    let mut s = login(addr, "small", "small-pw");
    for i in 0..3 {
        assert_eq!(q::<String>(&mut s, &["QCREATE", &format!("small.{i}")]), "OK");
    }
    let e = err(&mut s, &["QCREATE", "small.3"]);
    assert_eq!(e, "OVERQUOTA user small may create at most 3 queues (max_queues)");
    assert_eq!(q::<String>(&mut s, &["QDROP", "small.0"]), "OK");
    assert_eq!(q::<String>(&mut s, &["QCREATE", "small.3"]), "OK", "a dropped queue frees its place");
    let _: i64 = q(&mut s, &["SEND", "small.1", &"x".repeat(100)]);
    let e = err(&mut s, &["SEND", "small.1", &"x".repeat(101)]);
    assert_eq!(e, "OVERQUOTA a body of 101 bytes is over user small's limit of 100 bytes (max_body)");
}

/// QINFO read the whole queue for every request: 8 clients looping on it
/// pushed a neighbour's SEND to 276 ms. Its database figures are now kept
/// for `info_cache_ms`: a loop of QINFOs costs one count a second.
#[test]
fn qinfo_in_a_loop_costs_one_count_a_period() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.queues.info_cache_ms = 1000;
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "watched"]), "OK");
    let ready = |c: &mut redis::Connection| -> i64 {
        let info: std::collections::HashMap<String, redis::Value> = q(c, &["QINFO", "watched"]);
        redis::from_redis_value(&info["ready"]).unwrap()
    };
    // The figures are kept from after `read` (the first QINFO's), so a QINFO
    // answered within a period of it was answered from them, however slowly
    // the QINFOs come.
    let read = Instant::now();
    assert_eq!(ready(&mut c), 0);
    let before = info_of(&mut c, "db_statements");
    let _: i64 = q(&mut c, &["SEND", "watched", "x"]);
    for _ in 0..50 {
        let r = ready(&mut c);
        if read.elapsed() < Duration::from_millis(1000) {
            assert_eq!(r, 0, "the figures of the last second");
        }
    }
    let took = read.elapsed();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(ready(&mut c), 1, "read again after the period");
    // The SEND and one QINFO reached the database, not 51 QINFOs, and one
    // more for each whole period the loop lasted (a loaded machine may spread
    // it over several); a window of statements may still be open.
    let periods = (took.as_nanos() / Duration::from_millis(1000).as_nanos()) as u64;
    let statements = info_of(&mut c, "db_statements") - before;
    assert!(statements <= 3 + periods, "statements: {statements} for QINFOs over {took:?}");
    // A change to the queue forgets its figures.
    assert_eq!(q::<String>(&mut c, &["QALTER", "watched", "MAXMESSAGES", "10"]), "OK");
    let info: std::collections::HashMap<String, redis::Value> = q(&mut c, &["QINFO", "watched"]);
    assert_eq!(redis::from_redis_value::<i64>(&info["max_messages"]).unwrap(), 10);
}
