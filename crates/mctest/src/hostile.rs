//! Hostile clients for the tests of both middlewares: client sockets bound to
//! chosen loopback addresses (so one test can come from many sources), a
//! flood of sockets that say nothing or trickle at an HTTP endpoint, a flood
//! of clients that ask it again and again ([`Askers`]), and a probe that
//! asks it every 100 ms, as a liveness probe would.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A TCP connection to `to` from `from` (any address of 127.0.0.0/8 on
/// Linux), so that a test can play many source addresses.
pub fn connect_from(from: Ipv4Addr, to: SocketAddr) -> io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
    rustix::net::bind(&fd, &SocketAddr::V4(SocketAddrV4::new(from, 0)))?;
    rustix::net::connect(&fd, &to)?;
    Ok(TcpStream::from(fd))
}

/// `127.0.0.<n>` for the `i`-th of many sources (2 to 251, then again).
pub fn loopback(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 2 + (i % 250) as u8)
}

/// The status of `GET path` at an HTTP endpoint, or why there is none
/// (within `within`: a probe's timeout).
pub fn http_status(addr: SocketAddr, path: &str, within: Duration) -> Result<u16, String> {
    let mut s = TcpStream::connect_timeout(&addr, within).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(within)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(within)).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n").map_err(|e| format!("send: {e}"))?;
    let mut text = Vec::new();
    s.read_to_end(&mut text).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&text);
    text.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("no status in {text:?}"))
}

/// What a [`Flood`] sends.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Connects and says nothing.
    Idle,
    /// Sends a request head a byte every half second, never finishing it.
    Trickling,
}

/// Sockets held open at an endpoint by a thread of their own, each closed
/// and opened again every `reopen`, until dropped.
pub struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<usize>>,
}

impl Flood {
    /// `n` sockets of `kind` at `addr`, from 127.0.0.1 or, with `sources`,
    /// spread over that many loopback addresses ([`loopback`]).
    pub fn start(addr: SocketAddr, n: usize, kind: Kind, sources: Option<usize>, reopen: Duration) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let open = move |i: usize| -> Option<TcpStream> {
            let s = match sources {
                Some(k) => connect_from(loopback(i % k), addr).ok()?,
                None => TcpStream::connect(addr).ok()?,
            };
            s.set_nonblocking(true).ok()?;
            Some(s)
        };
        let thread = std::thread::spawn(move || {
            let mut opened = 0;
            let mut socks: Vec<(Option<TcpStream>, Instant)> = Vec::new();
            for i in 0..n {
                socks.push((open(i), Instant::now()));
                opened += 1;
            }
            let mut step = 0usize;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(500));
                step += 1;
                for (i, (s, at)) in socks.iter_mut().enumerate() {
                    if at.elapsed() >= reopen {
                        *s = open(i);
                        *at = Instant::now();
                        opened += 1;
                    }
                    if let (Kind::Trickling, Some(sock)) = (kind, s.as_mut()) {
                        let head = b"GET /healthz HTTP/1.1\r\nX-Slow: ";
                        let byte = if step < head.len() { head[step] } else { b'a' };
                        let _ = sock.write(&[byte]);
                    }
                }
            }
            opened
        });
        Flood { stop, thread: Some(thread) }
    }

    /// Stops it: how many sockets it opened in all.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Asks each of `paths` at `addr` every 100 ms for `during` (each answer
/// awaited up to 10 s: a slow machine must not fail the test, only a
/// refusal); the answers that were not `200`, as `(path, status or
/// error)`, and how many were asked.
pub fn probe(addr: SocketAddr, paths: &[&str], during: Duration) -> (Vec<(String, String)>, usize) {
    let t0 = Instant::now();
    let mut failed = Vec::new();
    let mut asked = 0;
    while t0.elapsed() < during {
        for path in paths {
            asked += 1;
            match http_status(addr, path, Duration::from_secs(10)) {
                Ok(200) => {}
                Ok(status) => failed.push((path.to_string(), status.to_string())),
                Err(e) => failed.push((path.to_string(), e)),
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (failed, asked)
}

/// [`probe`] of one path, timed: the answers that were not `200`, and how
/// long each answer took (for a report; a test asserts no time).
pub fn probe_timed(addr: SocketAddr, path: &str, during: Duration) -> (Vec<(String, String)>, Vec<Duration>) {
    let t0 = Instant::now();
    let (mut failed, mut took) = (Vec::new(), Vec::new());
    while t0.elapsed() < during {
        let asked = Instant::now();
        match http_status(addr, path, Duration::from_secs(10)) {
            Ok(200) => {}
            Ok(status) => failed.push((path.to_string(), status.to_string())),
            Err(e) => failed.push((path.to_string(), e)),
        }
        took.push(asked.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    (failed, took)
}

/// Clients that ask `GET path` again and again, each request on a fresh
/// connection as soon as the last one's answer came but at most once per
/// `every`, `per_source` of them from each of `sources` loopback addresses
/// ([`loopback`]), until stopped: a flood of probes that all stay within an
/// endpoint's per-source caps. (A slow endpoint has every client waiting on
/// it at once; a fast one is not asked faster than `every` allows, so that
/// hundreds of clients do not take the test machine's every core and starve
/// the server they attack.)
pub struct Askers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<u16>>>,
}

impl Askers {
    /// Starts them at `addr`.
    pub fn start(addr: SocketAddr, path: &'static str, sources: usize, per_source: usize, every: Duration) -> Askers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..sources * per_source)
            .map(|i| {
                let flag = stop.clone();
                let from = loopback(i % sources);
                std::thread::Builder::new()
                    .stack_size(128 * 1024)
                    .spawn(move || {
                        let mut statuses = Vec::new();
                        while !flag.load(Ordering::Relaxed) {
                            let asked = Instant::now();
                            statuses.push(ask_from(from, addr, path).unwrap_or(0));
                            std::thread::sleep(every.saturating_sub(asked.elapsed()));
                        }
                        statuses
                    })
                    .expect("a thread")
            })
            .collect();
        Askers { stop, threads }
    }

    /// Stops them: every answer's status (0: none came).
    pub fn stop(self) -> Vec<u16> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect()
    }
}

/// `GET path` from `from`: the answer's status.
fn ask_from(from: Ipv4Addr, addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = connect_from(from, addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: flood\r\n\r\n").ok()?;
    let mut text = Vec::new();
    s.read_to_end(&mut text).ok()?;
    String::from_utf8_lossy(&text).split(' ').nth(1)?.parse().ok()
}
