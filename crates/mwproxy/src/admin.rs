//! The HTTP admin endpoint's pages (`--admin ADDR`, served by
//! `mwserve::http`): `/metrics` in Prometheus text format, `/stats` as JSON
//! (the window in progress and the last closed one), `/healthz` (liveness:
//! 200 while the process serves, 503 once it is stopping) and `/readyz`
//! (readiness: 503, with the servers that are down, while some key has no
//! replica that is known to answer — down, stalled, or not checked yet by the
//! health checker (`checker.rs`); 200 otherwise).
//!
//! With a route tree (`[route]`), `/readyz` judges each pool so and then the
//! tree over them (`routes/ready.rs`): it is 503 only while some request the
//! tree routes reaches no pool that can answer it, and names those routes;
//! `/metrics` and `/stats` carry each route's counters (`stats routes`) and
//! each pool's.
//!
//! `/metrics` is current: the closed windows (whose sums windows.jsonl and,
//! after the run, summary.json hold) plus what the carriers hold of the
//! window in progress, read under the lock that closes windows, so a request
//! answered is counted at once and never twice. The servers' `up` gauges,
//! health-check and net counters are read live too.

use std::sync::Arc;

use mwserve::http::{Page, Probes, Routes, PROMETHEUS};
use mwstats::clock::unix_ms;
use mwstats::prom::PromText;
use mwstats::OpKind;

use crate::generation::Generation;
use crate::recorder::WorkerAcc;
use crate::routes::ready::PoolHealth;
use crate::routes::Tree;
use crate::shared::Shared;
use crate::stats::NetCounters;
use crate::windows::build_record;

/// The paths the endpoint serves.
pub const PATHS: &[&str] = &["/metrics", "/stats", "/healthz", "/readyz", "POST /reload"];

/// What the endpoint serves for `shared`'s proxy: `/healthz` answered by
/// the endpoint's loop itself (it reads a flag), `/readyz` one check at a
/// time, a wrong admin token counted as a failed login.
pub fn routes(shared: Arc<Shared>) -> Routes {
    let (live, ready, throttle) = (shared.clone(), shared.clone(), shared.logins.clone());
    let handler = Arc::new(move |r: &mwserve::http::Request| match (r.method, r.path) {
        ("GET", "/metrics") => Some(Page::ok(PROMETHEUS, metrics(&shared))),
        ("GET", "/stats") => Some(Page::ok("application/json", stats_json(&shared))),
        ("POST", "/reload") => Some(reload(&shared)),
        _ => None,
    });
    let probes = Probes { live: Arc::new(move || healthz(&live)), ready: Arc::new(move || readyz(&ready)) };
    Routes { paths: PATHS, own_login: None, probes: Some(probes), throttle: Some(throttle), handler }
}

/// `POST /reload`: 200 with what changed, 400 with why the running
/// configuration was kept, 409 when there is no file to read again.
fn reload(shared: &Shared) -> Page {
    let Some(read) = shared.source() else {
        return Page::text(
            409,
            "no configuration to reload from: this proxy was not started by its command line\n".into(),
        );
    };
    match crate::reload::reload(shared, read()) {
        Ok(report) => Page::ok("application/json", serde_json::to_string(&report).unwrap_or_default() + "\n"),
        Err(why) => Page::text(400, format!("reload refused, the running configuration stays: {why}\n")),
    }
}

fn healthz(shared: &Shared) -> Page {
    if shared.stopping.load(std::sync::atomic::Ordering::Relaxed) {
        return Page::text(503, "stopping\n".into());
    }
    Page::text(200, "ok\n".into())
}

fn readyz(shared: &Shared) -> Page {
    let generation = shared.generation();
    let router = &generation.router;
    let all = PoolHealth::of(router, &generation.ids, &shared.servers);
    if let Some(tree) = &generation.tree {
        return readyz_routes(shared, &generation, tree, &all);
    }
    let addrs = |list: &[usize]| list.iter().map(|&p| router.addrs[p].clone()).collect::<Vec<_>>();
    let body = serde_json::json!({
        "ready": !all.lost,
        "servers": generation.ids.len(),
        "replication": router.replication,
        "down": addrs(&all.down),
        "unchecked": addrs(&all.unchecked),
    });
    Page::json(if all.lost { 503 } else { 200 }, &body)
}

