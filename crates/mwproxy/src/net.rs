//! Net threads: accept clients, read and parse their requests, queue them.
//!
//! Each net thread runs an edge-triggered mio event loop over the listening
//! socket (shared by all net threads) and its own client connections. Parsed
//! requests are numbered per connection and put in the connection's line; a
//! connection that had nothing waiting is put on the request queue
//! (`queue.rs`). When the queue is full, or the connection's line or the
//! proxy's memory budget for waiting requests is used up (`budget.rs`), the
//! thread stops reading that connection (TCP backpressure reaches the client)
//! and retries every millisecond. It also stops reading a client that leaves
//! too many replies unread, and resumes it when the client reads again.
//! Inputs the parser refuses are answered right here with memcached's error,
//! in order with the other replies.
//!
//! Clients over the connection limit, or arriving when the process is out of
//! file descriptors, get `SERVER_ERROR Too many open connections` and are
//! closed (`mwserve::listen`).
//! A connection whose first byte is the binary protocol's magic (0x80)
//! speaks memcached's binary protocol from then on, as memcached decides:
//! its requests are turned into the same requests the text and meta parsers
//! produce (`mcproto::binary`), carry their binary context through the
//! routing core, and their replies are turned back into binary responses.
//! Logins over it are SASL PLAIN against the same users as text logins.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcproto::auth::Auth;
use mcproto::binary::{self, Binary, Ctx};
use mcproto::{parse_request, Parsed, ReadBuf, Request};
use mio::{Events, Interest, Token};
use mwserve::listen::{Front, Transport, WAKER};
use mwserve::throttle::{Attempt, Refused, Throttled};
use mwstats::clock::now_ns;

use crate::conn::{ClientConn, Job};
use crate::generation::Generation;
use crate::pipeline::{Pipeline, LINK_BASE};
use crate::route::Work;
use crate::shared::Shared;
use crate::stats::{add, bump};

/// Reads per connection before other connections get their turn.
const READ_BUDGET: usize = 16;
const READ_CHUNK: usize = 16 * 1024;
/// The first byte of every request of memcached's binary protocol.
const BINARY_MAGIC: u8 = 0x80;
/// How often connections are checked against the handshake and login deadlines.
const SWEEP: Duration = Duration::from_millis(250);
/// memcached's answer to a client over the connection limit.
pub const TOO_MANY: &[u8] = b"SERVER_ERROR Too many open connections\r\n";

/// A client connection as its net thread sees it.
pub(crate) struct Conn {
    shared: Arc<ClientConn>,
    rbuf: ReadBuf,
    /// Bytes still to discard (the data block of a refused value).
    swallow: usize,
    /// Bytes of the input budget held for the request that has begun in
    /// `rbuf` and is still arriving (`budget::Budget::reserve`).
    reserved: usize,
    /// Requests numbered so far.
    issued: u64,
    /// The connection has work but found the queue full.
    unqueued: bool,
    /// No more reading: the client quit, sent something fatal, or closed its side.
    done: bool,
    /// Reading paused because the client does not read its replies.
    output_paused: bool,
    /// An event said the client closed its side: read until end of stream,
    /// because no further edge will announce it.
    peer_closed: bool,
    /// When the last read returned (t_recv of the requests it completed).
    last_read_ns: u64,
    /// Logged in, or no login asked for (`--auth-file`).
    authenticated: bool,
    /// The client speaks the binary protocol (its first byte was 0x80).
    binary: bool,
    /// Failed logins on this connection.
    login_failures: u32,
    /// Where the client is (failed logins are throttled by it): its
    /// address, or a unix socket's client's uid.
    peer: Option<mwserve::throttle::Source>,
    /// When it was accepted (the handshake and login deadlines run from here).
    accepted: Instant,
}

/// What reading a connection led to.
enum Flow {
    /// Everything available was read.
    Drained,
    /// Budget used up; read again soon.
    More,
    /// Waiting for room in the queue or in the input budgets.
    Blocked,
    /// Waiting for the client to read its replies.
    Paused,
    /// The connection is finished or broken.
    Finished,
}

