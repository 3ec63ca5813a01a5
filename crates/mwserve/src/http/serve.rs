//! The admin endpoint's thread: one mio loop that accepts connections,
//! reads their requests, answers probes itself or hands a page to a thread
//! of its own, and writes the answer back — so that a socket that sends
//! nothing, or trickles, or never reads its answer, holds a few bytes of
//! this loop's table and never a thread or a slot.
//!
//! - **Reading** costs no slot: the whole request (head and body) must
//!   arrive within [`HEADER_TIMEOUT`] of the connection, or it is closed
//!   without an answer. The loop holds at most [`MAX_CONNECTIONS`]
//!   connections, at most [`MAX_PER_SOURCE`] from one source (an address,
//!   IPv6 by /64); past either cap, a connection reading (the one reading
//!   longest; else the one slowest to read its answer) is closed to make
//!   room — of the same source, or of the source holding the most — so
//!   newcomers (a probe sends its request at once) always get in, however
//!   many sockets an attacker holds: what cannot be closed (readiness
//!   probes waiting, pages being built) is bounded well below both caps.
//! - **Probes**: `GET /healthz` is answered by this loop at once
//!   ([`Probes::live`] reads a flag), never queued or refused. `GET /readyz`
//!   runs one check at a time on a thread of its own; those that arrive
//!   meanwhile wait for it (at most [`MAX_READY_WAITING`], and
//!   [`MAX_READY_WAITING_PER_SOURCE`] from one source: more hear `429`), and
//!   its answer is served again for [`READY_FOR`] — a flood of readiness
//!   probes costs one check per period.
//! - **Pages** run on a slot of their own, at most [`MAX_CONCURRENT`] at once
//!   and [`MAX_PAGES_PER_SOURCE`] for one source; past those they are
//!   answered `503`/`429` at once.
//! - **The admin token**: a request that presents a token
//!   (`Authorization: Bearer`, outside [`Routes::own_login`]) that is wrong
//!   hears `401` and counts as a failed login in [`Routes::throttle`]; from a
//!   source locked out, `429` unchecked. Without a token, pages show their
//!   public view.
//! - **Writing**: the answer is written by this loop, within
//!   [`WRITE_TIMEOUT`] (a client that does not read holds no thread).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token, Waker};

use super::page::{progress, same, Asked, Page, Probe, Progress, Request, Routes};
use super::{LIVENESS, READINESS};
use crate::listen::{Clients, LISTENER, WAKER};
use crate::stream::Stream;
use crate::throttle::{Attempt, Refused, Source};

/// Pages answered at once (more hear `503` at once).
pub const MAX_CONCURRENT: usize = 8;
/// Pages one source has answered at once (more hear `429`).
pub const MAX_PAGES_PER_SOURCE: usize = 4;
/// Readiness probes waiting for the check under way, at most (more hear `503`).
pub const MAX_READY_WAITING: usize = 128;
/// Readiness probes of one source waiting at once, at most (more hear `429`).
pub const MAX_READY_WAITING_PER_SOURCE: usize = 8;
/// How long a readiness check's answer is served again.
pub const READY_FOR: Duration = Duration::from_millis(500);
/// How long a readiness probe waits for a check before it hears `503`.
pub const READY_WAIT: Duration = Duration::from_secs(10);
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

