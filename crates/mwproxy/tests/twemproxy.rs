//! mwproxy places keys where twemproxy does. For every hash function and
//! distribution twemproxy has, with and without a hash tag, with weights and
//! with named servers, keys are stored through a real twemproxy (nutcracker)
//! and read back through mwproxy configured alike: every one is found, with
//! its value, on the server twemproxy put it on.

mod common;

use common::{client, config, servers, stop, twemproxy_pool};
use mcproto::ring::{twemproxy_order, KeyHash};
use mctest::{Client, Memcached};
use mwproxy::config::HashKind;
use mwproxy::{Proxy, Service};

/// Keys of every kind a hash meets: plain, tagged (some sharing a tag),
/// with bytes above 0x7f (which several of twemproxy's hashes read as
/// signed), of lengths 1 to 3 past a multiple of 4 and 12 (the tails).
fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 5 {
            0 => format!("k{i}"),
            1 => format!("user:{{{}}}:field{i}", i % 17),
            2 => format!("ключ-{i}-é"),
            3 => format!("{}{i}", "x".repeat(i % 13)),
            _ => format!("a{{b{i}"),
        })
        .collect()
}

struct Case {
    distribution: &'static str,
    hash: KeyHash,
    tag: Option<&'static str>,
    named: bool,
}

/// Stores `keys` through twemproxy, reads them through mwproxy: how many come back with their value.
fn agreeing(servers: &[Memcached], case: &Case, keys: &[String]) -> usize {
    let weights = [1, 2, 1];
    let entries: Vec<String> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let name = if case.named { format!(" cache-{i}") } else { String::new() };
            format!("{}:{}{name}", s.endpoint(), weights[i])
        })
        .collect();
    let mut options = format!("hash: {}\n  distribution: {}", case.hash.name(), case.distribution);
    if let Some(tag) = case.tag {
        options.push_str(&format!("\n  hash_tag: \"{tag}\""));
    }
    for s in servers {
        Client::connect(s.addr()).unwrap().call_str("flush_all\r\n").unwrap();
    }
    let tw = twemproxy_pool(&options, &entries);
    let mut c = Client::connect(tw.addr).unwrap();
    let mut batch = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("v{i}");
        batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    c.send(&batch).unwrap();
    for r in c.read_replies(keys.len()).unwrap() {
        assert_eq!(r, b"STORED\r\n", "twemproxy stores");
    }
    drop(tw);
    let p: Proxy = Proxy::start(config(servers, |c| {
        c.routing.hash = match case.distribution {
            "modula" => HashKind::Modula,
            _ => HashKind::Ketama,
        };
        c.routing.key_hash = case.hash;
        c.routing.hash_tag = case.tag.unwrap_or("").to_string();
        for (i, s) in c.routing.servers.iter_mut().enumerate() {
            s.weight = weights[i];
            s.name = case.named.then(|| format!("cache-{i}"));
        }
        // twemproxy keeps a pool's servers sorted by name; mwproxy's TOML
        // keeps them as written (reading a nutcracker.yml sorts them).
        twemproxy_order(&mut c.routing.servers);
    }))
    .expect("start mwproxy");
    let mut m = client(&p);
    let mut asks = Vec::new();
    for k in keys {
        asks.extend_from_slice(format!("get {k}\r\n").as_bytes());
    }
    m.send(&asks).unwrap();
    let found = m
        .read_replies(keys.len())
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            let text = String::from_utf8_lossy(r);
            text.contains(&format!("\r\nv{i}\r\nEND"))
        })
        .count();
    stop(p);
    found
}