/// One net thread.
pub struct NetThread {
    front: Front<Conn>,
    shared: Arc<Shared>,
    /// The configuration in use (parser limits, users, TLS), refreshed as
    /// connections are read.
    current: Arc<Generation>,
    blocked: Vec<Token>,
    ready: VecDeque<Token>,
    /// Request ids: `next_id * net_threads + index`, unique per process.
    ids: RequestIds,
    /// The async engine: this loop carries its connections' requests itself.
    pipeline: Option<Pipeline>,
    /// Where reads land before they are kept in their connection's buffer.
    scratch: Vec<u8>,
    /// TLS connections accepted and maybe still handshaking, oldest first
    /// (with when they were accepted: a token is used again after a close).
    handshakes: VecDeque<(Token, Instant)>,
    /// This loop's share of `[tls] max_handshaking`.
    handshake_cap: usize,
    /// When connections are next checked against their deadlines.
    next_sweep: Instant,
}

/// Hands out process-wide unique request ids without sharing a counter.
struct RequestIds {
    next: u64,
    index: u64,
    stride: u64,
}

impl RequestIds {
    fn take(&mut self) -> u64 {
        let id = self.next * self.stride + self.index;
        self.next += 1;
        id
    }
}

impl NetThread {
    /// A net thread serving the clients of `front`. With `pipeline` (the
    /// async engine) the thread carries its connections' requests to the
    /// servers itself instead of queueing them.
    pub(crate) fn new(index: usize, front: Front<Conn>, shared: Arc<Shared>, pipeline: Option<Pipeline>) -> NetThread {
        let loops = match pipeline {
            Some(_) => shared.config.proxy.loops(),
            None => shared.config.proxy.net_threads,
        };
        let ids = RequestIds { next: 0, index: index as u64, stride: loops as u64 };
        let handshake_cap = shared.config.tls.max_handshaking.div_ceil(loops.max(1)).max(1);
        NetThread {
            handshake_cap,
            pipeline,
            scratch: vec![0; READ_CHUNK],
            ids,
            front,
            current: shared.generation(),
            shared,
            blocked: Vec::new(),
            ready: VecDeque::new(),
            handshakes: VecDeque::new(),
            next_sweep: Instant::now() + SWEEP,
        }
    }

