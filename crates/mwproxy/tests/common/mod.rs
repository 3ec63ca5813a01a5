//! Shared helpers of the integration tests: real memcached servers on free
//! ports and an in-process mwproxy in front of them.

#![allow(dead_code)]

use mwproxy::Service;
use std::time::Duration;

use mctest::{Client, Memcached};
use mwproxy::{Config, Proxy};

/// The engine the tests run against: `MWPROXY_TEST_ENGINE=async|pool`,
/// by default mwproxy's own default, async (`make test` runs the suites
/// with it, `make test-slow` once more with the pool engine).
pub fn engine() -> mwproxy::config::Engine {
    match std::env::var("MWPROXY_TEST_ENGINE").as_deref() {
        Err(_) | Ok("") | Ok("async") => mwproxy::config::Engine::Async,
        Ok("pool") => mwproxy::config::Engine::Pool,
        Ok(other) => panic!("MWPROXY_TEST_ENGINE must be pool or async, not {other:?}"),
    }
}

/// The command-line flags that select [`engine`] (the async engine with two
/// loops, as in [`proxy`]).
pub fn engine_args() -> Vec<&'static str> {
    match engine() {
        mwproxy::config::Engine::Pool => vec!["--engine", "pool"],
        mwproxy::config::Engine::Async => vec!["--engine", "async", "--threads", "2"],
    }
}

/// Descriptors a proxy keeps for itself besides the 64 of its own, with
/// `workers` pool workers (or two async loops) and `servers` servers (the
/// health checker has a connection to each server too).
pub fn reserved_fds(workers: u64, servers: u64) -> u64 {
    match engine() {
        mwproxy::config::Engine::Pool => (workers + 1) * servers + 2,
        mwproxy::config::Engine::Async => 3 * servers + 2 * 2,
    }
}

/// Starts `n` memcached servers.
pub fn servers(n: usize) -> Vec<Memcached> {
    (0..n).map(|_| Memcached::start().expect("start memcached")).collect()
}

/// The mwproxy binary, with [`engine`]'s flags.
pub fn mwproxy_binary() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mwproxy"));
    c.args(engine_args());
    c
}

/// A proxy on a free port in front of `servers`, after `tweak` adjusts the defaults.
pub fn proxy(servers: &[Memcached], tweak: impl FnOnce(&mut Config)) -> Proxy {
    mctest::capture_logs();
    Proxy::start(config(servers, tweak)).expect("start mwproxy")
}

/// The configuration [`proxy`] starts with.
pub fn config(servers: &[Memcached], tweak: impl FnOnce(&mut Config)) -> Config {
    config_for(&servers.iter().map(Memcached::endpoint).collect::<Vec<_>>(), tweak)
}

/// A client connected to the proxy.
pub fn client(p: &Proxy) -> Client {
    Client::connect(p.local_addr()).expect("connect to mwproxy")
}

/// Stops a proxy and waits for its threads.
pub fn stop(p: Proxy) {
    p.shutdown();
    p.join();
}

/// Which of `servers` hold `key` (asked directly).
pub fn holders(servers: &[Memcached], key: &str) -> Vec<usize> {
    servers
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            let mut c = Client::connect(s.addr()).unwrap();
            c.call_str(&format!("get {key}\r\n")).unwrap() != "END\r\n"
        })
        .map(|(i, _)| i)
        .collect()
}

/// How long a test waits for something that must happen before it fails:
/// long, so that a loaded machine's delays are never taken for the thing not
/// happening (a wait that ends with the condition costs nothing more).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Sends `request` on a new connection to `addr` and reads until the peer
/// closes (or stays silent for [`PATIENCE`]): the bytes, and whether it closed.
pub fn exchange_until_closed(addr: std::net::SocketAddr, request: &[u8]) -> (Vec<u8>, bool) {
    mctest::exchange(addr, request, PATIENCE).unwrap()
}

/// Waits up to `within` for `cond`.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// The value of `STAT <name>` in a `stats` reply.
pub fn stat(stats: &str, name: &str) -> u64 {
    let prefix = format!("STAT {name} ");
    stats.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {name}")).parse().unwrap()
}

