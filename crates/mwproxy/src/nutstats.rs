//! twemproxy's stats, as its stats port serves them: a client connects, reads
//! one JSON document, and the connection is closed. The keys are
//! twemproxy's; the values mwproxy's own counts where it has them (what has
//! no equivalent is 0, listed in docs/twemproxy.md).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use crate::recorder::WorkerAcc;
use crate::shared::Shared;
use crate::stats::NetCounters;

/// One pool's part of the document, and its client connection counts
/// (accepted since start, open now) for the totals.
pub fn pool(shared: &Shared) -> (Value, u64, u64) {
    let net = shared.net.values();
    let v = |name: &str| NetCounters::value_of(&net, name);
    let open = v("total_connections").saturating_sub(v("closed_connections"));
    let generation = shared.generation();
    // The totals up to the last window, with the current window's counts
    // added. The run's lock is taken first and held while the slots are
    // read: the stats thread moves the slots into the totals under it, so a
    // request is never counted both in a slot and in the totals (read the
    // other way round, a window closing in between was counted twice).
    let run = shared.telemetry.run();
    let mut live = WorkerAcc::new(0);
    shared.telemetry.slots.peek(&mut live);
    let total = &run.total;
    let backend = |slot: usize| {
        let (a, b) = (total.backend(slot), live.backend(slot));
        (a.requests + b.requests, a.errors + b.errors, a.timeouts + b.timeouts)
    };
    let failures = total.counters.backend_failures + live.counters.backend_failures;
    let mut out = Map::new();
    out.insert("client_eof".into(), json!(v("closed_connections")));
    out.insert("client_err".into(), json!(v("protocol_errors")));
    out.insert("client_connections".into(), json!(open));
    out.insert("server_ejects".into(), json!(shared.servers.ejections()));
    out.insert("forward_error".into(), json!(failures));
    out.insert("fragments".into(), json!(0));
    let carriers = shared.config.proxy.carriers() as u64;
    for (p, spec) in generation.config.effective_routing().servers.iter().enumerate() {
        let slot = generation.ids[p];
        let (requests, errors, timeouts) = backend(slot);
        let up = !shared.servers.is_down(slot);
        let server = json!({
            "server_eof": 0,
            "server_err": errors.saturating_sub(timeouts),
            "server_timedout": timeouts,
            "server_connections": if up { carriers } else { 0 },
            "server_ejected_at": shared.servers.ejected_at_us(slot),
            "requests": requests,
            "request_bytes": 0,
            "responses": requests.saturating_sub(errors),
            "response_bytes": 0,
            "in_queue": shared.servers.waiting(slot),
            "in_queue_bytes": 0,
            "out_queue": 0,
            "out_queue_bytes": 0,
        });
        out.insert(mcproto::ring::ring_name(spec), server);
    }
    (Value::Object(out), v("total_connections"), open)
}

/// The whole document for `pools` (name, state), started at `started` (unix seconds).
pub fn document(pools: &[(String, Arc<Shared>)], started: u64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut doc = Map::new();
    doc.insert("service".into(), json!("mwproxy"));
    doc.insert("source".into(), json!(hostname()));
    doc.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    doc.insert("uptime".into(), json!(now.saturating_sub(started)));
    doc.insert("timestamp".into(), json!(now));
    let (mut total, mut current) = (0, 0);
    let mut parts = Vec::new();
    for (pool_name, shared) in pools {
        let (part, t, c) = pool(shared);
        total += t;
        current += c;
        parts.push((pool_name.clone(), part));
    }
    doc.insert("total_connections".into(), json!(total));
    doc.insert("curr_connections".into(), json!(current));
    for (n, part) in parts {
        doc.insert(n, part);
    }
    Value::Object(doc).to_string()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// The stats port: a thread that answers every connection with the document.
pub struct StatsPort {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StatsPort {
    /// Listens on `addr` and serves `pools`.
    pub fn start(addr: &str, pools: Vec<(String, Arc<Shared>)>) -> std::io::Result<StatsPort> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        if !local.ip().is_loopback() {
            tracing::warn!(
                addr = %local,
                "the twemproxy stats port listens beyond loopback without authentication: anyone who can reach it \
                 reads the pools' servers and counters"
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let started = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("stats-port".into()).spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                // A reader that never reads holds the port for a second at most.
                let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = conn.write_all(document(&pools, started).as_bytes());
            }
        })?;
        Ok(StatsPort { addr: local, stop, thread: Some(thread) })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StatsPort {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
