//! The HTTP admin endpoint (`--admin ADDR`, served by `mwserve::http`):
//! `/metrics` in Prometheus text format (current: the closed windows plus
//! the window in progress, so a request answered counts at once; with each queue's counters: the
//! `[queues] public_queues` to anyone, the others only with the admin
//! token; a wrong token hears `401` and counts as a failed login), `/stats`
//! as JSON (the window in progress and the last closed one), `/healthz`
//! (liveness, answered by the endpoint's loop itself: 200 while the process
//! serves, 503 once it is stopping), `/readyz` (readiness: 503 while the
//! database cannot be reached; one check at a time, its answer served again
//! for `mwserve::http::READY_FOR`) and the `/ui` page ([`crate::admin::ui`]).

pub mod ui;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mwserve::http::{Page, Probes, Request, Routes, PROMETHEUS};
use mwstats::prom::PromText;
use mwstats::OpClass;

use crate::command::MqOp;
use crate::shared::Shared;
use crate::windows::current_record;

/// The paths the endpoint serves.
pub const PATHS: &[&str] = &["/ui", "/metrics", "/stats", "/healthz", "/readyz"];

/// How long `/healthz` waits for the database's answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// What the endpoint serves for `shared`'s mwmq. `/readyz` asks the
/// database itself, on a connection of its own (opened on first use, opened
/// again after a failure), so it answers 503 when the database cannot be
/// reached or does not answer in time, whatever the pool holds.
pub fn routes(shared: Arc<Shared>) -> Routes {
    let check: Mutex<Vec<Option<postgres::Client>>> = Mutex::new((0..shared.pool.len()).map(|_| None).collect());
    let (live, ready, throttle) = (shared.clone(), shared.clone(), shared.logins.throttle.clone());
    // The page's sessions live as long as the endpoint.
    let ui = crate::admin::ui::Ui::default();
    let handler = Arc::new(move |r: &Request| match (r.method, r.path) {
        ("GET", "/metrics") => Some(Page::ok(PROMETHEUS, metrics(&shared, r.token))),
        ("GET", "/stats") => {
            let (current, last) = current_record(&shared);
            Some(Page::ok("application/json", serde_json::json!({ "current": current, "last": last }).to_string()))
        }
        _ => crate::admin::ui::route(&shared, &ui, r),
    });
    let probes = Probes {
        // Answered by the endpoint's loop itself: a flag, nothing else.
        live: Arc::new(move || {
            if live.stopping.load(Ordering::Relaxed) {
                Page::text(503, "stopping\n".into())
            } else {
                Page::text(200, "ok\n".into())
            }
        }),
        ready: Arc::new(move || readyz(&ready, &mut check.lock().unwrap_or_else(|p| p.into_inner()))),
    };
    // The page's requests are checked by its own logins (the token or a
    // user's password); a wrong admin token elsewhere counts as a failed login.
    Routes { paths: PATHS, own_login: Some("/ui/"), probes: Some(probes), throttle: Some(throttle), handler }
}

/// A `/readyz` check under way (at most one at a time: a frozen database
/// holds a check until it runs again).
static OPENING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the server `c` reached answers and takes writes: a standby, or a
/// new primary that pg_auto_failover keeps read-only until the old one is
/// known to be down, is no primary. (The connection was opened with the
/// configured `target_session_attrs`; a server can become read-only later.)
fn writable(c: &mut postgres::Client) -> Result<(), String> {
    let deadline = format!("SET statement_timeout = {}", HEALTH_TIMEOUT.as_millis());
    c.batch_execute(&deadline).map_err(|e| e.to_string())?;
    let row = c
        .query_one("SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'", &[])
        .map_err(|e| e.to_string())?;
    match (row.get::<_, bool>(0), row.get::<_, bool>(1)) {
        (false, false) => Ok(()),
        (true, _) => Err("the server is a standby (no primary answers)".into()),
        (false, true) => Err("the server is read-only (a failover under way?)".into()),
    }
}