    /// Runs until shutdown is requested and in-flight requests are answered.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut grace_deadline: Option<Instant> = None;
        loop {
            let pipelined = self.pipeline.as_ref();
            let timeout = if !self.ready.is_empty() || pipelined.is_some_and(Pipeline::has_work) {
                Some(Duration::ZERO)
            } else if !self.blocked.is_empty() || grace_deadline.is_some() {
                Some(Duration::from_millis(1))
            } else {
                // (Woken at least every SWEEP for the connections' deadlines.)
                Some(pipelined.and_then(Pipeline::sleep_limit).map_or(SWEEP, |t| t.min(SWEEP)))
            };
            if !self.front.wait(&mut events, timeout) {
                break;
            }
            let woke = now_ns();
            let mut removed = Vec::new();
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    token if Front::<Conn>::is_listener(token) => self.accept(),
                    token if token.0 >= LINK_BASE => {
                        if let Some(p) = self.pipeline.as_mut() {
                            p.link_event(token, ev);
                        }
                    }
                    token => {
                        if self.conn(token).is_none() {
                            continue;
                        }
                        if ev.is_writable() {
                            self.writable(token);
                        }
                        if ev.is_read_closed() || ev.is_error() {
                            if let Some(c) = self.conn(token) {
                                c.peer_closed = true;
                            }
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.service(token);
                        }
                        if self.conn(token).is_some_and(|c| c.shared.is_closed()) {
                            removed.push(token);
                        }
                    }
                }
            }
            self.retry_blocked(&mut removed);
            self.sweep(&mut removed);
            for _ in 0..self.ready.len() {
                let token = self.ready.pop_front().expect("non-empty");
                self.service(token);
                if self.conn(token).is_some_and(|c| c.shared.is_closed()) {
                    removed.push(token);
                }
            }
            for token in removed {
                self.remove(token);
            }
            if let Some(p) = self.pipeline.as_mut() {
                p.pump(self.front.poll.registry());
                p.add_busy(now_ns().saturating_sub(woke));
            }
            if self.shared.stopping.load(Ordering::Relaxed) {
                let deadline = *grace_deadline.get_or_insert_with(|| {
                    self.begin_shutdown();
                    Instant::now() + Duration::from_secs(self.shared.config.proxy.shutdown_grace_secs)
                });
                if self.all_idle() || Instant::now() >= deadline {
                    break;
                }
            }
        }
        for token in self.front.clients.tokens() {
            if let Some(c) = self.front.clients.remove(token) {
                c.shared.close();
                bump(&self.shared.net.closed_connections);
            }
        }
    }

    /// The socket can take bytes again: write what waits, and resume reading a
    /// client that was paused for not reading its replies.
    fn writable(&mut self, token: Token) {
        let NetThread { front, shared, ready, pipeline, .. } = self;
        let Some(conn) = front.clients.get_mut(token) else { return };
        if conn.shared.flush(&shared.net) {
            // Its waiting requests may run again.
            match pipeline {
                Some(p) => p.runnable(conn.shared.clone()),
                None => shared.queue.push_again(conn.shared.clone()),
            }
        }
        if conn.output_paused && shared.budget.may_run(conn.shared.pending_output()) {
            conn.output_paused = false;
            ready.push_back(token);
        }
    }

    fn conn(&mut self, token: Token) -> Option<&mut Conn> {
        self.front.clients.get_mut(token)
    }

    fn accept(&mut self) {
        let NetThread { front, shared, ready, current, .. } = self;
        shared.refresh(current);
        let net = &shared.net;
        let full = || {
            let open = net.total_connections.load(Ordering::Relaxed) - net.closed_connections.load(Ordering::Relaxed);
            open as usize >= shared.max_connections
        };
        let generation = &*current;
        let conn = |stream, tls: bool| {
            let transport = match Transport::new(stream, tls.then_some(generation.tls.as_ref()).flatten()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!("cannot start a TLS session: {e}");
                    return None;
                }
            };
            bump(&net.total_connections);
            let peer = transport.socket().peer_source();
            Some(Conn {
                shared: Arc::new(ClientConn::new(transport, shared.budget.clone())),
                // Grown on the first read: an idle connection costs a few bytes.
                rbuf: ReadBuf::with_capacity(0),
                swallow: 0,
                reserved: 0,
                issued: 0,
                unqueued: false,
                done: false,
                output_paused: false,
                peer_closed: false,
                last_read_ns: 0,
                authenticated: generation.users.is_none(),
                binary: false,
                login_failures: 0,
                peer,
                accepted: Instant::now(),
            })
        };
        let accepted = front.accept(full, || bump(&net.rejected_connections), conn);
        for &token in &accepted {
            if let Some(c) = front.clients.get_mut(token).filter(|c| c.shared.transport().is_tls()) {
                self.handshakes.push_back((token, c.accepted));
            }
        }
        ready.extend(accepted);
        self.cap_handshakes();
    }

    /// Forgets the connections that finished their handshake or went away.
    fn prune_handshakes(&mut self) {
        let entries = std::mem::take(&mut self.handshakes);
        self.handshakes = entries.into_iter().filter(|&(t, at)| self.still_handshaking(t, at)).collect();
    }

    /// Whether `token` is still the connection accepted at `at` and in its TLS handshake.
    fn still_handshaking(&mut self, token: Token, at: Instant) -> bool {
        self.conn(token).is_some_and(|c| c.accepted == at && !c.done && c.shared.transport().handshaking())
    }

    /// Past `[tls] max_handshaking` (this loop's share of it), closes the
    /// connections that have been handshaking longest: silent sockets cannot
    /// hold every slot, and a client that completes its handshake promptly
    /// always gets in.
    fn cap_handshakes(&mut self) {
        if self.handshakes.len() <= self.handshake_cap {
            return;
        }
        self.prune_handshakes();
        while self.handshakes.len() > self.handshake_cap {
            let (token, _) = self.handshakes.pop_front().expect("over the cap");
            bump(&self.shared.net.handshake_refused);
            self.remove(token);
        }
    }

    /// Closes connections past their deadlines: a TLS handshake not finished
    /// within `[tls] handshake_timeout_secs`, a login not done within
    /// `[auth] login_timeout_secs` (where users are configured).
    fn sweep(&mut self, removed: &mut Vec<Token>) {
        let now = Instant::now();
        if now < self.next_sweep {
            return;
        }
        self.next_sweep = now + SWEEP;
        self.shared.refresh(&mut self.current);
        let handshake = Duration::from_secs(self.shared.config.tls.handshake_timeout_secs);
        let auth = &self.current.config.auth;
        let login = (self.current.users.is_some() && auth.login_timeout_secs > 0)
            .then(|| Duration::from_secs(auth.login_timeout_secs));
        let net = &self.shared.net;
        for token in self.front.clients.tokens() {
            let Some(c) = self.front.clients.get_mut(token) else { continue };
            if c.done {
                continue;
            }
            let age = now.saturating_duration_since(c.accepted);
            let late = if !handshake.is_zero() && age > handshake && c.shared.transport().handshaking() {
                Some(&net.handshake_timeouts)
            } else if login.is_some_and(|l| age > l) && !c.authenticated {
                Some(&net.login_timeouts)
            } else {
                None
            };
            if let Some(counter) = late {
                bump(counter);
                c.done = true;
                c.shared.close();
                removed.push(token);
            }
        }
        if self.handshakes.len() > 64 {
            self.prune_handshakes();
        }
    }

    fn remove(&mut self, token: Token) {
        if let Some(c) = self.front.clients.remove(token) {
            self.shared.budget.input_moved(c.reserved, 0);
            c.shared.forget_waiting();
            let _ = self.front.poll.registry().deregister(&mut ClientConnSource(&c.shared));
            c.shared.close();
            bump(&self.shared.net.closed_connections);
            self.blocked.retain(|t| *t != token);
            self.ready.retain(|t| *t != token);
        }
    }

    /// Reads and parses a connection as far as it may go now.
    fn service(&mut self, token: Token) {
        let flow = self.read_conn(token);
        match flow {
            Flow::More => self.ready.push_back(token),
            Flow::Blocked => {
                if !self.blocked.contains(&token) {
                    self.blocked.push(token);
                }
            }
            Flow::Drained | Flow::Paused | Flow::Finished => {}
        }
    }

    fn retry_blocked(&mut self, removed: &mut Vec<Token>) {
        let blocked = std::mem::take(&mut self.blocked);
        for token in blocked {
            self.service(token);
            if self.conn(token).is_some_and(|c| c.shared.is_closed()) {
                removed.push(token);
            }
        }
    }

    fn read_conn(&mut self, token: Token) -> Flow {
        let NetThread { front, shared, ids, pipeline, scratch, current, .. } = self;
        let Some(conn) = front.clients.get_mut(token) else { return Flow::Finished };
        // The parser's limits and the users of the configuration in use.
        shared.refresh(current);
        let generation = &**current;
        let mut reads = 0;
        let mut drained = false;
        loop {
            if conn.unqueued {
                match shared.queue.push_fresh(conn.shared.clone()) {
                    Ok(()) => conn.unqueued = false,
                    Err(_) => return Flow::Blocked,
                }
            }
            if conn.done {
                return Flow::Finished;
            }
            let parsed = parse_all(conn, shared, generation, ids, pipeline.as_mut());
            // What was parsed no longer arrives: its share of the budget goes back.
            let want = arriving(conn);
            if want < conn.reserved && shared.budget.reserve(conn.reserved, want) {
                conn.reserved = want;
            }
            if let Some(flow) = parsed {
                return flow;
            }
            if !shared.budget.may_run(conn.shared.pending_output()) {
                conn.output_paused = true;
                return Flow::Paused;
            }
            if !conn.shared.may_read() {
                return Flow::Blocked;
            }
            if shared.stopping.load(Ordering::Relaxed) {
                return Flow::Drained;
            }
            if reads == READ_BUDGET {
                return Flow::More;
            }
            if drained && !conn.peer_closed {
                // The last read did not fill the buffer, so the socket was empty:
                // the next bytes, or the end of the stream, raise a new
                // edge-triggered event. An end that came with the bytes just
                // read raises none, so then the loop reads on until it sees it.
                return Flow::Drained;
            }
            // A request that has begun holds its whole size of the budget
            // before more of it is read; without room, it waits (as a
            // connection whose line is full does).
            let want = arriving(conn);
            if !shared.budget.reserve(conn.reserved, want) {
                return Flow::Blocked;
            }
            conn.reserved = want;
            reads += 1;
            conn.rbuf.shrink_to(READ_CHUNK);
            // A read with nothing pending lands in the loop's scratch buffer
            // and only what came is kept in the connection's, so an idle
            // connection holds no buffer; the rest of a request that has
            // begun is read where it is kept, without a second copy.
            let direct = !conn.rbuf.is_empty();
            let into: &mut [u8] = if direct { conn.rbuf.spare(READ_CHUNK / 4) } else { scratch };
            let room = into.len();
            let transport = conn.shared.transport();
            let r = transport.read(into);
            match r {
                Ok(0) => {
                    conn.done = true;
                    conn.shared.client_done(conn.issued, &shared.net);
                    return Flow::Finished;
                }
                Ok(n) => {
                    // A short read empties a plain socket; TLS may hold more records.
                    drained = n < room && !transport.is_tls();
                    conn.last_read_ns = now_ns();
                    if !direct {
                        conn.rbuf.spare(n)[..n].copy_from_slice(&scratch[..n]);
                    }
                    conn.rbuf.commit(n);
                    add(&shared.net.bytes_read, n as u64);
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => return Flow::Drained,
                    io::ErrorKind::Interrupted => {}
                    _ => {
                        if e.kind() == io::ErrorKind::InvalidData && transport.is_tls() {
                            bump(&shared.net.tls_handshake_failures);
                            shared.tls_log.note(&e);
                        }
                        conn.done = true;
                        conn.shared.close();
                        return Flow::Finished;
                    }
                },
            }
        }
    }

    fn begin_shutdown(&mut self) {
        self.front.stop_accepting();
    }

    fn all_idle(&self) -> bool {
        self.pipeline.as_ref().is_none_or(Pipeline::idle)
            && self.front.clients.iter().all(|c| !c.unqueued && c.shared.idle(c.issued))
    }
}

