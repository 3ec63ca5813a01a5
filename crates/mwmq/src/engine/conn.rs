//! A client connection as its net thread and the workers share it: the
//! socket, the replies not yet written, the client's name, and the leases
//! travelling in those replies.
//!
//! A connection has at most one request in the workers at a time, so its
//! replies leave in request order without any reordering. A worker writes
//! its reply straight to the socket; what the socket does not take stays
//! here and the net thread writes it when the socket becomes writable.
//!
//! The unwritten replies count in the output budget (`output.rs`) until
//! they are written, and remember when they last moved: a connection whose
//! replies stall while others wait for that budget is closed by the net
//! thread.
//!
//! A RECV reply carries leases. They are kept until the reply's last byte
//! has been handed to the socket: if the connection dies first, the net
//! thread or the worker gives them back (the messages become visible again at
//! once) instead of leaving them invisible until their lease expires.

use std::collections::VecDeque;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use std::sync::Arc;
use std::time::Instant;

use mwserve::listen::Transport;

use crate::db::LeaseRef;
use crate::output::{OutputBudget, Share};

struct Output {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    sent: usize,
    /// What the unwritten bytes hold of the output budget (`output.rs`).
    charge: Share,
    /// When the unwritten bytes last moved (or arrived, when there were none).
    progress: Instant,
    /// Bytes ever queued, and written, on this connection.
    queued_total: u64,
    written_total: u64,
    /// Leases per reply, with the position (in `queued_total`) of the reply's end.
    leases: VecDeque<(u64, Vec<LeaseRef>)>,
    closed: bool,
}

/// The part of a connection that workers touch.
pub struct ClientConn {
    /// Unique per process.
    pub id: u64,
    transport: Transport,
    out: Mutex<Output>,
    name: Mutex<Option<String>>,
    /// The user it logged in as (with `[[users]]` configured).
    user: Mutex<Option<std::sync::Arc<crate::users::User>>>,
    /// Its failed logins.
    pub attempts: crate::users::Attempts,
    /// The client's address (failed logins are throttled by it).
    pub peer: Option<std::net::IpAddr>,
    /// When it was accepted (the handshake and login deadlines run from here).
    pub accepted: std::time::Instant,
    /// Close once every reply is written (QUIT, a protocol error).
    closing: AtomicBool,
    /// The client asked for RESP3 (`HELLO 3`).
    resp3: AtomicBool,
    /// A request of this connection is with the workers.
    busy: AtomicBool,
    /// The net thread holds input (or an end of input) it could not parse
    /// while the connection was busy: the worker must tell it when done.
    input_waiting: AtomicBool,
}

/// What happened to a reply handed to [`ClientConn::deliver`].
#[derive(Debug, PartialEq, Eq)]
pub enum Delivered {
    /// All of it is in the socket.
    Written(usize),
    /// Part of it waits for the socket (the net thread finishes it).
    Pending(usize),
    /// The connection is gone; these leases must be given back.
    Lost(Vec<LeaseRef>),
}

impl ClientConn {
    /// A connection over `transport` (plain TCP, or TLS over it) whose
    /// unwritten replies count in `budget`.
    pub fn new(id: u64, transport: Transport, budget: &Arc<OutputBudget>) -> ClientConn {
        let peer = transport.socket().peer_ip();
        ClientConn {
            id,
            transport,
            out: Mutex::new(Output {
                buf: Vec::new(),
                sent: 0,
                charge: Share::none(budget),
                progress: Instant::now(),
                queued_total: 0,
                written_total: 0,
                leases: VecDeque::new(),
                closed: false,
            }),
            name: Mutex::new(None),
            user: Mutex::new(None),
            attempts: crate::users::Attempts::default(),
            peer,
            accepted: std::time::Instant::now(),
            closing: AtomicBool::new(false),
            resp3: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            input_waiting: AtomicBool::new(false),
        }
    }

