//! The net thread: accepts clients, reads and parses their requests, queues
//! them for the workers, and writes what the workers could not.
//!
//! One edge-triggered mio event loop serves the listening socket and every
//! client. A connection has at most one request with the workers: the next
//! one is parsed when the worker reports the previous one answered, so a
//! client's requests take effect, and are answered, in order (redis clients
//! may pipeline; they are served one request at a time). While a request is
//! with a worker, at most [`READ_AHEAD`] further bytes are read.
//!
//! Bounded memory, whatever clients do: a connection holds its partial
//! request and one read's worth of input; a request whose arguments pass
//! 64 KiB takes its size from the process's input budget first, and waits
//! (unread, so TCP backpressure reaches its client) while the budget is used
//! up; a client that leaves more than `max_pending_output` bytes of replies
//! unread gets no further request served until it reads, nor any while the
//! output budget is used up (`output.rs`); one whose unread replies do not
//! move for `reply_stall_ms` while others wait for that budget is closed.
//! When the request
//! queue is full, the request waits in its connection and the net thread
//! tries again every millisecond.
//!
//! Input that is not RESP is answered with Redis' protocol error and the
//! connection is closed; every other refusal leaves the connection usable.
//! Clients over the connection limit, or arriving when the process is out of
//! file descriptors, get `-ERR max number of clients reached` and are closed.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use mio::unix::SourceFd;
use mio::{Events, Token};
use mwserve::listen::{Front, Transport, WAKER};
use mwstats::clock::now_ns;

use crate::command::{self, Limits};
use crate::engine::conn::ClientConn;
use crate::engine::job::{Done, Job, Work};
use crate::resp::{Reply, Request, RequestParser};
use crate::shared::Shared;
use crate::telemetry::NetCounters;

const READ_CHUNK: usize = 16 * 1024;
/// Bytes read ahead of the request a worker holds.
pub const READ_AHEAD: usize = 64 * 1024;
/// Requests held with fewer bytes than this do not take from the input budget.
const SMALL: usize = 64 * 1024;
/// Redis' answer to a client over the limit.
pub const TOO_MANY: &[u8] = b"-ERR max number of clients reached\r\n";
/// How often connections are checked against the handshake and login deadlines.
const SWEEP: Duration = Duration::from_millis(250);
/// How long shutdown waits for in-flight requests and unread replies.
const DRAIN: Duration = Duration::from_secs(5);

/// A client connection as the net thread sees it.
pub(crate) struct Conn {
    shared: Arc<ClientConn>,
    parser: RequestParser,
    /// Input read but not yet given to the parser.
    rbuf: Vec<u8>,
    /// A parsed request that found the queue full.
    unqueued: Option<Box<Job>>,
    /// Read until `WouldBlock`: only a new event brings more.
    drained: bool,
    /// The client closed its side.
    eof: bool,
    /// The socket reported the client's close (or a failure), read or not.
    hung_up: bool,
    /// The request with the workers may wait (RECV WAIT, XREAD BLOCK...):
    /// a client that closes its side meanwhile is closed at once.
    waits: bool,
    /// Input budget taken for the request being read.
    reserved: usize,
    /// When the last read returned (t_recv of the request it completed).
    last_read_ns: u64,
}

/// What servicing a connection led to.
#[derive(PartialEq, Eq, Debug)]
enum Flow {
    /// Nothing more to do until an event.
    Idle,
    /// Input (or the end of it) waits, most likely behind a request that is
    /// with the workers: the worker must say when it is done (see
    /// `NetThread::service`, which steps again if it already is).
    Busy,
    /// Waiting for the input budget or room in the queue: try again soon.
    Blocked,
    /// The connection is finished.
    Close,
}

/// The net thread.
pub struct NetThread {
    front: Front<Conn>,
    shared: Arc<Shared>,
    done: Receiver<Done>,
    blocked: Vec<Token>,
    /// Where reads land before they are given to a connection.
    scratch: Vec<u8>,
    limits: Limits,
    last_conn_id: u64,
    next_request_id: u64,
    /// TLS connections accepted and maybe still handshaking, oldest first
    /// (with their ids: a token is used again after a close).
    handshakes: std::collections::VecDeque<(Token, u64)>,
    /// When connections are next checked against their deadlines.
    next_sweep: Instant,
}