/// Bytes the request that has begun in the connection's buffer will take
/// once it is all there: its declared size (a binary frame's header, a
/// storage command's line), else what is there and one more read (a line
/// still coming); 0 when nothing has begun or the rest is swallowed.
fn arriving(conn: &Conn) -> usize {
    let buf = conn.rbuf.filled();
    if buf.is_empty() || conn.swallow > 0 {
        return 0;
    }
    let declared = if conn.binary {
        binary::frame_len(buf)
    } else if conn.authenticated {
        mcproto::parse::declared_len(buf)
    } else {
        None
    };
    declared.unwrap_or(buf.len() + READ_CHUNK / 4).max(buf.len())
}

/// Parses every whole request in the buffer and puts it in the connection's
/// line. Returns a flow when reading must stop, `None` when more bytes are needed.
fn parse_all(
    conn: &mut Conn,
    shared: &Shared,
    generation: &Generation,
    ids: &mut RequestIds,
    mut pipeline: Option<&mut Pipeline>,
) -> Option<Flow> {
    let net = &shared.net;
    loop {
        if conn.swallow > 0 {
            let n = conn.swallow.min(conn.rbuf.len());
            conn.rbuf.consume(n);
            conn.swallow -= n;
            if conn.swallow > 0 {
                return None;
            }
        }
        if !conn.shared.may_read() {
            return Some(Flow::Blocked);
        }
        if conn.issued == 0 && !conn.binary && conn.rbuf.filled().first() == Some(&BINARY_MAGIC) {
            conn.binary = true;
            bump(&net.binary_connections);
        }
        if conn.binary {
            let (work, size, ctx) = match binary_step(conn, shared, generation) {
                Step::Wait => return None,
                Step::Answered => continue,
                Step::Stop => return Some(Flow::Finished),
                Step::Job(work, size, ctx) => (work, size, ctx),
            };
            if let Some(flow) = queue(conn, shared, ids, pipeline.as_deref_mut(), work, size, Some(Box::new(ctx))) {
                return Some(flow);
            }
            continue;
        }
        if !conn.authenticated {
            if let Some(flow) = log_in(conn, shared, generation) {
                return flow;
            }
        }
        let (work, size) = match parse_request(conn.rbuf.filled(), &generation.limits) {
            Parsed::Incomplete => return None,
            Parsed::Request { request: Request::Quit, .. } => {
                conn.shared.deliver(conn.issued, Vec::new(), true, net);
                conn.issued += 1;
                conn.done = true;
                return Some(Flow::Finished);
            }
            Parsed::Request { request, consumed } => {
                conn.rbuf.consume(consumed);
                (Work::Request(request), consumed)
            }
            Parsed::Reject(r) => {
                bump(&net.protocol_errors);
                if r.close {
                    conn.shared.deliver(conn.issued, Vec::new(), true, net);
                    conn.issued += 1;
                    conn.done = true;
                    return Some(Flow::Finished);
                }
                conn.rbuf.consume(r.consumed);
                conn.swallow = r.swallow;
                match r.stale_key {
                    Some(key) => (Work::DropStale { key, reply: r.reply }, r.consumed),
                    None => {
                        let bytes = r.reply.map(|l| format!("{l}\r\n").into_bytes()).unwrap_or_default();
                        conn.shared.deliver(conn.issued, bytes, false, net);
                        conn.issued += 1;
                        continue;
                    }
                }
            }
        };
        if let Some(flow) = queue(conn, shared, ids, pipeline.as_deref_mut(), work, size, None) {
            return Some(flow);
        }
    }
}