/// `/readyz` with a route tree: each pool judged as the one pool is, and
/// the tree judged over them (`routes/ready.rs`): 503 naming the routes
/// that cannot answer while there are some. A pool only shadows, all-async
/// children or warm-up fills reach is named but never makes it 503.
fn readyz_routes(shared: &Shared, generation: &Generation, tree: &Tree, all: &PoolHealth) -> Page {
    let names = |addrs: &[String], list: &[usize]| list.iter().map(|&p| addrs[p].clone()).collect::<Vec<_>>();
    let health: Vec<PoolHealth> =
        tree.pools.iter().map(|p| PoolHealth::of(&p.router, &p.ids, &shared.servers)).collect();
    let blocked = tree.not_servable(&health.iter().map(|h| !h.lost).collect::<Vec<_>>());
    let pools: serde_json::Map<String, serde_json::Value> = tree
        .pools
        .iter()
        .zip(&health)
        .map(|(p, h)| {
            let v = serde_json::json!({
                "ready": !h.lost,
                "servers": p.ids.len(),
                "replication": p.router.replication,
                "down": names(&p.router.addrs, &h.down),
                "unchecked": names(&p.router.addrs, &h.unchecked),
            });
            (p.name.clone(), v)
        })
        .collect();
    let body = serde_json::json!({
        "ready": blocked.is_empty(),
        "servers": generation.ids.len(),
        "down": names(&generation.router.addrs, &all.down),
        "unchecked": names(&generation.router.addrs, &all.unchecked),
        "pools": pools,
        "not_servable": blocked.iter().map(|&n| tree.spec.nodes[n].path.clone()).collect::<Vec<_>>(),
    });
    Page::json(if blocked.is_empty() { 200 } else { 503 }, &body)
}

