//! Test and benchmark support shared by the workspace's crates.
//!
//! [`Memcached`] starts a real memcached process on a free loopback port and
//! stops it when dropped; it can also be stopped, restarted on the same port,
//! paused and resumed, for failure tests. [`Client`] is a small blocking
//! text-protocol client that returns raw reply bytes, so tests can compare what
//! a proxy answers with what memcached answers, byte for byte. [`Postgres`]
//! starts a throwaway PostgreSQL server (`scripts/postgres.sh`) for mwmq.
//! [`hostile`] plays attackers: many source addresses, silent and trickling
//! sockets, and a probe beside them.
//!
//! A red test explains itself: every process started here keeps its log,
//! and when it is dropped while its test is failing (panicking), the log's
//! last lines are printed into the test's output; [`capture_logs`] does the
//! same for a middleware run inside the test process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub mod hostile;
mod logs;
pub use logs::{capture_logs, tail_if_failing};

/// Where [`free_port`] looks: below Linux's ephemeral range (32768-60999 by
/// default), so that no outgoing connection — a client's, a server's to its
/// backend — can be given a port between the moment it is handed out and the
/// moment the server it is for binds it.
const PORTS: std::ops::Range<u16> = 20_000..32_768;

/// A port on 127.0.0.1 that was free a moment ago and that no test process
/// running now has been given, so that two tests never start a server on
/// the same one (the second one's start probe would reach the first, or the
/// second server would fail to bind while the first's probe reached it).
///
/// A port is handed out only with an exclusive lock on a file of its own
/// (`$TMPDIR/mctest-ports/<port>`), held until this process exits: a
/// server that takes a second to bind (mwmq migrates its schema first)
/// keeps its port even while other test binaries ask for ports. Each
/// process starts at a place of its own in [`PORTS`] (from its process id)
/// and walks on from there, so it rarely meets another's locks at all.
pub fn free_port() -> u16 {
    use std::sync::Mutex;
    static NEXT: Mutex<Option<u32>> = Mutex::new(None);
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("mctest-ports");
    let _ = std::fs::create_dir_all(&dir);
    let span = u32::from(PORTS.end - PORTS.start);
    let mut next = NEXT.lock().unwrap_or_else(|p| p.into_inner());
    let at = next.get_or_insert_with(|| std::process::id().wrapping_mul(2_654_435_761) % span);
    for _ in 0..span {
        let port = PORTS.start + (*at % span) as u16;
        *at = (*at + 1) % span;
        let Some(lock) = reserve(&dir, port) else { continue };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HELD.lock().unwrap_or_else(|p| p.into_inner()).extend(lock);
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 between {} and {}", PORTS.start, PORTS.end)
}

/// The lock on `port`'s file in `dir`, when no other process holds it (a
/// directory that cannot be written leaves the bind check alone to decide).
fn reserve(dir: &std::path::Path, port: u16) -> Option<Option<std::fs::File>> {
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(port.to_string()));
    match file {
        Err(_) => Some(None),
        Ok(f) => match f.try_lock() {
            Ok(()) => Some(Some(f)),
            Err(_) => None,
        },
    }
}

