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
//! What may be sent to a server, how long to wait and what a failure means
//! is decided by each link's [`Exchange`], by the same rules as the pool
//! engine's: a server that is down or stalled gets nothing and its calls fail
//! at once; after the backoff one request probes it; repairs go first on the
//! same connection; a link that fails (refused, reset, timed out, garbage) is
//! closed and every call it carried fails with `SERVER_ERROR` — nothing is
//! ever sent twice. A stalled server (silent while others answer) keeps at
//! most its oldest call waiting, as the probe, until the timeout; the calls
//! behind it are answered at once and their late replies are read and
//! dropped, so its connection stays usable. Replies end their calls as they
//! come, whichever request they belong to.
//!
//! Timestamps: `t_enqueue` is when the request was parsed into its
//! connection's line (there is no queue between threads), `t_dequeue` when
//! the loop took its batch up and routed it, `t_send` when its bytes were
//! handed to the server socket, `t_backend_done` when its last reply was
//! parsed. A loop's busy time is the time it spent outside `epoll_wait`.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::Shutdown;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcproto::ReadBuf;
use mio::event::Event;
use mio::{Interest, Registry, Token};
use mwserve::stream::{Addr, Stream};
use mwstats::clock::now_ns;
use mwstats::slots::SlotWriter;

use mwserve::tls::Session;

use crate::batch::{finish_wave, waves, Entry};
use crate::conn::{write_out, After, ClientConn};
use crate::exchange::{Ended, Exchange, Verdict};
use crate::generation::Generation;
use crate::recorder::WorkerAcc;
use crate::route::{BackendError, Outbox};
use crate::shared::Shared;

/// Tokens at and above this one are server links (`LINK_BASE + server`).
pub const LINK_BASE: usize = 1 << 40;
const READ_CHUNK: usize = 64 * 1024;
/// Reads of one link per event before others get their turn.
const READS_PER_EVENT: usize = 32;

/// A call of a round: its batch, the request's place in it, the call's
/// index in the request's round.
type Tag = (usize, usize, usize);

/// A loop's connection to one server.
struct Link {
    addr: Addr,
    stream: Option<Stream>,
    /// The TLS session of the open connection.
    session: Option<Session>,
    /// Connecting since (the connection is not writable yet).
    connecting: Option<Instant>,
    wbuf: Vec<u8>,
    rbuf: ReadBuf,
    /// What the server owes and the rules of waiting for it.
    ex: Exchange<Tag>,
}

/// One connection's batch in progress.
struct Run {
    conn: Arc<ClientConn>,
    /// The configuration it is routed with (its id).
    generation: u64,
    entries: Vec<Entry>,
    waves: Vec<std::ops::Range<usize>>,
    wave: usize,
    /// Requests of the current wave not finished yet.
    unfinished: usize,
}

/// The async engine's part of one event loop.
pub struct Pipeline {
    id: usize,
    shared: Arc<Shared>,
    /// By server number, added as servers are first used.
    links: Vec<Link>,
    /// When links to servers that a reload removed were last looked for.
    retired: Instant,
    /// The configurations runs are routed with: the one in use, and older
    /// ones while runs begun with them go on.
    generations: Generations,
    runs: Vec<Option<Run>>,
    free: Vec<usize>,
    /// Connections with requests waiting and no batch in progress.
    runnable: VecDeque<Arc<ClientConn>>,
    /// Requests whose round is complete: they take their next one.
    advance: Vec<(usize, usize)>,
    outbox: Outbox,
    /// For each call of the outbox, whose it is.
    owners: Vec<Tag>,
    rr: usize,
    writer: SlotWriter<WorkerAcc>,
    /// Busy time not yet added to the accumulator (ns).
    busy: u64,
    busy_flushed: Instant,
    /// Unsent bytes to the servers beyond which no new batch starts.
    unsent_limit: usize,
    /// Links whose last read stopped at its budget with bytes still there:
    /// read again on the next turn. (The socket is edge-triggered: bytes
    /// left unread raise no new event, and a server whose replies then fill
    /// the socket sends nothing more to raise one; its calls waited for the
    /// stall check, 25 ms a turn, and large replies timed out.)
    unread: Vec<usize>,
}

/// Hands a call's end to its request; a request whose round is complete
/// goes to `advance` for its next round.
fn absorb(runs: &mut [Option<Run>], generations: &Generations, advance: &mut Vec<(usize, usize)>, end: Ended<'_, Tag>) {
    let (r, i, j) = end.tag;
    let run = runs[r].as_mut().expect("run in progress");
    if run.entries[i].absorb(generations.get(run.generation), j, end.outcome, end.fact) {
        advance.push((r, i));
    }
}

