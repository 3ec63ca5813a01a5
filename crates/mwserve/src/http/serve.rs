//! The admin endpoint's thread: one mio loop that accepts connections,
//! reads their requests, hands each whole request to a thread of its own
//! and writes the answer back — so that a socket that sends nothing, or
//! trickles, or never reads its answer, holds a few bytes of this loop's
//! table and never a thread or a slot.
//!
//! - **Reading** costs no slot: the whole request (head and body) must
//!   arrive within [`HEADER_TIMEOUT`] of the connection, or it is closed
//!   without an answer. The loop holds at most [`MAX_CONNECTIONS`]
//!   connections, at most [`MAX_PER_SOURCE`] from one source (an address,
//!   IPv6 by /64); past either cap, the connection reading longest (else the
//!   one slowest to read its answer) is closed to make room, so newcomers —
//!   a probe sends its request at once — always get in, however many silent
//!   or non-reading sockets an attacker holds.
//! - **Answering**: a probe (a `GET` of [`Routes::probes`]) runs on its own
//!   lane, at most [`MAX_PROBES`] at once; more wait their turn, never
//!   refused. A page runs on a slot of its own, at most [`MAX_CONCURRENT`]
//!   at once and [`MAX_PAGES_PER_SOURCE`] for one source; past those it is
//!   answered `503`/`429` at once.
//! - **Writing**: the answer is written by this loop, within
//!   [`WRITE_TIMEOUT`] (a client that does not read holds no thread).

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token, Waker};

use super::page::{progress, same, Asked, Page, Progress, Request, Routes};
use crate::listen::{Clients, LISTENER, WAKER};
use crate::stream::Stream;
use crate::throttle::Source;

/// Pages answered at once (more hear `503` at once).
pub const MAX_CONCURRENT: usize = 8;
/// Pages one source has answered at once (more hear `429`).
pub const MAX_PAGES_PER_SOURCE: usize = 4;
/// Probes answered at once (more wait their turn).
pub const MAX_PROBES: usize = 16;
/// Connections held at once, whatever they are doing.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections one source holds at once.
pub const MAX_PER_SOURCE: usize = 32;
/// Time a client has to send its request (head and body) from its connection.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to read its answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often deadlines are checked.
const SWEEP: Duration = Duration::from_millis(100);

/// Which lane an answer was built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Probe,
    Page,
}

/// What a connection is doing.
enum State {
    /// Its request is on its way (since `accepted`).
    Reading(Vec<u8>),
    /// A probe waiting for a lane.
    Waiting(Asked),
    /// Its answer is being built on another thread.
    Answering,
    /// Its answer is being written, from `at`, since `since`.
    Writing { out: Vec<u8>, at: usize, since: Instant },
}

struct Conn {
    stream: Stream,
    /// Tells a connection from a later one under the same token.
    id: u64,
    source: Source,
    peer: Option<IpAddr>,
    accepted: Instant,
    state: State,
}

/// An answer built on another thread: for which connection, on which lane, its bytes.
struct Built {
    token: Token,
    id: u64,
    lane: Lane,
    source: Source,
    bytes: Vec<u8>,
}

/// The loop's state.
pub struct Endpoint {
    poll: Poll,
    listener: mio::net::TcpListener,
    conns: Clients<Conn>,
    routes: Routes,
    token: Arc<Option<String>>,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    built_tx: Sender<Built>,
    built_rx: Receiver<Built>,
    next_id: u64,
    /// Connections held per source.
    held: HashMap<Source, usize>,
    /// Pages being built, in all and per source.
    pages: usize,
    pages_of: HashMap<Source, usize>,
    /// Probes being answered, and those waiting (token, id).
    probes: usize,
    waiting: VecDeque<(Token, u64)>,
}

