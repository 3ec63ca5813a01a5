//! One run: prefill, start the load threads at a common instant, close a
//! window at every wall-clock boundary (results files, progress line), then
//! the final table and the exit status.
//!
//! Phases: with `--warmup W`, measurement starts at the first window boundary at
//! least W seconds after the start, so every window lies in one phase
//! (`warmup`, `measure`, `cooldown`, marked in the window records). The final
//! table and summary.json cover the `measure` windows only.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context, Result};
use mcproto::ring::{HashKind, Ring};
use mwstats::clock::{mono_of_unix_ms, unix_ms, unix_us};
use mwstats::record::{ClientRecord, FORMAT};
use mwstats::slots::{Accumulator, Slots};
use mwstats::window::{next_boundary, sleep_until};
use mwstats::writer::ResultsWriter;
use mwstats::{Metadata, MqOp, OpClass, OpKind, WindowRecord};

use crate::acc::{ClientAcc, Connections};
use crate::config::{Mode, RunConfig, Think};
use crate::engine::{prefill, run_thread, Shared};

/// What a run measured and how it ends.
pub struct Outcome {
    /// Everything measured in the `measure` phase.
    pub measured: ClientAcc,
    /// Length of the measure phase in seconds.
    pub seconds: f64,
    /// Connections lost and re-established.
    pub connections: Connections,
}

/// The phase schedule of a run, in wall-clock milliseconds.
struct Schedule {
    start: u64,
    measure_start: u64,
    measure_end: u64,
    end: u64,
}

impl Schedule {
    fn new(cfg: &RunConfig, start: u64) -> Schedule {
        let w = cfg.window_ms;
        let measure_start =
            if cfg.warmup > 0.0 { next_boundary(start + (cfg.warmup * 1000.0) as u64 - 1, w) } else { start };
        let measure_end = match cfg.test_time {
            Some(t) => {
                let e = measure_start + (t * 1000.0) as u64;
                if cfg.cooldown > 0.0 && !e.is_multiple_of(w) {
                    next_boundary(e, w)
                } else {
                    e
                }
            }
            None => u64::MAX,
        };
        let end = if measure_end == u64::MAX { u64::MAX } else { measure_end + (cfg.cooldown * 1000.0) as u64 };
        Schedule { start, measure_start, measure_end, end }
    }

    fn phase(&self, ws: u64, we: u64) -> &'static str {
        if we <= self.measure_start && self.measure_start > self.start {
            "warmup"
        } else if ws >= self.measure_end {
            "cooldown"
        } else {
            "measure"
        }
    }
}

fn client_record(cfg: &RunConfig, acc: &ClientAcc, phase: &str, conns: Connections) -> ClientRecord {
    let (mode, rate, think) = match cfg.mode {
        Mode::Open { rate, .. } => ("open", rate, 0.0),
        Mode::Closed { think: Think::None } => ("closed", 0.0, 0.0),
        Mode::Closed { .. } => ("closed", 0.0, acc.think_mean_us()),
    };
    let bytes: u64 = acc.all_bytes();
    ClientRecord {
        phase: phase.into(),
        mode: mode.into(),
        threads: cfg.threads as u64,
        connections: (cfg.threads * cfg.connections) as u64,
        virtual_clients: cfg.virtual_clients as u64,
        think_time_us: think,
        target_rate: rate,
        late_sends: acc.late,
        bytes,
        verify_failures: acc.verify_failures,
        connections_lost: conns.lost,
        reconnects: conns.reconnected,
        unsent: acc.unsent,
        send_late_us: (acc.send_late.count() > 0).then(|| acc.send_late.summary()),
        send_gap_us: (acc.send_gap.count() > 0).then(|| acc.send_gap.summary()),
    }
}

fn record(
    cfg: &RunConfig,
    acc: &ClientAcc,
    window: Option<u64>,
    ws: u64,
    dur: u64,
    phase: &str,
    conns: Connections,
) -> WindowRecord {
    WindowRecord {
        format: FORMAT.into(),
        source: "mwload".into(),
        instance: cfg.instance.clone(),
        window,
        start_unix_ms: ws,
        duration_ms: dur,
        collected_late_us: None,
        ops: acc.records(cfg.mq.is_some()),
        middleware: None,
        client: Some(client_record(cfg, acc, phase, conns)),
        metadata: None,
    }
}

