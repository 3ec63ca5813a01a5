//! Requests the proxy answers itself: `version`, `stats` and its variants.
//!
//! `version` and plain `stats` are first asked of every server (the routing
//! core's gather plan): `version` answers the lowest version the servers
//! report, in memcached's form, so that clients which parse it (libmemcached's
//! `memcached_version`, Perl's `version->parse`, PHP's `getVersion`) keep
//! working; mwproxy's own version is `STAT mwproxy_version` and
//! `mwproxy --version`. `stats` adds the servers' item, byte and memory
//! figures up next to the proxy's own counters. `stats backends`,
//! `stats settings` and `stats reset` are the proxy's alone; `stats cachedump`
//! answers `END`, as memcached does when it has nothing to dump.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use mcproto::{Request, Response};

use crate::generation::Generation;
use crate::route::Answer;
use crate::shared::Shared;
use crate::stats::NetCounters;

/// Server figures that `stats` adds up over the servers.
const SUMMED: [&str; 5] = ["curr_items", "total_items", "bytes", "limit_maxbytes", "evictions"];

/// The reply to a request answered from the proxy's state alone.
pub fn reply(req: &Request, shared: &Shared, generation: &Generation) -> Vec<u8> {
    let mut out = Vec::new();
    match req {
        Request::Stats { args } => stats_variant(args, shared, generation, &mut out),
        _ => out.extend_from_slice(b"ERROR\r\n"),
    }
    out
}

/// The reply to `version` or `stats`, given every server's answer to it
/// (the servers of `generation`, in its order).
pub fn gathered(req: &Request, answers: &[Answer], shared: &Shared, generation: &Generation) -> Vec<u8> {
    let backends = BackendFigures::of(answers);
    match req {
        Request::Version => match &backends.version {
            Some(v) => format!("VERSION {v}\r\n").into_bytes(),
            None => {
                let mut out = Vec::new();
                let failed = answers.iter().position(Result::is_err).unwrap_or(0);
                match &answers.get(failed) {
                    Some(Err(e)) => generation.router.error_line(failed, e, &mut out),
                    _ => out.extend_from_slice(b"SERVER_ERROR no server reported its version\r\n"),
                }
                out
            }
        },
        _ => {
            let mut out = Vec::new();
            for (name, value) in general_stats(shared, generation, &backends) {
                out.extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
            }
            out.extend_from_slice(b"END\r\n");
            out
        }
    }
}

/// What the servers said about themselves.
#[derive(Debug, Default)]
pub struct BackendFigures {
    /// The lowest version reported.
    pub version: Option<String>,
    /// Sums of [`SUMMED`], in its order.
    pub sums: [u64; SUMMED.len()],
    /// Servers that answered.
    pub answered: usize,
}

impl BackendFigures {
    /// Reads `VERSION` lines or `STAT` replies.
    pub fn of(answers: &[Answer]) -> BackendFigures {
        let mut f = BackendFigures::default();
        for raw in answers.iter().filter_map(|a| a.as_ref().ok()) {
            match mcproto::parse_response(raw) {
                Ok(Some((Response::Version(v), _))) => {
                    f.answered += 1;
                    f.note_version(&String::from_utf8_lossy(v));
                }
                Ok(Some((Response::Stats(stats), _))) => {
                    f.answered += 1;
                    for (name, value) in stats {
                        let value = String::from_utf8_lossy(value);
                        if name == b"version" {
                            f.note_version(&value);
                        } else if let Some(i) = SUMMED.iter().position(|s| s.as_bytes() == name) {
                            f.sums[i] += value.parse::<u64>().unwrap_or(0);
                        }
                    }
                }
                _ => {}
            }
        }
        f
    }

    fn note_version(&mut self, v: &str) {
        let lower = match &self.version {
            None => true,
            Some(old) => version_key(v) < version_key(old),
        };
        if lower && version_key(v).is_some() {
            self.version = Some(v.trim().to_string());
        }
    }
}

