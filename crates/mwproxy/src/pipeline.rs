//! The async engine's request path: what one event loop does with the
//! requests its net loop parsed, without handing anything to another thread.
//!
//! Each loop (a [`NetThread`](crate::net::NetThread) with a `Pipeline`)
//! owns its client connections and one non-blocking connection to every
//! server (a [`Link`]). A connection with requests waiting is *runnable*; on
//! each turn of the loop the pipeline takes a batch from every runnable
//! connection — the same batches and waves as a pool worker takes
//! (`batch.rs`) — starts their requests in the routing core, and appends the
//! rounds' bytes of all of them to each server's write buffer: requests of
//! many clients travel over one server connection and are written with one
//! `write` per server per turn. A link remembers what it sent in order
//! ([`Pending`]); replies come back in that order, are cut by each call's
//! framing and handed to their requests. A request whose round is complete
//! takes its next round at once; a wave whose requests are all finished is
//! delivered and recorded, and the connection's next wave or batch starts.
//!
//! Health, repairs and failures follow the pool engine's rules (`worker.rs`):
//! a server that is down or stalled gets nothing and its calls fail at once;
//! after the backoff one request probes it; repairs go first on the same
//! connection; a link that fails (refused, reset, timed out, garbage) is
//! closed and every call it carried fails with `SERVER_ERROR` — nothing is
//! ever sent twice. A stalled server (silent while others answer) keeps at
//! most its oldest call waiting, as the probe, until the timeout; the calls
//! behind it are answered at once and their late replies are read and
//! dropped, so its connection stays usable.
//!
//! Timestamps: `t_enqueue` is when the request was parsed into its
//! connection's line (there is no queue between threads), `t_dequeue` when
//! the loop took its batch up and routed it, `t_send` when its bytes were
//! handed to the server socket, `t_backend_done` when its last reply was
//! parsed. A loop's busy time is the time it spent outside `epoll_wait`.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcproto::ReadBuf;
use mio::event::Event;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use mwstats::clock::now_ns;
use mwstats::slots::SlotWriter;

use crate::batch::{finish_wave, waves, Entry};
use crate::conn::{write_out, After, ClientConn};
use crate::recorder::{BackendFact, WorkerAcc};
use crate::repair::{Batch, REPAIR_CAP};
use crate::route::{Answer, BackendError, Framing, Outbox, Router};
use crate::shared::Shared;

/// Tokens at and above this one are server links (`LINK_BASE + server`).
pub const LINK_BASE: usize = 1 << 40;
const READ_CHUNK: usize = 64 * 1024;
/// Reads of one link per event before others get their turn.
const READS_PER_EVENT: usize = 32;

/// What a link sent and waits for, in order.
enum Pending {
    /// A request's call: its reply goes to `(run, item)` as call `j`.
    Call { run: usize, item: usize, j: usize, framing: Framing, cap: usize, sent: u64 },
    /// Repairs sent before the calls; `left` replies to read.
    Repair { batch: Option<Batch>, left: usize, sent: u64 },
    /// A call given up (its server stalled); its reply is read and dropped.
    Abandoned { framing: Framing, cap: usize, sent: u64 },
}

impl Pending {
    fn sent(&self) -> u64 {
        match self {
            Pending::Call { sent, .. } | Pending::Repair { sent, .. } | Pending::Abandoned { sent, .. } => *sent,
        }
    }
}

/// A loop's connection to one server.
struct Link {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    /// Connecting since (the connection is not writable yet).
    connecting: Option<Instant>,
    wbuf: Vec<u8>,
    rbuf: ReadBuf,
    fifo: VecDeque<Pending>,
    /// This loop holds the server's probe.
    probe: bool,
    /// The last connection failed: the next one counts as a reconnection.
    failed_before: bool,
    reconnects: u64,
    /// When the server last sent bytes, or calls started waiting (ns).
    progress: u64,
}

/// One connection's batch in progress.
struct Run {
    conn: Arc<ClientConn>,
    entries: Vec<Entry>,
    /// Per request: calls of the current round still without a reply.
    awaiting: Vec<usize>,
    /// Per request: outcomes of a round of several calls, absorbed in order
    /// once all are in.
    answers: Vec<Vec<Option<Answer>>>,
    waves: Vec<std::ops::Range<usize>>,
    wave: usize,
    /// Requests of the current wave not finished yet.
    unfinished: usize,
}

