//! Wake-ups as an attacker uses them: any role that can log in to the
//! database can NOTIFY on mwmq's channel. A flood of notifications naming a
//! queue with 200 parked receivers must not make each of them look (200
//! statements per notification): notifications are hints, looked at by the
//! shared poll, and a look rings no more waiters than it found messages. And
//! a blocking read cannot wait on any number of names.

mod common;

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use mwmq::Service;

/// Generous: this machine is shared and slow; the conditions, not the times, are asserted.
const PATIENCE: Duration = Duration::from_secs(30);
/// Receivers parked on the queue.
const WAITERS: usize = 200;
/// Notifications per flood.
const FLOOD: u64 = 2000;

/// A command as RESP, the way a client library sends it.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// A raw client that sent `args`, keeps its socket open and is read without blocking.
fn parked_client(addr: SocketAddr, args: &[&str]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(&resp(args)).expect("send");
    s.set_nonblocking(true).expect("nonblocking");
    s
}

/// Reads whatever each client has been answered so far into its buffer.
fn gather(clients: &mut [TcpStream], got: &mut [Vec<u8>]) {
    let mut buf = [0u8; 4096];
    for (c, out) in clients.iter_mut().zip(got.iter_mut()) {
        loop {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("a parked client's socket: {e}"),
            }
        }
    }
}

fn wait_for(c: &mut redis::Connection, field: &str, want: u64) {
    let ok = eventually(PATIENCE, || info_field(c, field) == want);
    assert!(ok, "INFO {field} did not become {want}: it is {}", info_field(c, field));
}

/// `n` notifications naming `name` on mwmq's channel, each its own
/// transaction, from a database role that has no grant at all.
fn flood(pg: &Postgres, name: &str, n: u64) -> std::thread::JoinHandle<()> {
    let info = pg.conninfo().replace("user=postgres", "user=flooder");
    let sql = format!("SELECT pg_notify('mwmq', '{name}')");
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&info, postgres::NoTls).expect("flooder connects");
        for _ in 0..n {
            c.simple_query(&sql).expect("notify");
        }
    })
}