/// Numbers a parsed request and puts it in its connection's line (and the
/// connection on its loop or the queue); `Some(flow)` when reading must stop.
fn queue(
    conn: &mut Conn,
    shared: &Shared,
    ids: &mut RequestIds,
    pipeline: Option<&mut Pipeline>,
    work: Work,
    size: usize,
    bin: Option<Box<Ctx>>,
) -> Option<Flow> {
    let t_parsed = now_ns();
    let job = Job {
        seq: conn.issued,
        work,
        request_id: ids.take(),
        t_recv: conn.last_read_ns,
        t_parsed,
        t_enqueue: t_parsed,
        size,
        bin,
    };
    conn.issued += 1;
    if conn.shared.admit(job) {
        if let Some(p) = pipeline {
            p.runnable(conn.shared.clone());
        } else if let Err(_full) = shared.queue.push_fresh(conn.shared.clone()) {
            bump(&shared.net.queue_full);
            conn.unqueued = true;
            return Some(Flow::Blocked);
        }
    }
    None
}

/// What one binary request led to.
enum Step {
    /// More bytes are needed.
    Wait,
    /// Answered here (noop, a refusal, a login): go on with the next.
    Answered,
    /// The connection is finished (quit, or input memcached closes on).
    Stop,
    /// A request for the servers, its size and its binary context.
    Job(Work, usize, Ctx),
}

