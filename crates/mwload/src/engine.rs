//! The load threads: each runs an event loop over its connections.
//!
//! A *client* is one connection to every target server (one socket when there
//! is one target); keys are placed on servers with the same ketama ring as
//! mwproxy, and a multi-get is split by server and complete when every part is.
//!
//! - Closed loop: each client carries `virtual_clients` virtual clients, each
//!   with one request outstanding at a time (several virtual clients on a
//!   connection pipeline, replies come back in order). After a reply a virtual
//!   client thinks (fixed or exponential time) and sends the next request.
//!   Response time runs from the send.
//! - Open loop: requests are due at Poisson (or fixed-interval) arrival times at
//!   the target rate, whatever the replies do, and are sent round-robin over the
//!   clients. Response time runs from the *intended* send time, so a stalled
//!   server shows up in the latencies instead of silently slowing the load (no
//!   coordinated omission); requests sent more than 1 ms after their time are
//!   counted as late.
//!
//! A connection that fails takes its client down: the requests in flight on it
//! count as errors. Without `--reconnect` that client's load stops; with it the
//! thread connects again after 50 ms, doubling the wait up to 1 s between
//! attempts, and gives up after 10 s of failures. A client that is back
//! resumes every virtual client it carries.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Result};
use mcproto::ring::Ring;
use mcproto::{parse_response, ReadBuf, Response};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use mwserve::tls::Session;
use mwstats::clock::now_ns;
use mwstats::slots::{SlotWriter, Slots};

use crate::acc::ClientAcc;
use crate::config::{Arrivals, Mode, Receive, RunConfig, Think};
use crate::resp;
use crate::rng::Rng;
use crate::secure::{Secure, Setup};
use crate::workload::{Command, Generator};

/// Requests later than this behind their intended time count as late.
pub const LATE_NS: u64 = 1_000_000;

/// Open loop: at most this many overdue arrivals are sent before the
/// thread reads what came back. A generator far behind its schedule (a
/// throttled or starved one) would otherwise spend all of its CPU sending
/// what is overdue and never read a reply.
const CATCH_UP: usize = 64;

/// First wait before reconnecting, and the longest wait between attempts.
const RETRY_FIRST_NS: u64 = 50_000_000;
const RETRY_MAX_NS: u64 = 1_000_000_000;
/// Reconnecting stops after failing for this long.
const RETRY_GIVE_UP_NS: u64 = 10_000_000_000;

/// State shared by the load threads and the reporter.
pub struct Shared {
    /// The run's configuration.
    pub cfg: RunConfig,
    /// Resolved target addresses.
    pub addrs: Vec<SocketAddr>,
    /// Key placement over several targets.
    pub ring: Option<Ring>,
    /// Per-thread measurements.
    pub slots: Slots<ClientAcc>,
    /// When load starts (ns, `mwstats::clock`).
    pub start_ns: u64,
    /// When load stops (ns), `u64::MAX` in request-count mode.
    pub end_ns: u64,
    /// Ask every thread to stop now.
    pub stop: AtomicBool,
    /// Threads that have finished.
    pub finished: AtomicU64,
    /// Connections lost during the run.
    pub lost: AtomicU64,
    /// Lost connections re-established (`--reconnect`).
    pub reconnected: AtomicU64,
}

impl Shared {
    /// Connections lost and re-established so far.
    pub fn connections(&self) -> crate::acc::Connections {
        crate::acc::Connections {
            lost: self.lost.load(Ordering::Relaxed),
            reconnected: self.reconnected.load(Ordering::Relaxed),
        }
    }
}

struct Sock {
    stream: TcpStream,
    /// Its TLS session (`--tls`).
    session: Option<Session>,
    rbuf: ReadBuf,
    wbuf: Vec<u8>,
    /// In-flight slots waiting for a reply on this socket, in send order.
    fifo: VecDeque<u32>,
}

struct InFlight {
    client: u32,
    /// Virtual client (closed loop) or `u32::MAX` (open loop).
    vc: u32,
    intended: u64,
    cmd: Command,
    parts: u16,
    hits: u32,
    error: bool,
    bytes: u64,
    /// mq: the message a RECV brought, to acknowledge next.
    lease: Option<(i64, i64)>,
}

