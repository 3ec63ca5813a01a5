//! A client connection as shared by its net thread and the workers: its line
//! of waiting requests, and the reorder buffer that keeps replies in request order.
//!
//! A connection's requests take effect in order, as with memcached: the net
//! thread puts each parsed request in the connection's line
//! ([`ClientConn::admit`]) and queues the connection when it had nothing
//! waiting; a worker takes a bounded batch from the line
//! ([`ClientConn::take_batch`]), carries it out, delivers the replies and
//! then, if more requests wait, sends the connection to the back of the queue
//! ([`ClientConn::after_batch`]) — or parks it while its client leaves too
//! many replies unread; the net thread resumes it when the client reads again.
//!
//! Replies are numbered by the net thread (`seq`). Whoever finishes a request
//! — a worker, or the net thread for a refused input — files the reply under
//! its number, and every reply that is now next in line is written straight to
//! the socket. Only when the socket is full do bytes stay behind; the net
//! thread writes them when the socket becomes writable again.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use mwserve::listen::Transport;

use crate::budget::Budget;
use crate::route::Work;
use crate::stats::NetCounters;

/// Most requests of one connection carried out as one batch.
pub const MAX_BATCH: usize = 64;
/// Most requests that may wait in one connection's line.
pub const MAX_PIPELINE: usize = 4096;

/// One request on its way through the proxy.
#[derive(Debug)]
pub struct Job {
    /// The request's number on its connection (replies go out in this order).
    pub seq: u64,
    /// What to do.
    pub work: Work,
    /// Unique per process (trace sampling uses it).
    pub request_id: u64,
    /// When the read that completed the request returned (ns, `mwstats::clock`).
    pub t_recv: u64,
    /// When it was parsed.
    pub t_parsed: u64,
    /// When it was put in the connection's line.
    pub t_enqueue: u64,
    /// Bytes it took on the wire (counted against the input budgets).
    pub size: usize,
    /// A binary-protocol request: how to turn its reply into a binary response.
    pub bin: Option<Box<mcproto::binary::Ctx>>,
}

/// The part of a connection that workers touch.
pub struct ClientConn {
    transport: Transport,
    out: Mutex<Output>,
    line: Mutex<Line>,
    budget: Arc<Budget>,
    /// The size (bytes) batches are planned with: the largest recent reply,
    /// and how many batches came back since without one as large. Before any
    /// reply it is the output budget, so a new connection's first batch is a
    /// single request; the first batch's largest reply sets it, a later
    /// batch's raises it at once, and it halves every [`PLAN_HALF_LIFE`]
    /// batches without so large a reply. (It once halved every second: a
    /// client that never reads, parked for seconds on a busy machine, then
    /// had its next batch planned with a reply 16 times too small, and 100
    /// such clients held 500-800 MB of replies past a 32 MB budget.) Error
    /// replies (failures answered at once) are not looked at. So a client
    /// whose replies are small gets full batches at once, and one that asks
    /// for large values keeps small batches through a burst of failures:
    /// what a batch brings back stays near the output budget. (The mean it
    /// once was fell with such a burst; the next batch then asked for 64
    /// large values at once, past every budget.)
    planned: Mutex<Option<(usize, u32)>>,
}

/// Requests waiting for a worker.
#[derive(Default)]
struct Line {
    /// The connection is queued, in a worker, or parked.
    busy: bool,
    waiting: VecDeque<Job>,
    bytes: usize,
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
    /// `buf.len()` as last counted in the budget.
    accounted: usize,
    /// The socket is gone or shut; nothing more is written.
    closed: bool,
    /// After this sequence number's reply, close the connection (quit, fatal input).
    close_after: Option<u64>,
    /// The client stopped sending: close once every request up to this number is answered.
    eof_at: Option<u64>,
    /// Requests wait, but the client must read its replies first.
    parked: bool,
}

struct Reply {
    bytes: Vec<u8>,
    close: bool,
}

/// What happens to a connection after a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum After {
    /// Nothing waits.
    Idle,
    /// More requests wait: back to the queue.
    Again,
    /// More requests wait, but its client must read first.
    Parked,
}