fn stats_json(shared: &Shared) -> String {
    let t = &shared.telemetry;
    // The slots are read under the run's lock, which the stats thread holds
    // while it closes a window: what they hold is then this window's.
    let mut live = WorkerAcc::new(0);
    let (last, start, net_before) = {
        let run = t.run();
        t.slots.peek(&mut live);
        (run.last.clone(), run.window_start(), run.extra.net_last.clone())
    };
    let now = unix_ms();
    let current =
        build_record(shared, &live, None, start, now.saturating_sub(start), &shared.net.values(), &net_before);
    let mut page = serde_json::json!({ "current": current, "last": last });
    if let Some(tree) = &shared.generation().tree {
        let routes: serde_json::Map<String, serde_json::Value> = (0..tree.spec.nodes.len())
            .map(|n| (tree.spec.nodes[n].path.clone(), tree.node_figures(n).into_iter().collect()))
            .collect();
        let pools: serde_json::Map<String, serde_json::Value> = tree
            .pool_figures(&|s| shared.servers.is_down(s))
            .into_iter()
            .map(|(name, figures)| (name.to_string(), figures.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
            .collect();
        page["routes"] = routes.into();
        page["pools"] = pools.into();
    }
    page.to_string()
}

/// The route tree's series: every node's counters (`stats routes`) by its
/// path, every pool's requests, errors, servers and readiness.
fn route_metrics(p: &mut PromText, shared: &Shared, tree: &Tree) {
    for (n, node) in tree.spec.nodes.iter().enumerate() {
        let l = [("route", node.path.as_str())];
        for (name, value) in tree.node_figures(n) {
            match name.as_str() {
                "requests" => p.counter(
                    "mwproxy_route_requests_total",
                    "Requests that reached the route (a multi-get once per key; copies too).",
                    &l,
                    value,
                ),
                "errors" => {
                    p.counter("mwproxy_route_errors_total", "Requests the route answered with an error.", &l, value)
                }
                "failovers" => p.counter(
                    "mwproxy_route_failovers_total",
                    "Next children taken (failover, miss-failover).",
                    &l,
                    value,
                ),
                "phase" => p.gauge(
                    "mwproxy_route_migrate_phase",
                    "Where a migration stands: 0 before its window, 1 in it, 2 after.",
                    &l,
                    value as f64,
                ),
                copies => {
                    let (what, end) = copies.rsplit_once('_').unwrap_or((copies, ""));
                    let of = match what {
                        "shadow" => "Shadow copies",
                        "fills" => "Warm-up fills",
                        _ => "Copies to all-async and all-initial children",
                    };
                    let metric = format!("mwproxy_route_{copies}");
                    match end {
                        "sent" => {
                            p.counter(&(metric + "_total"), &format!("{of} handed to the side thread."), &l, value)
                        }
                        "dropped" => p.counter(
                            &(metric + "_total"),
                            &format!("{of} dropped: the route held its queue's worth."),
                            &l,
                            value,
                        ),
                        _ => p.gauge(&metric, &format!("{of} waiting or on their way now."), &l, value as f64),
                    }
                }
            }
        }
    }
    let ready: Vec<bool> =
        tree.pools.iter().map(|pool| !PoolHealth::of(&pool.router, &pool.ids, &shared.servers).lost).collect();
    for ((name, figures), ready) in tree.pool_figures(&|s| shared.servers.is_down(s)).into_iter().zip(ready) {
        let l = [("pool", name)];
        let [(_, requests), (_, errors), (_, servers), (_, up)] = figures;
        p.counter(
            "mwproxy_pool_requests_total",
            "Requests that reached the pool (a multi-get once per key).",
            &l,
            requests,
        );
        p.counter("mwproxy_pool_errors_total", "Requests the pool answered with an error.", &l, errors);
        p.gauge("mwproxy_pool_servers", "Servers of the pool.", &l, servers as f64);
        p.gauge("mwproxy_pool_servers_up", "Servers of the pool that answer.", &l, up as f64);
        p.gauge(
            "mwproxy_pool_ready",
            "1 while every key of the pool has a replica known to answer.",
            &l,
            if ready { 1.0 } else { 0.0 },
        );
    }
}

fn metrics(shared: &Shared) -> String {
    let acc = &shared.telemetry.everything();
    let mut p = PromText::default();
    for kind in OpKind::ALL {
        let op = acc.ops.get(kind);
        let l = [("op", kind.name())];
        p.counter("mwproxy_requests_total", "Requests completed.", &l, op.count);
        p.counter("mwproxy_request_errors_total", "Requests answered with an error.", &l, op.errors);
        p.counter("mwproxy_keys_total", "Keys requested.", &l, op.keys);
        p.counter("mwproxy_hits_total", "Keys found.", &l, op.hits);
        p.counter("mwproxy_misses_total", "Keys not found.", &l, op.misses);
        p.histogram_seconds("mwproxy_response_seconds", "Arrival to reply (t_reply - t_recv).", &l, &op.response);
    }
    p.histogram_seconds("mwproxy_net_seconds", "Arrival to queue (t_enqueue - t_recv).", &[], &acc.net);
    p.histogram_seconds("mwproxy_queue_seconds", "Time waiting for a worker.", &[], &acc.queue);
    p.histogram_seconds("mwproxy_server_seconds", "First request sent to last reply.", &[], &acc.server);
    p.histogram_seconds("mwproxy_service_seconds", "Worker start to reply.", &[], &acc.service);
    p.counter("mwproxy_worker_busy_seconds_total", "Time workers spent on jobs.", &[], acc.busy_ns / 1_000_000_000);
    p.gauge(
        "mwproxy_workers",
        "Threads carrying requests (pool workers or async loops).",
        &[],
        shared.config.proxy.carriers() as f64,
    );
    p.gauge("mwproxy_queue_length", "Requests waiting for a worker now.", &[], shared.queue_len() as f64);
    let generation = shared.generation();
    for &i in &generation.ids {
        let b = acc.backend(i);
        let a = shared.servers.addr(i).to_string();
        let l = [("backend", a.as_str())];
        p.counter("mwproxy_backend_requests_total", "Requests sent to the server.", &l, b.requests);
        p.counter("mwproxy_backend_errors_total", "Requests without a usable reply.", &l, b.errors);
        p.counter("mwproxy_backend_timeouts_total", "Requests that timed out.", &l, b.timeouts);
        p.histogram_seconds("mwproxy_backend_server_seconds", "Send to reply, per server.", &l, &b.server);
        let up = !shared.servers.is_down(i);
        p.gauge("mwproxy_backend_up", "1 when the server answers.", &l, if up { 1.0 } else { 0.0 });
        let (checks, failed) = shared.servers.health.checks(i);
        p.counter("mwproxy_backend_health_checks_total", "Health checks of the server (check_ms).", &l, checks);
        p.counter("mwproxy_backend_health_check_failures_total", "Health checks that failed.", &l, failed);
    }
    let net = shared.net.values();
    let v = |name: &str| NetCounters::value_of(&net, name);
    p.gauge(
        "mwproxy_connections",
        "Client connections open.",
        &[],
        v("total_connections").saturating_sub(v("closed_connections")) as f64,
    );
    p.counter("mwproxy_connections_accepted_total", "Client connections accepted.", &[], v("total_connections"));
    p.counter("mwproxy_connections_closed_total", "Client connections closed.", &[], v("closed_connections"));
    p.counter(
        "mwproxy_connections_rejected_total",
        "Connections refused over the limit.",
        &[],
        v("rejected_connections"),
    );
    p.counter("mwproxy_received_bytes_total", "Bytes read from clients.", &[], v("bytes_read"));
    p.counter("mwproxy_sent_bytes_total", "Bytes written to clients.", &[], v("bytes_written"));
    p.counter("mwproxy_protocol_errors_total", "Inputs refused by the parser.", &[], v("protocol_errors"));
    p.counter("mwproxy_queue_full_total", "Times the request queue was full.", &[], v("queue_full"));
    p.counter("mwproxy_auth_commands_total", "Login attempts (--auth-file).", &[], v("auth_cmds"));
    p.counter("mwproxy_auth_errors_total", "Login attempts with wrong credentials.", &[], v("auth_errors"));
    p.counter(
        "mwproxy_auth_throttled_total",
        "Login attempts refused unchecked (their address or user name failed too often).",
        &[],
        v("auth_throttled"),
    );
    p.counter(
        "mwproxy_auth_repeated_total",
        "Login attempts refused as wrong unchecked (the same password failed from the same address lately).",
        &[],
        shared.logins.repeated.load(std::sync::atomic::Ordering::Relaxed),
    );
    p.counter("mwproxy_auth_closed_total", "Connections closed after failed logins.", &[], v("auth_closed"));
    p.counter(
        "mwproxy_login_timeouts_total",
        "Connections closed for not logging in in time.",
        &[],
        v("login_timeouts"),
    );
    p.counter(
        "mwproxy_handshake_timeouts_total",
        "Connections closed for not finishing the TLS handshake in time.",
        &[],
        v("handshake_timeouts"),
    );
    p.counter(
        "mwproxy_handshake_refused_total",
        "Connections closed because too many others were handshaking.",
        &[],
        v("handshake_refused"),
    );
    p.counter(
        "mwproxy_tls_handshake_failures_total",
        "Client connections whose TLS handshake failed.",
        &[],
        v("tls_handshake_failures"),
    );
    p.counter("mwproxy_config_reloads_total", "Configurations reloaded.", &[], v("config_reloads"));
    p.counter(
        "mwproxy_config_reload_failures_total",
        "Reloads refused (the running configuration kept).",
        &[],
        v("config_reload_failures"),
    );
    p.gauge("mwproxy_config_generation", "The configuration in use (1 at start).", &[], generation.id as f64);
    if let Some(tree) = &generation.tree {
        route_metrics(&mut p, shared, tree);
    }
    p.render()
}