struct Client {
    socks: Vec<Sock>,
    alive: bool,
    /// Requests still to send per virtual client (request-count mode).
    remaining: Vec<u64>,
    /// mq: the client's queue name.
    queue: Vec<u8>,
    /// mq: the name of the partner it sends to (`--pairs`).
    partner: Option<Vec<u8>>,
    /// mq: its own name (a stream consumer's name).
    name: Vec<u8>,
    /// mq: where each virtual client is in its cycle of `sets` SENDs then
    /// `gets` receives (the last entry: open-loop arrivals).
    cycle: Vec<u32>,
}

struct Thread<'a> {
    shared: &'a Shared,
    index: usize,
    rng: Rng,
    gen: Generator,
    clients: Vec<Client>,
    inflight: Vec<Option<InFlight>>,
    free: Vec<u32>,
    /// Virtual clients thinking: (due, client, vc, reply time).
    timers: BinaryHeap<Reverse<(u64, u32, u32, u64)>>,
    writer: SlotWriter<ClientAcc>,
    scratch: Vec<u8>,
    groups: Vec<Vec<u8>>,
    next_client: usize,
    active_vcs: usize,
    /// Lost clients waiting to reconnect (`--reconnect`); usually empty.
    retries: Vec<Retry>,
    /// When this thread last sent an open-loop request (ns; 0 before the first).
    last_send: u64,
}

/// A lost client waiting to reconnect, and when it tries again.
#[derive(Clone, Copy)]
struct Retry {
    client: usize,
    due: u64,
    wait: u64,
    since: u64,
}

/// Connects to `addr` (TLS and login first when the run asks for them) and
/// names the connection with `hello` (mq) before the load starts.
fn connect(
    addr: SocketAddr,
    timeout: Duration,
    hello: Option<&[u8]>,
    secure: &Secure,
) -> Result<(TcpStream, Option<Session>)> {
    let mut setup = Setup::open(addr, timeout, secure)?;
    if let Some(hello) = hello {
        // mq: name the connection (CLIENT SETNAME) before the load starts.
        let got = setup.call_line(hello)?;
        if !got.starts_with(b"+") {
            bail!("{addr} refused the client's name: {}", String::from_utf8_lossy(&got).trim_end());
        }
    }
    setup.stream.set_nonblocking(true)?;
    Ok((TcpStream::from_std(setup.stream), setup.session))
}

/// mq: the request that names client `g`.
fn hello_of(cfg: &RunConfig, g: usize) -> Option<Vec<u8>> {
    let mq = cfg.mq.as_ref()?;
    let mut out = Vec::new();
    resp::push_request(&mut out, &[b"CLIENT", b"SETNAME", mq.name_of(g).as_bytes()]);
    Some(out)
}

/// Bytes of `noreply` sets sent to a server before prefill waits for it.
const PREFILL_BATCH_BYTES: usize = 8 * 1024;

/// Token of a thread's timer.
const TIMER: Token = Token(usize::MAX);

/// A timerfd in the thread's poll: epoll's own timeout has a resolution of a
/// millisecond, the timer wakes it at the nanosecond asked for.
struct Timer {
    fd: std::os::fd::OwnedFd,
    /// The moment it is armed for (`now_ns` clock), to skip re-arming it.
    armed: std::cell::Cell<u64>,
}

impl Timer {
    fn new(poll: &Poll) -> Result<Timer> {
        use rustix::time::{timerfd_create, TimerfdClockId, TimerfdFlags};
        use std::os::fd::AsRawFd;
        let fd = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?;
        poll.registry().register(&mut mio::unix::SourceFd(&fd.as_raw_fd()), TIMER, Interest::READABLE)?;
        Ok(Timer { fd, armed: std::cell::Cell::new(0) })
    }

    /// Fires once at `at`, which is `ns` from now (at least 1 ns: 0 would disarm it).
    fn arm_at(&self, at: u64, ns: u64) -> Result<()> {
        if self.armed.get() == at {
            return Ok(());
        }
        self.armed.set(at);
        use rustix::time::{timerfd_settime, Itimerspec, TimerfdTimerFlags, Timespec};
        let ns = ns.max(1);
        let value = Timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 };
        let spec = Itimerspec { it_interval: Timespec { tv_sec: 0, tv_nsec: 0 }, it_value: value };
        timerfd_settime(&self.fd, TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }

    /// Reads the expiration count so the timer can fire again.
    fn clear(&self) {
        self.armed.set(0);
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut buf);
    }
}