/// The async engine's part of one event loop.
pub struct Pipeline {
    id: usize,
    shared: Arc<Shared>,
    links: Vec<Link>,
    runs: Vec<Option<Run>>,
    free: Vec<usize>,
    /// Connections with requests waiting and no batch in progress.
    runnable: VecDeque<Arc<ClientConn>>,
    /// Requests whose round is complete: they take their next one.
    advance: Vec<(usize, usize)>,
    outbox: Outbox,
    /// For each call of the outbox: run, item, call index.
    owners: Vec<(usize, usize, usize)>,
    rr: usize,
    writer: SlotWriter<WorkerAcc>,
    /// Busy time not yet added to the accumulator (ns).
    busy: u64,
    busy_flushed: Instant,
    /// A reply later than this (ns) fails its server connection.
    timeout: u64,
    connect_timeout: Duration,
    /// How long a server may be silent before the stall check.
    slice: u64,
    /// Unsent bytes to the servers beyond which no new batch starts.
    unsent_limit: usize,
}

impl Pipeline {
    /// The pipeline of loop `id`, with (lazily opened) links to every server.
    pub fn new(id: usize, shared: Arc<Shared>) -> Pipeline {
        let n = shared.addrs.len();
        let cfg = &shared.config.backend;
        let links = shared
            .addrs
            .iter()
            .map(|a| Link {
                addr: *a,
                stream: None,
                connecting: None,
                wbuf: Vec::new(),
                rbuf: ReadBuf::with_capacity(READ_CHUNK),
                fifo: VecDeque::new(),
                probe: false,
                failed_before: false,
                reconnects: 0,
                progress: 0,
            })
            .collect();
        Pipeline {
            id,
            links,
            runs: Vec::new(),
            free: Vec::new(),
            runnable: VecDeque::new(),
            advance: Vec::new(),
            outbox: Outbox::new(n),
            owners: Vec::new(),
            rr: id,
            writer: SlotWriter::new(id, WorkerAcc::new(n)),
            busy: 0,
            busy_flushed: Instant::now(),
            timeout: cfg.timeout_ms * 1_000_000,
            connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
            slice: cfg.stall_slice().as_nanos() as u64,
            unsent_limit: shared.config.proxy.memory_budget / shared.config.proxy.loops(),
            shared,
        }
    }

    /// A connection has requests waiting and no batch in progress.
    pub fn runnable(&mut self, conn: Arc<ClientConn>) {
        self.runnable.push_back(conn);
    }

    /// Whether the next poll must not sleep.
    pub fn has_work(&self) -> bool {
        !self.runnable.is_empty() && !self.saturated()
    }

    /// Whether the servers' connections hold so many unsent bytes (servers
    /// that read slowly) that no new batch may start: the clients then wait
    /// in their sockets, and the loop's memory stays bounded by its share of
    /// `memory_budget`.
    fn saturated(&self) -> bool {
        let unsent: usize = self.links.iter().map(|l| l.wbuf.len()).sum();
        unsent > self.unsent_limit
    }

    /// How long the loop may sleep at most: calls in flight need their
    /// deadlines checked.
    pub fn sleep_limit(&self) -> Option<Duration> {
        let any = self.links.iter().any(|l| !l.fifo.is_empty() || l.connecting.is_some());
        any.then(|| Duration::from_nanos(self.slice.min(5_000_000)))
    }

    /// Adds time the loop spent working; written to the accumulator every few ms.
    pub fn add_busy(&mut self, ns: u64) {
        self.busy += ns;
        if self.busy_flushed.elapsed() >= Duration::from_millis(10) {
            self.flush_busy();
        }
    }

    fn flush_busy(&mut self) {
        let busy = std::mem::take(&mut self.busy);
        self.busy_flushed = Instant::now();
        if busy > 0 {
            self.writer.record(&self.shared.telemetry.slots, |acc| {
                acc.busy_ns += busy;
                acc.dirty = true;
            });
        }
    }

    /// Whether nothing is in progress (shutdown waits for it).
    pub fn idle(&self) -> bool {
        self.runnable.is_empty() && self.runs.iter().all(Option::is_none)
    }