/// Answers `reply` in order with the other replies.
fn answer(conn: &mut Conn, reply: Vec<u8>, close: bool, shared: &Shared) {
    conn.shared.deliver(conn.issued, reply, close, &shared.net);
    conn.issued += 1;
    if close {
        conn.done = true;
    }
}

/// Reads the binary request at the front of the connection's buffer.
fn binary_step(conn: &mut Conn, shared: &Shared, generation: &Generation) -> Step {
    let sasl = generation.users.is_some();
    match binary::parse_binary(conn.rbuf.filled(), &generation.limits, sasl, conn.authenticated) {
        Binary::Incomplete => Step::Wait,
        // Before login, `version` is answered here, never carried to a server.
        Binary::Request { request: Request::Version, ctx, consumed } if !conn.authenticated => {
            conn.rbuf.consume(consumed);
            answer(conn, binary::success_with(ctx.opcode, ctx.opaque, crate::VERSION.as_bytes()), false, shared);
            Step::Answered
        }
        Binary::Request { request, ctx, consumed } => {
            conn.rbuf.consume(consumed);
            Step::Job(Work::Request(request), consumed, ctx)
        }
        Binary::Noop { reply, consumed } => {
            conn.rbuf.consume(consumed);
            answer(conn, reply, false, shared);
            Step::Answered
        }
        Binary::Quit { reply } => {
            answer(conn, reply, true, shared);
            Step::Stop
        }
        Binary::Sasl { opcode, opaque, mechanism, data, consumed } => {
            conn.rbuf.consume(consumed);
            sasl_step(conn, shared, generation, (opcode, opaque), &mechanism, &data)
        }
        Binary::Refuse { reply, consumed, swallow, close, stale_key } => {
            bump(&shared.net.protocol_errors);
            if close {
                answer(conn, reply, true, shared);
                return Step::Stop;
            }
            conn.rbuf.consume(consumed);
            conn.swallow = swallow;
            match (stale_key, binary::Frame::read(&reply)) {
                // A value too large: its key's old value is dropped on its
                // replicas, as for a text `set`, and the reply says "Too large."
                (Some(key), Some((f, _))) => {
                    let ctx = Ctx { opcode: f.opcode, opaque: f.opaque, key: Vec::new() };
                    let work = Work::DropStale { key, reply: Some(mcproto::parse::TOO_LARGE) };
                    Step::Job(work, consumed, ctx)
                }
                _ => {
                    answer(conn, reply, false, shared);
                    Step::Answered
                }
            }
        }
    }
}