impl ClientConn {
    /// Wraps an accepted socket.
    pub fn new(transport: Transport, budget: Arc<Budget>) -> ClientConn {
        ClientConn {
            transport,
            out: Mutex::new(Output::default()),
            line: Mutex::new(Line::default()),
            planned: Mutex::new(None),
            budget,
        }
    }

    /// The reply size batches are planned with now.
    fn planned_size(&self) -> usize {
        self.planned.lock().unwrap_or_else(|p| p.into_inner()).map_or(self.budget.output_per_conn, decayed)
    }

    fn line(&self) -> MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, Output> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts a request in line; true when the connection must now be queued
    /// (nothing of it was waiting or running).
    pub fn admit(&self, job: Job) -> bool {
        let mut l = self.line();
        let before = l.bytes;
        l.bytes += job.size;
        l.waiting.push_back(job);
        self.budget.input_moved(before, l.bytes);
        self.budget.queued_moved(0, 1);
        !std::mem::replace(&mut l.busy, true)
    }

    /// Whether the net thread may read more requests of this connection.
    pub fn may_read(&self) -> bool {
        let l = self.line();
        l.waiting.len() < MAX_PIPELINE && self.budget.may_read(l.bytes)
    }

    /// Requests waiting in line.
    pub fn waiting(&self) -> usize {
        self.line().waiting.len()
    }

    /// Takes the next batch: at most [`MAX_BATCH`] requests, fewer when
    /// replies are large, so that a batch's replies stay near the output budget.
    pub fn take_batch(&self) -> Vec<Job> {
        if self.is_closed() {
            self.forget_waiting();
            return Vec::new();
        }
        let avg = self.planned_size().max(1);
        let limit = (self.budget.output_per_conn / avg).clamp(1, MAX_BATCH);
        let mut l = self.line();
        let n = l.waiting.len().min(limit);
        let batch: Vec<Job> = l.waiting.drain(..n).collect();
        let before = l.bytes;
        l.bytes -= batch.iter().map(|j| j.size).sum::<usize>();
        self.budget.input_moved(before, l.bytes);
        self.budget.queued_moved(n, 0);
        batch
    }

    /// After a batch: idle, back to the queue, or parked until the client reads.
    pub fn after_batch(&self) -> After {
        let mut l = self.line();
        if l.waiting.is_empty() || self.is_closed() {
            l.busy = false;
            return After::Idle;
        }
        let mut out = self.lock();
        if self.budget.may_run(out.accounted) {
            After::Again
        } else {
            out.parked = true;
            After::Parked
        }
    }

    /// Drops waiting requests (the connection is going away).
    pub fn forget_waiting(&self) {
        let mut l = self.line();
        let n = l.waiting.len();
        l.waiting.clear();
        self.budget.input_moved(l.bytes, 0);
        self.budget.queued_moved(n, 0);
        l.bytes = 0;
    }

    /// The connection's bytes (plain or TLS), for the net thread's reads and registration.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// Files the reply to request `seq` and writes whatever is now in line.
    /// `close` closes the connection once this reply is written.
    pub fn deliver(&self, seq: u64, bytes: Vec<u8>, close: bool, net: &NetCounters) {
        let mut out = self.lock();
        self.file(&mut out, seq, bytes, close);
        self.flush_locked(&mut out, net);
    }

    /// Files the replies of a batch, in any order, and writes what is in
    /// line. Each comes with whether it reports a failure (those are not
    /// looked at when planning batches).
    pub fn deliver_all(&self, replies: impl IntoIterator<Item = (u64, Vec<u8>, bool)>, net: &NetCounters) {
        let mut out = self.lock();
        let mut largest = None;
        for (seq, reply, failure) in replies {
            if !failure {
                largest = largest.max(Some(reply.len()));
            }
            self.file(&mut out, seq, reply, false);
        }
        if let Some(largest) = largest {
            let mut p = self.planned.lock().unwrap_or_else(|p| p.into_inner());
            match &mut *p {
                Some(seen) if largest < decayed(*seen) => seen.1 = seen.1.saturating_add(1),
                _ => *p = Some((largest, 0)),
            }
        }
        self.flush_locked(&mut out, net);
    }