    /// A server link's socket is ready.
    pub fn link_event(&mut self, token: Token, ev: &Event) {
        let s = token.0 - LINK_BASE;
        if s >= self.links.len() {
            return;
        }
        if self.links[s].connecting.is_some() && (ev.is_writable() || ev.is_error()) {
            self.finish_connect(s);
        }
        if self.links[s].stream.is_none() {
            return;
        }
        if ev.is_writable() && self.links[s].connecting.is_none() {
            self.flush_link(s);
        }
        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
            self.read_link(s);
        }
    }

    /// One turn's work after the loop read its clients: start the runnable
    /// connections' batches and send every round that is ready, until
    /// nothing more can go out before replies come.
    pub fn pump(&mut self, registry: &Registry) {
        self.check_deadlines();
        loop {
            while !self.saturated() {
                let Some(conn) = self.runnable.pop_front() else { break };
                self.start_run(conn);
            }
            if self.advance.is_empty() {
                break;
            }
            self.round(registry);
        }
        if self.busy_flushed.elapsed() >= Duration::from_millis(10) {
            self.flush_busy();
        }
    }

    /// Takes a batch of the connection's waiting requests.
    fn start_run(&mut self, conn: Arc<ClientConn>) {
        let jobs = conn.take_batch();
        if jobs.is_empty() {
            self.after_run(conn);
            return;
        }
        let t_dequeue = now_ns();
        let waves = waves(&jobs, self.shared.router.replication);
        let n = jobs.len();
        let entries = jobs.into_iter().map(|job| Entry::begin(job, t_dequeue, &self.shared, &mut self.rr)).collect();
        let run =
            Run { conn, entries, awaiting: vec![0; n], answers: vec![Vec::new(); n], waves, wave: 0, unfinished: 0 };
        let r = match self.free.pop() {
            Some(r) => {
                self.runs[r] = Some(run);
                r
            }
            None => {
                self.runs.push(Some(run));
                self.runs.len() - 1
            }
        };
        self.start_wave(r);
    }

    fn start_wave(&mut self, r: usize) {
        let Pipeline { runs, shared, writer, advance, .. } = self;
        let run = runs[r].as_mut().expect("run in progress");
        let wave = run.waves[run.wave].clone();
        run.unfinished = wave.len();
        for i in wave {
            run.entries[i].answer_locally(shared, writer);
            advance.push((r, i));
        }
    }

    /// After a batch: the connection runs again if more requests wait.
    fn after_run(&mut self, conn: Arc<ClientConn>) {
        self.writer.settle(&self.shared.telemetry.slots);
        if conn.after_batch() == After::Again {
            self.runnable.push_back(conn);
        }
    }

    /// Asks every request in `advance` for its next round and sends them.
    fn round(&mut self, registry: &Registry) {
        self.outbox.clear();
        self.owners.clear();
        let mut again = Vec::new();
        let mut finished = Vec::new();
        let todo = std::mem::take(&mut self.advance);
        for &(r, i) in &todo {
            let run = self.runs[r].as_mut().expect("run in progress");
            let first = self.outbox.calls().len();
            let n = run.entries[i].exec.round(&self.shared.router, &mut self.outbox);
            let calls = &self.outbox.calls()[first..];
            run.entries[i].calls = 0..n;
            run.awaiting[i] = calls.iter().filter(|c| c.reply).count();
            if n > 1 {
                run.answers[i].clear();
                run.answers[i].resize_with(n, || None);
            }
            self.owners.extend((0..n).map(|j| (r, i, j)));
            if n == 0 {
                finished.push((r, i));
            } else if run.awaiting[i] == 0 {
                // Only calls without a reply: the next round follows at once.
                again.push((r, i));
            }
        }
        self.advance = todo;
        self.advance.clear();
        self.send_outbox(registry);
        self.advance.extend(again);
        for (r, i) in finished {
            self.item_finished(r, i);
        }
    }

    /// A request has its reply.
    fn item_finished(&mut self, r: usize, i: usize) {
        let Pipeline { runs, shared, writer, .. } = self;
        let run = runs[r].as_mut().expect("run in progress");
        run.entries[i].answer_gathered(shared, writer);
        run.unfinished -= 1;
        if run.unfinished > 0 {
            return;
        }
        let wave = run.waves[run.wave].clone();
        finish_wave(&mut run.entries[wave], &run.conn, shared, writer, self.id);
        run.wave += 1;
        if run.wave < run.waves.len() {
            self.start_wave(r);
            return;
        }
        let run = self.runs[r].take().expect("run in progress");
        self.free.push(r);
        self.after_run(run.conn);
    }

    /// Hands the outbox's calls to their links.
    fn send_outbox(&mut self, registry: &Registry) {
        let servers = self.outbox.servers();
        for s in 0..servers {
            if self.outbox.bytes(s).is_empty() {
                continue;
            }
            let probe = match self.shared.health.admit(s) {
                Ok(p) => p,
                Err(e) => {
                    self.shared.health.gave_up(s, &e);
                    self.fail_outbox_calls(s, &e);
                    continue;
                }
            };
            if probe {
                self.links[s].probe = true;
            }
            if let Err(e) = self.ensure_link(registry, s) {
                self.fail_outbox_calls(s, &e);
                self.link_failed(s, &e);
                continue;
            }
            let now = now_ns();
            let Pipeline { links, outbox, owners, runs, shared, .. } = self;
            let link = &mut links[s];
            // A link is waiting in the shared health while it has anything in flight.
            let was_idle = link.fifo.is_empty();
            if let Some(batch) = shared.repairs.take(s) {
                let left = batch.encode(&mut link.wbuf);
                link.fifo.push_back(Pending::Repair { batch: Some(batch), left, sent: now });
            }
            link.wbuf.extend_from_slice(outbox.bytes(s));
            for (ci, call) in outbox.calls().iter().enumerate() {
                if call.server != s {
                    continue;
                }
                let (r, i, j) = owners[ci];
                let e = &mut runs[r].as_mut().expect("run in progress").entries[i];
                e.facts.t_send = Some(e.facts.t_send.map_or(now, |t| t.min(now)));
                if call.reply {
                    link.fifo.push_back(Pending::Call {
                        run: r,
                        item: i,
                        j,
                        framing: call.framing,
                        cap: call.cap,
                        sent: now,
                    });
                }
            }
            if was_idle && !link.fifo.is_empty() {
                link.progress = now;
                shared.health.begin_wait(s);
            }
            if link.connecting.is_none() {
                self.flush_link(s);
            }
        }
    }

    /// Every call of the outbox to server `s` fails with `e` (nothing was sent).
    fn fail_outbox_calls(&mut self, s: usize, e: &BackendError) {
        let calls: Vec<(usize, usize, usize)> = self
            .outbox
            .calls()
            .iter()
            .zip(&self.owners)
            .filter(|(c, _)| c.server == s && c.reply)
            .map(|(_, o)| *o)
            .collect();
        let now = now_ns();
        for (r, i, j) in calls {
            self.deliver(r, i, j, s, Err(e), now, now);
        }
    }

    /// Opens the link if it is closed (the connect finishes in the background).
    fn ensure_link(&mut self, registry: &Registry, s: usize) -> Result<(), BackendError> {
        let link = &mut self.links[s];
        if link.stream.is_some() {
            return Ok(());
        }
        let mut stream = TcpStream::connect(link.addr).map_err(|e| BackendError::Connect(e.to_string()))?;
        registry
            .register(&mut stream, Token(LINK_BASE + s), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| BackendError::Connect(e.to_string()))?;
        if std::mem::take(&mut link.failed_before) {
            link.reconnects += 1;
        }
        link.stream = Some(stream);
        link.connecting = Some(Instant::now());
        link.rbuf.clear();
        Ok(())
    }

    fn finish_connect(&mut self, s: usize) {
        let link = &mut self.links[s];
        let Some(stream) = link.stream.as_ref() else { return };
        let outcome = match stream.take_error() {
            Ok(Some(e)) | Err(e) => Err(e),
            Ok(None) => match stream.peer_addr() {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => Err(e),
            },
        };
        match outcome {
            Ok(()) => {
                let _ = stream.set_nodelay(true);
                link.connecting = None;
                self.flush_link(s);
            }
            Err(e) => self.link_failed(s, &BackendError::Connect(e.to_string())),
        }
    }

    /// Writes what the link has buffered, as far as the socket takes it.
    fn flush_link(&mut self, s: usize) {
        let link = &mut self.links[s];
        let Some(stream) = link.stream.as_mut() else { return };
        if let Err(e) = write_out(stream, &mut link.wbuf) {
            let e = if e.kind() == io::ErrorKind::WriteZero { "closed by server".into() } else { e.to_string() };
            self.link_failed(s, &BackendError::Io(e));
        }
    }

    /// Reads the server's replies and hands each to its request.
    fn read_link(&mut self, s: usize) {
        let mut closed = None;
        for _ in 0..READS_PER_EVENT {
            let link = &mut self.links[s];
            let Some(stream) = link.stream.as_mut() else { return };
            link.rbuf.shrink_to(READ_CHUNK);
            let spare = link.rbuf.spare(READ_CHUNK / 4);
            let room = spare.len();
            match stream.read(spare) {
                Ok(0) => {
                    closed = Some(BackendError::Io("closed by server".into()));
                    break;
                }
                Ok(n) => {
                    link.rbuf.commit(n);
                    link.progress = now_ns();
                    self.shared.health.progress(s);
                    if n < room {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    closed = Some(BackendError::Io(e.to_string()));
                    break;
                }
            }
        }
        if let Err(e) = self.take_replies(s) {
            self.link_failed(s, &e);
            return;
        }
        if let Some(e) = closed {
            if self.links[s].fifo.is_empty() {
                // Closed while idle (a restart): open anew on next use, no failure.
                self.drop_stream(s);
            } else {
                self.link_failed(s, &e);
            }
        }
    }

    /// Hands every complete reply in the link's buffer to its request.
    fn take_replies(&mut self, s: usize) -> Result<(), BackendError> {
        let was_waiting = !self.links[s].fifo.is_empty();
        let mut at = 0;
        let result = loop {
            let link = &mut self.links[s];
            let Some(head) = link.fifo.front_mut() else { break Ok(()) };
            let filled = &link.rbuf.filled()[at..];
            let (framing, cap) = match head {
                Pending::Call { framing, cap, .. } | Pending::Abandoned { framing, cap, .. } => (*framing, *cap),
                Pending::Repair { .. } => (mcproto::status_reply_len as Framing, REPAIR_CAP),
            };
            let n = match framing(filled) {
                Ok(Some(n)) => n,
                Ok(None) if filled.len() > cap => break Err(BackendError::TooLarge),
                Ok(None) => break Ok(()),
                Err(e) => break Err(BackendError::Protocol(e.to_string())),
            };
            let now = now_ns();
            match head {
                Pending::Repair { batch, left, .. } => {
                    *left -= 1;
                    if *left == 0 {
                        if let Some(b) = batch.take() {
                            self.shared.repairs.completed(&b);
                        }
                        link.fifo.pop_front();
                    }
                }
                Pending::Abandoned { .. } => {
                    link.fifo.pop_front();
                }
                Pending::Call { .. } => {
                    let Some(Pending::Call { run, item, j, sent, .. }) = link.fifo.pop_front() else { unreachable!() };
                    if link.probe {
                        link.probe = false;
                        self.shared.health.end_probe(s);
                    }
                    self.shared.health.succeeded(s);
                    let fact = Fact { s, sent, done: now, reconnects: std::mem::take(&mut link.reconnects) };
                    let reply = &link.rbuf.filled()[at..at + n];
                    deliver(&mut self.runs, &mut self.advance, &self.shared.router, (run, item, j), fact, Ok(reply));
                }
            }
            at += n;
        };
        let link = &mut self.links[s];
        link.rbuf.consume(at.min(link.rbuf.len()));
        if was_waiting && link.fifo.is_empty() {
            self.shared.health.end_wait(s);
        }
        result
    }

    /// Call `j` of request `(r, i)` got its outcome from server `s`.
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        r: usize,
        i: usize,
        j: usize,
        s: usize,
        outcome: Result<&[u8], &BackendError>,
        sent: u64,
        done: u64,
    ) {
        let reconnects = std::mem::take(&mut self.links[s].reconnects);
        let fact = Fact { s, sent, done, reconnects };
        deliver(&mut self.runs, &mut self.advance, &self.shared.router, (r, i, j), fact, outcome);
    }

    /// Closes a link after a failure: every call it carried fails with `e`.
    fn link_failed(&mut self, s: usize, e: &BackendError) {
        self.drop_stream(s);
        let link = &mut self.links[s];
        link.failed_before = true;
        link.wbuf.clear();
        let pending = std::mem::take(&mut link.fifo);
        if !pending.is_empty() {
            self.shared.health.end_wait(s);
        }
        let now = now_ns();
        for p in pending {
            match p {
                Pending::Call { run, item, j, sent, .. } => self.deliver(run, item, j, s, Err(e), sent, now),
                Pending::Repair { batch: Some(b), .. } => self.shared.repairs.give_back(s, b),
                Pending::Repair { .. } | Pending::Abandoned { .. } => {}
            }
        }
        match e {
            BackendError::Stalled | BackendError::Down => self.shared.health.gave_up(s, e),
            _ => self.shared.health.failed(s, e),
        }
        if std::mem::take(&mut self.links[s].probe) {
            self.shared.health.end_probe(s);
        }
    }

    fn drop_stream(&mut self, s: usize) {
        let link = &mut self.links[s];
        if let Some(st) = link.stream.take() {
            let _ = st.shutdown(Shutdown::Both);
            // Dropping the socket removes it from the poll.
        }
        link.connecting = None;
        link.rbuf.clear();
        link.rbuf.shrink_to(READ_CHUNK);
    }

    /// Timeouts, connect timeouts and stalls of the links with calls in flight.
    fn check_deadlines(&mut self) {
        let stall_on = self.shared.config.backend.stall_ms > 0;
        let (timeout, slice) = (self.timeout, self.slice);
        let overdue =
            |link: &Link, now: u64| link.fifo.front().is_some_and(|h| now.saturating_sub(h.sent()) >= timeout);
        let quiet = |link: &Link, now: u64| !link.fifo.is_empty() && now.saturating_sub(link.progress) >= slice;
        for s in 0..self.links.len() {
            if let Some(since) = self.links[s].connecting {
                if since.elapsed() >= self.connect_timeout {
                    self.link_failed(s, &BackendError::Connect("connection timed out".into()));
                } else if overdue(&self.links[s], now_ns()) {
                    self.link_failed(s, &BackendError::Timeout);
                }
                continue;
            }
            let now = now_ns();
            if !overdue(&self.links[s], now) && !quiet(&self.links[s], now) {
                continue;
            }
            // Replies may have arrived while this loop was busy: take them
            // before judging the server.
            self.read_link(s);
            let now = now_ns();
            let link = &self.links[s];
            if overdue(link, now) {
                self.link_failed(s, &BackendError::Timeout);
                continue;
            }
            let health = &self.shared.health;
            if !stall_on || link.probe || !quiet(link, now) || !health.stalled(s, health.now_ms()) {
                continue;
            }
            // The oldest call stays as the probe if this loop may probe;
            // everything else is answered now.
            let keep = if health.claim_probe(s) {
                self.links[s].probe = true;
                1
            } else {
                0
            };
            self.abandon(s, keep);
        }
    }

    /// Gives up the calls of link `s` after the first `keep`: their
    /// requests get `stalled` now, their replies will be dropped.
    fn abandon(&mut self, s: usize, keep: usize) {
        let now = now_ns();
        let mut given_up = Vec::new();
        for (k, p) in self.links[s].fifo.iter_mut().enumerate() {
            if k < keep {
                continue;
            }
            if let Pending::Call { run, item, j, framing, cap, sent } = *p {
                given_up.push((run, item, j, sent));
                *p = Pending::Abandoned { framing, cap, sent };
            }
        }
        if !given_up.is_empty() {
            self.shared.health.gave_up(s, &BackendError::Stalled);
        }
        for (r, i, j, sent) in given_up {
            self.deliver(r, i, j, s, Err(&BackendError::Stalled), sent, now);
        }
    }
}