impl Endpoint {
    /// The loop over `listener`, serving `routes`; `stop` ends it (wake it with the waker).
    pub fn new(
        listener: std::net::TcpListener,
        routes: Routes,
        token: Option<String>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<Endpoint> {
        listener.set_nonblocking(true)?;
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let mut listener = mio::net::TcpListener::from_std(listener);
        poll.registry().register(&mut listener, LISTENER, mio::Interest::READABLE)?;
        let (built_tx, built_rx) = channel();
        Ok(Endpoint {
            poll,
            listener,
            conns: Clients::default(),
            routes,
            token: Arc::new(token),
            stop,
            waker,
            built_tx,
            built_rx,
            next_id: 0,
            held: HashMap::new(),
            pages: 0,
            pages_of: HashMap::new(),
            probes: 0,
            waiting: VecDeque::new(),
        })
    }

    /// What wakes the loop (to stop it).
    pub fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    /// Runs until `stop` is set.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut next_sweep = Instant::now() + SWEEP;
        while !self.stop.load(Ordering::Relaxed) {
            let timeout = next_sweep.saturating_duration_since(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("admin endpoint: poll failed: {e}");
                    return;
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    LISTENER => self.accept(),
                    token => {
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.readable(token);
                        }
                        if ev.is_writable() {
                            self.write(token);
                        }
                    }
                }
            }
            self.collect_built();
            if Instant::now() >= next_sweep {
                self.sweep();
                next_sweep = Instant::now() + SWEEP;
            }
        }
    }

    fn accept(&mut self) {
        loop {
            let (stream, addr) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("admin accept failed: {e}");
                    return;
                }
            };
            let source = Source::ip(addr.ip());
            let stream = Stream::Tcp(stream);
            // Room for it: the connection reading longest (of its source, then of all) goes.
            if self.held.get(&source).copied().unwrap_or(0) >= MAX_PER_SOURCE && !self.evict(Some(source)) {
                refuse(&stream, 429, "too many connections from your address\n");
                continue;
            }
            if self.conns.iter().count() >= MAX_CONNECTIONS && !self.evict(None) {
                refuse(&stream, 503, "busy: try again\n");
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            let conn = |stream| {
                Some(Conn {
                    stream,
                    id,
                    source,
                    peer: Some(addr.ip()),
                    accepted: Instant::now(),
                    state: State::Reading(Vec::new()),
                })
            };
            if let Some(token) = self.conns.add(self.poll.registry(), stream, conn) {
                *self.held.entry(source).or_default() += 1;
                // Its request may be there already.
                self.readable(token);
            }
        }
    }

    /// Closes the connection that has been reading longest (of `source`,
    /// or of all), else the one whose client has been slowest to read its
    /// answer; false when every one is waiting for or building its answer
    /// (at most the lanes' worth, and probes that wait their turn).
    fn evict(&mut self, source: Option<Source>) -> bool {
        let oldest = self
            .conns
            .tokens()
            .into_iter()
            .filter_map(|t| {
                let c = self.conns.get_mut(t)?;
                let since = match &c.state {
                    State::Reading(_) => (0, c.accepted),
                    State::Writing { since, .. } => (1, *since),
                    State::Waiting(_) | State::Answering => return None,
                };
                source.is_none_or(|s| c.source == s).then_some((since, t))
            })
            .min();
        match oldest {
            Some((_, t)) => {
                self.close(t);
                true
            }
            None => false,
        }
    }

    fn close(&mut self, token: Token) {
        if let Some(mut c) = self.conns.remove(token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            let _ = c.stream.shutdown(Shutdown::Both);
            if let Some(n) = self.held.get_mut(&c.source) {
                *n -= 1;
                if *n == 0 {
                    self.held.remove(&c.source);
                }
            }
        }
    }

    /// Reads what came; a whole request goes to be answered.
    fn readable(&mut self, token: Token) {
        let Some(c) = self.conns.get_mut(token) else { return };
        let State::Reading(buf) = &mut c.state else { return };
        let mut chunk = [0u8; 4096];
        let mut ended = false;
        loop {
            match (&c.stream).read(&mut chunk) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if !matches!(progress(buf), Progress::Incomplete) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    ended = true;
                    buf.clear();
                    break;
                }
            }
        }
        match progress(buf) {
            Progress::Complete(n) => {
                let asked = Asked::parse(&buf[..n]);
                self.dispatch(token, asked);
            }
            Progress::Refuse(status, why) => self.answer(token, Page::text(status, why.into())),
            // The client closed its side: answer what it sent, if anything.
            Progress::Incomplete if ended && !buf.is_empty() => {
                let asked = Asked::parse(buf);
                self.dispatch(token, asked);
            }
            Progress::Incomplete if ended => self.close(token),
            Progress::Incomplete => {}
        }
    }

    /// A whole request: refused here, or handed to its lane.
    fn dispatch(&mut self, token: Token, asked: Asked) {
        let token_cfg = self.token.as_deref();
        let carries = matches!((asked.bearer(), token_cfg), (Some(b), Some(t)) if same(b.as_bytes(), t.as_bytes()));
        let own_login = self.routes.own_login.is_some_and(|p| asked.path.starts_with(p));
        if !(asked.method == "GET" || token_cfg.is_none() || own_login || carries) {
            let why = format!("{} {} needs the admin token (Authorization: Bearer ...)\n", asked.method, asked.path);
            return self.answer(token, Page::text(401, why));
        }
        let Some(c) = self.conns.get_mut(token) else { return };
        let source = c.source;
        if asked.method == "GET" && self.routes.probes.contains(&asked.path.as_str()) {
            c.state = State::Waiting(asked);
            self.waiting.push_back((token, c.id));
            return self.start_probes();
        }
        if self.pages >= MAX_CONCURRENT {
            return self.answer(token, Page { retry_after: Some(1), ..Page::text(503, "busy: try again\n".into()) });
        }
        if self.pages_of.get(&source).copied().unwrap_or(0) >= MAX_PAGES_PER_SOURCE {
            let why = format!("{MAX_PAGES_PER_SOURCE} requests from your address are being answered: try again\n");
            return self.answer(token, Page { retry_after: Some(1), ..Page::text(429, why) });
        }
        self.pages += 1;
        *self.pages_of.entry(source).or_default() += 1;
        self.build(token, asked, Lane::Page, carries);
    }

    /// Starts the waiting probes there is room for.
    fn start_probes(&mut self) {
        while self.probes < MAX_PROBES {
            let Some((token, id)) = self.waiting.pop_front() else { return };
            let Some(c) = self.conns.get_mut(token).filter(|c| c.id == id) else { continue };
            let State::Waiting(asked) = std::mem::replace(&mut c.state, State::Answering) else { continue };
            self.probes += 1;
            let carries = matches!((asked.bearer(), self.token.as_deref()), (Some(b), Some(t)) if same(b.as_bytes(), t.as_bytes()));
            self.build(token, asked, Lane::Probe, carries);
        }
    }

    /// Builds the answer to `asked` on a thread of its own.
    fn build(&mut self, token: Token, asked: Asked, lane: Lane, carries: bool) {
        let Some(c) = self.conns.get_mut(token) else { return };
        c.state = State::Answering;
        let (id, source, peer) = (c.id, c.source, c.peer);
        let (routes, configured, tx, waker) =
            (self.routes.clone(), self.token.is_some(), self.built_tx.clone(), self.waker.clone());
        let spawned = std::thread::Builder::new().name("admin-page".into()).spawn(move || {
            let request = Request {
                method: &asked.method,
                path: &asked.path,
                query: &asked.query,
                authorization: asked.authorization.as_deref(),
                body: &asked.body,
                peer,
                token: carries,
                token_configured: configured,
            };
            // (A handler that panics answers 500 and frees its slot all the same.)
            let page = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (routes.handler)(&request)))
                .unwrap_or_else(|_| Some(Page::text(500, "the page failed\n".into())))
                .unwrap_or_else(|| match request.method {
                    "GET" => Page::text(404, format!("not found: try {}\n", routes.paths.join(", "))),
                    m => Page::text(405, format!("{m} {} is not served\n", request.path)),
                });
            let _ = tx.send(Built { token, id, lane, source, bytes: page.to_bytes() });
            let _ = waker.wake();
        });
        if spawned.is_err() {
            let bytes = Page::text(503, "busy: try again\n".into()).to_bytes();
            let _ = self.built_tx.send(Built { token, id, lane, source, bytes });
        }
    }

    /// Takes the answers built since last time: their slots are free, their bytes go out.
    fn collect_built(&mut self) {
        while let Ok(b) = self.built_rx.try_recv() {
            match b.lane {
                Lane::Probe => self.probes -= 1,
                Lane::Page => {
                    self.pages -= 1;
                    if let Some(n) = self.pages_of.get_mut(&b.source) {
                        *n -= 1;
                        if *n == 0 {
                            self.pages_of.remove(&b.source);
                        }
                    }
                }
            }
            if self.conns.get_mut(b.token).is_some_and(|c| c.id == b.id && matches!(c.state, State::Answering)) {
                self.send(b.token, b.bytes);
            }
        }
        self.start_probes();
    }

    /// Answers `page` from this loop.
    fn answer(&mut self, token: Token, page: Page) {
        self.send(token, page.to_bytes());
    }

    fn send(&mut self, token: Token, out: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(token) {
            c.state = State::Writing { out, at: 0, since: Instant::now() };
            self.write(token);
        }
    }

    /// Writes what the socket takes of the answer; closes once it is all out.
    fn write(&mut self, token: Token) {
        let Some(c) = self.conns.get_mut(token) else { return };
        let State::Writing { out, at, .. } = &mut c.state else { return };
        while *at < out.len() {
            match (&c.stream).write(&out[*at..]) {
                Ok(0) => break,
                Ok(n) => *at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.close(token);
    }

    /// Closes the connections past their deadlines: still reading after
    /// [`HEADER_TIMEOUT`], still writing after [`WRITE_TIMEOUT`].
    fn sweep(&mut self) {
        let now = Instant::now();
        for token in self.conns.tokens() {
            let Some(c) = self.conns.get_mut(token) else { continue };
            let late = match &c.state {
                State::Reading(_) => now.duration_since(c.accepted) >= HEADER_TIMEOUT,
                State::Writing { since, .. } => now.duration_since(*since) >= WRITE_TIMEOUT,
                State::Waiting(_) | State::Answering => false,
            };
            if late {
                self.close(token);
            }
        }
    }
}

/// Tells a connection there is no room for it (as far as the socket takes
/// it at once) and closes it.
fn refuse(stream: &Stream, status: u16, why: &str) {
    let page = Page { retry_after: Some(1), ..Page::text(status, why.into()) };
    let _ = (&*stream).write(&page.to_bytes());
    let _ = stream.shutdown(Shutdown::Both);
}
