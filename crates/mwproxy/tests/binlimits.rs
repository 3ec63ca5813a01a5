//! What a client of the binary protocol may make mwproxy hold, as an
//! attacker tries it: keys declared before any login, `version` before a
//! login (which must not reach a server), and values sent half-way and left
//! there after a login. mwproxy runs as its own process so that its memory
//! can be read; both engines (`MWPROXY_TEST_ENGINE`). Each test failed on
//! the code before the fix it names.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mcproto::binary::{encode_request, op, status, Frame, Header, REQUEST_MAGIC};
use mctest::{Client, Memcached};
use mwproxy::Service;

fn users_file(name: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("mwproxy-binlimits-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("users");
    std::fs::write(&path, "alice:s3cret\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let users = path.to_string_lossy().into_owned();
    (dir, users)
}

/// A text client logged in as alice (for `stats`).
fn member(addr: SocketAddr) -> Client {
    let mut c = Client::connect(addr).unwrap();
    assert_eq!(c.call_str("set auth 0 0 12\r\nalice s3cret\r\n").unwrap(), "STORED\r\n");
    c
}

/// Waits until the proxy has read all it will of what was sent (its
/// `bytes_read` grows by nothing but these `stats` requests for a second),
/// at most 60 s.
fn settle(c: &mut Client) {
    let ask = "stats\r\n";
    let mut last = 0;
    let mut still = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while still < 5 && Instant::now() < deadline {
        let now = common::stat(&c.call_str(ask).unwrap(), "bytes_read");
        still = if now - last <= ask.len() as u64 { still + 1 } else { 0 };
        last = now;
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Writes what the socket takes of `bytes[*at..]` now.
fn offer(s: &mut TcpStream, bytes: &[u8], at: &mut usize) {
    while *at < bytes.len() {
        match s.write(&bytes[*at..]) {
            Ok(0) => return,
            Ok(n) => *at += n,
            Err(_) => return,
        }
    }
}

/// Whether the proxy closed `s` (after whatever answer), within 30 s.
fn closed(s: &mut TcpStream) -> bool {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// 1,500 connections that had not logged in, each declaring a 65,535-byte
/// key and sending most of it, made mwproxy buffer 94 MB for the 30 s of
/// the login deadline (the text protocol closes an over-long line before
/// login). Now, before login, a frame whose key or body is larger than a
/// SASL exchange closes the connection at its header: every one is closed,
/// and mwproxy's memory stays near where it was.
#[test]
fn keys_declared_before_login_close_the_connection_and_hold_nothing() {
    mctest::raise_fd_limit(8192);
    let (dir, users) = users_file("keys");
    let server = Memcached::start().unwrap();
    let proxy = common::ProxyProcess::start("", &["-m", &server.endpoint(), "--auth-file", &users]);
    let mut c = member(proxy.addr());
    let before = proxy.rss_mb();
    let mut socks = Vec::new();
    for i in 0..1500 {
        let opcode = if i % 2 == 0 { op::GET } else { op::SASL_AUTH };
        let mut frame = Vec::new();
        Header { magic: REQUEST_MAGIC, opcode, keylen: u16::MAX, extlen: 0, bodylen: 65_535, opaque: 0, cas: 0 }
            .write(&mut frame);
        frame.resize(24 + 65_000, b'k');
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.set_nonblocking(true).unwrap();
        let mut at = 0;
        offer(&mut s, &frame, &mut at);
        socks.push(s);
    }
    settle(&mut c);
    let during = proxy.rss_mb();
    let still_open = socks.iter_mut().map(closed).filter(|c| !c).count();
    eprintln!("RSS {before:.0} MB before, {during:.0} MB with 1,500 declared keys; {still_open} left open");
    assert_eq!(still_open, 0, "every connection declaring a key too large before login is closed");
    assert!(during - before < 32.0, "RSS grew by {:.0} MB", during - before);
    let _ = std::fs::remove_dir_all(dir);
}

/// Binary `version` before a login was carried to memcached (80,000 in 4 s
/// from one connection that never logged in). Now mwproxy answers it
/// itself: in front of a server that is not even running, it still answers.
#[test]
fn version_before_login_is_answered_by_the_proxy_itself() {
    let (dir, users) = users_file("version");
    let nobody = format!("127.0.0.1:{}", mctest::free_port());
    let proxy = common::proxy_for(&[nobody], |c| c.auth.file = Some(users.clone()));
    let mut s = TcpStream::connect(proxy.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = Vec::new();
    for opaque in 0..100 {
        encode_request(&mut req, op::VERSION, opaque, 0, &[], &[], &[]);
    }
    s.write_all(&req).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut frames = Vec::new();
    while frames.len() < 100 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {} answers", frames.len());
        got.extend_from_slice(&buf[..n]);
        while let Some((f, len)) = Frame::read(&got) {
            frames.push((f.status, f.opaque, f.value.to_vec()));
            got.drain(..len);
        }
    }
    for (i, (st, opaque, value)) in frames.iter().enumerate() {
        assert_eq!((*st, *opaque), (status::SUCCESS, i as u32), "{}", String::from_utf8_lossy(value));
        assert_eq!(value.as_slice(), mwproxy::VERSION.as_bytes());
    }
    common::stop(proxy);
    let _ = std::fs::remove_dir_all(dir);
}

/// After a login, 300 connections each sending most of a 1 MB value and
/// stopping held 243 MB outside `memory_budget`: only whole requests were
/// counted. Now a request that has begun holds its declared size of the
/// budget before more of it is read, and a connection without room is not
/// read on: with a 16 MiB budget, mwproxy grows by at most the budget plus
/// 64 KiB a connection (one read and the buffer it lands in) plus 24 MB of
/// slack, other clients are served throughout, and the budget is given back
/// when the connections go.
#[test]
fn values_sent_half_way_stay_within_the_memory_budget() {
    mctest::raise_fd_limit(8192);
    let (dir, users) = users_file("half");
    let server = Memcached::start_with(&["-m", "256"]).unwrap();
    let mut proxy =
        common::ProxyProcess::start("", &["-m", &server.endpoint(), "--auth-file", &users, "--memory-budget", "16m"]);
    let mut c = member(proxy.addr());
    let before = proxy.rss_mb();
    let value_len = 1_000_000;
    let mut socks = Vec::new();
    for i in 0..330 {
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let half = if i < 300 {
            // Binary: SASL PLAIN, then a set whose value stops 1 KB short.
            let mut login = Vec::new();
            encode_request(&mut login, op::SASL_AUTH, 1, 0, &[], b"PLAIN", b"\0alice\0s3cret");
            s.write_all(&login).unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap();
            assert_eq!(Frame::read(&buf[..n]).map(|(f, _)| f.status), Some(status::SUCCESS));
            let mut set = Vec::new();
            encode_request(&mut set, op::SET, 2, 0, &[0; 8], format!("half{i}").as_bytes(), &vec![b'v'; value_len]);
            set.truncate(set.len() - 1000);
            set
        } else {
            // Text, the same way.
            s.write_all(b"set auth 0 0 12\r\nalice s3cret\r\n").unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"STORED\r\n");
            let mut set = format!("set half{i} 0 0 {value_len}\r\n").into_bytes();
            set.resize(set.len() + value_len - 1000, b'v');
            set
        };
        s.set_nonblocking(true).unwrap();
        socks.push((s, half, 0));
    }
    // Offer the rest for a few seconds, as the proxy reads.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        for (s, bytes, at) in &mut socks {
            offer(s, bytes, at);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    settle(&mut c);
    let during = proxy.rss_mb();
    // A neighbour is served all along.
    for i in 0..50 {
        let v = format!("small{i}");
        assert_eq!(c.call_str(&format!("set n 0 0 {}\r\n{v}\r\n", v.len())).unwrap(), "STORED\r\n");
        assert_eq!(c.call_str("get n\r\n").unwrap(), format!("VALUE n 0 {}\r\n{v}\r\nEND\r\n", v.len()));
    }
    let stats = c.call_str("stats\r\n").unwrap();
    let held = common::stat(&stats, "pending_input_bytes");
    let sent: usize = socks.iter().map(|s| s.2).sum();
    eprintln!(
        "RSS {before:.0} MB before, {during:.0} MB with 330 values half-sent ({} MB offered); budget held {held} B",
        sent >> 20
    );
    let bound = 16.0 + 330.0 * 64.0 / 1024.0 + 24.0;
    assert!(during - before < bound, "RSS grew by {:.0} MB (bound {bound:.0})", during - before);
    drop(socks);
    assert!(
        common::eventually(Duration::from_secs(30), || {
            let stats = c.call_str("stats\r\n").unwrap();
            common::stat(&stats, "curr_connections") == 1 && common::stat(&stats, "pending_input_bytes") == 0
        }),
        "the budget is given back when they go: {}",
        c.call_str("stats\r\n").unwrap()
    );
    assert!(proxy.child.try_wait().is_ok_and(|s| s.is_none()), "still running: {}", proxy.log());
    let _ = std::fs::remove_dir_all(dir);
}