fn readyz(shared: &Shared, conns: &mut [Option<postgres::Client>]) -> Page {
    let (open, idle) = shared.pool.occupancy();
    let pool = format!("pool {} open {open} idle {idle}\n", shared.pool.size());
    let answered = if OPENING.swap(true, Ordering::AcqRel) {
        Err("a check is still waiting for the database".to_string())
    } else {
        // On a thread of its own, within HEALTH_TIMEOUT: a frozen server
        // holds the thread, not the endpoint (and no second check starts).
        let cfgs: Vec<_> = (0..conns.len()).map(|i| shared.config.for_database(i)).collect();
        let names: Vec<String> = (0..conns.len()).map(|i| shared.pool.placement.name(i).to_string()).collect();
        let kept: Vec<_> = conns.iter_mut().map(Option::take).collect();
        let several = conns.len() > 1;
        let checked = crate::db::within(HEALTH_TIMEOUT, move || {
            let mut out = Vec::new();
            let mut first_error = None;
            for ((cfg, kept), name) in cfgs.iter().zip(kept).zip(names) {
                let c = match kept {
                    Some(c) => Ok(c),
                    None => crate::db::connect(cfg),
                }
                .and_then(|mut c| writable(&mut c).map(|()| c));
                match c {
                    Ok(c) => out.push(Some(c)),
                    Err(e) => {
                        out.push(None);
                        let e = if several { format!("database {name:?}: {e}") } else { e };
                        first_error.get_or_insert(e);
                    }
                }
            }
            OPENING.store(false, Ordering::Release);
            Ok((out, first_error))
        });
        match checked {
            Ok((kept, error)) => {
                for (slot, c) in conns.iter_mut().zip(kept) {
                    *slot = c;
                }
                error.map_or(Ok(()), Err)
            }
            Err(e) => Err(e),
        }
    };
    match answered {
        Ok(()) => Page::text(200, format!("ok\ndatabase up\n{pool}")),
        Err(e) => Page::text(503, format!("unavailable\ndatabase down: {e}\n{pool}")),
    }
}

