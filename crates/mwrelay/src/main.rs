//! `mwrelay`: a TCP relay that holds every chunk of data back for a fixed
//! one-way delay (with optional jitter) in each direction — link delay for
//! the lab's emulated hosts on kernels without the netem qdisc.
//!
//! Each accepted connection gets an upstream connection and, per direction,
//! one thread that stamps each chunk as it arrives, keeps it, and sends it
//! when its time has come, waiting in ppoll (nanoseconds, with the thread's
//! timer slack at its minimum; a socket's receive timeout counts in
//! scheduler ticks, an async runtime's timer wheel
//! rounds to a millisecond, and a second thread per direction cost a wake-up
//! more on every chunk). Jitter is uniform in ±jitter, and a chunk never overtakes
//! the one before it (TCP carries a byte stream; netem reorders packets,
//! which TCP puts back in order at the cost of the same wait). End of stream
//! is passed on after the data before it; an error on either side closes
//! both.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;

/// A TCP relay that delays what it forwards.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on, host:port
    #[arg(long)]
    listen: String,
    /// Address to forward to, host:port
    #[arg(long)]
    upstream: String,
    /// One-way delay in each direction: a number and us, ms or s (e.g. 2ms)
    #[arg(long, value_parser = parse_time)]
    delay: Duration,
    /// Jitter: each chunk's delay is uniform in delay ± jitter (never below 0)
    #[arg(long, value_parser = parse_time, default_value = "0us")]
    jitter: Duration,
}

fn parse_time(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!("a time is a number and us, ms or s, such as 2ms; not {text:?}"));
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("a time is a number and us, ms or s; not {text:?}"))?;
    if !(0.0..=60.0).contains(&(v * scale)) {
        return Err(format!("{text}: between 0 and 60 s"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// How long before a chunk is due its thread stops sleeping and spins (the
/// price: up to this much CPU per chunk; on two busy cores a 150 µs margin
/// still let a 4 ms round trip come out 4.4 ms in one run of three).
const SPIN: Duration = Duration::from_micros(400);

/// A small generator for the jitter (xorshift64*): no cryptography needed.
struct Jitter {
    state: u64,
    span: Duration,
}

impl Jitter {
    fn new(span: Duration, seed: u64) -> Jitter {
        Jitter { state: seed | 1, span }
    }

    /// A uniform offset in ±span, as (positive, amount).
    fn next(&mut self) -> (bool, Duration) {
        if self.span.is_zero() {
            return (true, Duration::ZERO);
        }
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let x = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let unit = (x >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        let off = (unit * 2.0 - 1.0) * self.span.as_secs_f64();
        (off >= 0.0, Duration::from_secs_f64(off.abs()))
    }
}

/// Data from `from` to `to`, each chunk `delay` (± jitter) after it arrived.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration, jitter: Duration, seed: u64) {
    let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
    let mut jitter = Jitter::new(jitter, seed);
    let mut held: std::collections::VecDeque<(Instant, Vec<u8>)> = std::collections::VecDeque::new();
    let mut last = Instant::now();
    let mut open = true;
    let mut buf = vec![0u8; 64 * 1024];
    while open || !held.is_empty() {
        // Send what is due.
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, data) = held.pop_front().expect("checked");
            if to.write_all(&data).is_err() {
                let _ = from.shutdown(Shutdown::Both);
                return;
            }
        }
        // Sleep until shortly before the next chunk is due, then spin: a
        // wake-up from a timer costs tens to hundreds of microseconds on a
        // busy virtual machine, which would add to every delay.
        let next = held.front().map(|(due, _)| *due);
        if let Some(due) = next {
            if due.saturating_duration_since(Instant::now()) <= SPIN {
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
                continue;
            }
        }
        let wait = next.map(|due| due.saturating_duration_since(Instant::now()).saturating_sub(SPIN));
        if !open {
            if let Some(w) = wait {
                thread::sleep(w);
            }
            continue;
        }
        // Wait for data until the next chunk is due (or without limit when
        // none is held): ppoll, to the nanosecond (a socket's receive
        // timeout counts in scheduler ticks).
        if let Some(w) = wait {
            let t = rustix::event::Timespec { tv_sec: w.as_secs() as i64, tv_nsec: w.subsec_nanos() as _ };
            let mut fds = [rustix::event::PollFd::new(&from, rustix::event::PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&t)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
        }
        match from.read(&mut buf) {
            Ok(0) => open = false,
            Ok(n) => {
                let arrived = Instant::now();
                let (later, off) = jitter.next();
                let due =
                    if later { arrived + delay + off } else { (arrived + delay).checked_sub(off).unwrap_or(arrived) };
                // Never overtake the chunk before.
                let due = due.max(last);
                last = due;
                held.push_back((due, buf[..n].to_vec()));
            }
            // (A blocking socket without a timeout: only a signal interrupts a read.)
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => open = false,
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn serve(client: TcpStream, args: &Args, seed: u64) -> Result<()> {
    let upstream = TcpStream::connect(&args.upstream).with_context(|| format!("connecting to {}", args.upstream))?;
    for s in [&client, &upstream] {
        s.set_nodelay(true)?;
    }
    let (c2, u2) = (client.try_clone()?, upstream.try_clone()?);
    let (delay, jitter) = (args.delay, args.jitter);
    thread::spawn(move || pump(client, upstream, delay, jitter, seed));
    thread::spawn(move || pump(u2, c2, delay, jitter, seed.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15));
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.jitter > args.delay {
        bail!("the jitter ({:?}) cannot exceed the delay ({:?})", args.jitter, args.delay);
    }
    let listener = TcpListener::bind(&args.listen).with_context(|| format!("listening on {}", args.listen))?;
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        if let Err(e) = serve(conn, &args, seed) {
            eprintln!("mwrelay: {e:#}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_jitter() {
        assert_eq!(parse_time("2ms").unwrap(), Duration::from_millis(2));
        assert_eq!(parse_time("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_time("0.5s").unwrap(), Duration::from_millis(500));
        assert!(parse_time("2").is_err() && parse_time("-1ms").is_err() && parse_time("2 weeks").is_err());
        let mut j = Jitter::new(Duration::from_micros(500), 7);
        for _ in 0..1000 {
            let (_, off) = j.next();
            assert!(off <= Duration::from_micros(500));
        }
        let mut none = Jitter::new(Duration::ZERO, 7);
        assert_eq!(none.next(), (true, Duration::ZERO));
    }
}
