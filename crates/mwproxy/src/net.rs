//! Net threads: accept clients, read and parse their requests, queue them.
//!
//! Each net thread runs an edge-triggered mio event loop over the listening
//! socket (shared by all net threads) and its own client connections. Parsed
//! requests are numbered per connection and put on the bounded request queue.
//! When the queue is full the thread keeps the request, stops reading that
//! connection (TCP backpressure reaches the client) and retries every
//! millisecond. It also stops reading a client that leaves more than
//! `max_pending_output` bytes of replies unread. Inputs the parser refuses are
//! answered right here with memcached's error, in order with the other replies.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use mcproto::{parse_request, Limits, Parsed, ReadBuf, Request};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};
use mwstats::clock::now_ns;

use crate::conn::{Admit, ClientConn};
use crate::server::Shared;
use crate::stats::{add, bump};
use crate::worker::{Job, Work};

/// Token of the waker that signals shutdown.
pub const WAKER: Token = Token(0);
const LISTENER: Token = Token(1);
const FIRST_CONN: usize = 2;
/// Reads per connection before other connections get their turn.
const READ_BUDGET: usize = 16;
/// Requests of one connection that may wait behind the one in progress before
/// mwproxy stops reading that connection.
const MAX_PIPELINE: usize = 4096;
const READ_CHUNK: usize = 16 * 1024;

/// A client connection as its net thread sees it.
struct Conn {
    shared: Arc<ClientConn>,
    rbuf: ReadBuf,
    /// Bytes still to discard (the data block of a refused value).
    swallow: usize,
    /// Requests numbered so far.
    issued: u64,
    /// A request waiting for room in the queue.
    stalled: Option<Job>,
    /// No more reading: the client quit, sent something fatal, or closed its side.
    done: bool,
    /// Reading paused because the client does not read its replies.
    output_paused: bool,
    /// An event said the client closed its side: read until end of stream,
    /// because no further edge will announce it.
    peer_closed: bool,
    /// When the last read returned (t_recv of the requests it completed).
    last_read_ns: u64,
}

/// What reading a connection led to.
enum Flow {
    /// Everything available was read.
    Drained,
    /// Budget used up; read again soon.
    More,
    /// Waiting for room in the queue.
    Blocked,
    /// Waiting for the client to read its replies.
    Paused,
    /// The connection is finished or broken.
    Finished,
}

/// One net thread.
pub struct NetThread {
    poll: Poll,
    listener: Option<TcpListener>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    queue: Sender<Job>,
    shared: Arc<Shared>,
    limits: Limits,
    blocked: Vec<Token>,
    ready: VecDeque<Token>,
    /// Request ids: `next_id * net_threads + index`, unique per process.
    ids: RequestIds,
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
    /// A net thread serving `listener`; `poll` must have the waker registered.
    pub fn new(
        index: usize,
        poll: Poll,
        mut listener: TcpListener,
        queue: Sender<Job>,
        shared: Arc<Shared>,
    ) -> io::Result<NetThread> {
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let limits = shared.config.parser_limits();
        let ids = RequestIds { next: 0, index: index as u64, stride: shared.config.proxy.net_threads as u64 };
        Ok(NetThread {
            ids,
            poll,
            listener: Some(listener),
            conns: Vec::new(),
            free: Vec::new(),
            queue,
            shared,
            limits,
            blocked: Vec::new(),
            ready: VecDeque::new(),
        })
    }

    /// Creates the poll and its waker for a net thread.
    pub fn poll_with_waker() -> io::Result<(Poll, Arc<Waker>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        Ok((poll, waker))
    }