/// The page; `token`: the request carries the admin token (every queue of
/// `metrics_queues` is named, not only the public ones).
fn metrics(shared: &Shared, token: bool) -> String {
    // The closed windows and the window in progress: a request answered counts at once.
    let acc = &shared.telemetry.everything();
    let s = &acc.stages;
    let mut p = PromText::default();
    for kind in MqOp::ALL {
        let op = s.ops.get(*kind);
        let l = [("op", kind.name())];
        p.counter("mwmq_requests_total", "Requests answered.", &l, op.count);
        p.counter("mwmq_request_errors_total", "Requests answered with an error.", &l, op.errors);
        p.histogram_seconds("mwmq_response_seconds", "Arrival to reply (t_reply - t_recv).", &l, &op.response);
    }
    p.counter("mwmq_messages_received_total", "Messages handed out by RECV, POP and PEEK.", &[], {
        [MqOp::Recv, MqOp::Pop, MqOp::Peek].iter().map(|k| s.ops.get(*k).hits).sum()
    });
    p.histogram_seconds("mwmq_net_seconds", "Arrival to queue (t_enqueue - t_recv).", &[], &s.net);
    p.histogram_seconds("mwmq_queue_seconds", "Time waiting for a worker.", &[], &s.queue);
    p.histogram_seconds("mwmq_pool_wait_seconds", "Time waiting for a database connection.", &[], &s.pool);
    p.histogram_seconds("mwmq_database_seconds", "Statement sent to answer.", &[], &s.server);
    p.histogram_seconds("mwmq_service_seconds", "Worker start to reply.", &[], &s.service);
    p.counter("mwmq_worker_busy_seconds_total", "Time workers spent on requests.", &[], s.busy_ns / 1_000_000_000);
    p.gauge("mwmq_workers", "Worker threads.", &[], shared.config.server.workers as f64);
    p.gauge("mwmq_queue_length", "Requests waiting for a worker now.", &[], shared.queue.len() as f64);
    p.gauge(
        "mwmq_long_polls_waiting",
        "RECVs, XREADs and XREADGROUPs waiting for messages now.",
        &[],
        shared.waiters.parked() as f64,
    );
    p.counter(
        "mwmq_wait_polls_total",
        "Statements of the shared poll for waiting requests (one per database per poll_ms while any wait).",
        &[],
        shared.waiters.polls.load(Ordering::Relaxed),
    );
    p.counter(
        "mwmq_waits_abandoned_total",
        "Waiting requests ended because their client left.",
        &[],
        shared.waiters.abandoned.load(Ordering::Relaxed),
    );
    let (open, idle) = shared.pool.occupancy();
    p.gauge("mwmq_pool_size", "Database connections the pool may hold.", &[], shared.pool.size() as f64);
    p.gauge("mwmq_pool_open", "Database connections open.", &[], open as f64);
    p.gauge("mwmq_pool_idle", "Database connections idle.", &[], idle as f64);
    let pools = &shared.pool;
    p.counter("mwmq_pool_waits_total", "Borrowings that waited for a connection.", &[], pools.sum(|c| &c.waits));
    p.counter("mwmq_pool_timeouts_total", "Borrowings that gave up.", &[], pools.sum(|c| &c.timeouts));
    p.counter("mwmq_db_connects_total", "Database connections opened.", &[], pools.sum(|c| &c.connects));
    p.counter("mwmq_db_connect_failures_total", "Failed attempts to connect.", &[], pools.sum(|c| &c.connect_failures));
    p.counter("mwmq_db_connections_lost_total", "Connections dropped after a failure.", &[], pools.sum(|c| &c.lost));
    let now = mwstats::clock::now_ns();
    for (i, pool) in pools.iter().enumerate() {
        let primary = &pool.counters.primary;
        let l = [("database", pools.placement.name(i))];
        p.counter(
            "mwmq_db_failovers_total",
            "Connections opened on another server than before.",
            &l,
            primary.failovers(),
        );
        p.counter("mwmq_db_outages_total", "Periods without an answering database that ended.", &l, primary.outages());
        p.counter_f64(
            "mwmq_db_unavailable_seconds_total",
            "Time without an answering database (no primary), the current period included.",
            &l,
            primary.down_seconds(now),
        );
        p.gauge("mwmq_db_up", "1 unless requests find the database unavailable now.", &l, f64::from(!primary.down()));
    }
    p.counter("mwmq_db_statements_total", "Statements run.", &[], acc.db_requests);
    p.counter("mwmq_db_errors_total", "Statements that failed.", &[], acc.db_errors);
    let net = shared.net.snapshot();
    p.gauge(
        "mwmq_connections",
        "Client connections open.",
        &[],
        shared.open_connections.load(Ordering::Relaxed) as f64,
    );
    p.counter("mwmq_connections_accepted_total", "Client connections accepted.", &[], net.accepted);
    p.counter("mwmq_connections_rejected_total", "Connections refused over the limit.", &[], net.rejected);
    p.counter("mwmq_received_bytes_total", "Bytes read from clients.", &[], net.bytes_in);
    p.counter("mwmq_sent_bytes_total", "Bytes written to clients.", &[], net.bytes_out);
    p.counter("mwmq_protocol_errors_total", "Inputs that were not RESP.", &[], net.protocol_errors);
    p.counter("mwmq_queue_full_total", "Times the request queue was full.", &[], net.queue_full);
    p.counter("mwmq_leases_released_total", "Leases given back (reply not delivered).", &[], net.leases_released);
    let out = shared.output.snapshot();
    p.gauge("mwmq_output_budget_bytes", "The output budget (output_budget).", &[], out.limit as f64);
    p.gauge(
        "mwmq_output_held_bytes",
        "Bytes of replies built and not yet written, and reserved for replies being built.",
        &[],
        out.held as f64,
    );
    p.gauge("mwmq_output_peak_bytes", "The most mwmq_output_held_bytes has been.", &[], out.peak as f64);
    p.gauge("mwmq_output_waiting", "Requests waiting for room in the output budget now.", &[], out.waiting as f64);
    p.counter("mwmq_output_delayed_total", "Requests that waited for room in the output budget.", &[], out.delayed);
    p.counter(
        "mwmq_stalled_readers_closed_total",
        "Connections closed for leaving replies unread (reply_stall_ms) while requests waited for the output budget.",
        &[],
        net.stalled_readers,
    );
    p.counter(
        "mwmq_db_vacuums_total",
        "VACUUMs of the messages table run by this process (queues.vacuum_s).",
        &[],
        shared.vacuums.load(Ordering::Relaxed),
    );
    p.counter(
        "mwmq_stream_replies_refused_total",
        "XRANGE, XREVRANGE and XINFO STREAM FULL refused: their entries would pass max_reply_bytes (or 10,000).",
        &[],
        shared.stream_replies.refused.load(Ordering::Relaxed),
    );
    p.counter(
        "mwmq_stream_replies_cut_total",
        "XREAD, XREADGROUP, XCLAIM and XAUTOCLAIM replies cut short by max_reply_bytes.",
        &[],
        shared.stream_replies.cut.load(Ordering::Relaxed),
    );
    p.counter(
        "mwmq_db_statements_cut_total",
        "Connections cut because the database did not answer a statement in time.",
        &[],
        shared.pool.cut(),
    );
    p.counter(
        "mwmq_tls_handshake_failures_total",
        "Client connections whose TLS handshake failed.",
        &[],
        net.tls_handshake_failures,
    );
    p.counter("mwmq_auth_failures_total", "Failed logins.", &[], shared.users.failures.load(Ordering::Relaxed));
    p.counter(
        "mwmq_auth_throttled_total",
        "Logins refused unchecked (their address or user name failed too often).",
        &[],
        shared.logins.throttle.refused.load(Ordering::Relaxed),
    );
    p.counter(
        "mwmq_auth_repeated_total",
        "Logins refused as wrong unchecked (the same password failed from the same address lately).",
        &[],
        shared.logins.throttle.repeated.load(Ordering::Relaxed),
    );
    for (name, help, value) in [
        ("mwmq_handshake_timeouts_total", "Connections closed for not finishing TLS in time.", net.handshake_timeouts),
        ("mwmq_handshake_refused_total", "Connections closed: too many others handshaking.", net.handshake_refused),
        ("mwmq_login_timeouts_total", "Connections closed for not logging in in time.", net.login_timeouts),
    ] {
        p.counter(name, help, &[], value);
    }
    let paused = shared.paused.names();
    p.gauge(
        "mwmq_queues_paused",
        "Queues paused (QPAUSE) now, as last read from the databases.",
        &[],
        paused.len() as f64,
    );
    for name in paused.iter().filter(|n| named(shared, n, token)).take(shared.config.queues.metrics_max_queues) {
        p.gauge("mwmq_queue_paused", "1 while the queue is paused.", &[("queue", name.as_str())], 1.0);
    }
    for (queue, fields) in queue_series(shared, token) {
        for (field, value) in fields {
            let help = format!("Messages {} this queue since start.", field.replace('_', " "));
            p.counter(&format!("mwmq_queue_{field}_total"), &help, &[("queue", queue.as_str())], value);
        }
    }
    p.render()
}

