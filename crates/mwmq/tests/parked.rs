//! Parked waits (`RECV ... WAIT`, `XREAD`/`XREADGROUP ... BLOCK`) as an
//! attacker uses them: a thousand clients that park and vanish leave nothing
//! behind (their slots, their waits, their polling, their leases), and
//! parked clients that stay cost the database one poll per queue, not one
//! per client.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use mwmq::Service;

/// Generous: this machine is shared and slow; the conditions, not the times, are asserted.
const PATIENCE: Duration = Duration::from_secs(30);

/// A command as RESP, the way a client library sends it.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// A raw client that sent `args` and keeps its socket open.
fn parked_client(addr: SocketAddr, args: &[&str]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(&resp(args)).expect("send");
    s
}

/// Statements the process ran for its clients and its waiters' shared polls.
fn statements(c: &mut redis::Connection) -> u64 {
    info_field(c, "db_statements") + info_field(c, "wait_polls")
}

fn wait_for(c: &mut redis::Connection, field: &str, want: u64) {
    let ok = eventually(PATIENCE, || info_field(c, field) == want);
    assert!(ok, "INFO {field} did not become {want}: it is {}", info_field(c, field));
}

/// Waits (without failing) until `n` clients are parked: what follows holds either way.
fn settle_parked(c: &mut redis::Connection, n: u64) {
    let _ = eventually(PATIENCE, || info_field(c, "blocked_clients") >= n);
}

/// Reads from a raw client until `end` arrived (or the read timed out).
fn read_until(s: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.ends_with(end) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

#[test]
fn a_thousand_blocked_clients_that_vanish_free_everything() {
    mctest::raise_fd_limit(8192);
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    // The observer and the thousand fill every slot.
    cfg.server.max_connections = 1001;
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut me = connect(addr);
    let _: String = q(&mut me, &["QCREATE", "q"]);
    let _: String = q(&mut me, &["XGROUP", "CREATE", "g.s", "g", "$", "MKSTREAM"]);
    let _: String = q(&mut me, &["XADD", "s", "*", "f", "v"]);
    let mut clients = Vec::with_capacity(1000);
    for i in 0..1000 {
        let c = format!("c{i}");
        let args: Vec<&str> = match i % 3 {
            0 => vec!["XREAD", "BLOCK", "0", "STREAMS", "s", "$"],
            1 => vec!["XREADGROUP", "GROUP", "g", &c, "BLOCK", "0", "STREAMS", "g.s", ">"],
            _ => vec!["RECV", "q", "WAIT", "300000"],
        };
        clients.push(parked_client(addr, &args));
    }
    wait_for(&mut me, "connected_clients", 1001);
    settle_parked(&mut me, 1000);
    // Everyone vanishes without a word.
    drop(clients);
    let t0 = std::time::Instant::now();
    wait_for(&mut me, "connected_clients", 1);
    eprintln!("1,000 vanished clients freed within {:?}", t0.elapsed());
    wait_for(&mut me, "blocked_clients", 0);
    // Nothing polls for them any more: the database is left alone.
    let before = statements(&mut me);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(statements(&mut me), before, "statements ran for clients that are gone");
    // Their slots are free again.
    let mut next = connect(addr);
    assert_eq!(q::<String>(&mut next, &["PING"]), "PONG");
    // And what they waited for is there for whoever comes next.
    let _: i64 = q(&mut me, &["SEND", "q", "after"]);
    let got = recv(&mut next, "q", &["WAIT", "10000"]);
    assert_eq!(got.len(), 1, "the message sent after they left went to a vanished client");
}

#[test]
fn parked_clients_share_one_poll_per_queue() {
    mctest::raise_fd_limit(4096);
    let pg = Postgres::start().unwrap();
    let cfg = config(&pg);
    let poll = Duration::from_millis(cfg.queues.poll_ms); // 100 ms
    let mq = start(cfg);
    let addr = mq.local_addr();
    let mut me = connect(addr);
    let _: String = q(&mut me, &["QCREATE", "q"]);
    let clients: Vec<TcpStream> = (0..200).map(|_| parked_client(addr, &["RECV", "q", "WAIT", "300000"])).collect();
    settle_parked(&mut me, 200);
    // The shared polls (a statement each) and the statements of requests,
    // counted over a window timed from before the first reading to after
    // the second (load can only lengthen it).
    let counts = |me: &mut redis::Connection| {
        let info: String = q(me, &["INFO"]);
        let field = |f: &str| -> u64 {
            info.lines().find_map(|l| l.strip_prefix(&format!("{f}:"))).unwrap().trim().parse().unwrap()
        };
        (field("wait_polls"), field("db_statements"))
    };
    let t0 = std::time::Instant::now();
    let (polls, requests) = counts(&mut me);
    std::thread::sleep(Duration::from_secs(3)); // about 30 poll periods
    let (polls, by_waiters) = {
        let (p, r) = counts(&mut me);
        (p - polls, r - requests)
    };
    let took = t0.elapsed();
    assert_eq!(info_field(&mut me, "blocked_clients"), 200, "every client waited the whole window");
    drop(clients);
    wait_for(&mut me, "blocked_clients", 0);
    eprintln!("200 parked clients in {took:?}: {polls} shared polls, {by_waiters} statements of their own");
    // One poll a period for the queue, whoever waits on it, and no
    // statement of their own (a look for each client would be 200 a
    // period, 6,000 in the window).
    let periods = (took.as_nanos() / poll.as_nanos()) as u64;
    assert!(polls <= periods + 1, "{polls} shared polls in {took:?}, {periods} poll periods");
    assert_eq!(by_waiters, 0, "parked clients with nothing new ran statements of their own");
}

#[test]
fn a_vanished_waiter_loses_no_message_and_a_pipelining_one_is_answered_in_order() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let addr = mq.local_addr();
    let mut me = connect(addr);
    let _: String = q(&mut me, &["QCREATE", "q"]);

    // A client parks with a 5-minute lease and leaves; a message arrives at once.
    let gone = parked_client(addr, &["RECV", "q", "WAIT", "300000", "VT", "300000"]);
    settle_parked(&mut me, 1);
    drop(gone);
    let _: i64 = q(&mut me, &["SEND", "q", "m1"]);
    // It is not held for 5 minutes by a lease nobody can acknowledge: the
    // next receiver gets it (the vanished client never took it, or gave its
    // lease back).
    let got = recv(&mut me, "q", &["WAIT", "20000"]);
    assert_eq!(got.len(), 1, "the message went to a client that had left");
    assert_eq!(got[0].3, b"m1");
    wait_for(&mut me, "connected_clients", 1);

    // A parked client pipelines a PING: it gets its RECV's reply, then PONG.
    let mut pipelining = parked_client(addr, &["RECV", "q", "WAIT", "30000"]);
    pipelining.set_read_timeout(Some(PATIENCE)).unwrap();
    settle_parked(&mut me, 1);
    pipelining.write_all(&resp(&["PING"])).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _: i64 = q(&mut me, &["SEND", "q", "m2"]);
    let got = read_until(&mut pipelining, b"+PONG\r\n");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("*1\r\n*4\r\n") && text.contains("m2\r\n"), "{text:?}");
    assert!(text.ends_with("+PONG\r\n"), "{text:?}");
    assert_eq!(q::<String>(&mut me, &["PING"]), "PONG");

    // A client that sends its blocking read and closes its sending side
    // (`printf 'XREAD ...' | nc -q0`) is closed, as Redis does.
    let mut half = parked_client(addr, &["XREAD", "BLOCK", "0", "STREAMS", "s", "$"]);
    half.set_read_timeout(Some(PATIENCE)).unwrap();
    settle_parked(&mut me, 1);
    half.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    assert!(half.read_to_end(&mut rest).is_ok(), "mwmq did not close the connection");
    assert!(rest.is_empty(), "{rest:?}");
    wait_for(&mut me, "connected_clients", 2);
    wait_for(&mut me, "blocked_clients", 0);
}

