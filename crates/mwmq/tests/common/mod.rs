//! What mwmq's tests share: a throwaway PostgreSQL, mwmq in this process or
//! as a child process, and a `redis` crate connection to it.

#![allow(dead_code)]

use mwmq::Service;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use mctest::Postgres;
use mwmq::{Config, Mq};

/// The engine the tests run against: `MWMQ_TEST_ENGINE=pool|async`
/// (default: mwmq's default, async).
pub fn engine() -> mwserve::config::Engine {
    match std::env::var("MWMQ_TEST_ENGINE").as_deref() {
        Ok("pool") => mwserve::config::Engine::Pool,
        Ok("async") | Ok("") | Err(_) => mwserve::config::Engine::Async,
        Ok(other) => panic!("MWMQ_TEST_ENGINE must be pool or async, not {other:?}"),
    }
}

/// A configuration for tests: a free port, small windows, quick polls, and
/// QINFO read fresh every time (tests look right after a change).
pub fn config(pg: &Postgres) -> Config {
    config_for(pg.conninfo())
}

/// [`config`] for the database at `url` (a connection string).
pub fn config_for(url: &str) -> Config {
    let mut c = Config::default();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 4;
    c.server.engine = engine();
    c.database.url = url.to_string();
    c.database.retry_min_ms = 20;
    c.database.retry_max_ms = 200;
    c.queues.poll_ms = 100;
    c.queues.info_cache_ms = 0;
    c.stats.window_ms = 200;
    c
}

/// mwmq in this process.
pub fn start(c: Config) -> Mq {
    Mq::start(c).expect("mwmq starts")
}

/// A connection to mwmq with the `redis` crate.
pub fn connect(addr: SocketAddr) -> redis::Connection {
    let client = redis::Client::open(format!("redis://{addr}/")).expect("client");
    let c = client.get_connection_with_timeout(Duration::from_secs(5)).expect("connect");
    // A reply that never comes fails the test instead of hanging it.
    c.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
    c
}

/// A named connection (CLIENT SETNAME).
pub fn connect_as(addr: SocketAddr, name: &str) -> redis::Connection {
    let mut c = connect(addr);
    let _: () = redis::cmd("CLIENT").arg("SETNAME").arg(name).query(&mut c).expect("setname");
    c
}

/// Runs a command, panicking on an error reply.
pub fn q<T: redis::FromRedisValue>(c: &mut redis::Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// A number from INFO's `field:value` lines.
pub fn info_field(c: &mut redis::Connection, field: &str) -> u64 {
    let info: String = q(c, &["INFO"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO has no {field}"))
        .trim()
        .parse()
        .unwrap()
}

/// Runs a command that must fail; returns the error's code and text.
pub fn err(c: &mut redis::Connection, args: &[&str]) -> String {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match cmd.query::<redis::Value>(c) {
        Ok(v) => panic!("{args:?} succeeded: {v:?}"),
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
    }
}

/// A message as RECV returns it: id, lease, sender, body.
pub type Leased = (i64, i64, String, Vec<u8>);

/// RECV with options.
pub fn recv(c: &mut redis::Connection, queue: &str, opts: &[&str]) -> Vec<Leased> {
    let mut cmd = redis::cmd("RECV");
    cmd.arg(queue);
    for o in opts {
        cmd.arg(*o);
    }
    cmd.query(c).unwrap_or_else(|e| panic!("RECV {queue} {opts:?}: {e}"))
}

/// RECV asked again until it hands something out (a lease that runs out
/// frees its message); panics with `what` after 30 s.
pub fn recv_when_free(c: &mut redis::Connection, queue: &str, opts: &[&str], what: &str) -> Vec<Leased> {
    let mut got = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            got = recv(c, queue, opts);
            !got.is_empty()
        }),
        "{what} within 30 s"
    );
    got
}

/// mwmq as a child process (for SIGKILL and SIGTERM).
pub struct MqProcess {
    pub child: Child,
    pub addr: SocketAddr,
}

impl MqProcess {
    /// Starts `mwmq` on `port` (0: a free one) with `extra` flags.
    pub fn start(pg: &Postgres, port: u16, extra: &[&str]) -> MqProcess {
        MqProcess::start_with(pg, port, extra, Stdio::inherit())
    }

    /// [`MqProcess::start`], its log (stderr) going to `stderr`.
    pub fn start_with(pg: &Postgres, port: u16, extra: &[&str], stderr: Stdio) -> MqProcess {
        let mut p = MqProcess::spawn(pg, port, extra, stderr);
        p.wait_listening();
        p
    }

    /// Starts `mwmq` without waiting for it to listen.
    pub fn spawn(pg: &Postgres, port: u16, extra: &[&str], stderr: Stdio) -> MqProcess {
        let port = if port == 0 { mctest::free_port() } else { port };
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // Four workers for the pool engine (the async engine would warn that it has none).
        let workers: &[&str] = match engine() {
            mwserve::config::Engine::Pool => &["--workers", "4"],
            mwserve::config::Engine::Async => &[],
        };
        let child = Command::new(env!("CARGO_BIN_EXE_mwmq"))
            .args(["--listen", &addr.to_string(), "--db", pg.conninfo(), "--log", "warn"])
            .args(["--engine", engine().name()])
            .args(workers)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn mwmq");
        MqProcess { child, addr }
    }