/// Which server answered a call, when it was sent and answered.
struct Fact {
    s: usize,
    sent: u64,
    done: u64,
    reconnects: u64,
}

/// Hands call `j` of request `(r, i)` its outcome; a request whose round is
/// complete goes to `advance` for its next round.
fn deliver(
    runs: &mut [Option<Run>],
    advance: &mut Vec<(usize, usize)>,
    router: &Router,
    (r, i, j): (usize, usize, usize),
    f: Fact,
    outcome: Result<&[u8], &BackendError>,
) {
    let run = runs[r].as_mut().expect("run in progress");
    let e = &mut run.entries[i];
    e.facts.backend.push(BackendFact {
        server: f.s,
        ns: f.done.saturating_sub(f.sent),
        failed: outcome.is_err(),
        timeout: matches!(outcome, Err(BackendError::Timeout)),
        reconnects: f.reconnects,
    });
    e.facts.t_backend_done = e.facts.t_backend_done.max(f.done);
    if e.calls.len() == 1 {
        e.exec.absorb(router, 0, outcome);
    } else {
        run.answers[i][j] = Some(crate::route::own(outcome));
    }
    run.awaiting[i] -= 1;
    if run.awaiting[i] > 0 {
        return;
    }
    if e.calls.len() > 1 {
        for (j, a) in run.answers[i].iter().enumerate() {
            if let Some(a) = a {
                e.exec.absorb(router, j, a.as_deref());
            }
        }
    }
    advance.push((r, i));
}