    /// Runs until shutdown is requested and in-flight requests are answered.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut grace_deadline: Option<Instant> = None;
        loop {
            let timeout = if !self.ready.is_empty() {
                Some(Duration::ZERO)
            } else if !self.blocked.is_empty() || grace_deadline.is_some() {
                Some(Duration::from_millis(1))
            } else {
                None
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("poll failed: {e}");
                    break;
                }
            }
            let mut removed = Vec::new();
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    LISTENER => self.accept(),
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
        for i in 0..self.conns.len() {
            if let Some(c) = self.conns[i].take() {
                c.shared.close();
                bump(&self.shared.net.closed_connections);
            }
        }
    }

    /// The socket can take bytes again: write what waits, and resume reading a
    /// client that was paused for not reading its replies.
    fn writable(&mut self, token: Token) {
        let NetThread { conns, shared, ready, .. } = self;
        let Some(conn) = conns.get_mut(token.0 - FIRST_CONN).and_then(Option::as_mut) else { return };
        conn.shared.flush(&shared.net);
        if conn.output_paused && conn.shared.pending_output() < shared.config.proxy.max_pending_output {
            conn.output_paused = false;
            ready.push_back(token);
        }
    }

    fn conn(&mut self, token: Token) -> Option<&mut Conn> {
        self.conns.get_mut(token.0.checked_sub(FIRST_CONN)?)?.as_mut()
    }

    fn accept(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else { return };
            let (mut stream, _) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            };
            let net = &self.shared.net;
            let open = net.total_connections.load(Ordering::Relaxed) - net.closed_connections.load(Ordering::Relaxed);
            if open as usize >= self.shared.config.proxy.max_connections {
                bump(&net.rejected_connections);
                let _ = stream.write(b"SERVER_ERROR Too many open connections\r\n");
                continue;
            }
            let _ = stream.set_nodelay(true);
            let slot = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            let token = Token(slot + FIRST_CONN);
            if let Err(e) = self.poll.registry().register(&mut stream, token, Interest::READABLE | Interest::WRITABLE) {
                tracing::warn!("register failed: {e}");
                self.free.push(slot);
                continue;
            }
            bump(&net.total_connections);
            self.conns[slot] = Some(Conn {
                shared: Arc::new(ClientConn::new(stream)),
                rbuf: ReadBuf::with_capacity(READ_CHUNK),
                swallow: 0,
                issued: 0,
                stalled: None,
                done: false,
                output_paused: false,
                peer_closed: false,
                last_read_ns: 0,
            });
            self.ready.push_back(token);
        }
    }

    fn remove(&mut self, token: Token) {
        let slot = token.0 - FIRST_CONN;
        if let Some(mut c) = self.conns[slot].take() {
            c.stalled = None;
            c.shared.forget_waiting();
            let _ = self.poll.registry().deregister(&mut ClientConnSource(&c.shared));
            c.shared.close();
            bump(&self.shared.net.closed_connections);
            self.blocked.retain(|t| *t != token);
            self.ready.retain(|t| *t != token);
            self.free.push(slot);
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
        let NetThread { conns, queue, shared, limits, ids, .. } = self;
        let slot = token.0 - FIRST_CONN;
        let Some(conn) = conns.get_mut(slot).and_then(Option::as_mut) else { return Flow::Finished };
        let mut reads = 0;
        let mut drained = false;
        loop {
            if let Some(job) = conn.stalled.take() {
                match queue.try_send(job) {
                    Ok(()) => {}
                    Err(TrySendError::Full(job)) => {
                        conn.stalled = Some(job);
                        return Flow::Blocked;
                    }
                    Err(TrySendError::Disconnected(_)) => return Flow::Finished,
                }
            }
            if conn.done {
                return Flow::Finished;
            }
            if conn.shared.waiting() >= MAX_PIPELINE {
                return Flow::Blocked;
            }
            if let Some(flow) = parse_all(conn, queue, shared, limits, ids) {
                return flow;
            }
            if conn.shared.pending_output() > shared.config.proxy.max_pending_output {
                conn.output_paused = true;
                return Flow::Paused;
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
            reads += 1;
            conn.rbuf.shrink_to(READ_CHUNK);
            let spare = conn.rbuf.spare(READ_CHUNK / 4);
            let room = spare.len();
            let r = conn.shared.stream().read(spare);
            match r {
                Ok(0) => {
                    conn.done = true;
                    conn.shared.client_done(conn.issued, &shared.net);
                    return Flow::Finished;
                }
                Ok(n) => {
                    drained = n < room;
                    conn.last_read_ns = now_ns();
                    conn.rbuf.commit(n);
                    add(&shared.net.bytes_read, n as u64);
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => return Flow::Drained,
                    io::ErrorKind::Interrupted => {}
                    _ => {
                        conn.done = true;
                        conn.shared.close();
                        return Flow::Finished;
                    }
                },
            }
        }
    }

    fn begin_shutdown(&mut self) {
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
    }

    fn all_idle(&self) -> bool {
        self.conns.iter().flatten().all(|c| c.stalled.is_none() && c.shared.idle(c.issued))
    }
}

/// Parses every whole request in the buffer and queues it. Returns a flow when
/// reading must stop, `None` when more bytes are needed.
fn parse_all(
    conn: &mut Conn,
    queue: &Sender<Job>,
    shared: &Shared,
    limits: &Limits,
    ids: &mut RequestIds,
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
        let work = match parse_request(conn.rbuf.filled(), limits) {
            Parsed::Incomplete => return None,
            Parsed::Request { request: Request::Quit, .. } => {
                conn.shared.deliver(conn.issued, Vec::new(), true, net);
                conn.issued += 1;
                conn.done = true;
                return Some(Flow::Finished);
            }
            Parsed::Request { request, consumed } => {
                conn.rbuf.consume(consumed);
                Work::Request(request)
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
                    Some(key) => Work::DropStale { key, reply: r.reply },
                    None => {
                        let bytes = r.reply.map(|l| format!("{l}\r\n").into_bytes()).unwrap_or_default();
                        conn.shared.deliver(conn.issued, bytes, false, net);
                        conn.issued += 1;
                        continue;
                    }
                }
            }
        };
        let t_parsed = now_ns();
        let job = Job {
            conn: conn.shared.clone(),
            seq: conn.issued,
            work,
            request_id: ids.take(),
            t_recv: conn.last_read_ns,
            t_parsed,
            t_enqueue: t_parsed,
        };
        conn.issued += 1;
        let job = match conn.shared.admit(job) {
            Admit::Run(mut job) => {
                job.t_enqueue = now_ns();
                job
            }
            Admit::Waiting(n) if n >= MAX_PIPELINE => return Some(Flow::Blocked),
            Admit::Waiting(_) => continue,
        };
        match queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) => {
                bump(&net.queue_full);
                conn.stalled = Some(job);
                return Some(Flow::Blocked);
            }
            Err(TrySendError::Disconnected(_)) => return Some(Flow::Finished),
        }
    }
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
        mio::unix::SourceFd(&self.0.stream().as_raw_fd()).deregister(registry)
    }
}