impl Pipeline {
    /// The pipeline of loop `id`, with (lazily opened) links to every server.
    pub fn new(id: usize, shared: Arc<Shared>) -> Pipeline {
        Pipeline {
            id,
            links: Vec::new(),
            retired: Instant::now(),
            generations: Generations { current: shared.generation(), older: Vec::new() },
            runs: Vec::new(),
            free: Vec::new(),
            runnable: VecDeque::new(),
            advance: Vec::new(),
            outbox: Outbox::new(0),
            owners: Vec::new(),
            rr: id,
            writer: SlotWriter::new(id, WorkerAcc::new(0)),
            busy: 0,
            busy_flushed: Instant::now(),
            unsent_limit: shared.config.proxy.memory_budget / shared.config.proxy.loops(),
            unread: Vec::new(),
            shared,
        }
    }

    /// A connection has requests waiting and no batch in progress.
    pub fn runnable(&mut self, conn: Arc<ClientConn>) {
        self.runnable.push_back(conn);
    }

    /// Whether the next poll must not sleep.
    pub fn has_work(&self) -> bool {
        (!self.runnable.is_empty() && !self.saturated()) || !self.unread.is_empty()
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
        let any = self.links.iter().any(|l| l.ex.in_flight() || l.connecting.is_some());
        any.then(|| self.shared.servers.slice().min(Duration::from_millis(5)))
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
        for s in std::mem::take(&mut self.unread) {
            if self.links[s].stream.is_some() && self.links[s].connecting.is_none() {
                self.read_link(s);
            }
        }
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
        self.generations.refresh(&self.shared, &self.runs);
        let generation = &self.generations.current;
        let waves = waves(&jobs, generation.wave_width());
        let entries = jobs.into_iter().map(|job| Entry::begin(job, t_dequeue, generation, &mut self.rr)).collect();
        let run = Run { conn, generation: generation.id, entries, waves, wave: 0, unfinished: 0 };
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
        let Pipeline { runs, shared, writer, advance, generations, .. } = self;
        let run = runs[r].as_mut().expect("run in progress");
        let wave = run.waves[run.wave].clone();
        run.unfinished = wave.len();
        let generation = generations.get(run.generation);
        for i in wave {
            run.entries[i].answer_locally(generation, shared, writer);
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
            let e = &mut run.entries[i];
            if e.finished {
                // (Pushed twice: when it gave calls up, and at its last reply.)
                continue;
            }
            if !e.abandon.is_empty() {
                // Calls it no longer waits for: their replies are dropped when they come.
                let gone = std::mem::take(&mut e.abandon);
                let given_up: usize =
                    self.links.iter_mut().map(|l| l.ex.give_up(|t| t.0 == r && t.1 == i && gone.contains(&t.2))).sum();
                e.awaiting -= given_up;
                if e.awaiting > 0 {
                    continue;
                }
            }
            let n = e.next_round(self.generations.get(run.generation), &mut self.outbox);
            self.owners.extend((0..n).map(|j| (r, i, j)));
            if n == 0 {
                finished.push((r, i));
            } else if e.awaiting == 0 {
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
        let Pipeline { runs, shared, writer, generations, .. } = self;
        let run = runs[r].as_mut().expect("run in progress");
        let generation = generations.get(run.generation);
        run.entries[i].answer_gathered(generation, shared, writer);
        run.unfinished -= 1;
        if run.unfinished > 0 {
            return;
        }
        let wave = run.waves[run.wave].clone();
        finish_wave(&mut run.entries[wave], generation, &run.conn, shared, writer, self.id);
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
        let Pipeline { links, outbox, owners, runs, advance, shared, generations, .. } = self;
        let servers = &shared.servers;
        while links.len() < outbox.servers() {
            let s = links.len();
            links.push(Link {
                addr: servers.addr(s),
                stream: None,
                session: None,
                connecting: None,
                wbuf: Vec::new(),
                rbuf: ReadBuf::with_capacity(READ_CHUNK),
                ex: Exchange::new(s),
            });
        }
        let mut ended = |end: Ended<'_, Tag>| absorb(runs, generations, advance, end);
        for (s, link) in links.iter_mut().enumerate() {
            if outbox.bytes(s).is_empty() {
                continue;
            }
            let Link { addr, stream, connecting, wbuf, rbuf, ex, session } = link;
            let open = || {
                let opened = open_link(registry, s, addr, stream, connecting, rbuf)?;
                if opened {
                    *session = match servers.tls(s) {
                        Some((cfg, name)) => {
                            Some(Session::connect(&cfg, name).map_err(|e| BackendError::Connect(e.to_string()))?)
                        }
                        None => None,
                    };
                }
                Ok(opened)
            };
            // (When nothing may be written, the calls have ended already.)
            if ex.begin(servers, outbox, owners, wbuf, now_ns(), open, &mut ended) && link.connecting.is_none() {
                if let Err(e) = flush(link) {
                    fail_link(link, shared, &e, &mut ended);
                }
            }
        }
    }

    fn finish_connect(&mut self, s: usize) {
        let link = &mut self.links[s];
        let Some(stream) = link.stream.as_ref() else { return };
        let outcome = match stream.connected() {
            Ok(true) => Ok(()),
            Ok(false) => return,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => {
                stream.set_nodelay();
                link.connecting = None;
                self.flush_link(s);
            }
            Err(e) => self.link_failed(s, &BackendError::Connect(e.to_string())),
        }
    }

    /// Writes what the link has buffered, as far as the socket takes it.
    fn flush_link(&mut self, s: usize) {
        if let Err(e) = flush(&mut self.links[s]) {
            self.link_failed(s, &e);
        }
    }

    /// Reads the server's replies and hands each to its request.
    fn read_link(&mut self, s: usize) {
        let Pipeline { links, runs, advance, shared, generations, unread, .. } = self;
        let servers = &shared.servers;
        let mut ended = |end: Ended<'_, Tag>| absorb(runs, generations, advance, end);
        let link = &mut links[s];
        let mut closed = None;
        let mut drained = false;
        for _ in 0..READS_PER_EVENT {
            let Some(stream) = link.stream.as_mut() else { return };
            link.rbuf.shrink_to(READ_CHUNK);
            let spare = link.rbuf.spare(READ_CHUNK / 4);
            let room = spare.len();
            let read = match link.session.as_mut() {
                Some(session) => session.read(&*stream, spare),
                None => (&*stream).read(spare),
            };
            match read {
                Ok(0) => {
                    closed = Some(BackendError::Io("closed by server".into()));
                    break;
                }
                Ok(n) => {
                    link.rbuf.commit(n);
                    link.ex.progress(servers, now_ns());
                    // A short read empties a plain socket; TLS may hold more records.
                    if n < room && link.session.is_none() {
                        drained = true;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drained = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    closed = Some(BackendError::Protocol(e.to_string()));
                    break;
                }
                Err(e) => {
                    closed = Some(BackendError::Io(e.to_string()));
                    break;
                }
            }
        }
        if !drained && closed.is_none() && !unread.contains(&s) {
            unread.push(s);
        }
        match link.ex.replies(servers, link.rbuf.filled(), now_ns(), &mut ended) {
            Ok(used) => link.rbuf.consume(used),
            Err(e) => return fail_link(link, shared, &e, &mut ended),
        }
        if let Some(e) = closed {
            if link.ex.in_flight() {
                fail_link(link, shared, &e, &mut ended);
            } else {
                // Closed while idle (a restart): open anew on next use, no failure.
                close(link);
            }
        }
    }

    /// Closes a link after a failure: every call it carried fails with `e`.
    fn link_failed(&mut self, s: usize, e: &BackendError) {
        let Pipeline { links, runs, advance, shared, generations, .. } = self;
        fail_link(&mut links[s], shared, e, &mut |end| absorb(runs, generations, advance, end));
    }

    /// Connect timeouts, reply timeouts and stalls of the links with calls in flight.
    fn check_deadlines(&mut self) {
        self.retire_links();
        let connect_timeout = self.shared.servers.connect_timeout();
        for s in 0..self.links.len() {
            let now = now_ns();
            let link = &self.links[s];
            if link.connecting.is_some_and(|since| since.elapsed() >= connect_timeout) {
                self.link_failed(s, &BackendError::Connect("connection timed out".into()));
                continue;
            }
            if !link.ex.due(&self.shared.servers, now) {
                continue;
            }
            // Replies may have arrived while this loop was busy: take them
            // before judging the server.
            if link.connecting.is_none() {
                self.read_link(s);
            }
            let Pipeline { links, runs, advance, shared, generations, .. } = self;
            let mut ended = |end: Ended<'_, Tag>| absorb(runs, generations, advance, end);
            if links[s].ex.check(&shared.servers, now_ns(), &mut ended) == Verdict::TimedOut {
                fail_link(&mut links[s], shared, &BackendError::Timeout, &mut ended);
            }
        }
    }
}

impl Pipeline {
    /// Closes, every 100 ms at most, the connections to servers that the
    /// configuration in use no longer has, once nothing is in flight on them
    /// (a request routed before the reload that still needs one opens it again).
    fn retire_links(&mut self) {
        if self.retired.elapsed() < Duration::from_millis(100) {
            return;
        }
        self.retired = Instant::now();
        self.generations.refresh(&self.shared, &self.runs);
        let generation = &self.generations.current;
        for (s, link) in self.links.iter_mut().enumerate() {
            let idle = link.stream.is_some() && !link.ex.in_flight() && link.wbuf.is_empty();
            if idle && link.connecting.is_none() && !generation.uses(s) {
                close(link);
            }
        }
    }
}

/// The configurations a loop's runs are routed with, looked up by id: a run
/// keeps the one it began with, and the loop holds it (one reference per
/// configuration, not per request) until no run needs it.
struct Generations {
    current: Arc<Generation>,
    older: Vec<Arc<Generation>>,
}

impl Generations {
    fn get(&self, id: u64) -> &Generation {
        if self.current.id == id {
            return &self.current;
        }
        self.older.iter().find(|g| g.id == id).expect("a run's configuration is kept while it runs")
    }

    /// Takes the configuration in use now, keeping the older ones that
    /// `runs` still use.
    fn refresh(&mut self, shared: &Shared, runs: &[Option<Run>]) {
        if let Some(now) = shared.changed(&self.current) {
            self.older.push(std::mem::replace(&mut self.current, now));
            let used = |id: u64| runs.iter().flatten().any(|r| r.generation == id);
            self.older.retain(|g| used(g.id));
        }
    }
}

/// Opens a link's connection if it is closed (the connect finishes in the
/// background); true when a new one was started.
fn open_link(
    registry: &Registry,
    s: usize,
    addr: &Addr,
    stream: &mut Option<Stream>,
    connecting: &mut Option<Instant>,
    rbuf: &mut ReadBuf,
) -> Result<bool, BackendError> {
    if stream.is_some() {
        return Ok(false);
    }
    let mut st = Stream::connect(addr).map_err(|e| BackendError::Connect(e.to_string()))?;
    registry
        .register(&mut st, Token(LINK_BASE + s), Interest::READABLE | Interest::WRITABLE)
        .map_err(|e| BackendError::Connect(e.to_string()))?;
    *stream = Some(st);
    *connecting = Some(Instant::now());
    rbuf.clear();
    Ok(true)
}

/// Writes what the link has buffered, as far as the socket (and a TLS
/// session's buffer) takes it.
fn flush(link: &mut Link) -> Result<(), BackendError> {
    let Some(stream) = link.stream.as_mut() else { return Ok(()) };
    let written = match link.session.as_mut() {
        Some(session) => {
            let plain = TlsWriter { session, stream: &*stream };
            write_out(plain, &mut link.wbuf).and_then(|_| session_flush(link))
        }
        None => write_out(&*stream, &mut link.wbuf).map(drop),
    };
    written.map_err(|e| {
        BackendError::Io(if e.kind() == io::ErrorKind::WriteZero { "closed by server".into() } else { e.to_string() })
    })
}

/// Writes the records a link's TLS session still holds.
fn session_flush(link: &mut Link) -> io::Result<()> {
    match (link.session.as_mut(), link.stream.as_ref()) {
        (Some(session), Some(stream)) => session.flush(stream).map(drop),
        _ => Ok(()),
    }
}

/// Plaintext into a TLS session over a link's socket, as an `io::Write`.
struct TlsWriter<'a> {
    session: &'a mut Session,
    stream: &'a Stream,
}

impl io::Write for TlsWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.session.write(self.stream, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.session.flush(self.stream).map(drop)
    }
}

/// Closes a link after a failure: every call it carried ends with `e`.
fn fail_link(link: &mut Link, shared: &Shared, e: &BackendError, ended: &mut impl FnMut(Ended<'_, Tag>)) {
    close(link);
    link.ex.fail(&shared.servers, e, now_ns(), ended);
}

/// Closes a link's connection and drops what it buffered (dropping the
/// socket removes it from the poll).
fn close(link: &mut Link) {
    if let Some(st) = link.stream.take() {
        let _ = st.shutdown(Shutdown::Both);
    }
    link.connecting = None;
    link.session = None;
    link.wbuf.clear();
    link.rbuf.clear();
    link.rbuf.shrink_to(READ_CHUNK);
}