    fn out(&self) -> MutexGuard<'_, Output> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The socket (for registration with the net thread's poll).
    pub fn stream(&self) -> &mwserve::stream::Stream {
        self.transport.socket()
    }

    /// What it speaks over: plain TCP or TLS.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The name given with `CLIENT SETNAME` (a sender's name; a receiver's address).
    pub fn name(&self) -> Option<String> {
        self.name.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sets the name.
    pub fn set_name(&self, name: String) {
        *self.name.lock().unwrap_or_else(|p| p.into_inner()) = Some(name);
    }

    /// The user it logged in as.
    pub fn user(&self) -> Option<std::sync::Arc<crate::users::User>> {
        self.user.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// It logged in as `user`.
    pub fn set_user(&self, user: std::sync::Arc<crate::users::User>) {
        *self.user.lock().unwrap_or_else(|p| p.into_inner()) = Some(user);
    }

    /// Who it is as a sender and a receiver: the user it logged in as, else
    /// the name it gave itself (`CLIENT SETNAME`: only without users).
    pub fn identity(&self) -> Option<String> {
        match self.user() {
            Some(u) => Some(u.name.clone()),
            None => self.name(),
        }
    }

    /// Whether a request of this connection is with the workers.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    /// The net thread handed a request to the workers.
    pub fn set_busy(&self) {
        self.busy.store(true, Ordering::SeqCst);
    }

    /// The net thread stops with input it could not parse because the
    /// connection is busy. True when the connection turned out not to be busy
    /// any more (then the net thread goes on itself).
    pub fn wait_for_worker(&self) -> bool {
        self.input_waiting.store(true, Ordering::SeqCst);
        !self.busy.load(Ordering::SeqCst)
    }

    /// The net thread goes on with the connection's input.
    pub fn resume_input(&self) {
        self.input_waiting.store(false, Ordering::SeqCst);
    }

    /// A worker answered the connection's request. True when the net thread
    /// must be told (it holds input, or the connection is to close); most
    /// replies need no word to the net thread: the client's next request
    /// arrives as a new event.
    pub fn finish_request(&self) -> bool {
        self.busy.store(false, Ordering::SeqCst);
        self.input_waiting.load(Ordering::SeqCst) || self.closing() || self.is_closed()
    }

    /// Whether the client closed its side or the connection failed (asked
    /// of the socket without reading: input not read yet does not hide it).
    pub fn hung_up(&self) -> bool {
        crate::peer::hung_up(std::os::fd::AsFd::as_fd(self.transport.socket()))
    }

    /// Whether replies are encoded in RESP3.
    pub fn resp3(&self) -> bool {
        self.resp3.load(Ordering::Relaxed)
    }

    /// Switches the protocol of the replies that follow.
    pub fn set_resp3(&self, on: bool) {
        self.resp3.store(on, Ordering::Relaxed);
    }

    /// Asks for the connection to close once its replies are written.
    pub fn close_after_replies(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }

    /// Whether [`ClientConn::close_after_replies`] was asked.
    pub fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Queues a reply and writes as much as the socket takes. With nothing
    /// else queued the reply becomes the buffer, not a copy in it: a large
    /// reply (`max_reply_bytes`) is held once while it goes out.
    pub fn deliver(&self, bytes: Vec<u8>, leases: Vec<LeaseRef>) -> Delivered {
        let mut o = self.out();
        if o.closed {
            return Delivered::Lost(leases);
        }
        o.queued_total += bytes.len() as u64;
        if o.buf.is_empty() {
            o.buf = bytes;
            o.sent = 0;
            o.progress = Instant::now();
        } else {
            o.buf.extend_from_slice(&bytes);
        }
        let unwritten = o.buf.len() - o.sent;
        o.charge.set(unwritten);
        if !leases.is_empty() {
            let end = o.queued_total;
            o.leases.push_back((end, leases));
        }
        match self.flush_locked(&mut o) {
            Ok(written) if o.sent == o.buf.len() => Delivered::Written(written),
            Ok(written) => Delivered::Pending(written),
            Err(_) => Delivered::Lost(Self::fail(&mut o)),
        }
    }

    fn fail(o: &mut Output) -> Vec<LeaseRef> {
        o.closed = true;
        o.buf = Vec::new();
        o.sent = 0;
        o.charge.set(0);
        o.leases.drain(..).flat_map(|(_, l)| l).collect()
    }

    /// Writes until done or the socket is full; the bytes written.
    fn flush_locked(&self, o: &mut Output) -> io::Result<usize> {
        let mut written = 0;
        while o.sent < o.buf.len() {
            match self.transport.write(&o.buf[o.sent..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    o.sent += n;
                    written += n;
                    o.written_total += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        // What a TLS session still holds goes out as the socket takes it.
        match self.transport.flush() {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
        while o.leases.front().is_some_and(|(end, _)| *end <= o.written_total) {
            o.leases.pop_front();
        }
        if written > 0 {
            o.progress = Instant::now();
        }
        if o.sent == o.buf.len() {
            o.buf.clear();
            o.sent = 0;
            if o.buf.capacity() > 64 * 1024 {
                o.buf.shrink_to(64 * 1024);
            }
        } else if o.sent > 64 * 1024 && o.sent * 2 > o.buf.len() {
            let sent = o.sent;
            o.buf.drain(..sent);
            o.sent = 0;
        }
        let unwritten = o.buf.len() - o.sent;
        o.charge.set(unwritten);
        Ok(written)
    }

    /// Writes what is pending (the socket became writable). `Ok(bytes)`, or
    /// the leases to give back when the connection broke.
    pub fn flush(&self) -> Result<usize, Vec<LeaseRef>> {
        let mut o = self.out();
        if o.closed {
            return Ok(0);
        }
        self.flush_locked(&mut o).map_err(|_| Self::fail(&mut o))
    }

    /// Bytes of replies not yet written (with what a TLS session holds for the socket).
    pub fn pending_output(&self) -> usize {
        let o = self.out();
        o.buf.len() - o.sent + self.transport.held()
    }

    /// Whether the connection holds unwritten replies that made no
    /// progress for `reply_stall_ms` while requests wait for the output budget.
    pub fn stalled(&self, budget: &OutputBudget) -> bool {
        let o = self.out();
        o.sent < o.buf.len() && budget.stalled(o.progress)
    }

    /// Whether the connection was closed.
    pub fn is_closed(&self) -> bool {
        self.out().closed
    }

    /// Closes the connection; returns the leases of replies never fully written.
    pub fn close(&self) -> Vec<LeaseRef> {
        let mut o = self.out();
        if o.closed {
            return Vec::new();
        }
        let _ = self.transport.socket().shutdown(Shutdown::Both);
        Self::fail(&mut o)
    }
}

impl crate::session::Session for ClientConn {
    fn id(&self) -> u64 {
        self.id
    }
    fn name(&self) -> Option<String> {
        ClientConn::name(self)
    }
    fn set_name(&self, name: String) {
        ClientConn::set_name(self, name)
    }
    fn user(&self) -> Option<std::sync::Arc<crate::users::User>> {
        ClientConn::user(self)
    }
    fn set_user(&self, user: std::sync::Arc<crate::users::User>) {
        ClientConn::set_user(self, user)
    }
    fn resp3(&self) -> bool {
        ClientConn::resp3(self)
    }
    fn set_resp3(&self, on: bool) {
        ClientConn::set_resp3(self, on)
    }
    fn attempts(&self) -> &crate::users::Attempts {
        &self.attempts
    }
    fn peer(&self) -> Option<std::net::IpAddr> {
        self.peer
    }
    fn identity(&self) -> Option<String> {
        ClientConn::identity(self)
    }
}