/// Connects client `c` to every target and registers its sockets.
fn open_socks(
    poll: &Poll,
    addrs: &[SocketAddr],
    c: usize,
    timeout: Duration,
    hello: Option<&[u8]>,
    secure: &Secure,
) -> Result<Vec<Sock>> {
    let mut socks = Vec::with_capacity(addrs.len());
    for (s, addr) in addrs.iter().enumerate() {
        let (mut stream, session) = connect(*addr, timeout, hello, secure)?;
        poll.registry().register(&mut stream, Token(c * addrs.len() + s), Interest::READABLE | Interest::WRITABLE)?;
        let rbuf = ReadBuf::with_capacity(16 * 1024);
        socks.push(Sock { stream, session, rbuf, wbuf: Vec::new(), fifo: VecDeque::new() });
    }
    Ok(socks)
}

/// Runs load thread `index` until the end of the run.
pub fn run_thread(shared: &Shared, index: usize) -> Result<()> {
    let cfg = &shared.cfg;
    let mut poll = Poll::new()?;
    let n_servers = shared.addrs.len();
    let mut clients = Vec::with_capacity(cfg.connections);
    for c in 0..cfg.connections {
        let g = index * cfg.connections + c;
        let hello = hello_of(cfg, g);
        let socks = open_socks(&poll, &shared.addrs, c, Duration::from_secs(3), hello.as_deref(), &cfg.secure)?;
        let remaining = vec![cfg.requests.unwrap_or(u64::MAX); cfg.virtual_clients];
        let (queue, partner, name) = match &cfg.mq {
            Some(mq) => (
                format!("q{}", mq.queue_of(g)).into_bytes(),
                mq.pairs.then(|| mq.name_of(g ^ 1).into_bytes()),
                mq.name_of(g).into_bytes(),
            ),
            None => (Vec::new(), None, Vec::new()),
        };
        let cycle = vec![0; cfg.virtual_clients + 1];
        clients.push(Client { socks, alive: true, remaining, queue, partner, name, cycle });
    }
    let threads = cfg.threads as u64;
    let mut t = Thread {
        shared,
        index,
        rng: Rng::new(cfg.seed, index as u64 + 1),
        gen: Generator::new(cfg.workload.clone(), index as u64, threads),
        clients,
        inflight: Vec::new(),
        free: Vec::new(),
        timers: BinaryHeap::new(),
        writer: SlotWriter::new(index, ClientAcc::default()),
        scratch: Vec::with_capacity(256),
        groups: vec![Vec::new(); n_servers],
        next_client: 0,
        active_vcs: 0,
        retries: Vec::new(),
        last_send: 0,
    };
    t.run(&mut poll)
}

