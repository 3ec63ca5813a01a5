//! Opening connections: blocking (`postgres`) and asynchronous (`tokio_postgres`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postgres::{Client, NoTls};

use crate::config::Config;
use crate::deadline::{Armed, Watch};

use super::*;

/// What keeps a connection's socket going: it must run (spawned on a
/// runtime, or polled beside the statements) for the client to work.
pub type Driver = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), postgres::Error>> + Send>>;

/// A pooled connection for the pool engine's workers: the connection with a
/// runtime of its own, on which a worker blocks for its statements (as the
/// `postgres` crate does); the statement deadline watches its socket.
pub struct DbConn {
    pub(super) pg: PgConn,
    pub(super) rt: tokio::runtime::Runtime,
    /// Its socket, watched for the statement deadline (`deadline.rs`).
    pub(super) armed: Option<Arc<Armed>>,
}

impl Drop for DbConn {
    fn drop(&mut self) {
        // Closing politely waits for the server: a frozen one never answers.
        if let Some(a) = &self.armed {
            a.cut();
        }
    }
}

impl DbConn {
    /// Opens a connection, sets its session up and prepares every statement,
    /// within the connect timeout and the statement deadline; its socket is
    /// watched by `watch`.
    pub fn open(cfg: &Config, db: usize, watch: &Arc<Watch>) -> Result<DbConn, String> {
        let limit = Duration::from_millis(cfg.database.connect_timeout_ms)
            + cfg.statement_deadline().unwrap_or(Duration::from_secs(30));
        let (cfg, watch) = (cfg.clone(), watch.clone());
        within(limit, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("a runtime for the connection: {e}"))?;
            let (pg, armed) = {
                let _one_at_a_time = crate::deadline::OPENING.lock().unwrap_or_else(|p| p.into_inner());
                let before = crate::deadline::sockets();
                let (mut pg, driver) = rt.block_on(PgConn::open(&cfg))?;
                pg.db = db;
                rt.spawn(driver);
                let after = crate::deadline::sockets();
                let ports = crate::db::tls::split(&cfg.database.url)
                    .ok()
                    .and_then(|t| t.conninfo.parse::<postgres::Config>().ok())
                    .map(|c| c.get_ports().to_vec())
                    .unwrap_or_default();
                let ports = if ports.is_empty() { vec![5432] } else { ports };
                (pg, crate::deadline::new_socket(&before, &after, &ports).map(|s| watch.watch(s)))
            };
            if armed.is_none() {
                tracing::warn!(
                    "could not tell this connection's socket apart: its statements have no client-side deadline"
                );
            }
            Ok(DbConn { pg, rt, armed })
        })
    }

    /// Runs `f` on the connection, blocking until it is done.
    pub fn run<T>(&mut self, f: impl AsyncFnOnce(&PgConn) -> T) -> T {
        let pg = &self.pg;
        self.rt.block_on(f(pg))
    }

    /// Whether a statement failed in a way that leaves the connection unusable.
    pub fn broken(&self) -> bool {
        self.pg.broken()
    }
}

/// Connects with the configured timeouts and session settings.
pub fn connect(cfg: &Config) -> Result<Client, String> {
    let _one_at_a_time = crate::deadline::OPENING.lock().unwrap_or_else(|p| p.into_inner());
    connect_now(cfg)
}

/// Where and how to connect: the libpq settings with the password found
/// (PGPASSWORD, passfile, PGPASSFILE, ~/.pgpass, as libpq), mwmq's name,
/// and whether TLS is spoken (never over a Unix socket: libpq ignores
/// sslmode there too).
fn target(cfg: &Config) -> Result<(tokio_postgres::Config, Option<crate::db::tls::DbTarget>), String> {
    let target = crate::db::tls::split(&cfg.database.url)?;
    let mut pg: tokio_postgres::Config = target.conninfo.parse().map_err(|e| format!("connection string: {e}"))?;
    pg.connect_timeout(Duration::from_millis(cfg.database.connect_timeout_ms));
    if pg.get_password().is_none() {
        if let Some(p) = crate::db::pgpass::password_for(&pg, target.passfile.as_deref()) {
            pg.password(p);
        }
    }
    if pg.get_application_name().is_none() {
        pg.application_name("mwmq");
    }
    let unix_only = pg.get_hosts().iter().all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let tls = (pg.get_hosts().is_empty() || !unix_only) && target.mode != crate::db::tls::Mode::Disable;
    Ok((pg, tls.then_some(target)))
}

/// The servers a connection string names, `host:port` each (a Unix socket's
/// directory for its host), for messages: a connection that failed says
/// where it tried, and never the password.
pub fn servers(cfg: &Config) -> String {
    let Ok(pg) = crate::db::tls::split(&cfg.database.url)
        .and_then(|t| t.conninfo.parse::<tokio_postgres::Config>().map_err(|e| e.to_string()))
    else {
        return "the database".into();
    };
    let ports = pg.get_ports();
    let hosts = pg.get_hosts();
    if hosts.is_empty() {
        return format!("the default host, port {}", ports.first().copied().unwrap_or(5432));
    }
    let named: Vec<String> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                tokio_postgres::config::Host::Unix(dir) => format!("{}:{port}", dir.display()),
            }
        })
        .collect();
    named.join(", ")
}

