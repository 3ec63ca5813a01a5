//! The records of the results format (docs/results-format.md), as serde types.
//!
//! Readers must ignore unknown fields; these types do (serde's default), so an
//! older reader keeps working when a component adds fields.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::hist::HistSummary;

/// The format identifier written into every record.
pub const FORMAT: &str = "mwlab/1";

/// One operation class in one window (or the whole run).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpRecord {
    /// Requests completed.
    pub count: u64,
    /// Of those, answered with an error.
    pub errors: u64,
    /// Keys found.
    pub hits: u64,
    /// Keys not found.
    pub misses: u64,
    /// Keys requested.
    pub keys: u64,
    /// Response time.
    pub response_us: HistSummary,
}

/// One server as seen by a middleware.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendRecord {
    /// Requests sent.
    pub requests: u64,
    /// Requests without a usable reply.
    pub errors: u64,
    /// Of those, timeouts.
    pub timeouts: u64,
    /// Time from sending a request to this server to its reply being parsed.
    pub server_us: HistSummary,
}

/// Client connections of a middleware.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionsRecord {
    /// Open at the end of the window.
    pub open: u64,
    /// Accepted during the window.
    pub accepted: u64,
    /// Closed during the window.
    pub closed: u64,
    /// Refused (over the limit) during the window.
    pub rejected: u64,
}

/// What only a middleware measures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MiddlewareRecord {
    /// Time-weighted mean number of requests waiting for a worker.
    pub queue_length_mean: f64,
    /// Worker threads.
    pub workers: u64,
    /// Busy time of all workers / (workers x window length).
    pub worker_utilisation: f64,
    /// t_enqueue - t_recv.
    pub net_us: HistSummary,
    /// t_dequeue - t_enqueue.
    pub queue_us: HistSummary,
    /// t_backend_done - t_send.
    pub server_us: HistSummary,
    /// t_reply - t_dequeue.
    pub service_us: HistSummary,
    /// Per server, by address.
    pub backends: BTreeMap<String, BackendRecord>,
    /// Client connections.
    pub connections: ConnectionsRecord,
    /// Bytes read from clients.
    pub bytes_in: u64,
    /// Bytes written to clients.
    pub bytes_out: u64,
    /// Inputs refused by the parser.
    pub protocol_errors: u64,
    /// Times the request queue was found full.
    pub queue_full: u64,
    /// t_pool - t_dequeue: waiting for a pooled database connection (mwmq).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_us: Option<HistSummary>,
    /// The database behind the middleware (mwmq).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseRecord>,
}

/// A middleware's database and its connection pool (mwmq).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DatabaseRecord {
    /// Connections the pool may hold.
    pub pool_size: u64,
    /// Connections open at the end of the window.
    pub pool_open: u64,
    /// Borrowings that had to wait for a free connection.
    pub pool_waits: u64,
    /// Borrowings that gave up (answered `-TRYAGAIN`).
    pub pool_timeouts: u64,
    /// Connections opened.
    pub connects: u64,
    /// Failed attempts to open one.
    pub connect_failures: u64,
    /// Connections dropped after a failure.
    pub connections_lost: u64,
    /// Requests that parked to wait for messages (RECV ... WAIT).
    pub long_polls: u64,
    /// Time parked requests waited.
    pub long_poll_us: HistSummary,
    /// Leases given back because their reply never reached the client.
    pub leases_released: u64,
}

/// What only a load generator measures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientRecord {
    /// `warmup`, `measure` or `cooldown`: the lab keeps `measure` windows.
    pub phase: String,
    /// `closed` or `open`.
    pub mode: String,
    /// Load threads.
    pub threads: u64,
    /// Connections (clients) in all, each to every target.
    pub connections: u64,
    /// Virtual clients per connection (closed loop).
    pub virtual_clients: u64,
    /// Mean think time actually spent, in microseconds (closed loop; the Z of
    /// the interactive response time law).
    pub think_time_us: f64,
    /// Target rate in requests per second (open loop, else 0).
    pub target_rate: f64,
    /// Requests sent more than 1 ms after their intended time (open loop).
    pub late_sends: u64,
    /// Bytes sent and received.
    pub bytes: u64,
    /// Values read back whose content was not what was written (with --verify).
    pub verify_failures: u64,
    /// Connections lost so far.
    pub connections_lost: u64,
    /// Lost connections re-established so far (mwload `--reconnect`).
    #[serde(default)]
    pub reconnects: u64,
    /// Open-loop arrivals not sent because no connection was up.
    #[serde(default)]
    pub unsent: u64,
    /// Open loop: how late sends left after their intended time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_late_us: Option<HistSummary>,
    /// Open loop: gaps between consecutive sends of a load thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_gap_us: Option<HistSummary>,
}

/// One window, or (with `metadata`) the whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowRecord {
    /// Always [`FORMAT`].
    pub format: String,
    /// The component: `mwproxy`, `mwload`, ...
    pub source: String,
    /// The instance name given on the command line.
    pub instance: String,
    /// Window number, counted from 0 at the first window of the run (absent in summaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Start of the window (or run), wall clock.
    pub start_unix_ms: u64,
    /// Length of the window (or run).
    pub duration_ms: u64,
    /// How long after the window's end its counts were collected: requests
    /// completed in that time are counted in this window, not the next (a
    /// loaded machine delays the collecting thread). Absent in summaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collected_late_us: Option<u64>,
    /// Per operation class, plus `all`.
    pub ops: BTreeMap<String, OpRecord>,
    /// Middleware figures (absent for clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub middleware: Option<MiddlewareRecord>,
    /// Load-generator figures (absent for middlewares).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientRecord>,
    /// Run metadata (summaries only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// What a summary says about the run that produced it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Component name and version.
    pub version: String,
    /// Git revision the binary was built from, or "unknown".
    pub git_revision: String,
    /// The command line.
    pub command_line: Vec<String>,
    /// The configuration as resolved.
    pub config: serde_json::Value,
    /// Host name.
    pub host: String,
    /// CPU model.
    pub cpu_model: String,
    /// Logical CPUs.
    pub cpu_count: u64,
    /// Start of the run, wall clock.
    pub start_unix_ms: u64,
    /// End of the run, wall clock.
    pub end_unix_ms: u64,
}

impl Metadata {
    /// Metadata of a run of `version` on this host (command line, host, CPU,
    /// git revision), with its configuration and interval.
    pub fn of_run(version: &str, config: serde_json::Value, start_unix_ms: u64, end_unix_ms: u64) -> Metadata {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Metadata {
            version: version.into(),
            git_revision: crate::GIT_REVISION.into(),
            // Passwords in connection strings are never written to results.
            command_line: crate::redact::redact_args(std::env::args()),
            config,
            host,
            cpu_model,
            cpu_count: std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(1),
            start_unix_ms,
            end_unix_ms,
        }
    }
}