/// A fake memcached for misbehaviour a real one cannot show on demand: it
/// accepts connections on a free port and hands each to `serve` on its own thread.
pub struct FakeServer {
    addr: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeServer {
    /// Starts it; `serve` gets every accepted connection.
    pub fn start(serve: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> FakeServer {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let serve = std::sync::Arc::new(serve);
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        let serve = serve.clone();
                        std::thread::spawn(move || serve(s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeServer { addr, stop, thread: Some(thread) }
    }

    /// `127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A proxy on a free port in front of servers given by address.
pub fn proxy_for(endpoints: &[String], tweak: impl FnOnce(&mut Config)) -> Proxy {
    mctest::capture_logs();
    Proxy::start(config_for(endpoints, tweak)).expect("start mwproxy")
}

/// The configuration of a proxy on a free port in front of servers given by address.
pub fn config_for(endpoints: &[String], tweak: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    c.proxy.listen = "127.0.0.1:0".into();
    c.proxy.workers = 4;
    c.proxy.engine = engine();
    c.proxy.threads = 2;
    c.routing.servers = endpoints.iter().map(|s| s.parse().unwrap()).collect();
    c.backend.timeout_ms = 500;
    c.backend.retry_min_ms = 20;
    c.backend.retry_max_ms = 200;
    tweak(&mut c);
    c
}

/// Reads one request line (and the data block of a storage command) from a
/// fake server's client; `None` at the end of the stream.
pub fn read_request(r: &mut impl std::io::BufRead) -> Option<String> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let storage = ["set", "add", "replace", "append", "prepend", "cas"];
    if words.first().is_some_and(|w| storage.contains(w)) {
        let len: usize = words.get(4).and_then(|w| w.parse().ok()).unwrap_or(0);
        let mut data = vec![0; len + 2];
        r.read_exact(&mut data).ok()?;
    }
    Some(line)
}

/// A client connected to a memcached server directly.
pub fn client_of(server: &Memcached) -> Client {
    Client::connect(server.addr()).expect("connect to memcached")
}

/// twemproxy (nutcracker) with ketama over md5, as mwproxy's ring.
pub struct Twemproxy {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl Drop for Twemproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// twemproxy in front of `servers`, each with weight 1.
pub fn twemproxy(servers: &[&Memcached]) -> Twemproxy {
    let entries: Vec<String> = servers.iter().map(|s| format!("{}:1", s.endpoint())).collect();
    twemproxy_with(&entries)
}

/// twemproxy in front of `entries` (`host:port:weight`).
pub fn twemproxy_with(entries: &[String]) -> Twemproxy {
    twemproxy_pool("hash: md5\n  distribution: ketama", entries)
}

/// twemproxy with a pool's `options` (YAML lines of the pool, indented by
/// two spaces after the first) in front of `entries` (`host:port:weight [name]`).
pub fn twemproxy_pool(options: &str, entries: &[String]) -> Twemproxy {
    use std::process::{Command, Stdio};
    let bin = ["/usr/sbin/nutcracker", "/usr/bin/nutcracker", "/usr/local/sbin/nutcracker"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
        .expect("nutcracker (twemproxy) is not installed; make test installs it with apt-get");
    let listen = mctest::free_port();
    let dir = std::env::temp_dir().join(format!("mwproxy-nutcracker-{}-{listen}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut conf = format!("pool:\n  listen: 127.0.0.1:{listen}\n  {options}\n  timeout: 2000\n  servers:\n");
    for e in entries {
        conf.push_str(&format!("   - {e}\n"));
    }
    let path = dir.join("nutcracker.yml");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new(bin)
        .arg("-c")
        .arg(&path)
        .args(["-s", &mctest::free_port().to_string(), "-a", "127.0.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{listen}").parse().unwrap();
    let t = Twemproxy { addr, child, dir };
    mctest::wait_for_port(addr, PATIENCE).unwrap();
    t
}

/// Sends each of `cases` on a new connection to memcached directly and to
/// the proxy: the same bytes come back, and both close the connection (each
/// read until it closes: one that does not fails after [`PATIENCE`]).
pub fn closes_alike(direct: std::net::SocketAddr, proxy: std::net::SocketAddr, cases: &[Vec<u8>]) {
    for case in cases {
        let (a, a_closed) = exchange_until_closed(direct, case);
        let (b, b_closed) = exchange_until_closed(proxy, case);
        let shown = String::from_utf8_lossy(&case[..case.len().min(40)]).into_owned();
        assert_eq!(b, a, "replies to {shown:?}");
        assert!(a_closed && b_closed, "both close after {shown:?} (memcached: {a_closed}, mwproxy: {b_closed})");
    }
}

/// mwproxy as its own process, so its memory can be read.
pub struct ProxyProcess {
    /// The process.
    pub child: std::process::Child,
    /// Where it listens (127.0.0.1).
    pub port: u16,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ProxyProcess {
    /// Starts it with `args` (and the engine's flags) after the shell
    /// commands `shell_prefix` (limits: `ulimit -v ...;`).
    pub fn start(shell_prefix: &str, args: &[&str]) -> ProxyProcess {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        use std::sync::{Arc, Mutex};
        let port = mctest::free_port();
        let mut cmd = Command::new("sh");
        let line = format!(
            "{shell_prefix} exec {} -p {port} {} {}",
            env!("CARGO_BIN_EXE_mwproxy"),
            engine_args().join(" "),
            args.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(" ")
        );
        cmd.args(["-c", &line]).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        mctest::wait_for_port(([127, 0, 0, 1], port).into(), PATIENCE).unwrap();
        ProxyProcess { child, port, stderr }
    }

    /// Its address.
    pub fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// Its resident memory, in MB.
    pub fn rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb / 1024.0
    }

    /// What it logged.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A proxy whose pools are one server each (`names[i]` is `servers[i]`),
/// routed by `route` (the `[route]` table's TOML, or `route = ...`).
pub fn route_config(servers: &[&Memcached], names: &[&str], route: &str, tweak: impl FnOnce(&mut Config)) -> Config {
    let mut c = config_for(&[], |_| {});
    let mut text = format!("{route}\n");
    for (s, n) in servers.iter().zip(names) {
        text += &format!("[pools.{n}]\nservers = [\"{}\"]\n", s.endpoint());
    }
    let t: Config = mwserve::config::ServiceConfig::from_toml(&text).unwrap();
    (c.pools, c.route) = (t.pools, t.route);
    tweak(&mut c);
    c
}

/// Starts the proxy of a route test in this process, its log captured.
pub fn route_start(c: Config) -> Proxy {
    mctest::capture_logs();
    Proxy::start(c).expect("start mwproxy")
}