/// Waits until something accepts connections on `addr`.
pub fn wait_for_port(addr: SocketAddr, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("nothing listens on {addr} after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn memcached_binary() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("MEMCACHED") {
        return Ok(PathBuf::from(p));
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/bin", "/usr/local/bin"]) {
        let p = PathBuf::from(dir).join("memcached");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("memcached is not installed (make test installs it with apt-get)")
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// A memcached server process on 127.0.0.1, killed when dropped.
pub struct Memcached {
    port: u16,
    extra: Vec<String>,
    child: Option<Child>,
    /// Its standard output and error (printed when its test fails).
    log: PathBuf,
}

impl Memcached {
    /// Starts memcached with default settings on a free port.
    pub fn start() -> Result<Memcached> {
        Self::start_with(&[])
    }

    /// Starts memcached with extra command-line arguments (e.g. `["-I", "2m"]`).
    pub fn start_with(extra: &[&str]) -> Result<Memcached> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut last = None;
        for _ in 0..5 {
            let mut m = Memcached { port: free_port(), extra: extra.clone(), child: None, log: PathBuf::new() };
            match m.spawn() {
                Ok(()) => return Ok(m),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap())
    }

    fn spawn(&mut self) -> Result<()> {
        let mut cmd = Command::new(memcached_binary()?);
        cmd.args(["-l", "127.0.0.1", "-p", &self.port.to_string(), "-U", "0", "-t", "1", "-m", "64"]);
        if running_as_root() {
            cmd.args(["-u", "root"]);
        }
        self.log = std::env::temp_dir().join(format!("mctest-memcached-{}-{}.log", std::process::id(), self.port));
        let log = std::fs::File::create(&self.log).context("memcached's log file")?;
        cmd.args(&self.extra).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        let mut child = cmd.spawn().context("start memcached")?;
        let addr = self.addr();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("memcached on port {} exited at start: {status}", self.port);
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("memcached did not listen on {addr}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
        Ok(())
    }

    /// Its TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `127.0.0.1:port`, as given to a proxy.
    pub fn endpoint(&self) -> String {
        self.addr().to_string()
    }

    /// Kills the process (the port stays reserved for [`Memcached::restart`]).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn signal(&self, sig: &str) -> Result<()> {
        let pid = self.child.as_ref().context("memcached is not running")?.id();
        let ok = Command::new("kill").args([sig, &pid.to_string()]).status()?.success();
        if !ok {
            bail!("kill {sig} {pid} failed");
        }
        Ok(())
    }

    /// Freezes the process (SIGSTOP): connections open, nothing answered.
    pub fn pause(&self) -> Result<()> {
        self.signal("-STOP")?;
        // Return once every thread is stopped: a thread already running could
        // otherwise still answer the next request.
        let pid = self.child.as_ref().context("memcached is not running")?.id();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))?;
            let stopped = tasks.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T') || rest.starts_with('t')))
                    .unwrap_or(true)
            });
            if stopped {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        bail!("memcached {pid} did not stop within 2 s of SIGSTOP")
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        self.signal("-CONT")
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.resume();
        }
        self.stop();
        tail_if_failing(&format!("memcached on port {}", self.port), &self.log);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// How long a [`Client`] waits for a reply before the test fails: long, so
