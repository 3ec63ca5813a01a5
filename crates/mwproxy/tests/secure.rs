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

/// How long a reply may take before the test fails: long, so that a loaded
/// machine's delays are never taken for a missing reply.
const PATIENCE: Duration = Duration::from_secs(30);

/// Sends `request` on `s` and reads its reply: until `complete` holds of the
/// bytes read (or the peer closes, shown as `<closed>`), within [`PATIENCE`];
/// then whatever else arrives before 150 ms pass quietly. That window only
/// catches extra bytes (a second reply, a close): a correct peer sends none,
/// so a busy machine can only make it miss them, never fail the test, and
/// extra bytes that come later show at the front of the next reply.
fn exchange(s: &mut TcpStream, request: &[u8], complete: impl Fn(&[u8]) -> bool) -> String {
    s.write_all(request).unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let mut waiting = true;
    loop {
        if waiting && complete(&out) {
            waiting = false;
        }
        let wait = if waiting {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(
                !left.is_zero(),
                "no whole reply to {:?} within {PATIENCE:?}: {:?}",
                String::from_utf8_lossy(request),
                String::from_utf8_lossy(&out)
            );
            left
        } else {
            Duration::from_millis(150)
        };
        s.set_read_timeout(Some(wait)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => {
                out.extend_from_slice(b"<closed>");
                break;
            }
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if waiting && matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `buf` holds one or more whole replies and nothing else. memcached
/// answers all the requests of one read in one write, so the first whole
/// replies that arrive are the whole answer to one write of requests.
fn whole_replies(mut buf: &[u8]) -> bool {
    if buf.is_empty() {
        return false;
    }
    while !buf.is_empty() {
        match mcproto::response_len(buf) {
            Ok(Some(n)) => buf = &buf[n..],
            _ => return false,
        }
    }
    true
}

/// The requests of each session: each is sent alone on its connection.
fn session_requests() -> Vec<Vec<&'static [u8]>> {
    vec![
        vec![b"get k\r\n", b"version\r\n", b"mg k v\r\n", b"set k 0 0\r\n", b"add k 0 0 12\r\nalice secret\r\n"],
        vec![b"set x 0 0 5\r\nalice\r\n", b"set x 0 0 11\r\nalice wrong\r\n", b"set x 0 0 3\r\nabcxx"],
        vec![b"set x 0 0 11\r\neve hunter2\r\n", b"get k\r\n", b"set x 0 0 12\r\nalice secret\r\n"],
        vec![b"set x 0 0 12 noreply\r\nalice secret\r\n", b"set k 0 0 1\r\nv\r\n", b"get k\r\n", b"delete k\r\n"],
        // Several attempts in one write: one reply for them, as memcached keeps one per read.
        vec![b"get k\r\nset x 0 0 11\r\nalice wrong\r\nset x 0 0 12\r\nalice secret\r\nget k\r\n"],
        vec![b"set x 0 0 11\r\nalice wrong\r\nget k\r\n", b"set x 0 0 12\r\nalice secret\r\n"],
        vec![b"set whatever 5 60 13\r\nalice  secret\r\n", b"get k\r\n", b"quit\r\n"],
        vec![b"set x 0 0 7\r\nbob pw2\r\n", b"incr n 1\r\n", b"set n 0 0 1\r\n1\r\n", b"incr n 1\r\n"],
    ]
}

/// The replies of memcached at `addr` to every session: each reply read
/// until it is whole replies (or the connection closes).
fn reference_sessions(addr: SocketAddr) -> Vec<Vec<String>> {
    session_requests()
        .into_iter()
        .map(|reqs| {
            let mut s = TcpStream::connect(addr).unwrap();
            reqs.iter().map(|r| exchange(&mut s, r, whole_replies)).collect()
        })
        .collect()
}

/// The replies of the proxy at `addr` to every session, each read until it
/// is as long as the one `expected` (or longer, or the connection closes).
fn sessions(addr: SocketAddr, expected: &[Vec<String>]) -> Vec<Vec<String>> {
    session_requests()
        .into_iter()
        .zip(expected)
        .map(|(reqs, wanted)| {
            let mut s = TcpStream::connect(addr).unwrap();
            reqs.iter().zip(wanted).map(|(r, w)| exchange(&mut s, r, |got| got.len() >= w.len())).collect()
        })
        .collect()
}

/// Only its owner may read it (mwproxy refuses users files others may read).
fn private(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn users_file(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("users");
    std::fs::write(&path, "alice:secret\nbob:pw2\n").unwrap();
    private(&path);
    path
}

/// The reply to a failed login.
const FAILED: &str = "CLIENT_ERROR authentication failure\r\n";

#[test]
fn authentication_answers_as_memcached_with_an_auth_file() {
    let dir = scratch("auth");
    let users = users_file(&dir);
    let reference = Memcached::start_with(&["-Y", users.to_str().unwrap()]).unwrap();
    let expected = reference_sessions(reference.addr());
    assert_eq!(expected[0][0], "CLIENT_ERROR unauthenticated\r\n", "memcached asks for a login");
    // What the proxy answers: memcached's replies, but for the two sessions
    // where it differs by design (asserted below).
    let mut wanted = expected.clone();
    wanted[4][0] = FAILED.into();
    wanted[5][0] = FAILED.into();
    let backend = common::servers(1);
    let proxy = common::proxy(&backend, |c| c.auth.file = Some(users.to_string_lossy().into_owned()));
    let got = sessions(proxy.local_addr(), &wanted);
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        if i == 4 {
            // Beyond memcached: what was pipelined behind a failed login is
            // dropped, so one write of many guesses tries one.
            assert_eq!(e, &["STORED\r\nEND\r\n"], "memcached takes a password pipelined behind a wrong one");
            assert_eq!(g, &[FAILED], "mwproxy drops it");
            continue;
        }
        if i == 5 {
            // The same: the `get` behind the failed login is dropped, and the
            // client hears that its login failed (memcached answers the `get`).
            assert_eq!(e[0], "CLIENT_ERROR unauthenticated\r\n");
            assert_eq!(g[0], FAILED);
            assert_eq!(e[1..], g[1..]);
            continue;
        }
        assert_eq!(e, g, "session {i}");
    }
    // Attempts and failures are counted, as memcached counts them.
    let mut c = common::client(&proxy);
    assert_eq!(c.call_str("set a 0 0 12\r\nalice secret\r\n").unwrap(), "STORED\r\n");
    let stats = c.call_str("stats\r\n").unwrap();
    // (memcached counts 11: the attempt dropped behind a failed one is not made.)
    assert_eq!(common::stat(&stats, "auth_cmds"), 10, "{stats}");
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
    // Wrong credentials: the servers refuse, and the client hears it from the
    // proxy. (Without health checks: a check would find the refusal first and
    // the client would hear `unavailable`, the reason being in the log;
    // tests/health_check.rs has that case.)
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "alice:nope\n").unwrap();
    private(&wrong);
    let proxy = common::proxy(&guarded, |c| {
        c.backend.auth_file = Some(wrong.to_string_lossy().into_owned());
        c.backend.check_ms = 0;
    });
    let mut c = common::client(&proxy);
    let reply = c.call_str("get k1\r\n").unwrap();
    assert!(reply.starts_with("SERVER_ERROR backend") && reply.contains("login refused"), "{reply}");
    drop(c);
    common::stop(proxy);
    // Without a login at all, the client hears the server's own refusal.
    let proxy = common::proxy(&guarded, |c| c.backend.check_ms = 0);
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

/// PEM files of two CAs, a certificate for 127.0.0.1/localhost signed by the
/// first, and client certificates signed by each.
struct Certs {
    ca: PathBuf,
    stranger_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    stranger_cert: PathBuf,
    stranger_key: PathBuf,
}

fn certs(dir: &std::path::Path) -> Certs {
    let ca = |name: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        (p.self_signed(&key).unwrap(), key)
    };
    let leaf = |names: Vec<String>, (ca, ca_key): &(rcgen::Certificate, rcgen::KeyPair)| {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(names).unwrap().signed_by(&key, ca, ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (trusted, stranger) = (ca("mwproxy test CA"), ca("someone else"));
    let server = leaf(vec!["localhost".into(), "127.0.0.1".into()], &trusted);
    let client = leaf(vec!["client".into()], &trusted);
    let other = leaf(vec!["client".into()], &stranger);
    let write = |name: &str, pem: &str| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    Certs {
        ca: write("ca.pem", &trusted.0.pem()),
        stranger_ca: write("stranger-ca.pem", &stranger.0.pem()),
        cert: write("cert.pem", &server.0),
        key: write("key.pem", &server.1),
        client_cert: write("client.pem", &client.0),
        client_key: write("client-key.pem", &client.1),
        stranger_cert: write("stranger.pem", &other.0),
        stranger_key: write("stranger-key.pem", &other.1),
    }
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS client of `addr` trusting `ca`, with a client certificate if given.
fn tls_client(addr: SocketAddr, ca: &std::path::Path, identity: Option<(&PathBuf, &PathBuf)>) -> Tls {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert).unwrap().map(Result::unwrap).collect();
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(key).unwrap()).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    rustls::StreamOwned::new(conn, sock)
}

/// Sends `request` and reads until the reply ends with `end`; an error if the connection fails first.
fn tls_call(s: &mut Tls, request: &str, end: &str) -> std::io::Result<String> {
    s.write_all(request.as_bytes())?;
    s.flush()?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.ends_with(end.as_bytes()) {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn path(p: &std::path::Path) -> Option<String> {
    Some(p.to_string_lossy().into_owned())
}

#[test]
fn clients_speak_tls_and_plaintext_to_the_tls_port_is_refused() {
    let dir = scratch("tls-clients");
    let c = certs(&dir);
    let backend = common::servers(2);
    let plain_port = mctest::free_port();
    let proxy = common::proxy(&backend, |cfg| {
        cfg.tls.cert = path(&c.cert);
        cfg.tls.key = path(&c.key);
        cfg.tls.plain_listen = Some(format!("127.0.0.1:{plain_port}"));
    });
    let mut s = tls_client(proxy.local_addr(), &c.ca, None);
    assert_eq!(tls_call(&mut s, "set t 0 0 5\r\nhello\r\n", "\r\n").unwrap(), "STORED\r\n");
    let big = "v".repeat(300_000);
    assert_eq!(tls_call(&mut s, &format!("set big 0 0 {}\r\n{big}\r\n", big.len()), "\r\n").unwrap(), "STORED\r\n");
    let reply = tls_call(&mut s, "get t big\r\n", "END\r\n").unwrap();
    assert!(reply.starts_with("VALUE t 0 5\r\nhello\r\nVALUE big 0 300000\r\n") && reply.len() > 300_000);
    // Pipelined requests over TLS come back in order.
    let many: String = (0..200).map(|i| format!("set p{i} 0 0 1\r\n{}\r\n", i % 10)).collect();
    let replies = tls_call(&mut s, &(many + "get p199\r\n"), "END\r\n").unwrap();
    assert!(replies.starts_with(&"STORED\r\n".repeat(200)) && replies.ends_with("VALUE p199 0 1\r\n9\r\nEND\r\n"));
    // The plaintext listener beside it serves the same keys.
    let mut plain = Client::connect(SocketAddr::from(([127, 0, 0, 1], plain_port))).unwrap();
    assert_eq!(plain.call_str("get t\r\n").unwrap(), "VALUE t 0 5\r\nhello\r\nEND\r\n");
    // The binary protocol over TLS reads the same key.
    let mut bin = tls_client(proxy.local_addr(), &c.ca, None);
    let mut request = Vec::new();
    mcproto::binary::encode_request(&mut request, mcproto::binary::op::GET, 7, 0, &[], b"t", &[]);
    bin.write_all(&request).unwrap();
    let mut buf = Vec::new();
    let got = loop {
        let mut chunk = [0u8; 4096];
        let n = bin.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before the binary reply");
        buf.extend_from_slice(&chunk[..n]);
        if let Some((f, _)) = mcproto::binary::Frame::read(&buf) {
            break (f.status, f.opaque, f.value.to_vec());
        }
    };
    assert_eq!(got, (0, 7, b"hello".to_vec()));
    // Plaintext to the TLS port: refused and closed, counted; everyone else goes on.
    let mut wrong = TcpStream::connect(proxy.local_addr()).unwrap();
    // (Read until it closes: nothing it could send completes the reply.)
    let answer = exchange(&mut wrong, b"get t\r\n", |_| false);
    assert!(answer.ends_with("<closed>") && !answer.contains("VALUE"), "{answer:?}");
    // A client that does not trust the proxy's CA gives up in the handshake.
    let mut untrusting = tls_client(proxy.local_addr(), &c.stranger_cert, None);
    assert!(tls_call(&mut untrusting, "get t\r\n", "END\r\n").is_err());
    assert_eq!(tls_call(&mut s, "get t\r\n", "END\r\n").unwrap(), "VALUE t 0 5\r\nhello\r\nEND\r\n");
    // (Counted once the proxy has finished with the handshake, which may be
    // just after the client gave up: read until it is in, 30 s at most.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let stats = plain.call_str("stats\r\n").unwrap();
        if common::stat(&stats, "tls_handshake_failures") >= 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{stats}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop((s, plain));
    common::stop(proxy);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn with_a_client_ca_only_clients_with_its_certificates_get_in() {
    let dir = scratch("mtls");
    let c = certs(&dir);
    let backend = common::servers(1);
    let proxy = common::proxy(&backend, |cfg| {
        cfg.tls.cert = path(&c.cert);
        cfg.tls.key = path(&c.key);
        cfg.tls.ca = path(&c.ca);
    });
    let mut good = tls_client(proxy.local_addr(), &c.ca, Some((&c.client_cert, &c.client_key)));
    assert_eq!(tls_call(&mut good, "set m 0 0 1\r\nx\r\n", "\r\n").unwrap(), "STORED\r\n");
    let mut anonymous = tls_client(proxy.local_addr(), &c.ca, None);
    assert!(tls_call(&mut anonymous, "get m\r\n", "END\r\n").is_err(), "no client certificate");
    let mut stranger = tls_client(proxy.local_addr(), &c.ca, Some((&c.stranger_cert, &c.stranger_key)));
    assert!(tls_call(&mut stranger, "get m\r\n", "END\r\n").is_err(), "a certificate another CA signed");
    assert_eq!(tls_call(&mut good, "get m\r\n", "END\r\n").unwrap(), "VALUE m 0 1\r\nx\r\nEND\r\n");
    // The proxy counts a refused handshake once it has finished with it,
    // which may be just after the client has given up: read the counter
    // until both refusals are in (a hang guard of 30 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let stats = tls_call(&mut good, "stats\r\n", "END\r\n").unwrap();
        if common::stat(&stats, "tls_handshake_failures") >= 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{stats}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(good);
    common::stop(proxy);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn mwproxy_speaks_tls_to_servers_started_with_tls() {
    let dir = scratch("tls-servers");
    let c = certs(&dir);
    let ssl = format!("ssl_chain_cert={},ssl_key={}", c.cert.display(), c.key.display());
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start_with(&["-Z", "-o", &ssl]).unwrap()).collect();
    // TLS on both sides, with replication (every write reaches two TLS servers).
    let proxy = common::proxy(&servers, |cfg| {
        cfg.backend.tls = true;
        cfg.backend.tls_ca = path(&c.ca);
        cfg.routing.replication = 2;
        cfg.tls.cert = path(&c.cert);
        cfg.tls.key = path(&c.key);
    });
    let mut s = tls_client(proxy.local_addr(), &c.ca, None);
    for i in 0..50 {
        assert_eq!(tls_call(&mut s, &format!("set s{i} 0 0 2\r\n{:02}\r\n", i), "\r\n").unwrap(), "STORED\r\n");
    }
    let keys: Vec<String> = (0..50).map(|i| format!("s{i}")).collect();
    let reply = tls_call(&mut s, &format!("get {}\r\n", keys.join(" ")), "END\r\n").unwrap();
    assert_eq!(reply.matches("VALUE").count(), 50, "{reply}");
    drop(s);
    common::stop(proxy);
    // A CA the servers' certificates do not come from: refused, each request told why.
    let proxy = common::proxy(&servers, |cfg| {
        cfg.backend.tls = true;
        cfg.backend.tls_ca = path(&c.stranger_cert);
    });
    let reply = common::client(&proxy).call_str("get s1\r\n").unwrap();
    assert!(reply.starts_with("SERVER_ERROR backend"), "{reply}");
    common::stop(proxy);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_reload_takes_new_users_and_certificates_for_new_connections() {
    let dir = scratch("reload-secrets");
    let c = certs(&dir);
    let users = users_file(&dir);
    let client_ca = dir.join("client-ca.pem");
    std::fs::copy(&c.ca, &client_ca).unwrap();
    let backend = common::servers(1);
    let config = common::config(&backend, |cfg| {
        cfg.auth.file = path(&users);
        cfg.tls.cert = path(&c.cert);
        cfg.tls.key = path(&c.key);
        cfg.tls.ca = path(&client_ca);
    });
    let proxy = mwproxy::Proxy::start(config.clone()).unwrap();
    let reload = proxy.reloads(std::sync::Arc::new(move || Ok(config.clone()))).expect("mwproxy reloads");
    let login = |user: &str, pw: &str| format!("set x 0 0 {}\r\n{user} {pw}\r\n", user.len() + pw.len() + 1);
    let mut old = tls_client(proxy.local_addr(), &c.ca, Some((&c.client_cert, &c.client_key)));
    assert_eq!(tls_call(&mut old, &login("alice", "secret"), "\r\n").unwrap(), "STORED\r\n");

    // A new password, and client certificates of the other CA only.
    std::fs::write(&users, "alice:changed\n").unwrap();
    std::fs::copy(&c.stranger_ca, &client_ca).unwrap();
    let report = reload().expect("reloaded");
    assert!(report.contains("configuration 2 in use"), "{report}");

    let mut stranger = tls_client(proxy.local_addr(), &c.ca, Some((&c.stranger_cert, &c.stranger_key)));
    assert_eq!(
        tls_call(&mut stranger, &login("alice", "secret"), "\r\n").unwrap(),
        "CLIENT_ERROR authentication failure\r\n"
    );
    let mut stranger = tls_client(proxy.local_addr(), &c.ca, Some((&c.stranger_cert, &c.stranger_key)));
    assert_eq!(tls_call(&mut stranger, &login("alice", "changed"), "\r\n").unwrap(), "STORED\r\n");
    let mut formerly = tls_client(proxy.local_addr(), &c.ca, Some((&c.client_cert, &c.client_key)));
    assert!(tls_call(&mut formerly, "get k\r\n", "END\r\n").is_err(), "the old client CA is no longer trusted");
    // The connection made before the reload stays, logged in.
    assert_eq!(tls_call(&mut old, "set k 0 0 1\r\nv\r\n", "\r\n").unwrap(), "STORED\r\n");

    // A users file that cannot be read: refused, the running configuration stays.
    std::fs::remove_file(&users).unwrap();
    let why = reload().expect_err("a missing users file is refused");
    assert!(why.contains("users"), "{why}");
    let mut again = tls_client(proxy.local_addr(), &c.ca, Some((&c.stranger_cert, &c.stranger_key)));
    assert_eq!(tls_call(&mut again, &login("alice", "changed"), "\r\n").unwrap(), "STORED\r\n");
    let stats = tls_call(&mut again, "stats\r\n", "END\r\n").unwrap();
    assert_eq!(common::stat(&stats, "config_reloads"), 1, "{stats}");
    assert_eq!(common::stat(&stats, "config_reload_failures"), 1, "{stats}");
    drop((old, stranger, formerly, again));
    common::stop(proxy);
    std::fs::remove_dir_all(&dir).ok();
}