/// What a connection is doing.
enum State {
    /// Its request is on its way (since `accepted`).
    Reading(Vec<u8>),
    /// A readiness probe waiting, since then, for the check under way.
    Waiting(Instant),
    /// Its page is being built on another thread.
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

/// What another thread built.
enum Built {
    /// A page, for this connection.
    Page { token: Token, id: u64, source: Source, bytes: Vec<u8> },
    /// A readiness check's answer, for every probe waiting.
    Ready(Vec<u8>),
}

/// The readiness probes: the last answer, the check under way, who waits.
#[derive(Default)]
struct Readiness {
    /// The last check's answer and when it came.
    last: Option<(Instant, Vec<u8>)>,
    running: bool,
    waiting: Vec<(Token, u64)>,
    waiting_of: HashMap<Source, usize>,
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
    ready: Readiness,
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
            ready: Readiness::default(),
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
    /// or else of the source that holds the most), else the one whose
    /// client has been slowest to read its answer; false when every one is
    /// waiting for or building its answer (a bounded number: readiness
    /// probes waiting, pages being built).
    fn evict(&mut self, source: Option<Source>) -> bool {
        let candidates: Vec<((u8, Instant), Token, Source)> = self
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
                Some((since, t, c.source))
            })
            .collect();
        let held = |s: &Source| self.held.get(s).copied().unwrap_or(0);
        let Some(from) = source.or_else(|| candidates.iter().map(|c| c.2).max_by_key(held)) else { return false };
        match candidates.into_iter().filter(|c| c.2 == from).min_by_key(|c| (c.0, c.1)) {
            Some((_, t, _)) => {
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

    /// A whole request: a probe, refused here, or handed to a page's slot.
    fn dispatch(&mut self, token: Token, asked: Asked) {
        let Some(source) = self.conns.get_mut(token).map(|c| c.source) else { return };
        if asked.method == "GET" {
            if let Some(probes) = &self.routes.probes {
                match asked.path.as_str() {
                    LIVENESS => {
                        let page = built(&probes.live);
                        return self.answer(token, page);
                    }
                    READINESS => return self.readiness(token, source),
                    _ => {}
                }
            }
        }
        let own_login = self.routes.own_login.is_some_and(|p| asked.path.starts_with(p));
        let carries = match asked.bearer() {
            Some(offered) if !own_login => match self.admin_token(source, offered) {
                Ok(()) => true,
                Err(page) => return self.answer(token, page),
            },
            Some(offered) => self.token.as_deref().is_some_and(|t| same(offered.as_bytes(), t.as_bytes())),
            None => false,
        };
        if !(asked.method == "GET" || self.token.is_none() || own_login || carries) {
            let why = format!("{} {} needs the admin token (Authorization: Bearer ...)\n", asked.method, asked.path);
            return self.answer(token, Page::text(401, why));
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
        self.build(token, asked, carries);
    }

    /// Checks a token offered from `source` against the admin token, as a
    /// login: refused unchecked (`429`) while the source is locked out, a
    /// wrong one (`401`) counted as a failed login.
    fn admin_token(&self, source: Source, offered: &str) -> Result<(), Page> {
        let Some(expected) = self.token.as_deref() else {
            let why = "this endpoint has no admin token ([stats] admin_token_file): send no Authorization header\n";
            return Err(Page::text(401, why.into()));
        };
        let attempt = Attempt { source: Some(source), user: None, secret: offered.as_bytes(), via: "the admin token" };
        let throttle = self.routes.throttle.as_deref();
        match throttle.map_or(Ok(()), |t| t.begin(&attempt)) {
            Err(Refused::Throttled(t)) => {
                return Err(Page { retry_after: Some(t.retry_secs), ..Page::text(429, format!("{t}\n")) })
            }
            Err(Refused::Repeated) => {}
            Ok(()) => {
                let right = same(offered.as_bytes(), expected.as_bytes());
                if let Some(t) = throttle {
                    t.checked(&attempt, right);
                }
                if right {
                    return Ok(());
                }
            }
        }
        Err(Page::text(401, "wrong admin token (Authorization: Bearer ...)\n".into()))
    }

    /// `GET /readyz`: the last answer while it is fresh; else a wait for the
    /// check under way (one is started if none is), within the caps.
    fn readiness(&mut self, token: Token, source: Source) {
        let r = &mut self.ready;
        if let Some((at, bytes)) = &r.last {
            if at.elapsed() < READY_FOR {
                let bytes = bytes.clone();
                return self.send(token, bytes);
            }
        }
        if r.waiting.len() >= MAX_READY_WAITING {
            let why = "too many readiness probes are waiting: try again\n";
            return self.answer(token, Page { retry_after: Some(1), ..Page::text(503, why.into()) });
        }
        let mine = r.waiting_of.entry(source).or_default();
        if *mine >= MAX_READY_WAITING_PER_SOURCE {
            let why =
                format!("{MAX_READY_WAITING_PER_SOURCE} readiness probes from your address are waiting: try again\n");
            return self.answer(token, Page { retry_after: Some(1), ..Page::text(429, why) });
        }
        *mine += 1;
        let Some(c) = self.conns.get_mut(token) else { return };
        c.state = State::Waiting(Instant::now());
        self.ready.waiting.push((token, c.id));
        if !self.ready.running {
            self.check_readiness();
        }
    }

    /// Runs the readiness check on a thread of its own.
    fn check_readiness(&mut self) {
        let Some(probes) = &self.routes.probes else { return };
        let (ready, tx, waker) = (probes.ready.clone(), self.built_tx.clone(), self.waker.clone());
        self.ready.running = true;
        let spawned = std::thread::Builder::new().name("admin-readyz".into()).spawn(move || {
            let _ = tx.send(Built::Ready(built(&ready).to_bytes()));
            let _ = waker.wake();
        });
        if spawned.is_err() {
            let _ = self.built_tx.send(Built::Ready(Page::text(503, "busy: try again\n".into()).to_bytes()));
        }
    }

    /// Builds the page `asked` on a thread of its own.
    fn build(&mut self, token: Token, asked: Asked, carries: bool) {
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
            let _ = tx.send(Built::Page { token, id, source, bytes: page.to_bytes() });
            let _ = waker.wake();
        });
        if spawned.is_err() {
            let bytes = Page::text(503, "busy: try again\n".into()).to_bytes();
            let _ = self.built_tx.send(Built::Page { token, id, source, bytes });
        }
    }

    /// Takes what was built since last time: pages free their slots, a
    /// readiness check answers every probe waiting for it.
    fn collect_built(&mut self) {
        while let Ok(b) = self.built_rx.try_recv() {
            match b {
                Built::Page { token, id, source, bytes } => {
                    self.pages -= 1;
                    if let Some(n) = self.pages_of.get_mut(&source) {
                        *n -= 1;
                        if *n == 0 {
                            self.pages_of.remove(&source);
                        }
                    }
                    if self.conns.get_mut(token).is_some_and(|c| c.id == id && matches!(c.state, State::Answering)) {
                        self.send(token, bytes);
                    }
                }
                Built::Ready(bytes) => {
                    self.ready.running = false;
                    self.ready.waiting_of.clear();
                    for (token, id) in std::mem::take(&mut self.ready.waiting) {
                        if self.conns.get_mut(token).is_some_and(|c| c.id == id && matches!(c.state, State::Waiting(_)))
                        {
                            self.send(token, bytes.clone());
                        }
                    }
                    self.ready.last = Some((Instant::now(), bytes));
                }
            }
        }
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
    /// [`HEADER_TIMEOUT`], still writing after [`WRITE_TIMEOUT`]; a
    /// readiness probe that waited [`READY_WAIT`] hears `503`.
    fn sweep(&mut self) {
        let now = Instant::now();
        for token in self.conns.tokens() {
            let Some(c) = self.conns.get_mut(token) else { continue };
            match &c.state {
                State::Reading(_) if now.duration_since(c.accepted) >= HEADER_TIMEOUT => self.close(token),
                State::Writing { since, .. } if now.duration_since(*since) >= WRITE_TIMEOUT => self.close(token),
                State::Waiting(since) if now.duration_since(*since) >= READY_WAIT => {
                    let why = format!("the readiness check did not answer in {} s\n", READY_WAIT.as_secs());
                    self.answer(token, Page { retry_after: Some(1), ..Page::text(503, why) });
                }
                _ => {}
            }
        }
    }
}

/// A probe's page; a probe that panics answers 500.
fn built(probe: &Probe) -> Page {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| probe()))
        .unwrap_or_else(|_| Page::text(500, "the probe failed\n".into()))
}

/// Tells a connection there is no room for it (as far as the socket takes
/// it at once) and closes it.
fn refuse(stream: &Stream, status: u16, why: &str) {
    let page = Page { retry_after: Some(1), ..Page::text(status, why.into()) };
    let _ = (&*stream).write(&page.to_bytes());
    let _ = stream.shutdown(Shutdown::Both);
}
