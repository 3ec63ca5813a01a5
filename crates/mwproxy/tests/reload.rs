//! Reloading the configuration of a running mwproxy (the binary, as a user
//! runs it): servers added and removed under load from 64 connections of
//! mwload without an error or a dropped client connection, keys where ketama
//! over the new list (and twemproxy with it) puts them, the connections to
//! unchanged servers kept and those to a removed one closed, and a broken
//! file refused while the proxy goes on serving.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mcproto::ring::{HashKind, Ring, ServerSpec};
use mctest::{free_port, http_get, wait_for_port, Client, Memcached};

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A binary of the workspace next to mwproxy's (`make test` builds them all first).
fn binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_mwproxy")).with_file_name(name);
    assert!(path.is_file(), "{} is missing: build the workspace's binaries first (make test does)", path.display());
    path
}

fn write_config(path: &Path, listen: u16, servers: &[&Memcached]) {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{}\"", s.endpoint())).collect();
    let text = format!(
        "[proxy]\nlisten = \"127.0.0.1:{listen}\"\n\n[routing]\nservers = [{}]\n\n[backend]\ntimeout_ms = 2000\n",
        list.join(", ")
    );
    std::fs::write(path, text).unwrap();
}

fn post(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn server_stat(server: &Memcached, name: &str) -> u64 {
    common::stat(&Client::connect(server.addr()).unwrap().call_str("stats\r\n").unwrap(), name)
}

fn proxy_stats(addr: SocketAddr) -> String {
    Client::connect(addr).unwrap().call_str("stats\r\n").unwrap()
}

/// The proxy's (process `pid`) open connections to `server`, by local address (`ss`).
fn proxy_links(server: &Memcached, pid: &str) -> std::collections::HashSet<String> {
    let out = Command::new("ss")
        .args(["-Htnp", "state", "established", "dst", &server.endpoint()])
        .output()
        .expect("ss (iproute2) runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

fn ring_of(servers: &[&Memcached]) -> Ring {
    let specs: Vec<ServerSpec> = servers.iter().map(|s| s.endpoint().parse().unwrap()).collect();
    Ring::new(HashKind::Ketama, &specs)
}

#[test]
fn servers_added_and_removed_under_load_lose_nothing_and_keys_follow_the_new_ring() {
    let all = common::servers(4);
    let (a, b, c, d) = (&all[0], &all[1], &all[2], &all[3]);
    let dir = std::env::temp_dir().join(format!("mwproxy-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("mwproxy.toml");
    let port = free_port();
    write_config(&conf, port, &[a, b, c]);
    let admin_port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_mwproxy"))
        .arg("-c")
        .arg(&conf)
        .args(common::engine_args())
        .args(["--admin", &format!("127.0.0.1:{admin_port}"), "--log", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let proxy = KillOnDrop(child);
    let pid = proxy.0.id().to_string();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    wait_for_port(addr, common::PATIENCE).unwrap();
    wait_for_port(admin, common::PATIENCE).unwrap();

    // 64 connections of mwload for 5 s, sets and gets, no reconnecting: a
    // dropped connection would show as lost, a failed request as an error.
    let out = dir.join("load");
    let load = Command::new(binary("mwload"))
        .args(["-s", "127.0.0.1", "-p", &port.to_string(), "-t", "2", "-c", "32", "--test-time", "5"])
        .args(["--ratio", "1:1", "--key-maximum", "999", "--progress", "never", "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));

    // A fourth server, by SIGHUP.
    let a_links = proxy_links(a, &pid);
    assert!(!a_links.is_empty(), "the proxy talks to every server before the reloads");
    write_config(&conf, port, &[a, b, c, d]);
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    assert!(
        common::eventually(common::PATIENCE, || common::stat(&proxy_stats(addr), "config_generation") == 2),
        "SIGHUP reloaded: {}",
        proxy_stats(addr)
    );
    assert!(common::eventually(common::PATIENCE, || server_stat(d, "curr_items") > 0), "the new server serves");
    std::thread::sleep(Duration::from_millis(1000));

    // One server removed, by POST /reload.
    write_config(&conf, port, &[a, b, d]);
    let (status, body) = post(admin, "/reload");
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["generation"], 3);
    assert_eq!(report["removed"], serde_json::json!([c.endpoint()]), "{body}");
    assert_eq!(report["kept"], 3, "{body}");
    assert!(report["not_applied"].as_array().unwrap().is_empty(), "{body}");

    // A broken file: refused with the reason, the proxy serves on.
    std::fs::write(&conf, "[routing]\nservers = [\"127.0.0.1:1\"]\nreplication = 5\n").unwrap();
    let (status, body) = post(admin, "/reload");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("replication"), "the reason is given: {body}");
    std::fs::write(&conf, "this is not TOML [").unwrap();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());

    let load = load.wait_with_output().unwrap();
    assert!(
        load.status.success(),
        "mwload: {}\n{}",
        String::from_utf8_lossy(&load.stderr),
        String::from_utf8_lossy(&load.stdout)
    );
    let summary = mwstats::reader::read_summary(&out).unwrap();
    let client = summary.client.as_ref().expect("a client record");
    let requests: u64 = summary.ops.values().map(|o| o.count).sum();
    let errors: u64 = summary.ops.values().map(|o| o.errors).sum();
    // (That the load ran at all; how much it did depends on the machine.)
    assert!(requests > 0, "load ran: {requests} requests");
    assert_eq!(errors, 0, "no request failed across three reloads");
    assert_eq!(client.connections_lost, 0, "no client connection dropped");

    let stats = proxy_stats(addr);
    assert_eq!(common::stat(&stats, "config_generation"), 3, "{stats}");
    assert_eq!(common::stat(&stats, "config_reloads"), 2, "{stats}");
    assert!(common::eventually(common::PATIENCE, || common::stat(&proxy_stats(addr), "config_reload_failures") == 2));
    assert_eq!(common::stat(&stats, "servers"), 3, "{stats}");
    // Unchanged servers kept their connections. (A loop that had not used a
    // server yet may open its own link to it later, so connections may be
    // added, but none of those open before the reloads was closed.)
    let kept = proxy_links(a, &pid);
    assert!(a_links.is_subset(&kept), "an unchanged server's connections were kept: {a_links:?} then {kept:?}");
    // The removed server's connections are closed once idle.
    let mut c0 = Client::connect(addr).unwrap();
    assert!(
        common::eventually(common::PATIENCE, || {
            let _ = c0.call_str("get poke\r\n");
            server_stat(c, "curr_connections") <= 2
        }),
        "connections to the removed server closed: {}",
        server_stat(c, "curr_connections")
    );

    // Every key is where ketama over the new list puts it...
    let servers = [a, b, d];
    let ring = ring_of(&servers);
    for s in &all {
        assert_eq!(Client::connect(s.addr()).unwrap().call_str("flush_all\r\n").unwrap(), "OK\r\n");
    }
    let keys: Vec<String> = (0..200).map(|i| format!("reload:{i}")).collect();
    for k in &keys {
        assert_eq!(c0.call_str(&format!("set {k} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
        let held: Vec<usize> = servers
            .iter()
            .enumerate()
            .filter(|(_, s)| Client::connect(s.addr()).unwrap().call_str(&format!("get {k}\r\n")).unwrap() != "END\r\n")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(held, vec![ring.server_for(k.as_bytes())], "{k}");
    }
    // ... and where twemproxy with the new list puts it: what twemproxy
    // stores, mwproxy finds.
    let twem = common::twemproxy(&servers);
    let mut t = Client::connect(twem.addr).unwrap();
    for k in &keys {
        assert_eq!(t.call_str(&format!("set {k} 0 0 2\r\ntw\r\n")).unwrap(), "STORED\r\n");
        assert_eq!(c0.call_str(&format!("get {k}\r\n")).unwrap(), format!("VALUE {k} 0 2\r\ntw\r\nEND\r\n"));
    }
    let (_, readyz) = http_get(admin, "/readyz");
    assert!(readyz.contains("\"servers\":3"), "{readyz}");
    std::fs::remove_dir_all(&dir).ok();
}