impl NetThread {
    /// The net thread serving the clients of `front`; workers report
    /// answered requests through `done`.
    pub(crate) fn new(front: Front<Conn>, shared: Arc<Shared>, done: Receiver<Done>) -> NetThread {
        let q = &shared.config.queues;
        let limits = Limits { default_vt_ms: q.default_vt_ms, max_wait_ms: q.max_wait_ms };
        NetThread {
            front,
            shared,
            done,
            blocked: Vec::new(),
            scratch: vec![0; READ_CHUNK],
            limits,
            last_conn_id: 0,
            next_request_id: 0,
            handshakes: Default::default(),
            next_sweep: Instant::now() + SWEEP,
        }
    }

    /// Runs until shutdown is asked for and the connections are finished.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut drain_until: Option<Instant> = None;
        loop {
            // (Woken at least every SWEEP for the connections' deadlines.)
            let waiting = !self.shared.reply_line.is_empty();
            let timeout = if !self.blocked.is_empty() || drain_until.is_some() || waiting {
                Some(Duration::from_millis(1))
            } else {
                Some(SWEEP)
            };
            if !self.front.wait(&mut events, timeout) {
                break;
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    token if Front::<Conn>::is_listener(token) => self.accept(),
                    token => {
                        if self.conn(token).is_none() {
                            continue;
                        }
                        if ev.is_writable() {
                            self.writable(token);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            if let Some(c) = self.conn(token) {
                                c.drained = false;
                                c.hung_up |= ev.is_read_closed() || ev.is_error();
                            }
                            self.service(token);
                        }
                    }
                }
            }
            while let Ok(d) = self.done.try_recv() {
                self.answered(d);
            }
            let blocked = std::mem::take(&mut self.blocked);
            for token in blocked {
                self.service(token);
            }
            if waiting {
                self.admit_replies();
            }
            self.sweep();
            if self.shared.stopping.load(Ordering::Relaxed) {
                let until = *drain_until.get_or_insert_with(|| {
                    self.front.stop_accepting();
                    Instant::now() + DRAIN
                });
                self.close_finished();
                if self.front.clients.is_empty() || Instant::now() >= until {
                    break;
                }
            }
        }
        for token in self.front.clients.tokens() {
            self.close(token);
        }
    }

    fn conn(&mut self, token: Token) -> Option<&mut Conn> {
        self.front.clients.get_mut(token)
    }

    /// While stopping: close every connection with nothing in flight or unwritten.
    fn close_finished(&mut self) {
        for token in self.front.clients.tokens() {
            let done = self.conn(token).is_some_and(|c| !c.shared.busy() && c.shared.pending_output() == 0);
            if done {
                self.close(token);
            }
        }
    }

    fn accept(&mut self) {
        let NetThread { front, shared, last_conn_id, .. } = self;
        let (open, net) = (&shared.open_connections, &shared.net);
        let full = || open.load(Ordering::Relaxed) >= shared.max_connections;
        let tls_cfg = shared.tls.clone();
        let conn = |stream: mwserve::stream::Stream, tls: bool| {
            crate::peer::limit_unsent(stream.as_fd());
            let transport = match Transport::new(stream, tls.then_some(tls_cfg.as_ref()).flatten()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!("cannot start a TLS session: {e}");
                    return None;
                }
            };
            *last_conn_id += 1;
            NetCounters::add(&net.accepted, 1);
            open.fetch_add(1, Ordering::Relaxed);
            Some(Conn {
                shared: Arc::new(ClientConn::new(*last_conn_id, transport, &shared.output)),
                parser: RequestParser::new(shared.config.server.max_body),
                rbuf: Vec::new(),
                unqueued: None,
                drained: false,
                eof: false,
                hung_up: false,
                waits: false,
                reserved: 0,
                last_read_ns: 0,
            })
        };
        // Accepted first, served after: serving needs the whole thread.
        let accepted = front.accept(full, || NetCounters::add(&net.rejected, 1), conn);
        for &token in &accepted {
            if let Some(c) = self.conn(token).filter(|c| c.shared.transport().is_tls()) {
                let id = c.shared.id;
                self.handshakes.push_back((token, id));
            }
        }
        self.cap_handshakes();
        for token in accepted {
            self.service(token);
        }
    }

    /// Requests that waited for room in the output budget and now fit go
    /// to the workers with their reservation; those whose client left are
    /// dropped; all of them when mwmq stops.
    fn admit_replies(&mut self) {
        let shared = self.shared.clone();
        let line = &shared.reply_line;
        let admitted: Vec<_> = if shared.stopping.load(Ordering::Relaxed) {
            line.take_all().into_iter().map(|j| (j, None)).collect()
        } else {
            let bounds = shared.bounds;
            let need = |j: &Job| match &j.cmd {
                Ok(c) if !j.conn.is_closed() => bounds.of(c).unwrap_or(0),
                _ => 0,
            };
            line.admit(|j| need(j)).into_iter().map(|(j, r)| (j, Some(r))).collect()
        };
        for (mut job, reply) in admitted {
            if job.conn.is_closed() {
                crate::events::abandon(&shared, job, false);
                continue;
            }
            job.reply = reply;
            // (Its wait for room is not a wait for a worker.)
            job.t_enqueue = now_ns();
            shared.queue.push_again(Work::Request(job));
        }
    }

    /// Forgets the connections that finished their handshake or went away.
    fn prune_handshakes(&mut self) {
        let entries = std::mem::take(&mut self.handshakes);
        self.handshakes = entries.into_iter().filter(|&(t, id)| self.still_handshaking(t, id)).collect();
    }

    /// Whether `token` is still connection `id` and in its TLS handshake.
    fn still_handshaking(&mut self, token: Token, id: u64) -> bool {
        self.conn(token).is_some_and(|c| c.shared.id == id && c.shared.transport().handshaking())
    }

    /// Past `[tls] max_handshaking`, closes the connections that have been
    /// handshaking longest: silent sockets cannot hold every slot, and a
    /// client that completes its handshake promptly always gets in.
    fn cap_handshakes(&mut self) {
        let cap = self.shared.config.tls.max_handshaking.max(1);
        if self.handshakes.len() <= cap {
            return;
        }
        self.prune_handshakes();
        while self.handshakes.len() > cap {
            let (token, _) = self.handshakes.pop_front().expect("over the cap");
            NetCounters::add(&self.shared.net.handshake_refused, 1);
            self.close(token);
        }
    }

    /// Closes connections past their deadlines: a TLS handshake not finished
    /// within `[tls] handshake_timeout_secs`, a login not done within
    /// `[auth] login_timeout_secs` (where users are configured).
    fn sweep(&mut self) {
        let now = Instant::now();
        if now < self.next_sweep {
            return;
        }
        self.next_sweep = now + SWEEP;
        let handshake = Duration::from_secs(self.shared.config.tls.handshake_timeout_secs);
        let auth = &self.shared.config.auth;
        let login = (self.shared.users.enabled() && auth.login_timeout_secs > 0)
            .then(|| Duration::from_secs(auth.login_timeout_secs));
        let shared = self.shared.clone();
        let mut late = Vec::new();
        for token in self.front.clients.tokens() {
            let Some(c) = self.front.clients.get_mut(token) else { continue };
            let age = now.saturating_duration_since(c.shared.accepted);
            if !handshake.is_zero() && age > handshake && c.shared.transport().handshaking() {
                late.push((token, &shared.net.handshake_timeouts));
            } else if login.is_some_and(|l| age > l) && c.shared.user().is_none() && !c.shared.busy() {
                late.push((token, &shared.net.login_timeouts));
            } else if c.shared.stalled(&shared.output) {
                // Holds unread replies that others wait for room for (`output.rs`).
                late.push((token, &shared.net.stalled_readers));
            }
        }
        for (token, counter) in late {
            NetCounters::add(counter, 1);
            self.close(token);
        }
        if self.handshakes.len() > 64 {
            self.prune_handshakes();
        }
    }

    fn close(&mut self, token: Token) {
        let Some(c) = self.front.clients.remove(token) else { return };
        let _ = self.front.poll.registry().deregister(&mut SourceFd(&c.shared.stream().as_raw_fd()));
        let leases = c.shared.close();
        self.shared.release_later(leases);
        // Its parked wait, if any, ends now: no statement, no reply. (One
        // with a worker ends there: see `Worker::request` and `answer`.)
        if c.waits {
            for job in self.shared.waiters.forget(c.shared.id) {
                crate::events::abandon(&self.shared, job, false);
            }
        }
        self.shared.input.give(c.reserved);
        if let Some(job) = c.unqueued {
            self.shared.input.give(job.size);
        }
        NetCounters::add(&self.shared.net.closed, 1);
        self.shared.open_connections.fetch_sub(1, Ordering::Relaxed);
        self.blocked.retain(|t| *t != token);
    }

    /// A worker answered a connection's request while input waited: serve its next one.
    fn answered(&mut self, d: Done) {
        let token = Token(d.token);
        if self.conn(token).is_some_and(|c| c.shared.id == d.conn_id) {
            self.service(token);
        }
    }

    /// The socket takes bytes again: write what waits.
    fn writable(&mut self, token: Token) {
        let Some(c) = self.conn(token) else { return };
        let was_full = c.shared.pending_output() > 0;
        match c.shared.flush() {
            Ok(n) => {
                NetCounters::add(&self.shared.net.bytes_out, n as u64);
                if was_full {
                    self.service(token);
                }
            }
            Err(leases) => {
                self.shared.release_later(leases);
                self.close(token);
            }
        }
    }

    /// Serves a connection as far as it may go now.
    fn service(&mut self, token: Token) {
        let mut flow = self.step(token);
        // Stopped with input behind a busy connection: the worker will say
        // when it is done — unless it already is, then go on here.
        while flow == Flow::Busy {
            let Some(c) = self.conn(token) else { return };
            if !c.shared.wait_for_worker() {
                break;
            }
            flow = self.step(token);
        }
        match flow {
            Flow::Idle | Flow::Busy => {}
            Flow::Blocked => {
                if !self.blocked.contains(&token) {
                    self.blocked.push(token);
                }
            }
            Flow::Close => self.close(token),
        }
    }

    fn step(&mut self, token: Token) -> Flow {
        let stopping = self.shared.stopping.load(Ordering::Relaxed);
        let max_output = self.shared.config.server.max_pending_output;
        loop {
            let Some(c) = self.conn(token) else { return Flow::Idle };
            if c.shared.is_closed() {
                return Flow::Close;
            }
            let busy = c.shared.busy();
            if busy && c.waits && (c.eof || c.hung_up) {
                // A waiting request's client left (or closed its side, as
                // `printf ... | nc -q0` does): Redis closes such a client, and
                // so does mwmq, freeing its slot and its wait at once.
                return Flow::Close;
            }
            if !busy {
                c.shared.resume_input();
            }
            if c.shared.closing() && !busy {
                // QUIT or a protocol error: close once the replies are out.
                return if c.shared.pending_output() == 0 { Flow::Close } else { Flow::Idle };
            }
            if let Some(job) = c.unqueued.take() {
                if let Err(Work::Request(job)) = self.shared.queue.push_fresh(Work::Request(job)) {
                    NetCounters::add(&self.shared.net.queue_full, 1);
                    self.conn(token).expect("still there").unqueued = Some(job);
                    return Flow::Blocked;
                }
                continue;
            }
            let c = self.conn(token).expect("still there");
            // Only a busy connection holds its input back; whether it still
            // is, the service loop asks in a way no worker can slip past. One
            // that holds unread replies waits for them to be read while the
            // output budget is used up (its writable events bring it back).
            let pending = c.shared.pending_output();
            let may_parse = !stopping && pending <= max_output && self.shared.output.may_run(pending);
            if !busy && may_parse {
                match self.parse(token) {
                    Some(flow) => return flow,
                    None => {
                        // A request was dispatched, or the buffer is used up.
                    }
                }
            }
            let c = self.conn(token).expect("still there");
            if c.drained || c.eof {
                if c.eof && !c.shared.busy() && c.rbuf.is_empty() {
                    // The client is done sending: close once it has every reply.
                    return if c.shared.pending_output() == 0 { Flow::Close } else { Flow::Idle };
                }
                let held = !c.rbuf.is_empty() || c.eof;
                return if held && may_parse { Flow::Busy } else { Flow::Idle };
            }
            if c.rbuf.len() >= READ_AHEAD {
                // Enough read ahead: the socket keeps the rest (not drained).
                return if may_parse { Flow::Busy } else { Flow::Idle };
            }
            // Read into the thread's scratch buffer: an idle connection holds no buffer at all.
            let stream = c.shared.clone();
            let r = stream.transport().read(&mut self.scratch);
            let c = self.front.clients.get_mut(token).expect("still there");
            match r {
                Ok(0) => c.eof = true,
                Ok(n) => {
                    c.rbuf.extend_from_slice(&self.scratch[..n]);
                    c.last_read_ns = now_ns();
                    NetCounters::add(&self.shared.net.bytes_in, n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.drained = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::InvalidData && stream.transport().is_tls() => {
                    // A failed handshake, or plaintext sent to the TLS port.
                    NetCounters::add(&self.shared.net.tls_handshake_failures, 1);
                    self.shared.tls_log.note(&e);
                    return Flow::Close;
                }
                Err(_) => return Flow::Close,
            }
        }
    }

    /// Feeds buffered input to the parser until a request is dispatched or
    /// the input is used up. `Some(flow)` ends the step.
    fn parse(&mut self, token: Token) -> Option<Flow> {
        let max_body = self.shared.config.server.max_body;
        loop {
            let shared = self.shared.clone();
            let c = self.conn(token)?;
            if c.rbuf.is_empty() {
                return None;
            }
            // Budget a large request before its bytes are held.
            let want = c.parser.held() + c.parser.need();
            if want > SMALL && want > c.reserved {
                let more = want - c.reserved;
                if !shared.input.take(more) {
                    return Some(Flow::Blocked);
                }
                c.reserved += more;
            }
            let (n, result) = c.parser.feed(&c.rbuf);
            c.rbuf.drain(..n);
            if c.rbuf.is_empty() {
                c.rbuf = Vec::new();
            }
            let request = match result {
                Ok(None) => continue,
                Ok(Some(Request::Empty)) => continue,
                Ok(Some(r)) => r,
                Err(e) => {
                    NetCounters::add(&shared.net.protocol_errors, 1);
                    let bytes = Reply::err(e.0).to_bytes();
                    c.shared.close_after_replies();
                    let _ = c.shared.deliver(bytes, Vec::new());
                    c.rbuf.clear();
                    return Some(if c.shared.pending_output() == 0 { Flow::Close } else { Flow::Idle });
                }
            };
            let cmd = match request {
                Request::Args(args) => command::parse(&args, &self.limits),
                Request::TooLarge { len, .. } => Err(Reply::err(format!(
                    "an argument of {len} bytes is over the server's limit of {max_body} bytes (max_body)"
                ))),
                Request::Empty => unreachable!("skipped above"),
            };
            let t_parsed = now_ns();
            let wait_until = match &cmd {
                Ok(c) => c.wait().map(|(_, ms)| Instant::now() + Duration::from_millis(ms)),
                Err(_) => None,
            };
            let request_id = self.next_request_id;
            self.next_request_id += 1;
            let c = self.conn(token)?;
            let job = Box::new(Job {
                conn: c.shared.clone(),
                token: token.0,
                cmd,
                request_id,
                t_recv: if c.last_read_ns == 0 { t_parsed } else { c.last_read_ns.min(t_parsed) },
                t_parsed,
                t_enqueue: t_parsed,
                size: std::mem::take(&mut c.reserved),
                reply: None,
                wait_until,
                parked_ns: 0,
                parked_at: None,
                last_try: false,
                login: None,
            });
            c.waits = job.wait_until.is_some();
            c.shared.set_busy();
            if let Err(Work::Request(job)) = shared.queue.push_fresh(Work::Request(job)) {
                NetCounters::add(&shared.net.queue_full, 1);
                c.unqueued = Some(job);
                return Some(Flow::Blocked);
            }
            return None;
        }
    }
}