    fn file(&self, out: &mut Output, seq: u64, bytes: Vec<u8>, close: bool) {
        if out.closed {
            return;
        }
        let Some(slot) = seq.checked_sub(out.next_seq) else { return };
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
            } else if out.buf.try_reserve(reply.bytes.len()).is_ok() {
                out.buf.extend_from_slice(&reply.bytes);
            } else {
                tracing::warn!("out of memory for a client's replies: closing its connection");
                self.close_locked(out);
                return;
            }
            if reply.close {
                out.close_after = Some(seq);
                break;
            }
        }
    }

    /// Writes buffered bytes (the socket is writable again); true when the
    /// connection was parked and may now run its waiting requests.
    pub fn flush(&self, net: &NetCounters) -> bool {
        let mut out = self.lock();
        self.flush_locked(&mut out, net);
        if out.parked && (out.closed || self.budget.may_run(out.accounted)) {
            out.parked = false;
            return true;
        }
        false
    }

    fn flush_locked(&self, out: &mut Output, net: &NetCounters) {
        if !out.closed {
            match write_out(&self.transport, &mut out.buf) {
                Ok(0) => {}
                Ok(written) => {
                    net.bytes_written.fetch_add(written as u64, Ordering::Relaxed);
                }
                Err(_) => {
                    self.close_locked(out);
                    return;
                }
            }
            // What a TLS session still holds goes out before a close.
            let sent = match self.transport.flush() {
                Ok(sent) => sent,
                Err(_) => {
                    self.close_locked(out);
                    return;
                }
            };
            if out.buf.is_empty() && sent {
                let done_through = out.next_seq;
                let quit = out.close_after.is_some_and(|s| s < done_through);
                let eof = out.eof_at.is_some_and(|s| s <= done_through) && out.pending.is_empty();
                if quit || eof {
                    self.close_locked(out);
                }
            }
        }
        self.account(out);
    }

    /// Counts the unwritten replies in the budgets: those waiting here and
    /// those a TLS session holds for the socket, as a plaintext connection's.
    fn account(&self, out: &mut Output) {
        let now = out.buf.len() + self.transport.held();
        self.budget.output_moved(out.accounted, now);
        out.accounted = now;
    }

    /// Shuts the socket so the net thread sees the connection end and cleans up.
    fn close_locked(&self, out: &mut Output) {
        out.closed = true;
        out.buf = Vec::new();
        out.pending.clear();
        self.account(out);
        let _ = self.transport.socket().shutdown(Shutdown::Both);
    }

    /// The client will send nothing more; `issued` requests were numbered.
    /// Closes now if all are answered, else when the last one is.
    pub fn client_done(&self, issued: u64, net: &NetCounters) {
        let mut out = self.lock();
        out.eof_at = Some(issued);
        self.flush_locked(&mut out, net);
    }

    /// Bytes of replies the client has not read yet (with what a TLS session holds).
    pub fn pending_output(&self) -> usize {
        self.lock().accounted
    }

    /// Whether the connection may be read: its waiting requests and its
    /// unread replies are within the budgets.
    pub fn readable(&self) -> bool {
        self.budget.may_run(self.pending_output()) && self.may_read()
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

/// How fast a large reply is forgotten when planning batches.
const PLAN_HALF_LIFE: u32 = 4;

/// A planned reply size, halved for every [`PLAN_HALF_LIFE`] batches since it was seen.
fn decayed((size, batches_since): (usize, u32)) -> usize {
    size >> (batches_since / PLAN_HALF_LIFE).min(63)
}

/// Writes as much of `buf` as a non-blocking socket takes now and removes it
/// from `buf` (an emptied buffer over 1 MiB is given back). The bytes
/// written, or an error when the peer is gone (a write of 0 bytes is one).
pub fn write_out(mut w: impl Write, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut written = 0;
    let mut outcome = Ok(());
    while written < buf.len() {
        match w.write(&buf[written..]) {
            Ok(0) => {
                outcome = Err(io::Error::from(io::ErrorKind::WriteZero));
                break;
            }
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    if written == buf.len() {
        buf.clear();
        if buf.capacity() > 1 << 20 {
            *buf = Vec::new();
        }
    } else {
        buf.drain(..written);
    }
    outcome.map(|()| written)
}