#[test]
fn every_key_is_where_twemproxy_put_it() {
    let servers = servers(3);
    // The second engine's run (make test runs every suite with each) checks
    // a corner of the matrix: placement is the routing core's, not the engine's.
    let full = common::engine() == mwproxy::config::Engine::Pool;
    let keys = keys(if full { 250 } else { 60 });
    let mut cases = Vec::new();
    for hash in KeyHash::ALL {
        for tag in [None, Some("{}")] {
            cases.push(Case { distribution: "ketama", hash, tag, named: false });
            cases.push(Case { distribution: "modula", hash, tag, named: false });
            cases.push(Case { distribution: "ketama", hash, tag, named: true });
        }
    }
    if !full {
        cases.retain(|c| matches!(c.hash, KeyHash::Fnv1a64 | KeyHash::Murmur | KeyHash::Md5));
    }
    let mut wrong = Vec::new();
    for case in &cases {
        let found = agreeing(&servers, case, &keys);
        if found != keys.len() {
            wrong.push(format!(
                "{} {} tag={:?} named={}: {found} of {}",
                case.hash,
                case.distribution,
                case.tag,
                case.named,
                keys.len()
            ));
        }
    }
    assert!(wrong.is_empty(), "keys not where twemproxy put them:\n{}", wrong.join("\n"));
}

