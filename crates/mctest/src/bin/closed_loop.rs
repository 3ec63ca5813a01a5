//! `closed_loop`: a small closed-loop memcached load for benchmarks.
//!
//! Each connection keeps exactly one request outstanding (set or get, in the
//! given set:get ratio, on uniformly drawn keys); a few threads drive many
//! connections with an event loop so the client costs little CPU next to the
//! system it measures. Prints one line of JSON: ops/s, mean and percentiles
//! of the response time in microseconds, errors and misses.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use hdrhistogram::Histogram;
use mcproto::{parse_response, ReadBuf, Response};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

/// Closed-loop memcached load (one outstanding request per connection).
#[derive(Parser, Debug, Clone)]
struct Args {
    /// Server or proxy address.
    #[arg(long, default_value = "127.0.0.1:11211")]
    target: SocketAddr,
    /// Connections in total.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Client threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Sets per `gets` gets, as memtier writes it: 1:10.
    #[arg(long, default_value = "1:10")]
    ratio: String,
    /// Distinct keys (`key:0` ... `key:N-1`).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 128)]
    value_size: usize,
    /// Seconds to measure.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds to run before measuring.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Only write every key once, then exit.
    #[arg(long)]
    prefill: bool,
}

struct Conn {
    stream: TcpStream,
    buf: ReadBuf,
    sent_at: Instant,
    n: u64,
}

struct Totals {
    ops: u64,
    errors: u64,
    misses: u64,
    hist: Histogram<u64>,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn request(out: &mut Vec<u8>, args: &Args, sets: u64, period: u64, rng: &mut u64, value: &[u8]) {
    out.clear();
    let key = xorshift(rng) % args.keys;
    if xorshift(rng) % period < sets {
        out.extend_from_slice(format!("set key:{key} 0 0 {}\r\n", value.len()).as_bytes());
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(format!("get key:{key}\r\n").as_bytes());
    }
}

fn run_thread(args: Args, conns: usize, seed: u64, start: Instant) -> Result<Totals> {
    let (sets, gets) = args.ratio.split_once(':').context("ratio must look like 1:10")?;
    let (sets, gets): (u64, u64) = (sets.parse()?, gets.parse()?);
    let period = sets + gets;
    if period == 0 {
        bail!("ratio 0:0 sends nothing");
    }
    let value = vec![b'v'; args.value_size];
    let mut poll = Poll::new()?;
    let mut list = Vec::new();
    let mut rng = seed | 1;
    let mut out = Vec::new();
    for i in 0..conns {
        let std = std::net::TcpStream::connect(args.target).with_context(|| format!("connect to {}", args.target))?;
        std.set_nodelay(true)?;
        std.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(std);
        poll.registry().register(&mut stream, Token(i), Interest::READABLE)?;
        request(&mut out, &args, sets, period, &mut rng, &value);
        stream.write_all(&out)?;
        list.push(Conn { stream, buf: ReadBuf::with_capacity(16 * 1024), sent_at: Instant::now(), n: 0 });
    }
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.seconds);
    let mut t = Totals { ops: 0, errors: 0, misses: 0, hist: Histogram::new_with_bounds(1, 60_000_000, 3)? };
    let mut events = Events::with_capacity(1024);
    while Instant::now() < end {
        poll.poll(&mut events, Some(Duration::from_millis(100)))?;
        for ev in events.iter() {
            let c = &mut list[ev.token().0];
            loop {
                match c.stream.read(c.buf.spare(4096)) {
                    Ok(0) => bail!("connection closed by {}", args.target),
                    Ok(n) => c.buf.commit(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.into()),
                }
            }
            while let Some((resp, used)) = parse_response(c.buf.filled())? {
                let now = Instant::now();
                if now >= measure_from && now < end {
                    t.ops += 1;
                    let us = now.duration_since(c.sent_at).as_micros() as u64;
                    t.hist.record(us.max(1))?;
                    match resp {
                        Response::Values(v) if v.is_empty() => t.misses += 1,
                        r if r.is_error() => t.errors += 1,
                        _ => {}
                    }
                }
                c.buf.consume(used);
                c.n += 1;
                request(&mut out, &args, sets, period, &mut rng, &value);
                c.sent_at = Instant::now();
                c.stream.write_all(&out)?;
            }
        }
    }
    Ok(t)
}

fn prefill(args: &Args) -> Result<()> {
    let mut s = std::net::TcpStream::connect(args.target)?;
    let value = vec![b'v'; args.value_size];
    let mut batch = Vec::new();
    let mut buf = ReadBuf::with_capacity(64 * 1024);
    let mut key = 0;
    while key < args.keys {
        batch.clear();
        let end = (key + 100).min(args.keys);
        for k in key..end {
            batch.extend_from_slice(format!("set key:{k} 0 0 {} noreply\r\n", value.len()).as_bytes());
            batch.extend_from_slice(&value);
            batch.extend_from_slice(b"\r\n");
        }
        batch.extend_from_slice(b"get key:0\r\n");
        s.write_all(&batch)?;
        loop {
            if let Some((_, used)) = parse_response(buf.filled())? {
                buf.consume(used);
                break;
            }
            let n = s.read(buf.spare(4096))?;
            if n == 0 {
                bail!("closed during prefill");
            }
            buf.commit(n);
        }
        key = end;
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.prefill {
        return prefill(&args);
    }
    let start = Instant::now();
    let threads: Vec<_> = (0..args.threads)
        .map(|i| {
            let a = args.clone();
            let conns = args.connections / args.threads + usize::from(i < args.connections % args.threads);
            std::thread::spawn(move || run_thread(a, conns, 0x243f6a8885a308d3 ^ ((i as u64 + 1) * 0x9e3779b9), start))
        })
        .collect();
    let mut total = Totals { ops: 0, errors: 0, misses: 0, hist: Histogram::new_with_bounds(1, 60_000_000, 3)? };
    for t in threads {
        let r = t.join().expect("client thread")?;
        total.ops += r.ops;
        total.errors += r.errors;
        total.misses += r.misses;
        total.hist.add(&r.hist)?;
    }
    let h = &total.hist;
    println!(
        "{{\"ops_per_sec\": {:.1}, \"mean_us\": {:.1}, \"p50_us\": {}, \"p99_us\": {}, \"max_us\": {}, \"errors\": {}, \"misses\": {}}}",
        total.ops as f64 / args.seconds,
        h.mean(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max(),
        total.errors,
        total.misses
    );
    Ok(())
}
