//! mwproxy on a real network: authentication as memcached does it (`-Y`),
//! on both sides, checked byte for byte against memcached itself; TLS on
//! both sides with certificates the test makes.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use mctest::{Client, Memcached};
use mwproxy::Service;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mwproxy-secure-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Sends `request` on `s` and reads what comes until nothing more does.
fn exchange(s: &mut TcpStream, request: &[u8]) -> String {
    s.write_all(request).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(150))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                out.extend_from_slice(b"<closed>");
                break;
            }
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Sessions of requests, each sent alone on its connection; the replies of all.
fn sessions(addr: SocketAddr) -> Vec<Vec<String>> {
    let sessions: Vec<Vec<&[u8]>> = vec![
        vec![b"get k\r\n", b"version\r\n", b"mg k v\r\n", b"set k 0 0\r\n", b"add k 0 0 12\r\nalice secret\r\n"],
        vec![b"set x 0 0 5\r\nalice\r\n", b"set x 0 0 11\r\nalice wrong\r\n", b"set x 0 0 3\r\nabcxx"],
        vec![b"set x 0 0 11\r\neve hunter2\r\n", b"get k\r\n", b"set x 0 0 12\r\nalice secret\r\n"],
        vec![b"set x 0 0 12 noreply\r\nalice secret\r\n", b"set k 0 0 1\r\nv\r\n", b"get k\r\n", b"delete k\r\n"],
        // Several attempts in one write: one reply for them, as memcached keeps one per read.
        vec![b"get k\r\nset x 0 0 11\r\nalice wrong\r\nset x 0 0 12\r\nalice secret\r\nget k\r\n"],
        vec![b"set x 0 0 11\r\nalice wrong\r\nget k\r\n", b"set x 0 0 12\r\nalice secret\r\n"],
        vec![b"set whatever 5 60 13\r\nalice  secret\r\n", b"get k\r\n", b"quit\r\n"],
        vec![b"set x 0 0 7\r\nbob pw2\r\n", b"incr n 1\r\n", b"set n 0 0 1\r\n1\r\n", b"incr n 1\r\n"],
    ];
    sessions
        .into_iter()
        .map(|reqs| {
            let mut s = TcpStream::connect(addr).unwrap();
            reqs.iter().map(|r| exchange(&mut s, r)).collect()
        })
        .collect()
}

fn users_file(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("users");
    std::fs::write(&path, "alice:secret\nbob:pw2\n").unwrap();
    path
}

#[test]
fn authentication_answers_as_memcached_with_an_auth_file() {
    let dir = scratch("auth");
    let users = users_file(&dir);
    let reference = Memcached::start_with(&["-Y", users.to_str().unwrap()]).unwrap();
    let expected = sessions(reference.addr());
    assert_eq!(expected[0][0], "CLIENT_ERROR unauthenticated\r\n", "memcached asks for a login");
    let backend = common::servers(1);
    let proxy = common::proxy(&backend, |c| c.auth.file = Some(users.to_string_lossy().into_owned()));
    let got = sessions(proxy.local_addr());
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(e, g, "session {i}");
    }
    // Attempts and failures are counted, as memcached counts them.
    let mut c = common::client(&proxy);
    assert_eq!(c.call_str("set a 0 0 12\r\nalice secret\r\n").unwrap(), "STORED\r\n");
    let stats = c.call_str("stats\r\n").unwrap();
    assert_eq!(common::stat(&stats, "auth_cmds"), 11, "{stats}");
    assert_eq!(common::stat(&stats, "auth_errors"), 4);
    drop(c);
    common::stop(proxy);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn mwproxy_logs_in_to_servers_that_require_it() {
    let dir = scratch("server-auth");
    let users = users_file(&dir);
    let guarded: Vec<Memcached> =
        (0..2).map(|_| Memcached::start_with(&["-Y", users.to_str().unwrap()]).unwrap()).collect();
    let proxy = common::proxy(&guarded, |c| c.backend.auth_file = Some(users.to_string_lossy().into_owned()));
    let mut c = common::client(&proxy);
    for i in 0..20 {
        assert_eq!(c.call_str(&format!("set k{i} 0 0 1\r\n{}\r\n", i % 10)).unwrap(), "STORED\r\n");
    }
    for i in 0..20 {
        assert_eq!(c.call_str(&format!("get k{i}\r\n")).unwrap(), format!("VALUE k{i} 0 1\r\n{}\r\nEND\r\n", i % 10));
    }
    drop(c);
    common::stop(proxy);
    // Wrong credentials: the servers refuse, and the client hears it from the proxy.
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "alice:nope\n").unwrap();
    let proxy = common::proxy(&guarded, |c| c.backend.auth_file = Some(wrong.to_string_lossy().into_owned()));
    let mut c = common::client(&proxy);
    let reply = c.call_str("get k1\r\n").unwrap();
    assert!(reply.starts_with("SERVER_ERROR backend") && reply.contains("login refused"), "{reply}");
    drop(c);
    common::stop(proxy);
    // Without a login at all, the client hears the server's own refusal.
    let proxy = common::proxy(&guarded, |_| {});
    let reply = common::client(&proxy).call_str("get k1\r\n").unwrap();
    assert_eq!(reply, "CLIENT_ERROR unauthenticated\r\n");
    common::stop(proxy);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_client_that_has_not_logged_in_reaches_no_server() {
    let dir = scratch("auth-gate");
    let users = users_file(&dir);
    let backend = common::servers(1);
    let proxy = common::proxy(&backend, |c| c.auth.file = Some(users.to_string_lossy().into_owned()));
    let mut c = common::client(&proxy);
    for _ in 0..5 {
        assert_eq!(c.call_str("set k 0 0 1\r\nx\r\n").unwrap(), "CLIENT_ERROR bad authentication token format\r\n");
    }
    let mut direct = Client::connect(backend[0].addr()).unwrap();
    assert_eq!(direct.call_str("get k\r\n").unwrap(), "END\r\n", "nothing reached the server");
    common::stop(proxy);
    std::fs::remove_dir_all(&dir).ok();
}