/// that a busy machine's delays are never taken for a server that does not
/// answer (what a test that needs a shorter wait sets itself).
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A blocking memcached text-protocol client for tests: it sends bytes and
/// returns replies as raw bytes.
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Connects with a 5 s read timeout.
    pub fn connect(addr: SocketAddr) -> Result<Client> {
        let stream =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).with_context(|| format!("connect to {addr}"))?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Client { stream, buf: Vec::new() })
    }

    /// Writes raw bytes.
    pub fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Closes the writing side (the peer reads end of stream); replies can still be read.
    pub fn shutdown_write(&mut self) -> Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)?;
        Ok(())
    }

    /// Reads one whole response and returns its bytes.
    pub fn read_reply(&mut self) -> Result<Vec<u8>> {
        loop {
            if let Some(n) = mcproto::response_len(&self.buf)? {
                return Ok(self.buf.drain(..n).collect());
            }
            self.fill()?;
        }
    }

    /// Sends a request and reads one response.
    pub fn call(&mut self, bytes: &[u8]) -> Result<Vec<u8>> {
        self.send(bytes)?;
        self.read_reply()
    }

    /// Like [`Client::call`], as a lossy string (handy in assertions).
    pub fn call_str(&mut self, bytes: &str) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.call(bytes.as_bytes())?).into_owned())
    }

    /// Reads exactly `n` responses.
    pub fn read_replies(&mut self, n: usize) -> Result<Vec<Vec<u8>>> {
        (0..n).map(|_| self.read_reply()).collect()
    }

    /// Reads whatever arrives until the peer is quiet for `quiet` (or closes);
    /// returns the bytes and whether the peer closed.
    pub fn read_until_quiet(&mut self, quiet: Duration) -> Result<(Vec<u8>, bool)> {
        self.stream.set_read_timeout(Some(quiet))?;
        let mut closed = false;
        loop {
            match self.fill() {
                Ok(()) => continue,
                Err(e) => {
                    let eof = e.to_string().contains("closed");
                    let timeout = e.downcast_ref::<std::io::Error>().is_some_and(|io| {
                        matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
                    });
                    if eof {
                        closed = true;
                        break;
                    }
                    if timeout {
                        break;
                    }
                    if let Some(io) = e.downcast_ref::<std::io::Error>() {
                        if io.kind() == std::io::ErrorKind::ConnectionReset {
                            closed = true;
                            break;
                        }
                    }
                    return Err(e);
                }
            }
        }
        self.stream.set_read_timeout(Some(READ_TIMEOUT))?;
        Ok((std::mem::take(&mut self.buf), closed))
    }

    fn fill(&mut self) -> Result<()> {
        let mut chunk = [0u8; 65536];
        let n = loop {
            match self.stream.read(&mut chunk) {
                // A signal to the test process (a child's exit, a stop) is not the peer's doing.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        if n == 0 {
            bail!("connection closed by peer");
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// The underlying stream (for shutdown and other socket-level tests).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}

/// Sends `request` to a fresh connection and returns everything answered
/// until the server is quiet for `quiet` or closes the connection.
pub fn exchange(addr: SocketAddr, request: &[u8], quiet: Duration) -> Result<(Vec<u8>, bool)> {
    let mut c = Client::connect(addr)?;
    c.send(request)?;
    c.read_until_quiet(quiet)
}

/// A throwaway PostgreSQL server (`scripts/postgres.sh`): `initdb` in a
/// directory of its own under the system's temporary directory, a unix
/// socket only, the database `mwmq`; stopped and removed when dropped.
///
/// Tests run it with `fsync=off`: the processes they kill are mwmq and
/// PostgreSQL, not the machine, so what PostgreSQL committed survives in the
/// page cache either way, and the tests run several times faster.
pub struct Postgres {
    dir: PathBuf,
    conninfo: String,
}

fn postgres_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/postgres.sh")
}

impl Postgres {
    /// Starts a server for tests (`fsync=off`).
    pub fn start() -> Result<Postgres> {
        Self::start_with(&["fsync=off"])
    }

    /// Starts a server with these settings (`name=value`).
    pub fn start_with(settings: &[&str]) -> Result<Postgres> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let dir =
            std::env::temp_dir().join(format!("mwlab-pg-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        let out = Command::new(postgres_script())
            .arg("start")
            .arg(&dir)
            .args(settings)
            .stderr(Stdio::piped())
            .output()
            .context("run scripts/postgres.sh")?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            bail!("PostgreSQL did not start: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let conninfo = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok(Postgres { dir, conninfo })
    }

    /// The libpq connection string (`host=DIR port=5432 user=postgres dbname=mwmq`).
    pub fn conninfo(&self) -> &str {
        &self.conninfo
    }

    /// The server's directory (its log is `server.log`).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Stops (`fast`: after disconnecting clients; `immediate`: as in a crash) and starts again.
    pub fn restart(&self, mode: &str) -> Result<()> {
        let st = Command::new(postgres_script()).arg("restart").arg(&self.dir).arg(mode).status()?;
        if !st.success() {
            bail!("PostgreSQL did not restart ({mode})");
        }
        Ok(())
    }

    /// Stops the server (it stays stopped until [`Postgres::restart`]).
    pub fn stop(&self) -> Result<()> {
        let st = Command::new(postgres_script()).arg("stop").arg(&self.dir).status()?;
        if !st.success() {
            bail!("PostgreSQL did not stop");
        }
        Ok(())
    }
}

/// Stops what `script` started in `dir` and removes the directory (a drop: errors are ignored).
fn stop_and_remove(script: PathBuf, dir: &std::path::Path) {
    let _ = Command::new(script).arg("stop").arg(dir).stdout(Stdio::null()).stderr(Stdio::null()).status();
    let _ = std::fs::remove_dir_all(dir);
}

impl Drop for Postgres {
    fn drop(&mut self) {
        tail_if_failing("PostgreSQL", &self.dir.join("server.log"));
        stop_and_remove(postgres_script(), &self.dir);
    }
}

/// A highly available PostgreSQL (`scripts/pg-ha.sh`): a pg_auto_failover
/// monitor and two data nodes on 127.0.0.1, node 1 the primary and node 2
/// its synchronous standby, with the monitor's fast timeouts; stopped and
/// removed when dropped. Tests run it with `fsync=off` (they kill processes,
/// not the machine).
pub struct PgHa {
    dir: PathBuf,
    conninfo: String,
    ports: Vec<u16>,
}

fn pg_ha_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pg-ha.sh")
}

impl PgHa {
    /// Starts the monitor and both nodes and waits until node 2 is node 1's standby.
    pub fn start() -> Result<PgHa> {
        Self::start_with(&[])
    }

    /// [`PgHa::start`] with more arguments for the script (`timeouts=default`:
    /// pg_auto_failover's own, slower timeouts).
    pub fn start_with(args: &[&str]) -> Result<PgHa> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "mwlab-pgha-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        // Dropped (stopped, removed) on every way out, a failed start too.
        let mut ha = PgHa { dir, conninfo: String::new(), ports: Vec::new() };
        let out = Command::new(pg_ha_script())
            .arg("start")
            .arg(&ha.dir)
            .arg("fsync=off")
            .args(args)
            .stderr(Stdio::piped())
            .output()
            .context("run scripts/pg-ha.sh")?;
        if !out.status.success() {
            bail!("the HA cluster did not start: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        ha.conninfo = String::from_utf8_lossy(&out.stdout).trim().to_string();
        ha.ports = std::fs::read_to_string(ha.dir.join("ports"))?
            .trim()
            .split(',')
            .map(|p| p.parse().context("a port"))
            .collect::<Result<Vec<u16>>>()?;
        Ok(ha)
    }

    /// The connection string naming both nodes (`target_session_attrs=read-write`).
    pub fn conninfo(&self) -> &str {
        &self.conninfo
    }

    /// A connection string for node `n` (1 or 2) alone.
    pub fn node_conninfo(&self, n: usize) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=mwmq connect_timeout=3 sslmode=disable", self.ports[n])
    }

    /// The cluster's directory (logs: `node1.log`, `node2.log`, `monitor.log`).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(pg_ha_script()).arg(args[0]).arg(&self.dir).args(&args[1..]).output()?;
        if !out.status.success() {
            bail!("pg-ha.sh {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// SIGKILLs node `n`'s keeper and PostgreSQL (as when its machine dies).
    pub fn kill(&self, n: usize) -> Result<()> {
        self.run(&["kill", &n.to_string()]).map(drop)
    }

    /// Starts node `n`'s keeper again.
    pub fn revive(&self, n: usize) -> Result<()> {
        self.run(&["revive", &n.to_string()]).map(drop)
    }

    /// SIGSTOPs node `n`'s PostgreSQL processes.
    pub fn freeze(&self, n: usize) -> Result<()> {
        self.run(&["freeze", &n.to_string()]).map(drop)
    }

    /// SIGCONTs them.
    pub fn thaw(&self, n: usize) -> Result<()> {
        self.run(&["thaw", &n.to_string()]).map(drop)
    }

    /// Waits until node 1 reports `s1` and node 2 `s2` (pg_auto_failover's
    /// state names: primary, secondary, wait_primary, ...).
    pub fn wait(&self, s1: &str, s2: &str, seconds: u32) -> Result<()> {
        self.run(&["wait", s1, s2, &seconds.to_string()]).map(drop)
    }

    /// Each node's name, address, reported and assigned state.
    pub fn state(&self) -> String {
        self.run(&["state"]).unwrap_or_else(|e| e.to_string())
    }
}

impl Drop for PgHa {
    fn drop(&mut self) {
        for log in ["monitor.log", "node1.log", "node2.log"] {
            tail_if_failing(&format!("pg_auto_failover's {log}"), &self.dir.join(log));
        }
        stop_and_remove(pg_ha_script(), &self.dir);
    }
}

/// `GET path` from an HTTP endpoint (the middlewares' admin endpoint): the
/// status line and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).expect("connect to the HTTP endpoint");
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("send the request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

/// Raises this process's open-file limit to `n` (and the hard limit with it
/// when running as root), for tests that hold thousands of connections.
pub fn raise_fd_limit(n: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    let hard = lim.maximum.unwrap_or(n).max(n);
    let _ = setrlimit(Resource::Nofile, Rlimit { current: Some(n.min(hard)), maximum: Some(hard) });
}

/// PEM files of a CA and of a certificate it signed for `localhost` and
/// 127.0.0.1, for TLS tests (memcached `-Z`, mwproxy `--tls-cert`).
pub struct Certificates {
    /// The CA's certificate.
    pub ca: std::path::PathBuf,
    /// The server's certificate.
    pub cert: std::path::PathBuf,
    /// The server's key.
    pub key: std::path::PathBuf,
}

impl Certificates {
    /// Makes them in `dir`.
    pub fn make(dir: &std::path::Path) -> Result<Certificates> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        // Names of their own: a leaf whose issuer is its own name looks
        // self-signed to OpenSSL (redis-cli, memcached).
        ca.distinguished_name.push(rcgen::DnType::CommonName, "mctest CA");
        let ca = ca.self_signed(&ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let mut leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])?;
        leaf.distinguished_name.push(rcgen::DnType::CommonName, "localhost");
        let leaf = leaf.signed_by(&key, &ca, &ca_key)?;
        std::fs::create_dir_all(dir)?;
        let c = Certificates { ca: dir.join("ca.pem"), cert: dir.join("cert.pem"), key: dir.join("key.pem") };
        std::fs::write(&c.ca, ca.pem())?;
        std::fs::write(&c.cert, leaf.pem())?;
        std::fs::write(&c.key, key.serialize_pem())?;
        Ok(c)
    }

    /// memcached's flags for TLS with them (`-Z -o ssl_chain_cert=...,ssl_key=...`).
    pub fn memcached_flags(&self) -> Vec<String> {
        vec!["-Z".into(), "-o".into(), format!("ssl_chain_cert={},ssl_key={}", self.cert.display(), self.key.display())]
    }
}

/// Debian's `redis-server` on 127.0.0.1 (no persistence unless `extra`
/// asks for it), killed when dropped: the reference for RESP and Streams.
pub struct RedisServer {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts redis-server on a free port with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Result<RedisServer> {
        let bin = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .context("redis-server is not installed (make test installs it with apt-get)")?;
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("mctest-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start redis-server")?;
        let r = RedisServer { port, child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(r.addr()).is_err() {
            if Instant::now() > deadline {
                bail!("redis-server did not listen on port {port}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(r)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        tail_if_failing("redis-server", &self.dir.join("redis.log"));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A small deterministic random generator (xorshift) for randomised tests,
/// so that a failing seed repeats. The seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.bits() % n
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_process_holds_is_not_handed_out() {
        let dir = std::env::temp_dir().join(format!("mctest-reserve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Another process's lock: a lock on another open of the same file conflicts as one would.
        let theirs = reserve(&dir, 20_001).expect("free at first").expect("a lock");
        assert!(reserve(&dir, 20_001).is_none(), "a held port was offered");
        assert!(reserve(&dir, 20_002).is_some(), "a port nobody holds was refused");
        drop(theirs);
        assert!(reserve(&dir, 20_001).is_some(), "a released port stayed held");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ports_handed_out_are_held_and_differ() {
        let (a, b) = (free_port(), free_port());
        assert_ne!(a, b);
        let dir = std::env::temp_dir().join("mctest-ports");
        assert!(reserve(&dir, a).is_none(), "port {a} was handed out without a lock");
    }
}