impl Thread<'_> {
    fn run(&mut self, poll: &mut Poll) -> Result<()> {
        let cfg = &self.shared.cfg;
        let start = self.shared.start_ns;
        while now_ns() < start {
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut next_arrival = match cfg.mode {
            Mode::Open { .. } => start + self.interarrival(),
            Mode::Closed { .. } => u64::MAX,
        };
        for c in 0..self.clients.len() {
            self.start_virtual_clients(c);
        }
        let mut events = Events::with_capacity(1024);
        let timer = Timer::new(poll)?;
        loop {
            let now = now_ns();
            if now >= self.shared.end_ns || self.shared.stop.load(Ordering::Relaxed) {
                break;
            }
            if !self.retries.is_empty() {
                self.reconnect_due(poll, now);
            }
            let retry_due = self.retries.iter().map(|r| r.due).min();
            if matches!(cfg.mode, Mode::Closed { .. }) && self.active_vcs == 0 && retry_due.is_none() {
                break;
            }
            let mut sent = 0;
            while next_arrival <= now && sent < CATCH_UP {
                match self.pick_client() {
                    Some(c) => self.issue(c, u32::MAX, next_arrival),
                    None => self.writer.record(&self.shared.slots, ClientAcc::record_unsent),
                }
                next_arrival += self.interarrival();
                sent += 1;
            }
            while let Some(&Reverse((due, c, vc, replied))) = self.timers.peek() {
                if due > now {
                    break;
                }
                self.timers.pop();
                let sent = now_ns();
                self.writer.record(&self.shared.slots, |a| a.record_think(sent - replied));
                self.issue(c, vc, sent);
            }
            let wake = next_arrival
                .min(self.timers.peek().map(|r| r.0 .0).unwrap_or(u64::MAX))
                .min(retry_due.unwrap_or(u64::MAX))
                .min(self.shared.end_ns);
            // epoll waits in whole milliseconds, rounded up: a timer armed for
            // the exact moment wakes it in time, so arrivals and think times
            // are kept to within microseconds without spinning.
            let left = wake.saturating_sub(now_ns());
            if left < 50_000_000 {
                timer.arm_at(wake, left)?;
            }
            let timeout = Duration::from_millis(50);
            // About to wait anyway: a record spilled while the stats thread held
            // the slot joins it now, in the window it belongs to.
            self.writer.settle(&self.shared.slots);
            poll.poll(&mut events, Some(timeout))?;
            for ev in events.iter() {
                if ev.token() == TIMER {
                    timer.clear();
                    continue;
                }
                let n = self.shared.addrs.len();
                let (c, s) = (ev.token().0 / n, ev.token().0 % n);
                if ev.is_writable() {
                    self.flush(c, s);
                }
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    self.read(c, s, ev.is_read_closed() || ev.is_error());
                }
            }
        }
        self.writer.settle(&self.shared.slots);
        Ok(())
    }

    fn interarrival(&mut self) -> u64 {
        match self.shared.cfg.mode {
            Mode::Open { rate, arrivals } => {
                let per_thread = rate / self.shared.cfg.threads as f64;
                let mean_ns = 1e9 / per_thread;
                match arrivals {
                    Arrivals::Poisson => self.rng.exponential(mean_ns).max(1.0) as u64,
                    Arrivals::Fixed => mean_ns.max(1.0) as u64,
                }
            }
            Mode::Closed { .. } => u64::MAX,
        }
    }

    fn pick_client(&mut self) -> Option<u32> {
        for _ in 0..self.clients.len() {
            let c = self.next_client;
            self.next_client = (self.next_client + 1) % self.clients.len();
            if self.clients[c].alive {
                return Some(c as u32);
            }
        }
        None
    }

    fn server_of(&self, key: &[u8]) -> usize {
        self.shared.ring.as_ref().map(|r| r.server_for(key)).unwrap_or(0)
    }

    /// Builds and sends one request for client `c` (virtual client `vc`).
    fn issue(&mut self, c: u32, vc: u32, intended: u64) {
        let client = &mut self.clients[c as usize];
        if !client.alive {
            return;
        }
        if vc != u32::MAX {
            let r = &mut client.remaining[vc as usize];
            if *r == 0 {
                self.active_vcs -= 1;
                return;
            }
            *r = r.saturating_sub(1);
        }
        if vc == u32::MAX {
            // Open loop: how late the send left, and the gap since the
            // thread's previous send (the lab tests the gaps for the
            // exponential distribution the arrivals were drawn from).
            let now = now_ns();
            let late = now.saturating_sub(intended);
            let gap = (self.last_send > 0).then(|| now.saturating_sub(self.last_send));
            self.last_send = now;
            self.writer.record(&self.shared.slots, |a| a.record_send(late, gap, late > LATE_NS));
        }
        if let Some(mq) = &self.shared.cfg.mq {
            // A fixed cycle (as memtier does with --ratio): SENDs, then receives,
            // so partners stay in step and the queues keep their size.
            let w = self.gen.workload();
            let (sends, period) = (w.sets, w.sets + w.gets);
            let at = &mut client.cycle[(vc as usize).min(self.shared.cfg.virtual_clients)];
            let send = *at < sends;
            *at = (*at + 1) % period;
            let cmd = match (send, mq.receive) {
                (true, _) => Command::Send,
                (false, Receive::Pop) => Command::Pop,
                (false, Receive::RecvAck | Receive::Stream) => Command::Recv,
            };
            self.issue_mq(c, vc, intended, cmd, None);
            return;
        }
        let cmd = self.gen.command(&mut self.rng);
        let slot = self.alloc(InFlight {
            client: c,
            vc,
            intended,
            cmd,
            parts: 0,
            hits: 0,
            error: false,
            bytes: 0,
            lease: None,
        });
        let n = self.shared.addrs.len();
        for g in &mut self.groups {
            g.clear();
        }
        let keys = match cmd {
            Command::Get(k) => k,
            _ => 1,
        };
        let mut bytes = 0u64;
        for _ in 0..keys {
            self.scratch.clear();
            let k = self.gen.key(&mut self.rng);
            self.gen.write_key(k, &mut self.scratch);
            let s = if n > 1 { self.server_of(&self.scratch) } else { 0 };
            let g = &mut self.groups[s];
            match cmd {
                Command::Get(_) => {
                    if g.is_empty() {
                        g.extend_from_slice(b"get");
                    }
                    g.push(b' ');
                    g.extend_from_slice(&self.scratch);
                }
                Command::Set => self.gen.write_set(&self.scratch, &mut self.rng, g),
                Command::Delete => {
                    g.extend_from_slice(b"delete ");
                    g.extend_from_slice(&self.scratch);
                    g.extend_from_slice(b"\r\n");
                }
                Command::Send | Command::Pop | Command::Recv | Command::Ack => unreachable!("mq commands"),
            }
        }
        let mut parts = 0;
        for s in 0..n {
            if self.groups[s].is_empty() {
                continue;
            }
            if matches!(cmd, Command::Get(_)) {
                self.groups[s].extend_from_slice(b"\r\n");
            }
            parts += 1;
            bytes += self.groups[s].len() as u64;
            let sock = &mut self.clients[c as usize].socks[s];
            sock.wbuf.extend_from_slice(&self.groups[s]);
            sock.fifo.push_back(slot);
        }
        let f = self.inflight[slot as usize].as_mut().expect("just allocated");
        f.parts = parts;
        f.bytes = bytes;
        for s in 0..n {
            if !self.groups[s].is_empty() {
                self.flush(c as usize, s);
            }
        }
    }

    /// mq: sends one queue command for client `c` (virtual client `vc`);
    /// `ack` is the message to acknowledge (`Command::Ack`).
    fn issue_mq(&mut self, c: u32, vc: u32, intended: u64, cmd: Command, ack: Option<(i64, i64)>) {
        let slot = self.alloc(InFlight {
            client: c,
            vc,
            intended,
            cmd,
            parts: 1,
            hits: 0,
            error: false,
            bytes: 0,
            lease: None,
        });
        let client = &self.clients[c as usize];
        self.scratch.clear();
        let q = client.queue.as_slice();
        let stream = self.shared.cfg.mq.as_ref().is_some_and(|m| m.receive == Receive::Stream);
        match cmd {
            Command::Send if stream => {
                let body = self.gen.body(&mut self.rng);
                resp::push_request(&mut self.scratch, &[b"XADD", q, b"*", b"body", body]);
            }
            Command::Recv if stream => {
                let me = client.name.as_slice();
                resp::push_request(
                    &mut self.scratch,
                    &[b"XREADGROUP", b"GROUP", b"mwload", me, b"COUNT", b"1", b"STREAMS", q, b">"],
                );
            }
            Command::Ack if stream => {
                let (ms, seq) = ack.expect("an XACK names its entry");
                let id = format!("{ms}-{seq}");
                resp::push_request(&mut self.scratch, &[b"XACK", q, b"mwload", id.as_bytes()]);
            }
            Command::Send => {
                let body = self.gen.body(&mut self.rng);
                match &client.partner {
                    Some(p) => resp::push_request(&mut self.scratch, &[b"SEND", q, body, b"TO", p]),
                    None => resp::push_request(&mut self.scratch, &[b"SEND", q, body]),
                }
            }
            Command::Pop => resp::push_request(&mut self.scratch, &[b"POP", q]),
            Command::Recv => resp::push_request(&mut self.scratch, &[b"RECV", q]),
            Command::Ack => {
                let (id, lease) = ack.expect("an ACK names its message");
                let (id, lease) = (id.to_string(), lease.to_string());
                resp::push_request(&mut self.scratch, &[b"ACK", q, id.as_bytes(), lease.as_bytes()]);
            }
            _ => unreachable!("memcached commands"),
        }
        let bytes = self.scratch.len() as u64;
        let sock = &mut self.clients[c as usize].socks[0];
        sock.wbuf.extend_from_slice(&self.scratch);
        sock.fifo.push_back(slot);
        self.inflight[slot as usize].as_mut().expect("just allocated").bytes = bytes;
        self.flush(c as usize, 0);
    }

    fn alloc(&mut self, f: InFlight) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.inflight[i as usize] = Some(f);
                i
            }
            None => {
                self.inflight.push(Some(f));
                (self.inflight.len() - 1) as u32
            }
        }
    }

    fn flush(&mut self, c: usize, s: usize) {
        let sock = &mut self.clients[c].socks[s];
        let mut written = 0;
        let mut failed = false;
        while written < sock.wbuf.len() {
            let wrote = match &mut sock.session {
                Some(session) => session.write(&sock.stream, &sock.wbuf[written..]),
                None => sock.stream.write(&sock.wbuf[written..]),
            };
            match wrote {
                Ok(0) => break,
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        // What a TLS session still holds goes out as the socket takes it.
        if let Some(session) = &mut sock.session {
            failed |= matches!(session.flush(&sock.stream), Err(e) if !mwserve::tls::quiet(&e));
        }
        if failed {
            self.lose(c);
            return;
        }
        sock.wbuf.drain(..written);
    }

    /// Reads what socket (c, s) has. `peer_closed`: the event said the server
    /// closed its side, so read on to the end of the stream even after a short
    /// read (the close came with the bytes and raises no further event).
    fn read(&mut self, c: usize, s: usize, peer_closed: bool) {
        loop {
            if !self.clients[c].alive {
                return;
            }
            let sock = &mut self.clients[c].socks[s];
            let spare = sock.rbuf.spare(16 * 1024);
            let room = spare.len();
            let tls = sock.session.is_some();
            let read = match &mut sock.session {
                Some(session) => session.read(&sock.stream, spare),
                None => sock.stream.read(spare),
            };
            match read {
                Ok(0) => {
                    self.lose(c);
                    return;
                }
                Ok(n) => {
                    sock.rbuf.commit(n);
                    self.replies(c, s);
                    // (A TLS session may hold more records than one read took.)
                    if n < room && !peer_closed && !tls {
                        // The socket is empty; new bytes raise a new edge-triggered event.
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.lose(c);
                    return;
                }
            }
        }
    }

    /// Handles every whole reply buffered on socket (c, s).
    fn replies(&mut self, c: usize, s: usize) {
        if self.shared.cfg.mq.is_some() {
            return self.mq_replies(c);
        }
        loop {
            let sock = &mut self.clients[c].socks[s];
            let (hits, error, verify_failed, used) = match parse_response(sock.rbuf.filled()) {
                Ok(None) => return,
                Ok(Some((resp, used))) => {
                    let (hits, failed) = match &resp {
                        Response::Values(v) => {
                            let bad = if self.shared.cfg.verify {
                                v.iter().filter(|x| !self.gen.verify(x.key, x.data)).count() as u64
                            } else {
                                0
                            };
                            (v.len() as u32, bad)
                        }
                        _ => (0, 0),
                    };
                    (hits, resp.is_error(), failed, used)
                }
                Err(_) => {
                    self.lose(c);
                    return;
                }
            };
            let sock = &mut self.clients[c].socks[s];
            sock.rbuf.consume(used);
            let Some(slot) = sock.fifo.pop_front() else {
                self.lose(c);
                return;
            };
            let f = self.inflight[slot as usize].as_mut().expect("in flight");
            f.hits += hits;
            f.error |= error;
            f.bytes += used as u64;
            f.parts -= 1;
            if verify_failed > 0 {
                self.writer.record(&self.shared.slots, |a| a.record_verify_failures(verify_failed));
            }
            if f.parts == 0 {
                self.complete(slot);
            }
        }
    }

    /// mq: handles every whole reply buffered on client `c`'s socket.
    fn mq_replies(&mut self, c: usize) {
        loop {
            let sock = &mut self.clients[c].socks[0];
            let (reply, used) = match resp::parse(sock.rbuf.filled()) {
                Ok(None) => return,
                Ok(Some(r)) => r,
                Err(e) => {
                    eprintln!("mwload: thread {}: connection {c}: {e}", self.index);
                    self.lose(c);
                    return;
                }
            };
            sock.rbuf.consume(used);
            let Some(slot) = sock.fifo.pop_front() else {
                self.lose(c);
                return;
            };
            let f = self.inflight[slot as usize].as_mut().expect("in flight");
            f.error = reply.error;
            f.bytes += used as u64;
            f.parts = 0;
            match f.cmd {
                Command::Recv => {
                    f.hits = reply.messages;
                    f.lease = reply.lease;
                }
                Command::Pop => f.hits = reply.messages,
                // An ACK whose lease is no longer current (0) found nothing.
                Command::Ack => f.hits = u32::from(reply.integer == Some(1)),
                _ => {}
            }
            self.complete(slot);
        }
    }

    fn complete(&mut self, slot: u32) {
        let f = self.inflight[slot as usize].take().expect("in flight");
        self.free.push(slot);
        let now = now_ns();
        if let Some(op) = f.cmd.mq_op() {
            let hits = u64::from(f.hits);
            self.writer.record(&self.shared.slots, |a| {
                a.record_mq(op, now.saturating_sub(f.intended), f.error, hits, f.bytes)
            });
            if let (Command::Recv, Some(lease)) = (f.cmd, f.lease) {
                // What came is acknowledged at once, by the same virtual client.
                if self.clients[f.client as usize].alive {
                    self.issue_mq(f.client, f.vc, now, Command::Ack, Some(lease));
                    return;
                }
            }
            if f.vc != u32::MAX {
                self.next_after(f.client, f.vc, now);
            }
            return;
        }
        let keys = match f.cmd {
            Command::Get(k) => k,
            _ => 1,
        };
        let op = f.cmd.op();
        self.writer.record(&self.shared.slots, |a| {
            a.record(op, now.saturating_sub(f.intended), f.error, u64::from(keys), u64::from(f.hits), f.bytes)
        });
        if f.vc == u32::MAX {
            return;
        }
        self.next_after(f.client, f.vc, now);
    }

    /// Closed loop: virtual client `vc` of `client` thinks, then sends again.
    fn next_after(&mut self, client: u32, vc: u32, now: u64) {
        match self.shared.cfg.mode {
            Mode::Closed { think: Think::None } => self.issue(client, vc, now),
            Mode::Closed { think: Think::Fixed(us) } => self.timers.push(Reverse((now + us * 1000, client, vc, now))),
            Mode::Closed { think: Think::Exponential(us) } => {
                let t = self.rng.exponential(us as f64 * 1000.0) as u64;
                self.timers.push(Reverse((now + t, client, vc, now)));
            }
            Mode::Open { .. } => {}
        }
    }

    /// A connection failed: its requests are counted as errors and the client stops.
    fn lose(&mut self, c: usize) {
        if !self.clients[c].alive {
            return;
        }
        self.clients[c].alive = false;
        self.shared.lost.fetch_add(1, Ordering::Relaxed);
        let mut lost = Vec::new();
        for sock in &mut self.clients[c].socks {
            lost.extend(sock.fifo.drain(..));
        }
        lost.sort_unstable();
        lost.dedup();
        let now = now_ns();
        for slot in lost {
            if let Some(f) = self.inflight[slot as usize].take() {
                self.free.push(slot);
                let rt = now.saturating_sub(f.intended);
                match f.cmd.mq_op() {
                    Some(op) => self.writer.record(&self.shared.slots, |a| a.record_mq(op, rt, true, 0, 0)),
                    None => {
                        let op = f.cmd.op();
                        self.writer.record(&self.shared.slots, |a| a.record(op, rt, true, 1, 0, 0))
                    }
                }
                if f.vc != u32::MAX {
                    self.active_vcs -= 1;
                }
            }
        }
        let still_thinking = self.timers.iter().filter(|r| r.0 .1 as usize == c).count();
        self.active_vcs -= still_thinking;
        self.timers.retain(|r| r.0 .1 as usize != c);
        let index = self.index;
        if self.shared.cfg.reconnect {
            self.retries.push(Retry { client: c, due: now + RETRY_FIRST_NS, wait: RETRY_FIRST_NS, since: now });
            eprintln!("mwload: thread {index}: connection {c} lost; reconnecting");
        } else {
            eprintln!("mwload: thread {index}: connection {c} lost; its load stops");
        }
    }

    /// Closed loop: every virtual client of client `c` sends its first request.
    fn start_virtual_clients(&mut self, c: usize) {
        if let Mode::Closed { .. } = self.shared.cfg.mode {
            for vc in 0..self.shared.cfg.virtual_clients {
                self.active_vcs += 1;
                self.issue(c as u32, vc as u32, now_ns());
            }
        }
    }

    /// Tries again every lost client whose wait is over. A client that is back
    /// resumes all its virtual clients (closed loop) or takes arrivals again.
    fn reconnect_due(&mut self, poll: &Poll, now: u64) {
        for retry in std::mem::take(&mut self.retries) {
            let c = retry.client;
            if retry.due > now {
                self.retries.push(retry);
                continue;
            }
            // Short: a lost server on this host refuses at once, and the thread's
            // other connections wait while this one connects.
            let hello = hello_of(&self.shared.cfg, self.index * self.shared.cfg.connections + c);
            let secure = &self.shared.cfg.secure;
            match open_socks(poll, &self.shared.addrs, c, Duration::from_millis(100), hello.as_deref(), secure) {
                Ok(socks) => {
                    let client = &mut self.clients[c];
                    client.socks = socks;
                    client.alive = true;
                    self.shared.reconnected.fetch_add(1, Ordering::Relaxed);
                    eprintln!("mwload: thread {}: connection {c} re-established", self.index);
                    self.start_virtual_clients(c);
                }
                Err(_) if now - retry.since >= RETRY_GIVE_UP_NS => {
                    eprintln!(
                        "mwload: thread {}: connection {c} could not be re-established; its load stops",
                        self.index
                    );
                }
                Err(_) => {
                    let wait = (retry.wait * 2).min(RETRY_MAX_NS);
                    self.retries.push(Retry { due: now + wait, wait, ..retry });
                }
            }
        }
    }
}

/// Writes every key of the key space once (noreply sets, pipelined), split
/// over the threads, so that gets hit. Returns the number of keys written.
pub fn prefill(shared: &Shared, thread: usize) -> Result<u64> {
    let cfg = &shared.cfg;
    let w = &cfg.workload;
    let span = w.key_max - w.key_min + 1;
    let per = span.div_ceil(cfg.threads as u64);
    let lo = w.key_min + per * thread as u64;
    let hi = (lo + per).min(w.key_max + 1);
    if lo >= hi {
        return Ok(0);
    }
    let gen = Generator::new(w.clone(), thread as u64, cfg.threads as u64);
    let mut rng = Rng::new(cfg.seed ^ 0x5eed, thread as u64);
    let mut conns: Vec<Setup> =
        shared.addrs.iter().map(|a| Setup::open(*a, Duration::from_secs(3), &cfg.secure)).collect::<Result<_>>()?;
    let mut batches: Vec<Vec<u8>> = vec![Vec::new(); conns.len()];
    let mut key = Vec::new();
    let mut k = lo;
    while k < hi {
        // Batches of at most 200 keys and about 8 KiB per server: memcached
        // 1.6 with TLS (-Z) stops reading a connection whose bytes of
        // `noreply` commands span more than one TLS record (16 KiB).
        let mut end = k;
        while end < hi && end < k + 200 && batches.iter().all(|b| b.len() < PREFILL_BATCH_BYTES) {
            key.clear();
            gen.write_key(end, &mut key);
            let s = shared.ring.as_ref().map(|r| r.server_for(&key)).unwrap_or(0);
            let b = &mut batches[s];
            let start = b.len();
            gen.write_set(&key, &mut rng, b);
            // make it a noreply set: insert the word before the first CRLF
            let line_end = start + b[start..].windows(2).position(|x| x == b"\r\n").expect("line");
            b.splice(line_end..line_end, b" noreply".iter().copied());
            end += 1;
        }
        for (s, b) in batches.iter_mut().enumerate() {
            b.extend_from_slice(b"version\r\n");
            conns[s].write_all(b)?;
            conns[s].flush()?;
            b.clear();
            wait_version(&mut conns[s])?;
        }
        k = end;
    }
    Ok(hi - lo)
}

fn wait_version(s: &mut Setup) -> Result<()> {
    let mut buf = ReadBuf::with_capacity(4096);
    s.stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    loop {
        if let Some((resp, used)) = parse_response(buf.filled())? {
            match resp {
                Response::Version(_) => return Ok(()),
                other if other.is_error() => bail!("the server refused a prefill write: {other:?}"),
                _ => {}
            }
            buf.consume(used);
            continue;
        }
        let n = s.read(buf.spare(4096))?;
        if n == 0 {
            bail!("the server closed the connection during prefill");
        }
        buf.commit(n);
    }
}