#[test]
fn random_distribution_uses_every_server_as_twemproxy_does() {
    let servers = servers(3);
    let items = |s: &Memcached| {
        let stats = Client::connect(s.addr()).unwrap().call_str("stats\r\n").unwrap();
        common::stat(&stats, "curr_items")
    };
    let tw = twemproxy_pool(
        "hash: fnv1a_64\n  distribution: random",
        &servers.iter().map(|s| format!("{}:1", s.endpoint())).collect::<Vec<_>>(),
    );
    let mut c = Client::connect(tw.addr).unwrap();
    for i in 0..90 {
        assert_eq!(c.call_str(&format!("set r{i} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    drop(tw);
    assert!(servers.iter().all(|s| items(s) > 5), "twemproxy spreads them");
    for s in &servers {
        Client::connect(s.addr()).unwrap().call_str("flush_all\r\n").unwrap();
    }
    let p = Proxy::start(config(&servers, |c| c.routing.hash = HashKind::Random)).unwrap();
    let mut m = client(&p);
    for i in 0..90 {
        assert_eq!(m.call_str(&format!("set r{i} 0 0 1\r\nx\r\n")).unwrap(), "STORED\r\n");
    }
    stop(p);
    assert!(servers.iter().all(|s| items(s) > 5), "and so does mwproxy");
}

fn mwproxy() -> std::process::Command {
    common::mwproxy_binary()
}

/// A process stopped (and reaped) when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The stats port's document.
fn stats_of(port: u16) -> serde_json::Value {
    use std::io::Read;
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Every key path of a JSON document (`pool/server/requests`), values left out.
fn key_paths(v: &serde_json::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
    if let serde_json::Value::Object(m) = v {
        for (k, v) in m {
            let path = format!("{prefix}/{k}");
            out.insert(path.clone());
            key_paths(v, &path, out);
        }
    }
}

/// A directory of the test's own, removed when dropped.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("mwproxy-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// nutcracker serving the file at `path`, its stats on `stats`.
fn nutcracker(path: &std::path::Path, stats: u16) -> Running {
    let bin = ["/usr/sbin/nutcracker", "/usr/bin/nutcracker"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .expect("nutcracker (twemproxy) is not installed; make test installs it with apt-get");
    Running(
        std::process::Command::new(bin)
            .arg("-c")
            .arg(path)
            .args(["-s", &stats.to_string(), "-a", "127.0.0.1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A one-pool file in `dir` that ejects: `hash`, ketama, the failure
/// limit and retry timeout, `servers` (`host:port:weight` lines).
fn ejecting_pool(
    dir: &Dir,
    listen: u16,
    hash: &str,
    limit: u32,
    retry_ms: u64,
    servers: &[String],
) -> std::path::PathBuf {
    let path = dir.0.join("nutcracker.yml");
    let list: String = servers.iter().map(|s| format!("   - {s}\n")).collect();
    let text = format!(
        "pool:\n  listen: 127.0.0.1:{listen}\n  hash: {hash}\n  distribution: ketama\n  timeout: 500\n  \
         auto_eject_hosts: true\n  server_failure_limit: {limit}\n  server_retry_timeout: {retry_ms}\n  servers:\n{list}"
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_same_file_served_by_twemproxy_then_by_mwproxy() {
    let servers = servers(3);
    let (a, b) = (mctest::free_port(), mctest::free_port());
    let file = format!(
        "alpha:\n  listen: 127.0.0.1:{a}\n  hash: fnv1a_64\n  hash_tag: \"{{}}\"\n  distribution: ketama\n  timeout: 400\n  \
         backlog: 512\n  preconnect: true\n  server_connections: 1\n  auto_eject_hosts: false\n  servers:\n   - {}:1 one\n   - {}:2 two\n\
         beta:\n  listen: 127.0.0.1:{b}\n  hash: murmur\n  distribution: modula\n  servers:\n   - {}:1\n",
        servers[0].endpoint(),
        servers[1].endpoint(),
        servers[2].endpoint()
    );
    let dir = Dir::new("twemproxy-file");
    let path = dir.0.join("nutcracker.yml");
    std::fs::write(&path, &file).unwrap();
    let keys: Vec<String> = (0..200).map(|i| format!("user:{{{}}}:k{i}", i % 23)).collect();
    // twemproxy stores the keys and says what its stats hold.
    let stats_tw = mctest::free_port();
    let tw = nutcracker(&path, stats_tw);
    for port in [a, b, stats_tw] {
        mctest::wait_for_port(format!("127.0.0.1:{port}").parse().unwrap(), common::PATIENCE).unwrap();
    }
    for port in [a, b] {
        let mut c = Client::connect(format!("127.0.0.1:{port}").parse().unwrap()).unwrap();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(
                c.call_str(&format!("set {k} 0 0 {}\r\n{port}-{i}\r\n", format!("{port}-{i}").len())).unwrap(),
                "STORED\r\n"
            );
        }
    }
    let theirs = stats_of(stats_tw);
    drop(tw);
    // mwproxy serves the same file: every key where twemproxy put it, in both pools.
    let stats_mw = mctest::free_port();
    let mw =
        Running(mwproxy().arg("-c").arg(&path).args(["-s", &stats_mw.to_string(), "--log", "warn"]).spawn().unwrap());
    for port in [a, b, stats_mw] {
        mctest::wait_for_port(format!("127.0.0.1:{port}").parse().unwrap(), common::PATIENCE).unwrap();
    }
    for port in [a, b] {
        let mut c = Client::connect(format!("127.0.0.1:{port}").parse().unwrap()).unwrap();
        for (i, k) in keys.iter().enumerate() {
            let v = format!("{port}-{i}");
            assert_eq!(
                c.call_str(&format!("get {k}\r\n")).unwrap(),
                format!("VALUE {k} 0 {}\r\n{v}\r\nEND\r\n", v.len()),
                "pool on {port}"
            );
        }
    }
    // Its stats port answers with twemproxy's keys, and true counts. A
    // response is counted just after its reply is written, so the count of
    // the last get may come a moment after the client read it: read until
    // it is there (an overcount still fails below).
    let beta = servers[2].endpoint();
    let mut ours = stats_of(stats_mw);
    common::eventually(common::PATIENCE, || {
        ours = stats_of(stats_mw);
        ours["beta"][&beta]["responses"].as_u64().unwrap_or(0) >= keys.len() as u64
    });
    let (mut k_theirs, mut k_ours) = (Default::default(), Default::default());
    key_paths(&theirs, "", &mut k_theirs);
    key_paths(&ours, "", &mut k_ours);
    assert_eq!(k_ours, k_theirs, "the same keys as twemproxy's stats for the same file");
    assert_eq!(ours["service"], "mwproxy");
    let sent: u64 = ["one", "two"].iter().map(|s| ours["alpha"][s]["requests"].as_u64().unwrap()).sum();
    assert!(sent >= keys.len() as u64, "alpha's servers answered its {} gets: {ours}", keys.len());
    assert_eq!(ours["beta"][servers[2].endpoint()]["responses"].as_u64().unwrap(), keys.len() as u64);
    assert!(ours["alpha"]["client_connections"].as_u64().unwrap() <= 1);
    drop(mw);
}

#[test]
fn a_file_mwproxy_cannot_serve_is_refused_by_name() {
    let dir = Dir::new("twemproxy-refused");
    let cases = [
        (
            "cache:\n  listen: 127.0.0.1:1\n  redis: true\n  servers:\n   - 127.0.0.1:6379:1\n",
            "pool cache: is a redis pool",
        ),
        ("c:\n  listen: 127.0.0.1:1\n  hash: sha1\n  servers:\n   - 127.0.0.1:1:1\n", "unknown hash \"sha1\""),
        ("c:\n  listen: /tmp/x.sock 0966\n  servers:\n   - 127.0.0.1:1:1\n", "octal"),
        (
            "c:\n  listen: 127.0.0.1:1\n  servers:\n   - 127.0.0.1:1:1\n  mwproxy: {routing: {replication: 3}}\n",
            "replication",
        ),
    ];
    for (text, wanted) in cases {
        let path = dir.0.join("n.yml");
        std::fs::write(&path, text).unwrap();
        let out = mwproxy().arg("-c").arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(wanted), "{text}: {err}");
    }
    // A flag that would give two pools one address.
    let path = dir.0.join("two.yml");
    std::fs::write(&path, "a:\n  listen: 127.0.0.1:1\n  servers: [\"127.0.0.1:2:1\"]\nb:\n  listen: 127.0.0.1:3\n  servers: [\"127.0.0.1:2:1\"]\n").unwrap();
    let out = mwproxy().arg("--twemproxy-config").arg(&path).args(["--admin", "9999"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--admin would give all 2 pools"));
}

/// A memcached listening on the unix socket `path` only, stopped when dropped.
fn memcached_on(path: &std::path::Path) -> Running {
    let mut cmd = std::process::Command::new("memcached");
    cmd.arg("-s").arg(path).args(["-a", "0700", "-t", "1", "-m", "64"]);
    if rustix::process::getuid().is_root() {
        cmd.args(["-u", "root"]);
    }
    let m = Running(cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap());
    let up = common::eventually(common::PATIENCE, || std::os::unix::net::UnixStream::connect(path).is_ok());
    assert!(up, "memcached on {}", path.display());
    m
}

/// Sends `request` over the unix socket at `path` and reads until `ends`
/// replies ended with `END\r\n` (or 5 s passed); nothing when nobody listens.
fn over_unix(path: &std::path::Path, request: &[u8], ends: usize) -> String {
    use std::io::{Read, Write};
    let Ok(mut c) = std::os::unix::net::UnixStream::connect(path) else { return String::new() };
    c.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    c.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while got.windows(5).filter(|w| w == b"END\r\n").count() < ends {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn a_pool_on_unix_sockets_serves_as_twemproxy_does() {
    use std::os::unix::fs::PermissionsExt;
    let dir = Dir::new("twemproxy-unix");
    let socks: Vec<_> = (0..3).map(|i| dir.0.join(format!("mc{i}.sock"))).collect();
    let _memcached: Vec<Running> = socks.iter().map(|p| memcached_on(p)).collect();
    let list = |weights: [u32; 3]| -> String {
        socks.iter().zip(weights).map(|(p, w)| format!("   - {}:{w}\n", p.display())).collect()
    };
    // twemproxy on TCP in front of the unix sockets (unnamed: ketama hashes `path:`).
    let (tw_port, stats_tw, stats_mw) = (mctest::free_port(), mctest::free_port(), mctest::free_port());
    let body = |listen: &str| {
        format!("pool:\n  listen: {listen}\n  hash: fnv1a_64\n  distribution: ketama\n  servers:\n{}", list([1, 2, 1]))
    };
    let path = dir.0.join("nutcracker.yml");
    std::fs::write(&path, body(&format!("127.0.0.1:{tw_port}"))).unwrap();
    let keys: Vec<String> = keys(200);
    let tw = nutcracker(&path, stats_tw);
    for port in [tw_port, stats_tw] {
        mctest::wait_for_port(format!("127.0.0.1:{port}").parse().unwrap(), common::PATIENCE).unwrap();
    }
    let mut c = Client::connect(format!("127.0.0.1:{tw_port}").parse().unwrap()).unwrap();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(c.call_str(&format!("set {k} 0 0 {}\r\nv{i}\r\n", format!("v{i}").len())).unwrap(), "STORED\r\n");
    }
    let theirs = stats_of(stats_tw);
    drop(tw);
    // mwproxy serves the same pool on a unix socket of its own, with twemproxy's mode.
    let ours_sock = dir.0.join("mw.sock");
    std::fs::write(&path, body(&format!("{} 0660", ours_sock.display()))).unwrap();
    let mw =
        Running(mwproxy().arg("-c").arg(&path).args(["-s", &stats_mw.to_string(), "--log", "warn"]).spawn().unwrap());
    mctest::wait_for_port(format!("127.0.0.1:{stats_mw}").parse().unwrap(), common::PATIENCE).unwrap();
    let listening = || std::os::unix::net::UnixStream::connect(&ours_sock).is_ok();
    assert!(common::eventually(common::PATIENCE, listening));
    assert_eq!(std::fs::metadata(&ours_sock).unwrap().permissions().mode() & 0o777, 0o660);
    let asks: String = keys.iter().map(|k| format!("get {k}\r\n")).collect();
    let replies = over_unix(&ours_sock, asks.as_bytes(), keys.len());
    let found = keys
        .iter()
        .enumerate()
        .filter(|(i, k)| replies.contains(&format!("VALUE {k} 0 {}\r\nv{i}\r\n", format!("v{i}").len())))
        .count();
    assert_eq!(found, keys.len(), "every key where twemproxy put it, through unix sockets both sides");
    // Its stats name the servers as twemproxy's do (`path:`), with the same keys.
    let ours = stats_of(stats_mw);
    let (mut k_theirs, mut k_ours) = (Default::default(), Default::default());
    key_paths(&theirs, "", &mut k_theirs);
    key_paths(&ours, "", &mut k_ours);
    assert_eq!(k_ours, k_theirs, "the same keys as twemproxy's stats");
    assert!(ours["pool"][format!("{}:", socks[1].display())]["requests"].as_u64().unwrap() > 0, "{ours}");
    // Stopped, it removes its socket; started again over a stale one, it takes its place.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(mw.0.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(common::eventually(common::PATIENCE, || !ours_sock.exists()), "socket file removed");
    drop(mw);
    let stale = std::os::unix::net::UnixListener::bind(&ours_sock).unwrap();
    drop(stale);
    let mw = Running(
        mwproxy().arg("-c").arg(&path).args(["-s", &mctest::free_port().to_string(), "--log", "warn"]).spawn().unwrap(),
    );
    assert!(common::eventually(common::PATIENCE, || {
        over_unix(&ours_sock, format!("get {}\r\n", keys[0]).as_bytes(), 1).contains("v0")
    }));
    // A second one on the same socket is refused: it is in use.
    let out = mwproxy().arg("-c").arg(&path).args(["-s", &mctest::free_port().to_string()]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another process listens on it"), "{out:?}");
    drop(mw);
}

#[test]
fn sighup_reads_the_file_again() {
    let servers = servers(2);
    let (listen, stats) = (mctest::free_port(), mctest::free_port());
    let dir = Dir::new("twemproxy-reload");
    let path = dir.0.join("nutcracker.yml");
    let write = |n: usize| {
        let list: String = servers[..n].iter().map(|s| format!("   - {}:1\n", s.endpoint())).collect();
        std::fs::write(&path, format!("pool:\n  listen: 127.0.0.1:{listen}\n  hash: fnv1a_64\n  servers:\n{list}"))
            .unwrap();
    };
    write(1);
    let mw = Running(mwproxy().arg("-c").arg(&path).args(["-s", &stats.to_string(), "--log", "warn"]).spawn().unwrap());
    mctest::wait_for_port(format!("127.0.0.1:{stats}").parse().unwrap(), common::PATIENCE).unwrap();
    let servers_in =
        |doc: &serde_json::Value| doc["pool"].as_object().unwrap().keys().filter(|k| k.contains(':')).count();
    assert_eq!(servers_in(&stats_of(stats)), 1);
    write(2);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(mw.0.id() as i32).unwrap(),
        rustix::process::Signal::HUP,
    )
    .unwrap();
    assert!(
        common::eventually(common::PATIENCE, || servers_in(&stats_of(stats)) == 2),
        "the second server after SIGHUP"
    );
    drop(mw);
}

#[test]
fn an_ejected_server_leaves_the_ring_and_comes_back() {
    use mcproto::ring::{HashKind as Dist, Placement, Ring};
    let mut servers = servers(3);
    let listen = mctest::free_port();
    let stats = mctest::free_port();
    let dir = Dir::new("twemproxy-eject");
    let entries: Vec<String> = servers.iter().map(|s| format!("{}:1", s.endpoint())).collect();
    let path = ejecting_pool(&dir, listen, "fnv1a_64", 2, 1500, &entries);
    let admin = mctest::free_port();
    let mw = Running(
        mwproxy()
            .arg("-c")
            .arg(&path)
            .args(["-s", &stats.to_string(), "--admin", &admin.to_string(), "--log", "error"])
            .spawn()
            .unwrap(),
    );
    let addr = format!("127.0.0.1:{listen}").parse().unwrap();
    mctest::wait_for_port(addr, common::PATIENCE).unwrap();
    let mut specs: Vec<mcproto::ring::ServerSpec> =
        servers.iter().map(|s| format!("{}:1", s.endpoint()).parse().unwrap()).collect();
    twemproxy_order(&mut specs);
    let placement = Placement { distribution: Dist::Ketama, hash: KeyHash::Fnv1a64, tag: None };
    let full = Ring::with(placement, &specs);
    let victim_pos = 1;
    let victim = servers.iter().position(|s| specs[victim_pos].port == s.port()).unwrap();
    let victim_keys: Vec<String> =
        (0..2000).map(|i| format!("k{i}")).filter(|k| full.server_for(k.as_bytes()) == victim_pos).take(20).collect();
    servers[victim].stop();
    // Its keys fail until it has failed twice in a row; then they are stored on the others.
    let mut c = Client::connect(addr).unwrap();
    let stored = common::eventually(common::PATIENCE, || {
        c.call_str(&format!("set {} 0 0 1\r\nx\r\n", victim_keys[0])).unwrap() == "STORED\r\n"
    });
    assert!(stored, "the key is stored elsewhere once its server is ejected");
    let mut live = [true; 3];
    live[victim_pos] = false;
    let without = Ring::with_live(placement, &specs, &live);
    for k in &victim_keys {
        assert_eq!(c.call_str(&format!("set {k} 0 0 1\r\ny\r\n")).unwrap(), "STORED\r\n");
        let holder = without.server_for(k.as_bytes());
        let on = servers.iter().position(|s| s.port() == specs[holder].port).unwrap();
        let others: Vec<usize> = (0..servers.len())
            .filter(|&i| i != victim)
            .filter(|&i| common::holders(std::slice::from_ref(&servers[i]), k) == vec![0])
            .collect();
        assert_eq!(others, vec![on], "{k} where twemproxy's ring without it puts it");
    }
    let doc = stats_of(stats);
    let name = specs[victim_pos].endpoint();
    assert!(doc["pool"]["server_ejects"].as_u64().unwrap() >= 1, "{doc}");
    assert!(doc["pool"][&name]["server_ejected_at"].as_u64().unwrap() > 1_000_000_000_000_000, "{doc}");
    // Ready: the server is down, but no key is lost while it is off the ring.
    let ready = {
        use std::io::{Read, Write};
        let mut h = std::net::TcpStream::connect(("127.0.0.1", admin)).unwrap();
        h.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        h.read_to_string(&mut text).unwrap();
        text
    };
    assert!(ready.starts_with("HTTP/1.1 200") && ready.contains("\"ready\":true"), "{ready}");
    // Back after the retry timeout, once it answers again.
    servers[victim].restart().unwrap();
    let back = common::eventually(common::PATIENCE, || {
        let _ = c.call_str(&format!("set {} 0 0 1\r\nz\r\n", victim_keys[1]));
        common::holders(&servers, &victim_keys[1]).contains(&victim)
    });
    assert!(back, "the server is on the ring again after server_retry_timeout");
    drop(mw);
}

/// While a server is ejected, its keys go where twemproxy sends them: the same
/// file, the same server stopped, each proxy driven until the server is off
/// its ring, then the same keys written through each; they land on the same
/// servers.
#[test]
fn while_a_server_is_ejected_its_keys_go_where_twemproxy_sends_them() {
    let mut servers = servers(3);
    let listen = mctest::free_port();
    let dir = Dir::new("twemproxy-eject-both");
    let entries: Vec<String> = servers.iter().enumerate().map(|(i, s)| format!("{}:{}", s.endpoint(), i + 1)).collect();
    let path = ejecting_pool(&dir, listen, "murmur", 1, 60_000, &entries);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    servers[0].stop();
    let keys: Vec<String> = (0..150).map(|i| format!("e{i}")).collect();
    // Where each proxy puts every key once the stopped server is off its ring.
    let placed = |c: &mut Client, marker: &str| -> Vec<usize> {
        let ejected = common::eventually(common::PATIENCE, || {
            keys.iter().all(|k| c.call_str(&format!("set {k} 0 0 1\r\n{marker}\r\n")).unwrap() == "STORED\r\n")
        });
        assert!(ejected, "{marker}: every key stored once the server is ejected");
        // Keys stored before the ejection sit where the full ring put them
        // (ejection moves some keys between the live servers too): clear
        // them, and store every key on the ring without the ejected server.
        for s in &servers[1..] {
            Client::connect(s.addr()).unwrap().call_str("flush_all\r\n").unwrap();
        }
        for k in &keys {
            assert_eq!(c.call_str(&format!("set {k} 0 0 1\r\n{marker}\r\n")).unwrap(), "STORED\r\n");
        }
        keys.iter()
            .map(|k| {
                let on: Vec<usize> = (1..servers.len())
                    .filter(|&i| {
                        let mut d = Client::connect(servers[i].addr()).unwrap();
                        d.call_str(&format!("get {k}\r\n")).unwrap().contains(&format!("\r\n{marker}\r\n"))
                    })
                    .collect();
                assert_eq!(on.len(), 1, "{k} on one server: {on:?}");
                on[0]
            })
            .collect()
    };
    let tw = nutcracker(&path, mctest::free_port());
    mctest::wait_for_port(addr, common::PATIENCE).unwrap();
    let theirs = placed(&mut Client::connect(addr).unwrap(), "t");
    drop(tw);
    let mw = Running(
        mwproxy()
            .arg("-c")
            .arg(&path)
            .args(["-s", &mctest::free_port().to_string(), "--log", "error"])
            .spawn()
            .unwrap(),
    );
    mctest::wait_for_port(addr, common::PATIENCE).unwrap();
    let ours = placed(&mut Client::connect(addr).unwrap(), "m");
    drop(mw);
    assert_eq!(ours, theirs, "the ejected server's keys (and the others') on the same servers");
    assert!(theirs.contains(&1) && theirs.contains(&2));
}

/// A daemon stopped when dropped (a failed test leaves none behind).
struct Daemon(rustix::process::Pid);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::KILL);
    }
}

#[test]
fn nutcrackers_command_line_starts_mwproxy_unchanged() {
    let servers = servers(2);
    let dir = Dir::new("twemproxy-flags");
    let (listen, stats) = (mctest::free_port(), mctest::free_port());
    let path = dir.0.join("nutcracker.yml");
    let list: String = servers.iter().map(|s| format!("   - {}:1\n", s.endpoint())).collect();
    std::fs::write(&path, format!("pool:\n  listen: 127.0.0.1:{listen}\n  hash: fnv1a_64\n  servers:\n{list}"))
        .unwrap();
    // Under the name nutcracker (a link), as an init script would run it.
    let link = dir.0.join("nutcracker");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_mwproxy"), &link).unwrap();
    let version = std::process::Command::new(&link).arg("-V").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).contains("This is mwproxy-"), "{version:?}");
    // -t checks the file.
    let ok = std::process::Command::new(&link).arg("-t").arg("-c").arg(&path).output().unwrap();
    assert_eq!(ok.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&ok.stderr).contains("syntax is ok"), "{ok:?}");
    let bad = dir.0.join("bad.yml");
    std::fs::write(&bad, "pool:\n  listen: 127.0.0.1:1\n  hash: sha1\n  servers: [\"127.0.0.1:1:1\"]\n").unwrap();
    let refused = std::process::Command::new(&link).args(["-t", "-c"]).arg(&bad).output().unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("syntax is invalid"), "{refused:?}");
    // -d -p -o -v -s -a -i -m: a daemon, its pid in the file, its log in the other.
    let (pid_file, log) = (dir.0.join("n.pid"), dir.0.join("n.log"));
    let started = std::process::Command::new(env!("CARGO_BIN_EXE_mwproxy"))
        .arg("nutcracker")
        .args(["-d", "-v", "6", "-i", "10000", "-m", "16384", "-a", "127.0.0.1", "-s", &stats.to_string(), "-c"])
        .arg(&path)
        .arg("-p")
        .arg(&pid_file)
        .arg("-o")
        .arg(&log)
        .status()
        .unwrap();
    assert!(started.success(), "the parent returns once the daemon runs");
    assert!(common::eventually(common::PATIENCE, || pid_file.exists()));
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let pid = rustix::process::Pid::from_raw(pid).unwrap();
    let _daemon = Daemon(pid);
    assert_eq!(rustix::process::getsid(Some(pid)).unwrap(), pid, "the daemon leads a session of its own");
    mctest::wait_for_port(format!("127.0.0.1:{listen}").parse().unwrap(), common::PATIENCE).unwrap();
    let mut c = Client::connect(format!("127.0.0.1:{listen}").parse().unwrap()).unwrap();
    assert_eq!(c.call_str("set a 0 0 1\r\nx\r\n").unwrap(), "STORED\r\n");
    // -D describes every stat the stats port serves.
    let described = std::process::Command::new(&link).arg("-D").output().unwrap();
    let described = String::from_utf8_lossy(&described.stdout).into_owned();
    let doc = stats_of(stats);
    let server = servers[0].endpoint();
    let stat_names = doc["pool"].as_object().unwrap().keys().filter(|k| !k.contains(':')).cloned();
    let server_names = doc["pool"][&server].as_object().unwrap().keys().cloned();
    for k in stat_names.chain(server_names) {
        assert!(described.contains(&format!("  {k} ")), "{k} described: {described}");
    }
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(common::eventually(common::PATIENCE, || !pid_file.exists()), "pid file removed at exit");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("serving") && logged.contains("stopped"), "{logged}");
    assert!(!logged.contains('\u{1b}'), "no colours in a log file");
}