/// The SASL commands: `PLAIN` is the one mechanism, checked against the
/// users of `--auth-file` as text logins are ([`check_login`]), failures
/// counted, throttled per source and per user name (a throttled login hears
/// the auth error status with the throttle's message), closing the
/// connection at `[auth] max_failures`, and whatever was pipelined behind a
/// failed login dropped unread.
fn sasl_step(
    conn: &mut Conn,
    shared: &Shared,
    generation: &Generation,
    (opcode, opaque): (u8, u32),
    mechanism: &[u8],
    data: &[u8],
) -> Step {
    let net = &shared.net;
    let Some(users) = generation.users.as_ref() else {
        answer(conn, binary::error(opcode, opaque, binary::status::UNKNOWN_COMMAND), false, shared);
        return Step::Answered;
    };
    if opcode == binary::op::SASL_LIST_MECHS {
        answer(conn, binary::success_with(opcode, opaque, b"PLAIN"), false, shared);
        return Step::Answered;
    }
    bump(&net.auth_cmds);
    let offered = plain(data).filter(|_| opcode == binary::op::SASL_AUTH && mechanism == b"PLAIN");
    let user = plain(data).map(|(user, _)| user);
    let checked = match offered {
        Some((user, password)) => check_login(conn, shared, "binary SASL", user, password, |u, p| users.check(u, p)),
        // Not a PLAIN login: nothing to check, still a failure (within the throttle).
        None => match shared.logins.check(&Attempt { source: conn.peer, user, secret: b"", via: "binary SASL" }) {
            Err(Refused::Throttled(t)) => Err(t),
            _ => Ok(false),
        },
    };
    if checked == Ok(true) {
        conn.authenticated = true;
        answer(conn, binary::success_with(opcode, opaque, b"Authenticated"), false, shared);
        return Step::Answered;
    }
    let reply = match &checked {
        // Told why, never "Auth failure": the password was not checked.
        Err(t) => binary::error_with(opcode, opaque, binary::status::AUTH_ERROR, t.to_string().as_bytes()),
        Ok(_) => binary::error(opcode, opaque, binary::status::AUTH_ERROR),
    };
    let close = login_failed(conn, shared, generation, checked.is_err());
    answer(conn, reply, close, shared);
    if close {
        bump(&net.auth_closed);
        return Step::Stop;
    }
    Step::Answered
}

/// A login, text or SASL, within the throttle (`mwserve::throttle`): the
/// password checked with `check` (`Ok(true)`: right), charged to the source
/// and the user name before it is; a password that failed lately from the
/// same source for the same user is wrong without a check and not counted
/// again (`Ok(false)`); a throttled login is refused unchecked (`Err`).
fn check_login(
    conn: &Conn,
    shared: &Shared,
    via: &'static str,
    user: &[u8],
    password: &[u8],
    check: impl FnOnce(&[u8], &[u8]) -> bool,
) -> Result<bool, Throttled> {
    let attempt = Attempt { source: conn.peer, user: Some(user), secret: password, via };
    match shared.logins.begin(&attempt) {
        Err(Refused::Throttled(t)) => Err(t),
        Err(Refused::Repeated) => Ok(false),
        Ok(()) => {
            let right = check(user, password);
            shared.logins.checked(&attempt, right);
            Ok(right)
        }
    }
}

