//! Bad input never hurts: garbage, truncated and oversized frames, bodies over
//! the limit, ten thousand idle connections, clients that never read and
//! clients that send half a huge body — each gets Redis' answer, everyone
//! else keeps being served, and mwmq's memory stays bounded.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads until the server closes the connection (or 5 s pass).
fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn read_until(s: &mut TcpStream, end: &str) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.ends_with(end.as_bytes()) {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap()))
        .unwrap()
}

#[test]
fn malformed_input_gets_redis_errors_and_others_are_served() {
    let pg = Postgres::start().unwrap();
    let mq = MqProcess::start(&pg, 0, &["--max-body", "1k"]);
    let mut good = connect(mq.addr);
    let _: String = q(&mut good, &["QCREATE", "q"]);
    for (input, want) in [
        (&b"*abc\r\n"[..], "-ERR Protocol error: invalid multibulk length"),
        (b"*2\r\n$4\r\nSEND\r\n$99999999999\r\n", "-ERR Protocol error: invalid bulk length"),
        (b"*1\r\n:5\r\n", "-ERR Protocol error: expected '$', got ':'"),
        (b"*1\r\n$4\r\nPINGxx", "-ERR Protocol error: bulk string not terminated by CRLF"),
        (b"*99999999\r\n", "-ERR Protocol error: invalid multibulk length"),
    ] {
        let mut s = raw(mq.addr);
        s.write_all(input).unwrap();
        let got = read_to_close(&mut s);
        assert!(got.starts_with(want), "{input:?}: {got:?}");
        assert_eq!(q::<String>(&mut good, &["PING"]), "PONG");
    }
    // QUIT answers OK and closes; what was pipelined after it is not run (as Redis).
    let mut s = raw(mq.addr);
    s.write_all(b"PING\r\nQUIT\r\nSEND q after-quit\r\n").unwrap();
    assert_eq!(read_to_close(&mut s), "+PONG\r\n+OK\r\n");
    assert_eq!(q::<i64>(&mut good, &["QLEN", "q"]), 0, "nothing after QUIT was run");
    // Garbage that parses as an inline command is an unknown command; the connection stays.
    let mut s = raw(mq.addr);
    s.write_all(b"\x00\x01\xfe\xff garbage\r\nPING\r\n").unwrap();
    let got = read_until(&mut s, "+PONG\r\n");
    assert_eq!(got, "-ERR unknown command '\\x00\\x01\\xfe\\xff'\r\n+PONG\r\n");
    // A body over --max-body is read, refused, and the connection goes on.
    let mut s = raw(mq.addr);
    let body = vec![b'x'; 5000];
    let mut req = format!("*3\r\n$4\r\nSEND\r\n$1\r\nq\r\n${}\r\n", body.len()).into_bytes();
    req.extend_from_slice(&body);
    req.extend_from_slice(b"\r\n*1\r\n$4\r\nPING\r\n");
    s.write_all(&req).unwrap();
    let got = read_until(&mut s, "+PONG\r\n");
    assert!(got.contains("an argument of 5000 bytes is over the server's limit of 1024 bytes"), "{got:?}");
    assert!(got.ends_with("+PONG\r\n"), "{got:?}");
    assert_eq!(q::<i64>(&mut good, &["QLEN", "q"]), 0, "the refused SEND stored nothing");
    // Truncated frames from clients that then vanish.
    for cut in [3, 10, 25, 40] {
        let mut s = raw(mq.addr);
        let frame = b"*3\r\n$4\r\nSEND\r\n$1\r\nq\r\n$100\r\nabcdefghij";
        s.write_all(&frame[..cut.min(frame.len())]).unwrap();
        drop(s);
    }
    assert_eq!(q::<i64>(&mut good, &["QLEN", "q"]), 0);
    assert_eq!(q::<String>(&mut good, &["PING"]), "PONG");
}

#[test]
fn ten_thousand_idle_connections_and_one_more() {
    mctest::raise_fd_limit(20_500);
    let pg = Postgres::start().unwrap();
    let mq = MqProcess::start(&pg, 0, &["--max-connections", "10000"]);
    let before = rss_kib(mq.child.id());
    let mut idle = Vec::with_capacity(10_000);
    let mut good = connect(mq.addr);
    let _: String = q(&mut good, &["QCREATE", "q"]);
    while idle.len() < 9_999 {
        idle.push(TcpStream::connect(mq.addr).unwrap());
    }
    // Connections are accepted asynchronously: wait until all are counted.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info: String = q(&mut good, &["INFO"]);
        if info.contains("connected_clients:10000") {
            break;
        }
        assert!(Instant::now() < deadline, "not all connections were accepted: {info}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut over = raw(mq.addr);
    assert_eq!(read_to_close(&mut over), "-ERR max number of clients reached\r\n");
    // Served at all (a connection that is not gets the client's 30 s read timeout).
    let id: i64 = q(&mut good, &["SEND", "q", "still served"]);
    assert!(id > 0);
    let grown = rss_kib(mq.child.id()).saturating_sub(before);
    assert!(grown < 64 * 1024, "10,000 idle connections cost {grown} KiB");
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !q::<String>(&mut good, &["INFO"]).contains("connected_clients:1\r") {
        assert!(Instant::now() < deadline, "closed connections were not noticed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn clients_that_never_read_or_stall_mid_body_cost_bounded_memory() {
    let pg = Postgres::start().unwrap();
    let dir = std::env::temp_dir().join(format!("mwmq-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("mq.toml");
    std::fs::write(&cfg, "[server]\ninput_budget = 16777216\nmax_pending_output = 1048576\n").unwrap();
    let mq = MqProcess::start(&pg, 0, &["-c", cfg.to_str().unwrap()]);
    let mut good = connect(mq.addr);
    let _: String = q(&mut good, &["QCREATE", "q"]);
    let big = "y".repeat(256 * 1024);
    let _: i64 = q(&mut good, &["SEND", "q", &big]);
    let before = rss_kib(mq.child.id());
    // A client asks for the big message 2,000 times and never reads: 500 MiB of replies.
    let mut deaf = raw(mq.addr);
    let peek = b"*2\r\n$4\r\nPEEK\r\n$1\r\nq\r\n".repeat(2_000);
    deaf.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = deaf.write_all(&peek);
    // Thirty clients each send the start of a 4 MiB body and stop.
    let mut stalled = Vec::new();
    for _ in 0..30 {
        let mut s = raw(mq.addr);
        let mut req = b"*3\r\n$4\r\nSEND\r\n$1\r\nq\r\n$4194304\r\n".to_vec();
        req.extend(std::iter::repeat_n(b'z', 3 << 20));
        s.set_write_timeout(Some(Duration::from_millis(500))).unwrap();
        let _ = s.write_all(&req);
        stalled.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    // Everyone else is served (a client that is not waits out its 30 s read timeout and fails).
    for _ in 0..20 {
        let _: i64 = q(&mut good, &["QLEN", "q"]);
    }
    let grown = rss_kib(mq.child.id()).saturating_sub(before);
    // Without bounds: 90 MiB of half bodies plus hundreds of MiB of replies.
    assert!(grown < 48 * 1024, "mwmq grew by {grown} KiB");
    drop(stalled);
    drop(deaf);
    assert_eq!(q::<i64>(&mut good, &["QLEN", "q"]), 1, "no half body became a message");
    std::fs::remove_dir_all(dir).unwrap();
}
