//! The active health check (`[backend] check_ms`): `/readyz` tells the truth
//! about servers no client has tried. Before it, `/readyz` only reflected what
//! client traffic had found: 200 at start with its only memcached not running,
//! and 503 for ever after that memcached came back if no client came (behind
//! a load balancer that routes on `/readyz`, none does). Every verdict here is
//! a condition polled with a generous deadline, or a count.

mod common;

use std::io::{BufReader, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mctest::{http_get, Memcached};
use mwproxy::Service;

/// Long enough for anything this machine does under load.
const PATIENCE: Duration = Duration::from_secs(30);

/// `/readyz`: whether it answered 200, and its body. A readiness answer is
/// served again for `READY_FOR`: waited out first, so that this answer is a
/// new look at the servers' health.
fn ready(admin: SocketAddr) -> (bool, serde_json::Value) {
    std::thread::sleep(mwserve::http::READY_FOR);
    let (status, body) = http_get(admin, "/readyz");
    let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (status.contains(" 200 "), v)
}

/// Waits until `/readyz` answers 200 (`true`) or 503 (`false`) with every
/// server checked; the last body otherwise.
fn until_ready(admin: SocketAddr, want: bool) -> Result<serde_json::Value, serde_json::Value> {
    let mut last = serde_json::Value::Null;
    let reached = common::eventually(PATIENCE, || {
        let (ok, v) = ready(admin);
        let checked = v["unchecked"].as_array().is_some_and(Vec::is_empty);
        last = v;
        ok == want && checked
    });
    if reached {
        Ok(last)
    } else {
        Err(last)
    }
}

/// The sum of a `/metrics` counter over its labels.
fn metric(admin: SocketAddr, name: &str) -> f64 {
    let (_, page) = http_get(admin, "/metrics");
    page.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn with_admin(c: &mut mwproxy::Config) {
    c.stats.admin = Some("127.0.0.1:0".into());
    c.backend.check_ms = 100;
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mwproxy-check-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A `user:password` file only its owner may read.
fn users_file(dir: &std::path::Path, line: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("users-{}", line.len()));
    std::fs::write(&path, format!("{line}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn readyz_follows_a_server_that_no_client_has_tried() {
    let mut server = Memcached::start().unwrap();
    server.stop();
    let proxy = common::proxy(std::slice::from_ref(&server), with_admin);
    let admin = proxy.admin_addr().unwrap();
    let v = until_ready(admin, false).expect("503 once the first check found the server down");
    assert_eq!(v["down"], serde_json::json!([server.endpoint()]), "{v}");
    // The server starts: ready, and no client has connected.
    server.restart().unwrap();
    until_ready(admin, true).expect("200 once a check found it answering");
    // Killed again: not ready, still without a client.
    server.stop();
    until_ready(admin, false).expect("503 once a check found it gone");
    assert_eq!(metric(admin, "mwproxy_connections_accepted_total"), 0.0, "no client ever connected");
    assert!(metric(admin, "mwproxy_backend_health_check_failures_total") >= 2.0);
    assert!(metric(admin, "mwproxy_backend_health_checks_total") >= 3.0);
    common::stop(proxy);
}

/// `check_ms = 0`: no checks, a server's health is what requests found, as
/// before the checker: ready at start whatever the servers, not ready after
/// a request failed, until a request finds the server again.
#[test]
fn without_checks_readyz_is_what_requests_found() {
    let mut server = Memcached::start().unwrap();
    server.stop();
    let proxy = common::proxy(std::slice::from_ref(&server), |c| {
        with_admin(c);
        c.backend.check_ms = 0;
    });
    let admin = proxy.admin_addr().unwrap();
    let (ok, v) = ready(admin);
    assert!(ok && v["down"] == serde_json::json!([]) && v["unchecked"] == serde_json::json!([]), "{v}");
    let mut c = common::client(&proxy);
    assert!(c.call_str("get k\r\n").unwrap().starts_with("SERVER_ERROR backend"));
    assert!(!ready(admin).0, "a failed request marks it down");
    server.restart().unwrap();
    // Nothing tries it: it stays down (a few looks, each answered at once).
    for _ in 0..5 {
        assert!(!ready(admin).0, "nobody tried the server");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        common::eventually(PATIENCE, || c.call_str("get k\r\n").unwrap() == "END\r\n" && ready(admin).0),
        "a request after the backoff probes it"
    );
    assert_eq!(metric(admin, "mwproxy_backend_health_checks_total"), 0.0);
    common::stop(proxy);
}

/// A server marked down by a request comes back by a check alone: checks of
/// a down server follow its backoff, however long `check_ms` is.
#[test]
fn a_server_marked_down_by_a_request_comes_back_by_the_checker_alone() {
    let mut servers = common::servers(2);
    let proxy = common::proxy(&servers, |c| {
        with_admin(c);
        // No idle checks within the test: only the request can find the server down.
        c.backend.check_ms = 600_000;
    });
    let admin = proxy.admin_addr().unwrap();
    until_ready(admin, true).expect("both servers checked at start");
    let key = "k1";
    let mut c = common::client(&proxy);
    assert_eq!(c.call_str(&format!("set {key} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    let owner = common::holders(&servers, key)[0];
    servers[owner].stop();
    let reply = c.call_str(&format!("get {key}\r\n")).unwrap();
    assert!(reply.starts_with("SERVER_ERROR backend"), "{reply}");
    let v = until_ready(admin, false).expect("the request marked it down");
    assert_eq!(v["down"], serde_json::json!([servers[owner].endpoint()]), "{v}");
    servers[owner].restart().unwrap();
    until_ready(admin, true).expect("up again by a check, without a request");
    assert_eq!(c.call_str(&format!("get {key}\r\n")).unwrap(), "END\r\n", "the first request after it is served");
    common::stop(proxy);
}

/// What a check sends, recorded by a fake server: the login first on each
/// connection when the servers want one, then `version`, and nothing else.
#[test]
fn a_check_sends_only_version_after_the_login() {
    let dir = scratch("fake");
    for auth in [None, Some(users_file(&dir, "alice:secret"))] {
        let lines = Arc::new(Mutex::new(Vec::<(usize, String)>::new()));
        let seen = lines.clone();
        let conns = Arc::new(AtomicUsize::new(0));
        let fake = common::FakeServer::start(move |s| {
            let id = conns.fetch_add(1, Ordering::Relaxed);
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            while let Some(line) = common::read_request(&mut r) {
                let reply: &[u8] = match line.split_whitespace().next() {
                    Some("set") => b"STORED\r\n",
                    Some("version") => b"VERSION 1.6.99\r\n",
                    _ => b"ERROR\r\n",
                };
                seen.lock().unwrap().push((id, line.trim_end().to_string()));
                if w.write_all(reply).is_err() {
                    return;
                }
            }
        });
        let proxy = common::proxy_for(&[fake.endpoint()], |c| {
            with_admin(c);
            c.backend.auth_file.clone_from(&auth);
        });
        let admin = proxy.admin_addr().unwrap();
        let versions = || lines.lock().unwrap().iter().filter(|(_, l)| l == "version").count();
        assert!(common::eventually(PATIENCE, || versions() >= 3), "checks repeat: {:?}", lines.lock().unwrap());
        until_ready(admin, true).expect("the fake answers");
        common::stop(proxy);
        let got = lines.lock().unwrap().clone();
        let mut first = std::collections::HashSet::new();
        for (id, line) in &got {
            let login = first.insert(*id) && auth.is_some();
            let want = if login { "set auth 0 0 12" } else { "version" };
            assert_eq!(line, want, "connection {id} of {got:?}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// TLS to servers that require a login: a check logs in over TLS, a wrong
/// password is a failed check; a server on a unix socket is checked too.
#[test]
fn servers_behind_tls_logins_and_unix_sockets_are_checked() {
    let dir = scratch("kinds");
    let certs = mctest::Certificates::make(&dir).unwrap();
    let users = users_file(&dir, "alice:secret");
    let mut flags = certs.memcached_flags();
    flags.extend(["-Y".to_string(), users.clone()]);
    let mut server = Memcached::start_with(&flags.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let tls = |c: &mut mwproxy::Config| {
        with_admin(c);
        c.backend.tls = true;
        c.backend.tls_ca = Some(certs.ca.to_string_lossy().into_owned());
    };
    let proxy = common::proxy(std::slice::from_ref(&server), |c| {
        tls(c);
        c.backend.auth_file = Some(users.clone());
    });
    let admin = proxy.admin_addr().unwrap();
    until_ready(admin, true).expect("checked over TLS, logged in");
    assert!(common::eventually(PATIENCE, || metric(admin, "mwproxy_backend_health_checks_total") >= 2.0));
    assert_eq!(metric(admin, "mwproxy_backend_health_check_failures_total"), 0.0);
    server.stop();
    until_ready(admin, false).expect("a check finds it gone");
    server.restart().unwrap();
    until_ready(admin, true).expect("and back");
    common::stop(proxy);
    let wrong = users_file(&dir, "alice:wrong-password");
    let proxy = common::proxy(std::slice::from_ref(&server), |c| {
        tls(c);
        c.backend.auth_file = Some(wrong.clone());
    });
    until_ready(proxy.admin_addr().unwrap(), false).expect("a refused login fails the check");
    common::stop(proxy);

    let sock = dir.join("mc.sock");
    let unix = || {
        let mut cmd = std::process::Command::new("memcached");
        cmd.arg("-s").arg(&sock).args(["-a", "0700", "-t", "1", "-m", "64"]);
        if rustix::process::getuid().is_root() {
            cmd.args(["-u", "root"]);
        }
        cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap()
    };
    let mut child = unix();
    let proxy = common::proxy_for(&[sock.to_string_lossy().into_owned()], with_admin);
    let admin = proxy.admin_addr().unwrap();
    until_ready(admin, true).expect("checked over its unix socket");
    child.kill().unwrap();
    child.wait().unwrap();
    until_ready(admin, false).expect("a check finds it gone");
    let mut child = unix();
    until_ready(admin, true).expect("and back");
    common::stop(proxy);
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

/// With twemproxy's ejection: checks count as requests do while the server
/// is on the ring (two failed checks eject an idle dead server), not while it
/// is off it (no ejection again, no longer time off the ring), and a check's
/// success does not bring it back before `eject_for_ms`.
#[test]
fn checks_eject_a_dead_server_once_and_do_not_bring_it_back_early() {
    let mut servers = common::servers(2);
    let proxy = common::proxy(&servers, |c| {
        with_admin(c);
        c.backend.eject = true;
        c.backend.eject_after = 2;
        c.backend.eject_for_ms = 600_000;
    });
    let admin = proxy.admin_addr().unwrap();
    until_ready(admin, true).expect("both checked");
    let shared = proxy.shared();
    servers[1].stop();
    assert!(common::eventually(PATIENCE, || shared.servers.ejections() == 1), "ejected by failed checks");
    let failed = metric(admin, "mwproxy_backend_health_check_failures_total");
    assert!(
        common::eventually(PATIENCE, || metric(admin, "mwproxy_backend_health_check_failures_total") >= failed + 4.0),
        "checked on while ejected"
    );
    assert_eq!(shared.servers.ejections(), 1, "failed checks of an ejected server eject it no more");
    let (ok, v) = ready(admin);
    assert!(ok, "its keys are on the other server's ring: {v}");
    servers[1].restart().unwrap();
    until_ready(admin, true).expect("up again");
    assert!(common::eventually(PATIENCE, || v_down(admin).is_empty()), "a check brought it up");
    // Still off the ring: every key goes to the other server.
    let mut c = common::client(&proxy);
    for i in 0..20 {
        assert_eq!(c.call_str(&format!("set e{i} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
        assert_eq!(common::holders(&servers, &format!("e{i}")), vec![0], "e{i} while the server is ejected");
    }
    common::stop(proxy);
}

/// The servers `/readyz` names down.
fn v_down(admin: SocketAddr) -> Vec<serde_json::Value> {
    ready(admin).1["down"].as_array().cloned().unwrap_or_default()
}