fn progress(elapsed_s: f64, phase: &str, acc: &ClientAcc, dur_ms: u64) {
    let all = acc.all();
    let rate = all.count as f64 * 1000.0 / dur_ms.max(1) as f64;
    let mut e = std::io::stderr();
    let _ = write!(
        e,
        "\r\x1b[2K[{elapsed_s:>6.1}s] {phase:<8} {rate:>10.0} ops/s   mean {:>8.1} us   p99 {:>7} us   errors {}",
        all.response.mean(),
        all.response.quantile(0.99),
        all.errors
    );
    let _ = e.flush();
}

/// Runs the load as configured.
pub fn run(cfg: RunConfig) -> Result<Outcome> {
    let addrs = cfg.resolve()?;
    let ring = (addrs.len() > 1).then(|| Ring::new(HashKind::Ketama, &cfg.servers));
    let threads = cfg.threads;
    let mut shared = Shared {
        addrs,
        ring,
        slots: Slots::new((0..threads).map(|_| ClientAcc::default()).collect()),
        start_ns: 0,
        end_ns: u64::MAX,
        stop: AtomicBool::new(false),
        finished: AtomicU64::new(0),
        lost: AtomicU64::new(0),
        reconnected: AtomicU64::new(0),
        cfg,
    };
    if shared.cfg.prefill {
        let shared_ref = &shared;
        let prefilled = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|i| s.spawn(move || prefill(shared_ref, i))).collect();
            hs.into_iter().map(|h| h.join().expect("prefill thread")).sum::<Result<u64>>()
        })
        .context("prefill")?;
        eprintln!("mwload: prefilled {prefilled} keys");
    }
    if let Some(mq) = &shared.cfg.mq {
        create_queues(shared.addrs[0], mq.queues, mq.receive == crate::config::Receive::Stream)
            .context("creating the queues")?;
    }
    let start = unix_ms() + 300;
    let sched = Schedule::new(&shared.cfg, start);
    shared.start_ns = mono_of_unix_ms(start);
    shared.end_ns = if sched.end == u64::MAX { u64::MAX } else { mono_of_unix_ms(sched.end) };
    let mut out = match &shared.cfg.out {
        Some(dir) => {
            Some(ResultsWriter::create(dir, false).with_context(|| format!("cannot write into {}", dir.display()))?)
        }
        None => None,
    };
    let shared = &shared;
    let cfg = &shared.cfg;
    let (measured, seconds) = std::thread::scope(|s| -> Result<(ClientAcc, f64)> {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                // Named, so that the lab can tell the load threads' CPU from the rest.
                std::thread::Builder::new()
                    .name(format!("load-{i}"))
                    .spawn_scoped(s, move || {
                        let r = run_thread(shared, i);
                        if r.is_err() {
                            shared.stop.store(true, Ordering::Relaxed);
                        }
                        shared.finished.fetch_add(1, Ordering::Relaxed);
                        r
                    })
                    .expect("start a load thread")
            })
            .collect();
        let mut spares: Vec<ClientAcc> = (0..threads).map(|_| ClientAcc::default()).collect();
        let mut window = ClientAcc::default();
        let mut measured = ClientAcc::default();
        let mut measured_ms = 0u64;
        let mut ws = start;
        let mut index = 0;
        loop {
            let boundary = next_boundary(ws, cfg.window_ms).min(sched.end);
            let all_done = || shared.finished.load(Ordering::Relaxed) == threads as u64;
            let stopped = sleep_until(boundary, all_done);
            let we = if stopped { unix_ms().clamp(ws, boundary) } else { boundary };
            let late_us = unix_us().saturating_sub(we * 1000);
            shared.slots.collect(&mut spares, &mut window);
            let phase = sched.phase(ws, we);
            let conns = shared.connections();
            if let Some(w) = out.as_mut() {
                let mut r = record(cfg, &window, Some(index), ws, we - ws, phase, conns);
                r.collected_late_us = Some(late_us);
                w.window(&r)?;
            }
            if cfg.progress {
                progress((we - start) as f64 / 1000.0, phase, &window, we - ws);
            }
            if phase == "measure" {
                measured.absorb(&mut window);
                measured_ms += we - ws;
            }
            window.clear();
            if stopped || we >= sched.end {
                break;
            }
            ws = we;
            index += 1;
        }
        shared.stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().expect("load thread")?;
        }
        if cfg.progress {
            eprintln!();
        }
        Ok((measured, measured_ms as f64 / 1000.0))
    })?;
    let connections = shared.connections();
    if let Some(w) = out.as_mut() {
        let mut r =
            record(cfg, &measured, None, sched.measure_start, (seconds * 1000.0) as u64, "measure", connections);
        let version = concat!("mwload-", env!("CARGO_PKG_VERSION"));
        r.metadata = Some(Metadata::of_run(version, cfg.to_json(), start, unix_ms()));
        w.summary(&r)?;
    }
    Ok(Outcome { measured, seconds, connections })
}