/// What only the shared poll can bring: another process's messages and
/// entries when notifications are off, a lease that ran out, a DELAY that
/// ended. Each waiter gets its own, with no SEND or XADD of this process to
/// wake it.
#[test]
fn the_shared_poll_finds_what_no_wake_up_announces() {
    let pg = Postgres::start().unwrap();
    let quiet = || {
        let mut c = config(&pg);
        c.database.notify = false;
        c
    };
    let here = start(quiet());
    let there = start(quiet());
    let (a, b) = (here.local_addr(), there.local_addr());
    let mut me = connect(a);
    let mut other = connect(b);
    for q_ in ["q", "leased", "later"] {
        let _: String = q(&mut me, &["QCREATE", q_]);
    }
    let _: String = q(&mut me, &["XGROUP", "CREATE", "gs", "g", "$", "MKSTREAM"]);
    let _: String = q(&mut me, &["XADD", "s", "*", "f", "old"]);
    // A message under a short lease taken by the other process, and one sent with a DELAY.
    let _: i64 = q(&mut other, &["SEND", "leased", "comes back"]);
    assert_eq!(recv(&mut other, "leased", &["VT", "500"]).len(), 1);
    let waiters: Vec<std::thread::JoinHandle<String>> = [
        vec!["RECV", "q", "WAIT", "60000"],
        vec!["RECV", "leased", "WAIT", "60000"],
        vec!["RECV", "later", "WAIT", "60000"],
        vec!["XREAD", "BLOCK", "60000", "STREAMS", "s", "$"],
        vec!["XREADGROUP", "GROUP", "g", "c", "BLOCK", "60000", "STREAMS", "gs", ">"],
    ]
    .into_iter()
    .map(|args| {
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        std::thread::spawn(move || {
            let mut c = connect(a);
            let mut cmd = redis::cmd(&args[0]);
            for x in &args[1..] {
                cmd.arg(x);
            }
            let v: redis::Value = cmd.query(&mut c).unwrap();
            format!("{v:?}")
        })
    })
    .collect();
    settle_parked(&mut me, 5);
    let _: i64 = q(&mut me, &["SEND", "later", "delayed", "DELAY", "300"]);
    let _: i64 = q(&mut other, &["SEND", "q", "from there"]);
    let _: String = q(&mut other, &["XADD", "s", "*", "f", "new"]);
    let _: String = q(&mut other, &["XADD", "gs", "*", "f", "grouped"]);
    let got: Vec<String> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
    for (got, want) in got.iter().zip(["from there", "comes back", "delayed", "new", "grouped"]) {
        assert!(got.contains(&format!("{want:?}")), "wanted {want:?}, got {got}");
    }
}
