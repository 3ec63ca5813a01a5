//! `mwsample`: the lab's sampler on a host reached over SSH. It samples the
//! process trees named by the pid files in `--dir` every `--interval-ms` into
//! `--out`/cpu.csv and `--out`/resources.csv (the columns of the lab's local
//! sampler) until `--dir`/mwsample.stop appears, then takes a last sample and
//! exits.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use mwload::sample::{host_ticks, net_bytes, pid_files, processes, sample_tree};

#[derive(Parser)]
#[command(version, about = "Samples the lab's processes on this host (CPU per process and thread, memory, network)")]
struct Args {
    /// The directory of the pid files (`NAME.pid`) of the processes to sample.
    #[arg(long)]
    dir: PathBuf,
    /// Where cpu.csv and resources.csv go.
    #[arg(long)]
    out: PathBuf,
    /// Milliseconds between samples.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    interval_ms: u64,
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

struct Sampler {
    dir: PathBuf,
    proc: PathBuf,
    tick_s: f64,
    page_mb: f64,
    cpu: BufWriter<File>,
    res: BufWriter<File>,
    last_ticks: HashMap<String, u64>,
    last_host: (u64, u64),
    last_net: (u64, u64),
    last_at: Instant,
    cores: f64,
}

impl Sampler {
    fn host(&self) -> ((u64, u64), (u64, u64)) {
        let host = fs::read_to_string(self.proc.join("stat")).ok().as_deref().and_then(host_ticks).unwrap_or_default();
        let net = fs::read_to_string(self.proc.join("net/dev")).map(|d| net_bytes(&d)).unwrap_or_default();
        (host, net)
    }

    /// One sample; `rates` false for the first (cumulative figures only).
    fn sample(&mut self, rates: bool) -> std::io::Result<()> {
        let stamp = now_ms();
        let dt = self.last_at.elapsed().as_secs_f64().max(1e-6);
        self.last_at = Instant::now();
        let all = processes(&self.proc);
        for (name, root) in pid_files(&self.dir, "mwsample") {
            let Some(s) = sample_tree(&self.proc, root, &all) else { continue };
            writeln!(self.cpu, "{stamp},{name},*,{:.3}", s.ticks as f64 * self.tick_s)?;
            for (class, ticks) in &s.classes {
                writeln!(self.cpu, "{stamp},{name},{class},{:.3}", *ticks as f64 * self.tick_s)?;
            }
            let prev = self.last_ticks.insert(name.clone(), s.ticks).unwrap_or(s.ticks);
            if rates {
                let pct = 100.0 * s.ticks.saturating_sub(prev) as f64 * self.tick_s / dt;
                writeln!(self.res, "{stamp},{name},{pct:.1},{:.1},,", s.rss_pages as f64 * self.page_mb)?;
            }
        }
        let (host, net) = self.host();
        writeln!(self.cpu, "{stamp},host,busy,{:.3}", host.0 as f64 * self.tick_s)?;
        if rates {
            let share =
                host.0.saturating_sub(self.last_host.0) as f64 / host.1.saturating_sub(self.last_host.1).max(1) as f64;
            writeln!(
                self.res,
                "{stamp},host,{:.1},,{:.3},{:.3}",
                100.0 * share * self.cores,
                net.0.saturating_sub(self.last_net.0) as f64 / dt / 1e6,
                net.1.saturating_sub(self.last_net.1) as f64 / dt / 1e6
            )?;
        }
        self.last_host = host;
        self.last_net = net;
        self.cpu.flush()?;
        self.res.flush()
    }
}

fn run(args: &Args) -> std::io::Result<()> {
    fs::create_dir_all(&args.out)?;
    let mut cpu = BufWriter::new(File::create(args.out.join("cpu.csv"))?);
    let mut res = BufWriter::new(File::create(args.out.join("resources.csv"))?);
    writeln!(cpu, "unix_ms,process,thread,cpu_s")?;
    writeln!(res, "unix_ms,name,cpu_percent,rss_mb,net_rx_mb_s,net_tx_mb_s")?;
    let cores = std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(1.0);
    let mut s = Sampler {
        dir: args.dir.clone(),
        proc: PathBuf::from("/proc"),
        tick_s: 1.0 / rustix::param::clock_ticks_per_second() as f64,
        page_mb: rustix::param::page_size() as f64 / 1e6,
        cpu,
        res,
        last_ticks: HashMap::new(),
        last_host: (0, 0),
        last_net: (0, 0),
        last_at: Instant::now(),
        cores,
    };
    (s.last_host, s.last_net) = s.host();
    s.sample(false)?;
    let stop = args.dir.join("mwsample.stop");
    let interval = Duration::from_millis(args.interval_ms);
    let mut next = Instant::now() + interval;
    loop {
        while Instant::now() < next {
            if stop_requested(&stop) {
                return s.sample(true);
            }
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
        }
        next += interval;
        s.sample(true)?;
    }
}

fn stop_requested(stop: &Path) -> bool {
    stop.exists()
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mwsample: {e}");
            ExitCode::FAILURE
        }
    }
}