/// `1.6.18` as numbers, for comparing versions; `None` when it does not start with one.
fn version_key(v: &str) -> Option<Vec<u64>> {
    let nums: Vec<u64> = v
        .trim()
        .split('.')
        .map_while(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect();
    (!nums.is_empty()).then_some(nums)
}

fn stats_variant(args: &[Vec<u8>], shared: &Shared, generation: &Generation, out: &mut Vec<u8>) {
    let mut stat = |name: &str, value: &dyn std::fmt::Display| {
        out.extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
    };
    match args.first().map(Vec::as_slice) {
        Some(b"routes") if args.len() == 1 => {
            for (name, value) in generation.tree.iter().flat_map(|t| t.figures()) {
                stat(&name, &value);
            }
            if let Some(tree) = &generation.tree {
                for (pool, figures) in tree.pool_figures(&|s| shared.servers.is_down(s)) {
                    for (name, value) in figures {
                        stat(&format!("pool:{pool}:{name}"), &value);
                    }
                }
            }
        }
        Some(b"backends") if args.len() == 1 => {
            let acc = shared.telemetry.everything();
            for (i, spec) in generation.config.effective_routing().servers.iter().enumerate() {
                let id = generation.ids[i];
                let b = acc.backend(id);
                let status = if shared.servers.is_down(id) { "down" } else { "up" };
                stat(&format!("backend:{i}:address"), &spec.endpoint());
                stat(&format!("backend:{i}:weight"), &spec.weight);
                stat(&format!("backend:{i}:status"), &status);
                stat(&format!("backend:{i}:requests"), &b.requests);
                stat(&format!("backend:{i}:errors"), &b.errors);
                stat(&format!("backend:{i}:timeouts"), &b.timeouts);
                stat(&format!("backend:{i}:reconnects"), &b.reconnects);
                stat(&format!("backend:{i}:repairs_waiting"), &shared.servers.repairs.waiting(id));
                let (checks, failed) = shared.servers.health.checks(id);
                stat(&format!("backend:{i}:health_checks"), &checks);
                stat(&format!("backend:{i}:health_check_failures"), &failed);
                stat(&format!("backend:{i}:server_us_mean"), &format!("{:.1}", b.server.mean()));
                stat(&format!("backend:{i}:server_us_p99"), &b.server.quantile(0.99));
            }
        }
        Some(b"settings") if args.len() == 1 => {
            for (k, v) in settings(&generation.config) {
                stat(&k, &v);
            }
        }
        Some(b"reset") if args.len() == 1 => {
            shared.telemetry.reset_counters(&shared.net);
            out.extend_from_slice(b"RESET\r\n");
            return;
        }
        Some(b"cachedump") => {
            // What memcached answers when it has nothing to dump (the proxy
            // has no items of its own), with memcached's argument checks.
            let number = |i: usize| args.get(i).and_then(|a| mcproto::number::parse_u32(a));
            let refusal: Option<&[u8]> = if args.len() < 3 {
                Some(b"CLIENT_ERROR bad command line\r\n")
            } else {
                match (number(1), number(2)) {
                    (Some(id), Some(_)) if id >= 64 => Some(b"CLIENT_ERROR Illegal slab id\r\n"),
                    (Some(_), Some(_)) => None,
                    _ => Some(b"CLIENT_ERROR bad command line format\r\n"),
                }
            };
            if let Some(line) = refusal {
                out.extend_from_slice(line);
                return;
            }
        }
        _ => {
            out.extend_from_slice(b"ERROR\r\n");
            return;
        }
    }
    out.extend_from_slice(b"END\r\n");
}

/// The figures of the plain `stats` command, in memcached's order where it has them.
pub fn general_stats(shared: &Shared, generation: &Generation, backends: &BackendFigures) -> Vec<(String, String)> {
    let uptime = shared.started.elapsed();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let live = shared.telemetry.live(&shared.net);
    let net = |name: &str| NetCounters::value_of(&live.net, name);
    let total = shared.net.values();
    let open = NetCounters::value_of(&total, "total_connections") - NetCounters::value_of(&total, "closed_connections");
    let cfg = &generation.config;
    let (user, system) = cpu_seconds();
    let sum = |name: &str| backends.sums[SUMMED.iter().position(|s| *s == name).expect("a summed figure")];
    let c = &live.counters;
    let mut v: Vec<(String, String)> = Vec::new();
    let mut put = |name: &str, value: String| v.push((name.to_string(), value));
    put("pid", std::process::id().to_string());
    put("uptime", uptime.as_secs().to_string());
    put("time", now.to_string());
    put("version", backends.version.clone().unwrap_or_else(|| "unknown".into()));
    put("mwproxy_version", env!("CARGO_PKG_VERSION").to_string());
    put("pointer_size", (8 * std::mem::size_of::<usize>()).to_string());
    put("rusage_user", format!("{user:.6}"));
    put("rusage_system", format!("{system:.6}"));
    put("max_connections", shared.max_connections.to_string());
    put("curr_connections", open.to_string());
    put("total_connections", net("total_connections").to_string());
    put("rejected_connections", net("rejected_connections").to_string());
    let backend_conns = cfg.proxy.carriers() * generation.ids.len();
    put("connection_structures", (open as usize + backend_conns).to_string());
    for (name, value) in crate::stats::WorkerCounters::NAMES.iter().zip(c.values()) {
        put(name, value.to_string());
    }
    put("bytes_read", net("bytes_read").to_string());
    put("bytes_written", net("bytes_written").to_string());
    put("limit_maxbytes", sum("limit_maxbytes").to_string());
    put("threads", cfg.proxy.carriers().to_string());
    put("engine", cfg.proxy.engine.name().to_string());
    put("bytes", sum("bytes").to_string());
    put("curr_items", sum("curr_items").to_string());
    put("total_items", sum("total_items").to_string());
    put("evictions", sum("evictions").to_string());
    put("servers", generation.ids.len().to_string());
    put("servers_answering", backends.answered.to_string());
    put("servers_down", generation.down(&shared.servers).len().to_string());
    put("replication", cfg.routing.replication.to_string());
    put("net_threads", cfg.proxy.net_threads.to_string());
    put("closed_connections", net("closed_connections").to_string());
    put("protocol_errors", net("protocol_errors").to_string());
    put("binary_connections", net("binary_connections").to_string());
    put("auth_cmds", net("auth_cmds").to_string());
    put("auth_errors", net("auth_errors").to_string());
    for k in ["auth_throttled", "auth_closed", "login_timeouts", "handshake_timeouts", "handshake_refused"] {
        put(k, net(k).to_string());
    }
    put("auth_repeated", shared.logins.repeated.load(std::sync::atomic::Ordering::Relaxed).to_string());
    put("tls_handshake_failures", net("tls_handshake_failures").to_string());
    put("config_generation", generation.id.to_string());
    put("config_reloads", net("config_reloads").to_string());
    put("config_reload_failures", net("config_reload_failures").to_string());
    put("queue_capacity", cfg.proxy.queue_capacity.to_string());
    put("queue_length", shared.queue_len().to_string());
    put("queue_full", net("queue_full").to_string());
    put("pending_input_bytes", shared.budget.input_bytes().to_string());
    put("pending_output_bytes", shared.budget.output_bytes().to_string());
    put("requests", live.requests.to_string());
    let r = &shared.servers.repairs;
    put("repairs_queued", r.queued.load(Ordering::Relaxed).to_string());
    put("repairs_done", r.done.load(Ordering::Relaxed).to_string());
    put("repair_flushes", r.flushes.load(Ordering::Relaxed).to_string());
    let (checks, failed) = (0..shared.servers.capacity())
        .map(|s| shared.servers.health.checks(s))
        .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    put("health_checks", checks.to_string());
    put("health_check_failures", failed.to_string());
    let capacity = cfg.proxy.carriers() as f64 * uptime.as_nanos() as f64;
    let util = if capacity > 0.0 { live.busy_ns as f64 / capacity } else { 0.0 };
    put("worker_utilization", format!("{util:.4}"));
    v
}

/// CPU seconds this process spent in user and system mode, from
/// `getrusage(2)` (microseconds, as memcached reports them; the clock ticks
/// of /proc/self/stat, 10 ms each, showed 0.000000 for a light load).
fn cpu_seconds() -> (f64, f64) {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else { return (0.0, 0.0) };
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    (seconds(usage.user_time()), seconds(usage.system_time()))
}

/// The configuration as `stats settings` lines: a section's own settings by
/// their names (`replication`, `timeout_ms`), as memcached names its own;
/// anything deeper (a pool's, a route node's) by its dotted path
/// (`pools.main.servers`, `route.routes."hot:".type`); every value on one
/// line (lists as `[a, b]`), strings without their quotes.
fn settings(config: &crate::config::Config) -> Vec<(String, String)> {
    /// The settings of `table` at `path`: by their names, or (`full`) by their paths.
    fn walk(path: &str, table: &toml::Table, full: bool, out: &mut Vec<(String, String)>) {
        for (k, v) in table {
            let name = if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                k.clone()
            } else {
                format!("{k:?}")
            };
            let at = format!("{path}.{name}");
            match v {
                toml::Value::Table(t) => walk(&at, t, true, out),
                toml::Value::String(s) => out.push((if full { at } else { name }, s.clone())),
                other => out.push((if full { at } else { name }, other.to_string())),
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(toml::Value::Table(top)) = toml::Value::try_from(config) {
        for (section, v) in &top {
            match v {
                // The route tree and the pools are named by their paths throughout.
                toml::Value::Table(t) => walk(section, t, section == "route" || section == "pools", &mut out),
                toml::Value::String(s) => out.push((section.clone(), s.clone())),
                other => out.push((section.clone(), other.to_string())),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_version_and_the_sums_come_from_the_servers() {
        let answers: Vec<Answer> = vec![
            Ok(b"STAT version 1.6.18\r\nSTAT curr_items 3\r\nSTAT bytes 100\r\nEND\r\n".to_vec()),
            Err(crate::route::BackendError::Down),
            Ok(b"STAT version 1.6.9\r\nSTAT curr_items 4\r\nSTAT bytes 50\r\nEND\r\n".to_vec()),
        ];
        let f = BackendFigures::of(&answers);
        assert_eq!(f.version.as_deref(), Some("1.6.9"));
        assert_eq!(f.sums[0], 7);
        assert_eq!(f.sums[2], 150);
        assert_eq!(f.answered, 2, "each server that answered counts once");
        let f = BackendFigures::of(&[Ok(b"VERSION 1.6.21\r\n".to_vec()), Ok(b"VERSION 1.10.0\r\n".to_vec())]);
        assert_eq!(f.version.as_deref(), Some("1.6.21"));
        assert_eq!(f.answered, 2);
        assert!(version_key("1.6.18-foo") > version_key("1.6.9"));
        assert_eq!(version_key("x"), None);
    }
}