/// Whether /metrics names `queue`: `[queues] metrics_queues` names it, and
/// it is public (`public_queues`) or the request carries the admin token.
fn named(shared: &Shared, queue: &str, token: bool) -> bool {
    let q = &shared.config.queues;
    let any = |patterns: &[String]| patterns.iter().any(|p| crate::users::matches(p, queue));
    any(&q.metrics_queues) && (token || any(&q.public_queues))
}

/// The per-queue series /metrics shows: the queues it names ([`named`]),
/// in name order, at most `metrics_max_queues` of them; the rest added up as
/// `_other` (so /metrics neither names every queue nor grows without
/// bound, nor names a queue to someone `/ui` would hide it from).
fn queue_series(shared: &Shared, token: bool) -> Vec<(String, Vec<(&'static str, u64)>)> {
    let q = &shared.config.queues;
    let mut all = shared.queues.all();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let mut shown = Vec::new();
    let mut other: Vec<(&'static str, u64)> = Vec::new();
    for (queue, counts) in all {
        if named(shared, &queue, token) && shown.len() < q.metrics_max_queues {
            shown.push((queue, counts.fields().to_vec()));
        } else {
            let fields = counts.fields();
            if other.is_empty() {
                other = fields.iter().map(|(k, _)| (*k, 0)).collect();
            }
            for (o, (_, v)) in other.iter_mut().zip(fields) {
                o.1 += v;
            }
        }
    }
    if !other.is_empty() {
        shown.push(("_other".to_string(), other));
    }
    shown
}
