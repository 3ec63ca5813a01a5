//! Requests the proxy answers from its own state: `version` and `stats`
//! (`stats`, `stats backends`, `stats settings`, `stats reset`).

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use mcproto::Request;

use crate::shared::Shared;
use crate::stats::NetCounters;

/// The reply to a request answered locally.
pub fn reply(req: &Request, shared: &Shared) -> Vec<u8> {
    let mut out = Vec::new();
    match req {
        Request::Version => out.extend_from_slice(format!("VERSION {}\r\n", crate::VERSION).as_bytes()),
        Request::Stats { args } => stats(args, shared, &mut out),
        _ => out.extend_from_slice(b"ERROR\r\n"),
    }
    out
}

fn stats(args: &[Vec<u8>], shared: &Shared, out: &mut Vec<u8>) {
    let mut stat = |name: &str, value: &dyn std::fmt::Display| {
        out.extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
    };
    match args.first().map(Vec::as_slice) {
        None => {
            for (name, value) in general_stats(shared) {
                stat(&name, &value);
            }
        }
        Some(b"backends") if args.len() == 1 => {
            let acc = shared.telemetry.everything();
            for (i, spec) in shared.config.routing.servers.iter().enumerate() {
                let b = &acc.backends[i];
                let status = if shared.health.is_down(i) { "down" } else { "up" };
                stat(&format!("backend:{i}:address"), &spec.endpoint());
                stat(&format!("backend:{i}:weight"), &spec.weight);
                stat(&format!("backend:{i}:status"), &status);
                stat(&format!("backend:{i}:requests"), &b.requests);
                stat(&format!("backend:{i}:errors"), &b.errors);
                stat(&format!("backend:{i}:timeouts"), &b.timeouts);
                stat(&format!("backend:{i}:reconnects"), &b.reconnects);
                stat(&format!("backend:{i}:repairs_waiting"), &shared.repairs.waiting(i));
                stat(&format!("backend:{i}:server_us_mean"), &format!("{:.1}", b.server.mean()));
                stat(&format!("backend:{i}:server_us_p99"), &b.server.quantile(0.99));
            }
        }
        Some(b"settings") if args.len() == 1 => {
            for line in shared.config.to_toml().lines() {
                if let Some((k, v)) = line.split_once(" = ") {
                    stat(k.trim(), &v.trim().trim_matches('"'));
                }
            }
        }
        Some(b"reset") if args.len() == 1 => {
            shared.telemetry.reset_counters(&shared.net);
            out.extend_from_slice(b"RESET\r\n");
            return;
        }
        _ => {
            out.extend_from_slice(b"ERROR\r\n");
            return;
        }
    }
    out.extend_from_slice(b"END\r\n");
}

/// The figures of the plain `stats` command, in memcached's order where it has them.
pub fn general_stats(shared: &Shared) -> Vec<(String, String)> {
    let uptime = shared.started.elapsed();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let live = shared.telemetry.live(&shared.net);
    let total = shared.net.values();
    let open = NetCounters::value_of(&total, "total_connections") - NetCounters::value_of(&total, "closed_connections");
    let cfg = &shared.config;
    let mut v: Vec<(String, String)> = vec![
        ("pid".into(), std::process::id().to_string()),
        ("uptime".into(), uptime.as_secs().to_string()),
        ("time".into(), now.to_string()),
        ("version".into(), crate::VERSION.to_string()),
        ("pointer_size".into(), (8 * std::mem::size_of::<usize>()).to_string()),
        ("curr_connections".into(), open.to_string()),
        ("max_connections".into(), shared.max_connections.to_string()),
        ("threads".into(), cfg.proxy.workers.to_string()),
        ("net_threads".into(), cfg.proxy.net_threads.to_string()),
        ("queue_capacity".into(), cfg.proxy.queue_capacity.to_string()),
        ("queue_length".into(), shared.queue_len().to_string()),
        ("pending_input_bytes".into(), shared.budget.input_bytes().to_string()),
        ("pending_output_bytes".into(), shared.budget.output_bytes().to_string()),
    ];
    for name in NetCounters::NAMES {
        v.push((name.to_string(), NetCounters::value_of(&live.net, name).to_string()));
    }
    v.push(("requests".into(), live.requests.to_string()));
    for (name, value) in crate::stats::WorkerCounters::NAMES.iter().zip(live.counters.values()) {
        v.push((name.to_string(), value.to_string()));
    }
    let r = &shared.repairs;
    v.push(("repairs_queued".into(), r.queued.load(Ordering::Relaxed).to_string()));
    v.push(("repairs_done".into(), r.done.load(Ordering::Relaxed).to_string()));
    v.push(("repair_flushes".into(), r.flushes.load(Ordering::Relaxed).to_string()));
    let capacity = cfg.proxy.workers as f64 * uptime.as_nanos() as f64;
    let util = if capacity > 0.0 { live.busy_ns as f64 / capacity } else { 0.0 };
    v.push(("worker_utilization".into(), format!("{util:.4}")));
    v.push(("servers".into(), shared.addrs.len().to_string()));
    v.push(("servers_down".into(), shared.servers_down().to_string()));
    v.push(("replication".into(), cfg.routing.replication.to_string()));
    v
}