/// A failed login, text or SASL: counted (or the throttle counted when it
/// was refused unchecked), and whatever was pipelined behind it dropped
/// unread (it was sent before the client could know the login failed). True
/// when the connection must now close: the login was throttled, or this
/// connection reached `[auth] max_failures`.
fn login_failed(conn: &mut Conn, shared: &Shared, generation: &Generation, locked: bool) -> bool {
    bump(&shared.net.auth_errors);
    if locked {
        bump(&shared.net.auth_throttled);
    }
    conn.login_failures += 1;
    let rest = conn.rbuf.len();
    conn.rbuf.consume(rest);
    locked || conn.login_failures >= generation.config.auth.max_failures.max(1)
}

/// A SASL PLAIN message: `[authzid] NUL authcid NUL password`; an authzid,
/// when given, must name the same user (no user acts as another).
fn plain(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (authz, user, password) = (parts.next()?, parts.next()?, parts.next()?);
    (authz.is_empty() || authz == user).then_some((user, password))
}

/// Reads login attempts (and what refuses them) before the connection's
/// first request, as memcached with `-Y` does, and answers them in order with
/// the other replies. Like memcached, which keeps one reply per read while a
/// connection is not logged in, the attempts of one read are answered by the
/// last one's reply (a client that pipelines a refused command and its data
/// block hears one refusal, not two). `None`: logged in, go on; `Some(flow)`:
/// stop (`None` inside: more bytes are needed).
///
/// Beyond memcached, guessing is made expensive: whatever was pipelined
/// behind a failed login is dropped unread (it was sent before the client
/// could know the login failed), the connection is closed at its
/// `[auth] max_failures`-th failure, and a source or a user name that failed
/// too often (`mwserve::throttle`) has its logins refused unchecked — told
/// `CLIENT_ERROR too many failed logins ...; retry in N s` — and the
/// connection closed.
fn log_in(conn: &mut Conn, shared: &Shared, generation: &Generation) -> Option<Option<Flow>> {
    let net = &shared.net;
    let users = generation.users.as_ref()?;
    let mut reply: Option<Vec<u8>> = None;
    let mut close = false;
    let flow = loop {
        let consumed = match mcproto::auth::parse_auth(conn.rbuf.filled()) {
            Auth::Incomplete => break Some(None),
            Auth::Close => {
                conn.shared.close();
                conn.done = true;
                return Some(Some(Flow::Finished));
            }
            Auth::Refused { consumed, reply: r } => {
                reply = Some(r.to_vec());
                consumed
            }
            Auth::Credentials { consumed, user, password } => {
                bump(&net.auth_cmds);
                let checked = check_login(conn, shared, "the text protocol", user, password, |u, p| users.check(u, p));
                reply = Some(match &checked {
                    // Told why, never "authentication failure": the password was not checked.
                    Err(t) => format!("CLIENT_ERROR {t}\r\n").into_bytes(),
                    Ok(true) => mcproto::auth::STORED.to_vec(),
                    Ok(false) => mcproto::auth::FAILURE.to_vec(),
                });
                conn.authenticated = checked == Ok(true);
                if !conn.authenticated {
                    close = login_failed(conn, shared, generation, checked.is_err());
                    break Some(None);
                }
                consumed
            }
        };
        conn.rbuf.consume(consumed);
        if conn.authenticated {
            break None;
        }
    };
    if let Some(r) = reply {
        conn.shared.deliver(conn.issued, r, close, net);
        conn.issued += 1;
    }
    if close {
        bump(&net.auth_closed);
        conn.done = true;
        return Some(Some(Flow::Finished));
    }
    flow
}

/// Lets the registry deregister a stream that lives inside an `Arc`.
struct ClientConnSource<'a>(&'a ClientConn);

impl mio::event::Source for ClientConnSource<'_> {
    fn register(&mut self, _: &mio::Registry, _: Token, _: Interest) -> io::Result<()> {
        unreachable!("only used to deregister")
    }

    fn reregister(&mut self, _: &mio::Registry, _: Token, _: Interest) -> io::Result<()> {
        unreachable!("only used to deregister")
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        mio::unix::SourceFd(&self.0.transport().socket().as_raw_fd()).deregister(registry)
    }
}