/// "error performing TLS handshake" says little without its cause. With
/// `target_session_attrs=read-write`, tokio-postgres tries every host and
/// gives the last one's error: "database does not allow writes" when no
/// host took writes and the last one answered read-only (a standby), which
/// during a failover means the primary is gone ([`NO_PRIMARY`]).
///
/// With several hosts the error is the last one's whatever it was: the
/// last host down (refused, timed out) while the others answered read-only
/// or were down too means the same, no server takes writes, and is said so
/// ([`no_server_of`]) rather than as the last host's refusal alone.
fn connect_error(e: postgres::Error, hosts: usize) -> String {
    match std::error::Error::source(&e) {
        Some(cause) if cause.to_string() == "database does not allow writes" => NO_PRIMARY.to_string(),
        Some(cause) if hosts > 1 => no_server_of(hosts, &cause.to_string()),
        Some(cause) => format!("{e}: {cause}"),
        None if hosts > 1 => no_server_of(hosts, &e.to_string()),
        None => e.to_string(),
    }
}

/// No server of the `hosts` a failover connection string names took a
/// read-write connection; `last` is what the last one tried said.
fn no_server_of(hosts: usize, last: &str) -> String {
    format!(
        "no primary: none of the {hosts} database servers took a read-write connection (the last one tried: \
         {last}); the primary is gone, and a promotion is awaited (or a server's return)"
    )
}

/// The session's settings. The statements find messages through the
/// (queue_id, id) index, lowest id first. Left to itself the planner may
/// choose a bitmap scan and a sort while the table's statistics are those of
/// an empty table; bitmap scans never mark the index entries of deleted
/// messages dead, so every POP would visit every message ever deleted until
/// the next vacuum. An index scan marks them as it passes, and costs the same
/// when the table is small. (docs/mwmq.md) Those settings make any plan that
/// would still need a disabled node look expensive, which would start the
/// JIT compiler (hundreds of ms) on a statement that runs in one: off.
/// The search path is mwmq's schema only, whatever the connection string
/// or the role's defaults say, before any statement names anything
/// (`migrations.rs`: nothing in `public` is ever what mwmq calls).
pub fn session_settings(cfg: &Config) -> String {
    let timeout = cfg.database.statement_timeout_ms;
    format!(
        "SET search_path = mwmq; SET statement_timeout = {timeout}; SET lock_timeout = {timeout}; \
         SET enable_bitmapscan = off; SET enable_seqscan = off; SET enable_sort = off; SET jit = off; \
         SET mwmq.max_consumers = {}",
        cfg.server.max_consumers_per_group
    )
}

/// [`connect`], without waiting for other connections being opened.
fn connect_now(cfg: &Config) -> Result<Client, String> {
    let (pg, tls) = target(cfg)?;
    let hosts = pg.get_hosts().len();
    let pg = postgres::Config::from(pg);
    let mut client = match &tls {
        None => pg.connect(NoTls),
        Some(t) => pg.connect(crate::db::tls::connector(t)?),
    }
    .map_err(|e| connect_error(e, hosts))?;
    client.batch_execute(&session_settings(cfg)).map_err(|e| e.to_string())?;
    Ok(client)
}

/// Who a connection reached: `host:port` (`local:port` over a Unix socket).
pub(super) const SERVER: &str = "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')";

/// Connects asynchronously: the client, and the driver that must run for it
/// to work. The driver sets `unreplicated` when the server warns that it
/// cancelled a commit's wait for the synchronous standby.
pub(super) async fn connect_async(
    cfg: &Config,
    unreplicated: Arc<AtomicBool>,
) -> Result<(tokio_postgres::Client, Driver), String> {
    let (pg, tls) = target(cfg)?;
    let hosts = pg.get_hosts().len();
    match &tls {
        None => {
            let (c, conn) = pg.connect(tokio_postgres::NoTls).await.map_err(|e| connect_error(e, hosts))?;
            Ok((c, drive(conn, unreplicated)))
        }
        Some(t) => {
            let (c, conn) = pg.connect(crate::db::tls::connector(t)?).await.map_err(|e| connect_error(e, hosts))?;
            Ok((c, drive(conn, unreplicated)))
        }
    }
}

/// Runs a connection, reading the server's notices: tokio-postgres hands
/// them over in the order they arrived, each before the messages that
/// followed it are passed on to the statements waiting for them.
fn drive<S, T>(mut conn: tokio_postgres::Connection<S, T>, unreplicated: Arc<AtomicBool>) -> Driver
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use std::task::Poll;
    Box::pin(std::future::poll_fn(move |cx| loop {
        match conn.poll_message(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => return Poll::Ready(Ok(())),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
            Poll::Ready(Some(Ok(tokio_postgres::AsyncMessage::Notice(n)))) => {
                if n.message().starts_with(UNREPLICATED) {
                    unreplicated.store(true, Ordering::Release);
                    tracing::warn!(
                        "the database cancelled a commit's wait for its synchronous standby: {}",
                        n.message()
                    );
                }
            }
            Poll::Ready(Some(Ok(_))) => {}
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both servers of a failover connection string down (the state while
    /// the primary, last in the list, is dead and its standby not yet
    /// promoted): said as no primary, not as the last host's refusal.
    #[test]
    fn no_server_of_several_taking_a_connection_is_said_as_no_primary() {
        let mut cfg = Config::default();
        cfg.database.url = "host=127.0.0.1,127.0.0.1 port=1,2 user=x dbname=x sslmode=disable".into();
        let e = connect_now(&cfg).err().expect("nothing listens on ports 1 and 2");
        assert!(e.starts_with("no primary: none of the 2 database servers"), "{e}");
        assert!(e.contains("the last one tried:"), "{e}");
        cfg.database.url = "host=127.0.0.1 port=1 user=x dbname=x sslmode=disable".into();
        let e = connect_now(&cfg).err().expect("nothing listens on port 1");
        assert!(!e.contains("no primary") && e.contains("error connecting to server"), "{e}");
    }
}
