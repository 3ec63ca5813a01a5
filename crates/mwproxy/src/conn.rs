//! A client connection as shared by its net thread and the workers, and the
//! reorder buffer that keeps replies in request order.
//!
//! The net thread numbers every request of a connection (its `seq`). Whoever
//! finishes a request — a worker, or the net thread itself for a refused input
//! — calls [`ClientConn::deliver`], which files the reply under its number and
//! writes every reply that is now next in line straight to the socket. Only
//! when the socket is full do bytes stay behind; the net thread writes them
//! when the socket becomes writable again. The lock is per connection and held
//! only while replies are filed and written, so workers never wait on each
//! other unless they finish requests of the same connection at the same moment.
//!
//! A connection's requests also take effect in order, as with memcached: only
//! one of them is in the request queue or in a worker at a time. The others
//! wait in the connection's own line ([`ClientConn::admit`]); the worker that
//! finishes one takes the next ([`ClientConn::next_job`]), so a pipelined `get`
//! never overtakes the `set` before it.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use mio::net::TcpStream;

use crate::stats::NetCounters;
use crate::worker::Job;

/// The part of a connection that workers touch.
pub struct ClientConn {
    stream: TcpStream,
    out: Mutex<Output>,
    sched: Mutex<Sched>,
}

/// Requests of the connection that wait for the one in progress.
#[derive(Default)]
struct Sched {
    /// A request of this connection is queued or in a worker.
    busy: bool,
    waiting: VecDeque<Job>,
}

/// What [`ClientConn::admit`] decided.
pub enum Admit {
    /// Nothing of this connection is in progress: queue this job now.
    Run(Job),
    /// The job waits behind the one in progress; this many wait now.
    Waiting(usize),
}

/// Replies waiting for their turn, and bytes waiting for the socket.
#[derive(Default)]
struct Output {
    /// Sequence number of the next reply to write.
    next_seq: u64,
    /// Replies for `next_seq..`, `None` where the request is still in progress.
    pending: VecDeque<Option<Reply>>,
    /// Bytes in line but not yet accepted by the socket.
    buf: Vec<u8>,
    /// The socket is gone or shut; nothing more is written.
    closed: bool,
    /// After this sequence number's reply, close the connection (quit, fatal input).
    close_after: Option<u64>,
    /// The client stopped sending: close once every request up to this number is answered.
    eof_at: Option<u64>,
}

struct Reply {
    bytes: Vec<u8>,
    close: bool,
}

impl ClientConn {
    /// Wraps an accepted socket.
    pub fn new(stream: TcpStream) -> ClientConn {
        ClientConn { stream, out: Mutex::new(Output::default()), sched: Mutex::new(Sched::default()) }
    }

    /// Lets a new request run now or makes it wait behind the one in progress.
    pub fn admit(&self, job: Job) -> Admit {
        let mut s = self.sched.lock().unwrap_or_else(|p| p.into_inner());
        if s.busy {
            s.waiting.push_back(job);
            Admit::Waiting(s.waiting.len())
        } else {
            s.busy = true;
            Admit::Run(job)
        }
    }

    /// Called by the worker that finished a request: the next one to run, if any.
    pub fn next_job(&self) -> Option<Job> {
        let mut s = self.sched.lock().unwrap_or_else(|p| p.into_inner());
        let next = s.waiting.pop_front();
        s.busy = next.is_some();
        next
    }

    /// Requests waiting behind the one in progress.
    pub fn waiting(&self) -> usize {
        self.sched.lock().unwrap_or_else(|p| p.into_inner()).waiting.len()
    }

    /// Drops waiting requests (the connection is going away).
    pub fn forget_waiting(&self) {
        let mut s = self.sched.lock().unwrap_or_else(|p| p.into_inner());
        s.waiting.clear();
    }

    /// The socket, for the net thread's reads and registration.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    fn lock(&self) -> MutexGuard<'_, Output> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Files the reply to request `seq` and writes whatever is now in line.
    /// `close` closes the connection once this reply is written.
    pub fn deliver(&self, seq: u64, bytes: Vec<u8>, close: bool, net: &NetCounters) {
        let mut out = self.lock();
        if out.closed {
            return;
        }
        let Some(slot) = seq.checked_sub(out.next_seq) else {
            return;
        };
        let slot = slot as usize;
        if out.pending.len() <= slot {
            out.pending.resize_with(slot + 1, || None);
        }
        out.pending[slot] = Some(Reply { bytes, close });
        while let Some(Some(_)) = out.pending.front() {
            let Some(Some(reply)) = out.pending.pop_front() else { unreachable!() };
            let seq = out.next_seq;
            out.next_seq += 1;
            if out.buf.is_empty() {
                out.buf = reply.bytes;
            } else {
                out.buf.extend_from_slice(&reply.bytes);
            }
            if reply.close {
                out.close_after = Some(seq);
                break;
            }
        }
        self.flush_locked(&mut out, net);
    }

    /// Writes buffered bytes (called by the net thread when the socket is writable).
    pub fn flush(&self, net: &NetCounters) {
        let mut out = self.lock();
        self.flush_locked(&mut out, net);
    }

    fn flush_locked(&self, out: &mut Output, net: &NetCounters) {
        if out.closed {
            return;
        }
        let mut written = 0;
        while written < out.buf.len() {
            match (&self.stream).write(&out.buf[written..]) {
                Ok(0) => {
                    self.close_locked(out);
                    return;
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.close_locked(out);
                    return;
                }
            }
        }
        if written > 0 {
            out.buf.drain(..written);
            net.bytes_written.fetch_add(written as u64, Ordering::Relaxed);
        }
        if out.buf.is_empty() {
            let done_through = out.next_seq;
            let quit = out.close_after.is_some_and(|s| s < done_through);
            let eof = out.eof_at.is_some_and(|s| s <= done_through) && out.pending.is_empty();
            if quit || eof {
                self.close_locked(out);
            }
        }
    }

    /// Shuts the socket so the net thread sees the connection end and cleans up.
    fn close_locked(&self, out: &mut Output) {
        out.closed = true;
        out.buf = Vec::new();
        out.pending.clear();
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// The client will send nothing more; `issued` requests were numbered.
    /// Closes now if all are answered, else when the last one is.
    pub fn client_done(&self, issued: u64, net: &NetCounters) {
        let mut out = self.lock();
        out.eof_at = Some(issued);
        self.flush_locked(&mut out, net);
    }

    /// Bytes of replies the client has not read yet.
    pub fn pending_output(&self) -> usize {
        self.lock().buf.len()
    }

    /// Whether the connection is closed for writing.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Whether every numbered request has been answered and written.
    pub fn idle(&self, issued: u64) -> bool {
        let out = self.lock();
        out.closed || (out.next_seq >= issued && out.buf.is_empty())
    }

    /// Closes the connection at once (shutdown).
    pub fn close(&self) {
        let mut out = self.lock();
        self.close_locked(&mut out);
    }
}