    /// Waits until it listens (panics if it exits first).
    pub fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(self.addr).is_err() {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("mwmq exited at start: {st}");
            }
            assert!(Instant::now() < deadline, "mwmq did not listen on {}", self.addr);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and wait.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM; the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signal");
        self.child.wait().expect("wait")
    }
}

impl Drop for MqProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Direct SQL on the test database.
pub fn sql(pg: &Postgres) -> postgres::Client {
    sql_at(pg.conninfo())
}

/// [`sql`] for the database at `conninfo`: mwmq's tables (in the schema
/// `mwmq`) are named without their schema, and what a test creates goes
/// to `public`, as it would without the setting.
pub fn sql_at(conninfo: &str) -> postgres::Client {
    let mut c = postgres::Client::connect(conninfo, postgres::NoTls).expect("sql connection");
    c.batch_execute("SET search_path = public, mwmq").expect("search_path");
    c
}

/// A `[[users]]` entry as `mwmq user add` makes it.
pub fn user(name: &str, password: &str, send: &[&str], receive: &[&str], admin: &[&str]) -> mwmq::users::UserConfig {
    let v = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let table = mwmq::users::user_table(name, password.as_bytes(), &v(send), &v(receive), &v(admin)).unwrap();
    let doc: toml::Table = toml::from_str(&table).unwrap();
    let mut users: Vec<mwmq::users::UserConfig> = doc["users"].clone().try_into().unwrap();
    users.pop().unwrap()
}

/// A connection logged in as `name` (the redis crate sends `AUTH name password`).
pub fn login(addr: SocketAddr, name: &str, password: &str) -> redis::Connection {
    let client = redis::Client::open(format!("redis://{name}:{password}@{addr}/")).unwrap();
    let c = client.get_connection_with_timeout(Duration::from_secs(10)).expect("logged in");
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c
}

/// Certificates made in a scratch directory named after `name`, and `cfg`
/// set to listen with TLS and on a plaintext port beside it (returned).
pub fn with_tls(cfg: &mut Config, name: &str) -> (mctest::Certificates, u16) {
    let dir = std::env::temp_dir().join(format!("mwmq-{name}-{}", std::process::id()));
    let certs = mctest::Certificates::make(&dir).unwrap();
    let plain = mctest::free_port();
    cfg.tls.cert = Some(certs.cert.display().to_string());
    cfg.tls.key = Some(certs.key.display().to_string());
    cfg.tls.plain_listen = Some(format!("127.0.0.1:{plain}"));
    (certs, plain)
}

/// Whether `check` holds within `limit` (tried every 20 ms).
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// QINFO of `queue` as field -> value (numbers as their digits).
pub fn qinfo(c: &mut redis::Connection, queue: &str) -> std::collections::HashMap<String, String> {
    let flat: Vec<redis::Value> = q(c, &["QINFO", queue]);
    flat.chunks(2)
        .map(|kv| {
            let v = match &kv[1] {
                redis::Value::Int(i) => i.to_string(),
                other => redis::from_redis_value::<String>(other).unwrap_or_default(),
            };
            (redis::from_redis_value::<String>(&kv[0]).unwrap(), v)
        })
        .collect()
}

/// One of QINFO's numbers.
pub fn qinfo_int(c: &mut redis::Connection, queue: &str, field: &str) -> i64 {
    let info = qinfo(c, queue);
    info.get(field).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("QINFO {queue} {field}: {info:?}"))
}

/// A number on mwmq's `/metrics` page at `admin` (a series without labels).
pub fn metric(admin: SocketAddr, name: &str) -> f64 {
    let (_, page) = mctest::http_get(admin, "/metrics");
    page.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("/metrics has no {name}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits (30 s at most) until a client's statement waits for a lock on
/// `mwmq_messages`, as PostgreSQL's lock table shows; `db` may be the
/// transaction that holds the lock. (VACUUM's wait, for a
/// ShareUpdateExclusiveLock, is not a client's; mwmq's other housekeeping
/// that touches the table, the maintenance pass, is to be set off with a
/// long `queues.maintenance_s`.)
pub fn until_a_statement_waits_for_the_lock(db: &mut impl postgres::GenericClient) {
    let waits = || {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'mwmq_messages'::regclass
                 AND mode <> 'ShareUpdateExclusiveLock'",
                &[],
            )
            .unwrap()
            .get(0);
        n > 0
    };
    assert!(eventually(Duration::from_secs(30), waits), "no statement of mwmq waited for the lock within 30 s");
}

/// With mwmq's only carrier held (its statement waits for a lock), waits (30
/// s at most) until mwmq has taken in every request written so far: the pool
/// engine's queue for its worker holds `queued` requests; the async engine
/// has read `bytes` bytes more than `base` (`mwmq_received_bytes_total`): its
/// loop reads, parses and queues a request in one step, before it can start
/// a statement for it.
pub fn until_taken_in(admin: SocketAddr, queued: usize, base: f64, bytes: usize) {
    let taken = || match engine() {
        mwserve::config::Engine::Pool => metric(admin, "mwmq_queue_length") >= queued as f64,
        mwserve::config::Engine::Async => metric(admin, "mwmq_received_bytes_total") >= base + bytes as f64,
    };
    assert!(
        eventually(Duration::from_secs(30), taken),
        "mwmq did not take in the requests written within 30 s (queue {}, bytes read {} of {base} + {bytes})",
        metric(admin, "mwmq_queue_length"),
        metric(admin, "mwmq_received_bytes_total")
    );
}
