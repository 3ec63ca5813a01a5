//! mwmq as an attacker on the network would try it, with real clients (the
//! `redis` crate): another user's deliveries, guessed leases, dead-letter
//! queues outside one's rights. Each test failed on the code before the fix
//! it names.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use mwmq::users::{user_table, UserConfig};
use mwmq::Service;

fn user(name: &str, password: &str, send: &[&str], receive: &[&str], admin: &[&str]) -> UserConfig {
    let v = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let table = user_table(name, password.as_bytes(), &v(send), &v(receive), &v(admin)).unwrap();
    let doc: toml::Table = toml::from_str(&table).unwrap();
    let mut users: Vec<UserConfig> = doc["users"].clone().try_into().unwrap();
    users.pop().unwrap()
}

fn login(addr: SocketAddr, name: &str, password: &str) -> redis::Connection {
    let client = redis::Client::open(format!("redis://{name}:{password}@{addr}/")).unwrap();
    let c = client.get_connection_with_timeout(Duration::from_secs(10)).expect("logged in");
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c
}

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