#[test]
fn a_notify_flood_wakes_nobody_and_a_message_wakes_one() {
    mctest::raise_fd_limit(4096);
    let pg = Postgres::start().unwrap();
    sql(&pg).batch_execute("CREATE ROLE flooder LOGIN").unwrap();
    let mut cfg = config(&pg);
    cfg.server.max_connections = 2 * WAITERS;
    // Only wake-ups and hints bring messages within the test: a lost one fails it.
    cfg.queues.poll_ms = 600_000;
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut me = connect(addr);
    let _: String = q(&mut me, &["QCREATE", "q"]);
    let mut clients: Vec<TcpStream> =
        (0..WAITERS).map(|_| parked_client(addr, &["RECV", "q", "WAIT", "300000"])).collect();
    let mut got = vec![Vec::new(); WAITERS];
    wait_for(&mut me, "blocked_clients", WAITERS as u64);

    // The flood, with nothing in the queue.
    let (requests, polls, hints) =
        (info_field(&mut me, "db_statements"), info_field(&mut me, "wait_polls"), info_field(&mut me, "wake_hints"));
    flood(&pg, "q", FLOOD).join().unwrap();
    // (Every notification heard: what follows counts all of them.)
    wait_for(&mut me, "wake_hints", hints + FLOOD);
    std::thread::sleep(Duration::from_millis(300)); // a last look, if one was due
    let by_waiters = info_field(&mut me, "db_statements") - requests;
    let looks = info_field(&mut me, "wait_polls") - polls;
    eprintln!("{FLOOD} notifications, {WAITERS} waiters: {by_waiters} statements by waiters, {looks} looks");
    // Before: every notification (each burst of them) made all 200 look.
    assert!(by_waiters <= 5, "{by_waiters} statements by waiters after notifications with nothing behind them");
    assert!(looks <= FLOOD + 2, "{looks} looks for {FLOOD} notifications");
    assert_eq!(info_field(&mut me, "blocked_clients"), WAITERS as u64);
    gather(&mut clients, &mut got);
    assert!(got.iter().all(Vec::is_empty), "a waiter was answered with nothing sent");

    // A real SEND: exactly one waiter gets it; the others still wait.
    let _: i64 = q(&mut me, &["SEND", "q", "the-one"]);
    let ok = eventually(PATIENCE, || {
        gather(&mut clients, &mut got);
        got.iter().any(|g| g.ends_with(b"the-one\r\n"))
    });
    assert!(ok, "no waiter got the message");
    wait_for(&mut me, "blocked_clients", WAITERS as u64 - 1);
    gather(&mut clients, &mut got);
    assert_eq!(got.iter().filter(|g| !g.is_empty()).count(), 1, "more than one waiter was answered");
    let winner = got.iter().position(|g| !g.is_empty()).unwrap();
    clients.swap_remove(winner);
    got.swap_remove(winner);

    // Messages from another mwmq process (announced by NOTIFY, as the
    // flood) during a second flood: each received exactly once.
    let other = start(config(&pg));
    let mut sender = connect(other.local_addr());
    let requests = info_field(&mut me, "db_statements");
    let storm = flood(&pg, "q", FLOOD);
    let bodies: Vec<String> = (0..50).map(|i| format!("during-{i:03}")).collect();
    for b in &bodies {
        let _: i64 = q(&mut sender, &["SEND", "q", b]);
    }
    storm.join().unwrap();
    let received = |got: &[Vec<u8>]| -> HashMap<&str, usize> {
        let mut n = HashMap::new();
        for b in &bodies {
            let needle = format!("{b}\r\n");
            let times = got.iter().filter(|g| g.windows(needle.len()).any(|w| w == needle.as_bytes())).count();
            n.insert(b.as_str(), times);
        }
        n
    };
    let ok = eventually(PATIENCE, || {
        gather(&mut clients, &mut got);
        received(&got).values().all(|&n| n >= 1)
    });
    let missing: Vec<&str> = received(&got).into_iter().filter(|(_, n)| *n == 0).map(|(b, _)| b).collect();
    assert!(ok, "messages sent during the flood never reached a waiter: {missing:?}");
    wait_for(&mut me, "blocked_clients", (WAITERS - 1 - bodies.len()) as u64);
    let by_waiters = info_field(&mut me, "db_statements") - requests;
    eprintln!("{} messages from another process during a flood: {by_waiters} statements by waiters", bodies.len());
    gather(&mut clients, &mut got);
    assert!(received(&got).values().all(|&n| n == 1), "a message was received twice: {:?}", received(&got));
    assert_eq!(got.iter().filter(|g| !g.is_empty()).count(), bodies.len(), "a waiter was answered twice or empty");
}

#[test]
fn a_blocking_read_waits_on_at_most_max_wait_names() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.queues.max_wait_names = 16;
    let mq = start(cfg);
    let mut me = connect(mq.local_addr());
    let _: String = q(&mut me, &["XGROUP", "CREATE", "s0", "g", "$", "MKSTREAM"]);
    let keys = |n: usize| (0..n).map(|i| format!("s{i}")).collect::<Vec<_>>();
    let read = |n: usize, group: bool| {
        let mut args: Vec<String> = if group {
            ["XREADGROUP", "GROUP", "g", "c", "BLOCK", "50", "STREAMS"].map(String::from).to_vec()
        } else {
            ["XREAD", "BLOCK", "50", "STREAMS"].map(String::from).to_vec()
        };
        args.extend(keys(n));
        args.extend((0..n).map(|_| if group { ">".to_string() } else { "$".to_string() }));
        args
    };
    let as_strs = |v: &[String]| v.iter().map(String::to_string).collect::<Vec<_>>();
    for group in [false, true] {
        let over = as_strs(&read(17, group));
        let refused = err(&mut me, &over.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(refused.contains("at most 16 keys (17 given"), "{refused}");
    }
    // At the cap it waits (and ends empty); without BLOCK any number is read.
    let at = read(16, false);
    let v: redis::Value = q(&mut me, &at.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(v, redis::Value::Nil);
    let mut plain: Vec<String> = ["XREAD", "STREAMS"].map(String::from).to_vec();
    plain.extend(keys(40));
    plain.extend((0..40).map(|_| "0".to_string()));
    let v: redis::Value = q(&mut me, &plain.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(matches!(v, redis::Value::Nil | redis::Value::Array(_)), "{v:?}");
}