/// mq: creates queues q0 .. q{n-1} where missing (QCREATE; EXISTS is fine),
/// or streams with the consumer group `mwload` (XGROUP CREATE ... MKSTREAM).
fn create_queues(addr: std::net::SocketAddr, n: u32, streams: bool) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(3))
        .with_context(|| format!("cannot connect to {addr}"))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let mut w = &s;
    let mut r = BufReader::new(&s);
    for i in 0..n {
        let mut req = Vec::new();
        let q = format!("q{i}");
        if streams {
            crate::resp::push_request(&mut req, &[b"XGROUP", b"CREATE", q.as_bytes(), b"mwload", b"$", b"MKSTREAM"]);
        } else {
            crate::resp::push_request(&mut req, &[b"QCREATE", q.as_bytes()]);
        }
        w.write_all(&req)?;
        let mut line = String::new();
        r.read_line(&mut line)?;
        if !(line.starts_with("+OK") || line.starts_with("-EXISTS") || line.starts_with("-BUSYGROUP")) {
            anyhow::bail!("QCREATE q{i}: {}", line.trim_end());
        }
    }
    Ok(())
}

/// The memtier-style table of the measured phase.
pub fn table(o: &Outcome) -> String {
    let secs = o.seconds.max(1e-9);
    let mut t = format!(
        "{:<10}{:>12}{:>12}{:>12}{:>14}{:>13}{:>13}{:>15}{:>12}\n",
        "Type",
        "Ops/sec",
        "Hits/sec",
        "Misses/sec",
        "Avg. Latency",
        "p50 Latency",
        "p99 Latency",
        "p99.9 Latency",
        "KB/sec"
    );
    t.push_str(&"-".repeat(113));
    t.push('\n');
    let m = &o.measured;
    let rows = [
        ("Sets", Some((m.ops.get(OpKind::Set).clone(), m.bytes[OpKind::Set as usize]))),
        ("Gets", Some((m.ops.get(OpKind::Get).clone(), m.bytes[OpKind::Get as usize]))),
        ("Multigets", Some((m.ops.get(OpKind::Multiget).clone(), m.bytes[OpKind::Multiget as usize]))),
        ("Deletes", Some((m.ops.get(OpKind::Delete).clone(), m.bytes[OpKind::Delete as usize]))),
        ("Sends", Some((m.mq.get(MqOp::Send).clone(), m.mq_bytes[MqOp::Send.index()]))),
        ("Pops", Some((m.mq.get(MqOp::Pop).clone(), m.mq_bytes[MqOp::Pop.index()]))),
        ("Recvs", Some((m.mq.get(MqOp::Recv).clone(), m.mq_bytes[MqOp::Recv.index()]))),
        ("Acks", Some((m.mq.get(MqOp::Ack).clone(), m.mq_bytes[MqOp::Ack.index()]))),
        ("Totals", None),
    ];
    for (name, row) in rows {
        let total = row.is_none();
        let (acc, bytes) = row.unwrap_or_else(|| (m.all(), m.all_bytes()));
        if !total && acc.count == 0 {
            continue;
        }
        let ms = |us: f64| us / 1000.0;
        t.push_str(&format!(
            "{:<10}{:>12.2}{:>12.2}{:>12.2}{:>14.5}{:>13.5}{:>13.5}{:>15.5}{:>12.2}\n",
            name,
            acc.count as f64 / secs,
            acc.hits as f64 / secs,
            acc.misses as f64 / secs,
            ms(acc.response.mean()),
            ms(acc.response.quantile(0.5) as f64),
            ms(acc.response.quantile(0.99) as f64),
            ms(acc.response.quantile(0.999) as f64),
            bytes as f64 / 1024.0 / secs
        ));
    }
    t.push_str("(latencies in ms)\n");
    t
}
