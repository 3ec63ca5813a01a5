//! The async engine (the default): one event loop per thread (a tokio
//! current-thread runtime) owns its clients and a few database connections.
//! A client's request is read, parsed, checked and answered on the same
//! thread; a request that needs the database joins the loop's waiting
//! requests, and whenever a statement may start, every waiting request that
//! can share it goes with it (many SENDs, ACKs, POPs of one queue or single
//! RECVs of one queue as one statement). Statements are pipelined: several
//! are in flight on each connection at once (`loop_db` connections, two
//! statements each), each its own transaction, each answered only once its
//! commit is confirmed (tokio-postgres reads a statement's answer up to the
//! ReadyForQuery that follows the commit). A lone request never waits for
//! company: with a statement slot free it goes at once.
//!
//! What each command does is `commands/`, shared with the pool engine.
//! See docs/mwmq.md ("Engines").

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mwstats::clock::now_ns;
use mwstats::slots::SlotWriter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, watch};

use crate::command::{self, Command, Limits, MqOp};
use crate::commands::{Answer, Batch, Core, Databases, DbFacts, Look, Outcome, Session};
use crate::config::Config;
use crate::db::{DbError, LeaseRef, PgConn};
use crate::output::Share;
use crate::peer::{self, while_waiting, Input, Left, Socket};
use crate::resp::{Reply, Request, RequestParser};
use crate::shared::Shared;
use crate::telemetry::{MqAcc, NetCounters, Stamps};
use crate::users::{Attempts, User};

/// A request larger than this takes its size from the input budget first.
const SMALL: usize = 64 * 1024;

/// A connection's replies not yet written, the leases they carry, and what
/// they hold of the output budget (`output.rs`).
struct Out {
    bytes: Vec<u8>,
    leases: Vec<LeaseRef>,
    charge: Share,
}

impl Out {
    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// A client connection of the async engine.
struct Sess {
    id: u64,
    name: RefCell<Option<String>>,
    user: RefCell<Option<Arc<User>>>,
    resp3: Cell<bool>,
    attempts: Attempts,
    peer: Option<IpAddr>,
}

impl Session for Sess {
    fn id(&self) -> u64 {
        self.id
    }
    fn name(&self) -> Option<String> {
        self.name.borrow().clone()
    }
    fn set_name(&self, name: String) {
        *self.name.borrow_mut() = Some(name);
    }
    fn user(&self) -> Option<Arc<User>> {
        self.user.borrow().clone()
    }
    fn set_user(&self, user: Arc<User>) {
        *self.user.borrow_mut() = Some(user);
    }
    fn resp3(&self) -> bool {
        self.resp3.get()
    }
    fn set_resp3(&self, on: bool) {
        self.resp3.set(on);
    }
    fn attempts(&self) -> &Attempts {
        &self.attempts
    }
    fn peer(&self) -> Option<IpAddr> {
        self.peer
    }
}

/// A request waiting for a statement.
struct Pending {
    cmd: Command,
    sess: Rc<Sess>,
    /// The statement it may share (`Batch::of`, once), when batching is on.
    kind: Option<Batch>,
    /// The database its statement runs on.
    db: usize,
    t_enqueue: u64,
    tx: oneshot::Sender<Carried>,
}

/// A request carried out.
struct Carried {
    outcome: Outcome,
    db: DbFacts,
    t_dequeue: u64,
    /// The loop's time for it (a batch's shared out).
    busy: u64,
}

/// One database connection of a loop, opened on demand, opened again
/// (after a backoff) when it broke.
#[derive(Default)]
struct Slot {
    pg: Option<(Rc<PgConn>, tokio::task::AbortHandle)>,
    /// Statements in flight on it.
    busy: Rc<Cell<usize>>,
    opening: bool,
    next_attempt: Option<Instant>,
    backoff: Duration,
    last_error: Option<String>,
}

/// A statement in flight on a connection (counted while it lives).
struct Busy(Rc<Cell<usize>>);

impl Busy {
    fn on(count: &Rc<Cell<usize>>) -> Busy {
        count.set(count.get() + 1);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// A loop's connections to one database, and the statements in flight on them.
struct LoopDb {
    /// This database's configuration (`Config::for_database`).
    cfg: Config,
    slots: RefCell<Vec<Slot>>,
    /// A slot became usable (or failed to): statements waiting for one look again.
    slot_changed: tokio::sync::Notify,
    inflight: Cell<usize>,
    /// The batch kinds of the statements in flight.
    kinds: RefCell<Vec<Batch>>,
    /// When the last statement started (a second one waits `loop_patience_us` after it).
    last_start: Cell<Instant>,
    /// A kick is scheduled for when the patience is over.
    rekick: Cell<bool>,
}

/// One event loop.
struct Loop {
    id: usize,
    shared: Arc<Shared>,
    /// Per database (`[[databases]]`; one with `--db`).
    dbs: Vec<LoopDb>,
    /// Statements in flight, on every database (a stop waits for them).
    inflight: Cell<usize>,
    patience: Duration,
    /// Statements a connection takes at once (pipelined).
    pipeline: usize,
    pending: RefCell<VecDeque<Pending>>,
    writer: RefCell<SlotWriter<MqAcc>>,
    /// Client connections open on this loop.
    clients: Cell<usize>,
    /// Handshakes under way, oldest first, each with its cancel.
    handshaking: RefCell<VecDeque<(u64, oneshot::Sender<()>)>>,
    next_handshake: Cell<u64>,
    /// This loop's share of `max_handshaking`.
    handshake_cap: usize,
    logins: tokio::sync::Semaphore,
    logins_waiting: Cell<usize>,
    stop: watch::Receiver<bool>,
    limits: Limits,
}

/// A running async engine: its loops' threads.
pub struct Engine {
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl Engine {
    /// Starts `loops` event loops serving `listeners` (each with whether it speaks TLS).
    pub fn start(
        shared: Arc<Shared>,
        listeners: Vec<(std::net::TcpListener, bool)>,
        loops: usize,
    ) -> std::io::Result<Engine> {
        let (stop, stop_rx) = watch::channel(false);
        let mut threads = Vec::new();
        for id in 0..loops.max(1) {
            let mut mine = Vec::new();
            for (l, tls) in &listeners {
                l.set_nonblocking(true)?;
                mine.push((l.try_clone()?, *tls));
            }
            let (shared, stop_rx) = (shared.clone(), stop_rx.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("loop-{id}"))
                    .spawn(move || run_loop(id, shared, mine, stop_rx))?,
            );
        }
        Ok(Engine { threads, stop })
    }

    /// A handle that stops the loops (they answer what is in flight, then end).
    pub fn stopper(&self) -> impl Fn() + Send + Sync + 'static {
        let tx = self.stop.clone();
        move || {
            let _ = tx.send(true);
        }
    }

    /// Waits for the loops to end.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn run_loop(
    id: usize,
    shared: Arc<Shared>,
    listeners: Vec<(std::net::TcpListener, bool)>,
    stop: watch::Receiver<bool>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("event loop {id}: no runtime: {e}");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let cfg = &shared.config;
        let q = &cfg.queues;
        let conns = cfg.server.loop_db.max(1);
        let lp = Rc::new(Loop {
            id,
            shared: shared.clone(),
            dbs: (0..shared.pool.len())
                .map(|i| LoopDb {
                    cfg: cfg.for_database(i),
                    slots: RefCell::new((0..conns).map(|_| Slot::default()).collect()),
                    slot_changed: tokio::sync::Notify::new(),
                    inflight: Cell::new(0),
                    kinds: RefCell::new(Vec::new()),
                    last_start: Cell::new(Instant::now()),
                    rekick: Cell::new(false),
                })
                .collect(),
            inflight: Cell::new(0),
            patience: Duration::from_micros(cfg.server.loop_patience_us),
            pipeline: cfg.server.loop_pipeline.max(1),
            pending: RefCell::new(VecDeque::new()),
            writer: RefCell::new(SlotWriter::new(id, MqAcc::default())),
            clients: Cell::new(0),
            handshaking: RefCell::new(VecDeque::new()),
            next_handshake: Cell::new(0),
            handshake_cap: (cfg.tls.max_handshaking / cfg.loops()).max(1),
            logins: tokio::sync::Semaphore::new(cfg.auth.login_threads.max(1)),
            logins_waiting: Cell::new(0),
            stop: stop.clone(),
            limits: Limits { default_vt_ms: q.default_vt_ms, max_wait_ms: q.max_wait_ms },
        });
        let mut accepting = Vec::new();
        for (l, tls) in listeners {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => accepting.push(tokio::task::spawn_local(accept(lp.clone(), l, tls))),
                Err(e) => tracing::error!("event loop {id}: cannot listen: {e}"),
            }
        }
        for a in accepting {
            let _ = a.await;
        }
        // Stopping: the clients answer what they have and close.
        let until = Instant::now() + Duration::from_secs(30);
        while (lp.clients.get() > 0 || lp.inflight.get() > 0) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        lp.writer.borrow_mut().settle(&lp.shared.telemetry.slots);
    });
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn accept(lp: Rc<Loop>, l: tokio::net::TcpListener, tls: bool) {
    let mut stop = lp.stop.clone();
    loop {
        let (stream, _) = tokio::select! {
            r = l.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors or the like: try again soon.
                    tracing::debug!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => return,
        };
        let shared = &lp.shared;
        NetCounters::add(&shared.net.accepted, 1);
        if shared.open_connections.fetch_add(1, Ordering::AcqRel) >= shared.max_connections {
            shared.open_connections.fetch_sub(1, Ordering::AcqRel);
            NetCounters::add(&shared.net.rejected, 1);
            tokio::task::spawn_local(async move {
                let mut stream = stream;
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), stream.write_all(crate::engine::net::TOO_MANY)).await;
            });
            continue;
        }
        let _ = stream.set_nodelay(true);
        peer::limit_unsent(stream.as_fd());
        lp.clients.set(lp.clients.get() + 1);
        let lp2 = lp.clone();
        tokio::task::spawn_local(async move {
            let peer = stream.peer_addr().ok().map(|a| a.ip());
            let accepted = Instant::now();
            match (tls, lp2.shared.tls.clone()) {
                (true, Some(cfg)) => {
                    if let Some(io) = Box::pin(handshake(&lp2, stream, cfg)).await {
                        Box::pin(serve(&lp2, io, peer, accepted)).await;
                    }
                }
                _ => Box::pin(serve(&lp2, stream, peer, accepted)).await,
            }
            lp2.clients.set(lp2.clients.get() - 1);
            lp2.shared.open_connections.fetch_sub(1, Ordering::AcqRel);
            NetCounters::add(&lp2.shared.net.closed, 1);
        });
    }
}

/// A TLS handshake within `[tls] handshake_timeout_secs`, at most
/// `max_handshaking` at once (shared out between the loops).
async fn handshake(
    lp: &Loop,
    stream: tokio::net::TcpStream,
    cfg: Arc<rustls::ServerConfig>,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let tls = &lp.shared.config.tls;
    let cap = lp.handshake_cap;
    let net = &lp.shared.net;
    let (cancel, cancelled) = oneshot::channel();
    let me = lp.next_handshake.get();
    lp.next_handshake.set(me + 1);
    {
        let mut h = lp.handshaking.borrow_mut();
        // Past the cap the oldest handshake makes room: silent sockets cannot lock clients out.
        while h.len() >= cap {
            if let Some((_, oldest)) = h.pop_front() {
                NetCounters::add(&net.handshake_refused, 1);
                let _ = oldest.send(());
            }
        }
        h.push_back((me, cancel));
    }
    let limit = Duration::from_secs(tls.handshake_timeout_secs.max(1));
    let r = tokio::select! {
        r = tokio::time::timeout(limit, tokio_rustls::TlsAcceptor::from(cfg).accept(stream)) => r,
        _ = cancelled => return None,
    };
    lp.handshaking.borrow_mut().retain(|(id, _)| *id != me);
    match r {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            NetCounters::add(&net.tls_handshake_failures, 1);
            lp.shared.tls_log.note(&e);
            None
        }
        Err(_) => {
            NetCounters::add(&net.handshake_timeouts, 1);
            None
        }
    }
}

/// Request ids of the async engine (unique per process).
static NEXT_REQUEST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Serves one client until it leaves, breaks the protocol, QUITs, or mwmq stops.
async fn serve<IO: AsyncRead + AsyncWrite + Socket + Unpin>(
    lp: &Rc<Loop>,
    mut io: IO,
    peer: Option<IpAddr>,
    accepted: Instant,
) {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let shared = lp.shared.clone();
    let sess = Rc::new(Sess {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        name: RefCell::new(None),
        user: RefCell::new(None),
        resp3: Cell::new(false),
        attempts: Attempts::default(),
        peer,
    });
    let mut parser = RequestParser::new(shared.config.server.max_body);
    // Small while the client is idle (10,000 idle clients cost little), grown when reads fill it.
    let mut rbuf = vec![0u8; 512];
    let (mut have, mut pos) = (0usize, 0usize);
    let mut out = Out { bytes: Vec::new(), leases: Vec::new(), charge: Share::none(&shared.output) };
    let mut reserved = 0usize;
    let mut last_read_ns = 0u64;
    let mut stop = lp.stop.clone();
    let login_deadline = (shared.users.enabled() && shared.config.auth.login_timeout_secs > 0)
        .then(|| accepted + Duration::from_secs(shared.config.auth.login_timeout_secs));
    let mut closing = false;
    'serve: loop {
        if pos == have {
            // Everything read is parsed: the replies go out, then more is read.
            if !out.is_empty() && !Box::pin(flush(lp, &mut io, &mut out)).await {
                break;
            }
            if closing || *stop.borrow() {
                break;
            }
            let deadline = login_deadline.filter(|_| sess.user.borrow().is_none());
            let read = async {
                match deadline {
                    Some(d) => tokio::time::timeout_at(d.into(), io.read(&mut rbuf)).await.ok(),
                    None => Some(io.read(&mut rbuf).await),
                }
            };
            let n = tokio::select! {
                r = read => r,
                _ = stopped(&mut stop) => break,
            };
            match n {
                None => {
                    NetCounters::add(&shared.net.login_timeouts, 1);
                    break;
                }
                Some(Ok(0)) | Some(Err(_)) => break,
                Some(Ok(n)) => {
                    NetCounters::add(&shared.net.bytes_in, n as u64);
                    if n == rbuf.len() && rbuf.len() < 16 * 1024 {
                        rbuf.resize(rbuf.len() * 4, 0);
                    }
                    last_read_ns = now_ns();
                    (have, pos) = (n, 0);
                }
            }
        }
        // Budget a large request before its bytes are held.
        let want = parser.held() + parser.need();
        if want > SMALL && want > reserved {
            let more = want - reserved;
            while !shared.input.take(more) {
                if *stop.borrow() {
                    break 'serve;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            reserved += more;
        }
        let (n, result) = parser.feed(&rbuf[pos..have]);
        pos += n;
        let request = match result {
            Ok(None) | Ok(Some(Request::Empty)) => continue,
            Ok(Some(r)) => r,
            Err(e) => {
                NetCounters::add(&shared.net.protocol_errors, 1);
                Reply::err(e.0).encode(&mut out.bytes);
                let _ = Box::pin(flush(lp, &mut io, &mut out)).await;
                break;
            }
        };
        let t_parsed = now_ns();
        let cmd = match request {
            Request::Args(args) => command::parse(&args, &lp.limits),
            Request::TooLarge { len, .. } => Err(Reply::err(format!(
                "an argument of {len} bytes is over the server's limit of {} bytes (max_body)",
                shared.config.server.max_body
            ))),
            Request::Empty => continue,
        };
        closing = matches!(cmd, Ok(Command::Quit));
        let stamps = Stamps {
            request_id: NEXT_REQUEST.fetch_add(1, Ordering::Relaxed),
            t_recv: if last_read_ns == 0 { t_parsed } else { last_read_ns.min(t_parsed) },
            t_parsed,
            t_enqueue: t_parsed,
            parked_ns: 0,
        };
        if matches!(&cmd, Ok(c) if c.wait().is_some()) {
            // A wait: what was answered before it goes out first, and the
            // client is listened to while it waits (peer.rs).
            if !out.is_empty() && !Box::pin(flush(lp, &mut io, &mut out)).await {
                break;
            }
            let left = Left::default();
            let work = Box::pin(answer(lp, &sess, cmd, stamps, &mut out, Some(&left)));
            let mut input = Input { buf: &mut rbuf, pos: &mut pos, have: &mut have };
            while_waiting(work, &mut io, &mut input, &left).await;
            shared.input.give(std::mem::take(&mut reserved));
            if left.is_set() || peer::hung_up(io.socket()) {
                // It left: no reply, its leases go back now (below).
                shared.waiters.abandoned.fetch_add(1, Ordering::Relaxed);
                out.bytes.clear();
                break;
            }
            continue;
        }
        // A reply that may be large first reserves what it may weigh of the
        // output budget, and waits (unread) until that fits; replies not
        // yet written go out first while the budget is used up.
        let need = cmd.as_ref().ok().and_then(|c| shared.bounds.of(c));
        let mut reply = need.and_then(|n| shared.output.reserve(n));
        let no_room = need.is_some() && reply.is_none();
        if !out.is_empty() && (no_room || shared.output.over()) && !Box::pin(flush(lp, &mut io, &mut out)).await {
            break;
        }
        if let (Some(n), true) = (need, no_room) {
            let gone = || *stop.borrow() || peer::hung_up(io.socket());
            reply = shared.output.wait_for(n, gone).await;
            if reply.is_none() {
                break;
            }
        }
        // (Boxed: an idle client's task holds only what reading needs.)
        Box::pin(answer(lp, &sess, cmd, stamps, &mut out, None)).await;
        // The reply holds what it weighs now, not its reservation.
        drop(reply);
        shared.input.give(std::mem::take(&mut reserved));
        if closing {
            // QUIT: its OK goes out, what was pipelined after it is not read (as Redis).
            let _ = Box::pin(flush(lp, &mut io, &mut out)).await;
            break;
        }
        if out.bytes.len() >= SMALL && !Box::pin(flush(lp, &mut io, &mut out)).await {
            break;
        }
    }
    shared.input.give(reserved);
    if !out.leases.is_empty() {
        release(lp, std::mem::take(&mut out.leases));
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
}

/// Writes the replies; false when the client is gone (the leases they
/// carried are given back) or was closed for stalling.
async fn flush<W: AsyncWrite + Unpin>(lp: &Rc<Loop>, wr: &mut W, out: &mut Out) -> bool {
    // A client that does not read holds only itself, until mwmq stops
    // (then it has a second more) or others wait for the output budget
    // while its replies do not move for `reply_stall_ms` (`output.rs`).
    let mut stop = lp.stop.clone();
    let output = &lp.shared.output;
    let progress = Cell::new(Instant::now());
    let bytes = &out.bytes;
    let write = async {
        let mut sent = 0;
        while sent < bytes.len() {
            match wr.write(&bytes[sent..]).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    sent += n;
                    progress.set(Instant::now());
                }
            }
        }
        wr.flush().await.is_ok()
    };
    let stalled = async {
        loop {
            let check = output.stall.max(Duration::from_millis(100));
            tokio::time::sleep(check.min(Duration::from_secs(1))).await;
            if output.stalled(progress.get()) {
                NetCounters::add(&lp.shared.net.stalled_readers, 1);
                return;
            }
        }
    };
    let ok = tokio::select! {
        ok = write => ok,
        _ = async {
            stopped(&mut stop).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        } => false,
        _ = stalled => false,
    };
    if ok {
        NetCounters::add(&lp.shared.net.bytes_out, out.bytes.len() as u64);
        out.leases.clear();
    } else if !out.leases.is_empty() {
        release(lp, std::mem::take(&mut out.leases));
    }
    out.bytes.clear();
    if out.bytes.capacity() > SMALL {
        out.bytes.shrink_to(SMALL);
    }
    out.charge.set(0);
    ok
}

/// Gives back leases whose replies never reached their client.
fn release(lp: &Rc<Loop>, leases: Vec<LeaseRef>) {
    for db in 0..lp.dbs.len() {
        let leases: Vec<LeaseRef> = leases.iter().filter(|l| l.db == db).copied().collect();
        if leases.is_empty() {
            continue;
        }
        let lp = lp.clone();
        lp.inflight.set(lp.inflight.get() + 1);
        tokio::task::spawn_local(async move {
            let r = match lp.connection(db).await {
                Ok((pg, _busy)) => pg.release(&leases).await,
                Err(e) => Err(e),
            };
            match r {
                Ok(n) => NetCounters::add(&lp.shared.net.leases_released, n),
                // They expire by themselves after their visibility timeout.
                Err(e) => tracing::warn!("could not give back {} leases: {e:?}", leases.len()),
            }
            lp.inflight.set(lp.inflight.get() - 1);
        });
    }
}

/// Carries out one request and encodes its reply into `out`.
async fn answer(
    lp: &Rc<Loop>,
    sess: &Rc<Sess>,
    cmd: Result<Command, Reply>,
    stamps: Stamps,
    out: &mut Out,
    left: Option<&Left>,
) {
    let shared = &*lp.shared;
    let core = Core::new(shared);
    let t_start = now_ns();
    let op = cmd.as_ref().map(Command::op).unwrap_or(MqOp::Other);
    let keys = match &cmd {
        Ok(Command::Recv(r)) => u64::from(r.count),
        _ => 1,
    };
    let mut stamps = stamps;
    // A wait's reservation of the output budget, for its last look (`database`).
    let mut room = None;
    let (outcome, db, t_dequeue, busy) = match cmd {
        Err(refusal) => (Outcome::Reply(refusal, Vec::new(), "client_error"), DbFacts::default(), t_start, None),
        Ok(c) => match core.gate(&c, &**sess) {
            Some(refusal) => (Outcome::Reply(refusal, Vec::new(), "client_error"), DbFacts::default(), t_start, None),
            None => match core.local(&c, &**sess, None) {
                Some(Outcome::Verify) => (log_in(lp, &c, sess).await, DbFacts::default(), t_start, None),
                Some(o) => (o, DbFacts::default(), t_start, None),
                None => {
                    let (carried, parked, reserved) = database(lp, c, sess, left).await;
                    room = reserved;
                    stamps.parked_ns = parked;
                    stamps.t_enqueue += parked;
                    (carried.outcome, carried.db, carried.t_dequeue, Some(carried.busy))
                }
            },
        },
    };
    let (reply, leases, status) = match outcome {
        Outcome::Reply(r, l, s) => (r, l, s),
        Outcome::Nothing(_) => (Reply::NilArray, Vec::new(), "ok"),
        Outcome::Park(..) | Outcome::Verify => (Reply::err("internal: no reply"), Vec::new(), "server_error"),
    };
    reply.encode_as(&mut out.bytes, sess.resp3());
    out.leases.extend(leases);
    // Unwritten replies hold what they weigh; the reservation goes.
    out.charge.set(out.bytes.len());
    drop(room);
    let status = if reply.is_error() { status } else { "ok" };
    let done = crate::telemetry::Done { op, keys, status, t_dequeue, t_reply: now_ns(), busy };
    let mut w = lp.writer.borrow_mut();
    shared.record_request(&mut w, lp.id as u32, &stamps, &done, &db);
    w.settle(&shared.telemetry.slots);
}

thread_local! {
    /// A login thread's argon2 memory, kept from check to check.
    static VERIFIER: RefCell<crate::users::Verifier> = RefCell::new(crate::users::Verifier::default());
}

/// A login's password, checked on a blocking thread (at most
/// `[auth] login_threads` per loop at once, `login_queue` more waiting).
async fn log_in(lp: &Rc<Loop>, c: &Command, sess: &Rc<Sess>) -> Outcome {
    let credentials = match c {
        Command::Auth(x) | Command::Hello { auth: Some(x), .. } => x.clone(),
        _ => unreachable!("only logins are checked"),
    };
    let cfg = &lp.shared.config.auth;
    if lp.logins_waiting.get() >= cfg.login_queue {
        return Outcome::Reply(
            Reply::Error("TRYAGAIN too many logins are waiting to be checked".into()),
            Vec::new(),
            "server_error",
        );
    }
    lp.logins_waiting.set(lp.logins_waiting.get() + 1);
    let permit = lp.logins.acquire().await;
    lp.logins_waiting.set(lp.logins_waiting.get() - 1);
    let shared = lp.shared.clone();
    let peer = sess.peer;
    let checked = tokio::task::spawn_blocking(move || {
        let (throttle, users) = (&shared.logins.throttle, &shared.users);
        VERIFIER.with(|m| crate::logins::check(throttle, users, peer, &credentials, "AUTH", &mut m.borrow_mut()))
    })
    .await
    .unwrap_or(crate::users::Checked::Wrong);
    drop(permit);
    let core = Core::new(&lp.shared);
    core.local(c, &**sess, Some(checked)).unwrap_or_else(|| Outcome::ok(Reply::Simple("OK")))
}

/// Carries out a command that needs the database; a `RECV ... WAIT` (or
/// `XREAD ... BLOCK`) that finds nothing waits, without a statement, until
/// its queue is rung (a SEND here, another process's notification, the
/// shared poll: `poller.rs`), and looks again, until its wait is over, its
/// client left (`left`) or mwmq stops. The time it waited is returned
/// beside, and the last look's reservation of the output budget: each look
/// reserves what its reply may weigh (waiting for room as a request does),
/// and a wait holds none while it is parked.
async fn database(lp: &Rc<Loop>, c: Command, sess: &Rc<Sess>, left: Option<&Left>) -> (Carried, u64, Option<Share>) {
    let wait = c.wait().map(|(names, ms)| {
        (names.iter().map(|n| n.to_string()).collect::<Vec<_>>(), Instant::now() + Duration::from_millis(ms))
    });
    let Some((names, until)) = wait else {
        return (lp.submit(c, sess.clone()).await, 0, None);
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut c = c;
    let waiters = &lp.shared.waiters;
    let mut parked = 0u64;
    let mut stop = lp.stop.clone();
    let gone = || left.is_some_and(Left::is_set);
    let mut seen = waiters.seq(&names);
    let room = async |c: &Command| match lp.shared.bounds.of(c) {
        Some(n) => lp.shared.output.wait_for(n, || *lp.stop.borrow() || gone()).await.map(Some).ok_or(()),
        None => Ok(None),
    };
    let Ok(mut held) = room(&c).await else {
        return (nothing(&c), 0, None);
    };
    let core = Core::new(&lp.shared);
    let mut carried = lp.submit(c.clone(), sess.clone()).await;
    loop {
        let outcome = std::mem::replace(&mut carried.outcome, Outcome::Nothing(None));
        let (next, last) = match core.looked(outcome, &carried.db) {
            Look::Answer(o) => {
                carried.outcome = o;
                return (carried, parked, held);
            }
            Look::Empty { next, last } => (next, last),
        };
        carried.outcome = last;
        if let Some(next) = next {
            c = *next;
        }
        if Instant::now() >= until || *stop.borrow() || gone() {
            return (carried, parked, held);
        }
        // This look is answered by the next one: its statements count now.
        lp.count_statements(std::mem::take(&mut carried.db.statements));
        drop(held.take());
        // Nothing yet: wait for a wake-up of these names, the end, or the client's.
        let t0 = now_ns();
        {
            let watching = waiters.watch(crate::waiters::interests(&c, sess.identity()));
            loop {
                let bell = waiters.bell.notified();
                tokio::pin!(bell);
                bell.as_mut().enable();
                // A wake-up of its names, or a look that rang this wait.
                if waiters.seq(&names) != seen || watching.rung() {
                    break;
                }
                let left_wait = async {
                    match left {
                        Some(l) => l.wait().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = &mut bell => {}
                    _ = tokio::time::sleep_until(until.into()) => break,
                    _ = stopped(&mut stop) => break,
                    _ = left_wait => break,
                }
            }
        }
        parked += now_ns().saturating_sub(t0);
        if *stop.borrow() || gone() {
            return (carried, parked, None);
        }
        seen = waiters.seq(&names);
        match room(&c).await {
            Ok(r) => held = r,
            // (Its client left or mwmq stops while it waited for room: the empty answer it has.)
            Err(()) => return (carried, parked, None),
        }
        carried = lp.submit(c.clone(), sess.clone()).await;
    }
}

/// A wait's empty answer, when it ends before its first look.
fn nothing(c: &Command) -> Carried {
    let outcome = match c {
        Command::Recv(_) => Outcome::ok(Reply::Array(Vec::new())),
        _ => Outcome::Nothing(None),
    };
    Carried { outcome, db: DbFacts::default(), t_dequeue: now_ns(), busy: 0 }
}

/// A loop's connections, as the commands' driver uses them.
struct LoopDbs<'a>(&'a Rc<Loop>);

impl Databases for LoopDbs<'_> {
    fn count(&self) -> usize {
        self.0.dbs.len()
    }

    async fn on<T>(
        &self,
        d: usize,
        db: &mut DbFacts,
        f: impl AsyncFnOnce(&PgConn, &mut DbFacts) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        self.0.on_connection(d, db, f).await
    }
}

impl Loop {
    /// Statements run for a request that is not answered yet (a wait that looks again).
    fn count_statements(&self, n: u64) {
        if n > 0 {
            let mut w = self.writer.borrow_mut();
            w.record(&self.shared.telemetry.slots, |acc| {
                acc.db_requests += n;
                acc.stages.dirty = true;
            });
            w.settle(&self.shared.telemetry.slots);
        }
    }

    /// Hands a request to the statements; its outcome.
    async fn submit(self: &Rc<Self>, cmd: Command, sess: Rc<Sess>) -> Carried {
        let Some(db) = Core::new(&self.shared).home(&cmd) else {
            return self.on_every_database(cmd, sess).await;
        };
        let (tx, rx) = oneshot::channel();
        let kind = (self.shared.config.server.batch > 1).then(|| Batch::of(&cmd, &*sess)).flatten();
        self.pending.borrow_mut().push_back(Pending { cmd, sess, kind, db, t_enqueue: now_ns(), tx });
        self.kick(db);
        rx.await.unwrap_or_else(|_| Carried {
            outcome: Outcome::Reply(Reply::err("internal: the request was dropped"), Vec::new(), "server_error"),
            db: DbFacts::default(),
            t_dequeue: now_ns(),
            busy: 0,
        })
    }

    /// QLIST: its statement on every database, one after the other, the
    /// answers merged.
    async fn on_every_database(self: &Rc<Self>, cmd: Command, sess: Rc<Sess>) -> Carried {
        let t_dequeue = now_ns();
        let core = Core::new(&self.shared);
        let mut db = DbFacts::default();
        self.inflight.set(self.inflight.get() + 1);
        let r = core.carry(&LoopDbs(self), None, &cmd, &*sess, &mut db).await;
        self.inflight.set(self.inflight.get() - 1);
        let outcome = core.settled(r, &mut db);
        Carried { outcome, db, t_dequeue, busy: now_ns().saturating_sub(t_dequeue) }
    }

    /// Starts statements on database `d` for waiting requests while there is
    /// room: each takes every waiting request that can share it.
    fn kick(self: &Rc<Self>, d: usize) {
        let batch = self.shared.config.server.batch.max(1);
        let here = &self.dbs[d];
        let room = here.slots.borrow().len() * self.pipeline;
        while here.inflight.get() < room {
            // Patience: while a statement of a kind is in flight, what
            // arrives meanwhile goes in the next one, unless it is slow.
            // Requests that share no statement (QINFO, a RECV that may
            // wait) or whose kind has room go first.
            let patient = here.last_start.get().elapsed() < self.patience;
            let next = {
                let pending = self.pending.borrow();
                let kinds = here.kinds.borrow();
                if !pending.iter().any(|p| p.db == d) {
                    return;
                }
                pending
                    .iter()
                    .position(|p| p.db == d && (!patient || p.kind.as_ref().is_none_or(|k| !kinds.contains(k))))
            };
            let Some(next) = next else {
                if !here.rekick.replace(true) {
                    let lp = self.clone();
                    let wait = self.patience.saturating_sub(here.last_start.get().elapsed());
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep(wait).await;
                        lp.dbs[d].rekick.set(false);
                        lp.kick(d);
                    });
                }
                return;
            };
            here.last_start.set(Instant::now());
            let (kind, group) = {
                let mut p = self.pending.borrow_mut();
                let Some(first) = p.remove(next) else { return };
                let kind = first.kind.clone();
                let mut group = vec![first];
                if kind.is_some() {
                    let mut i = next;
                    while i < p.len() && group.len() < batch {
                        if p[i].kind == kind && p[i].db == d {
                            group.extend(p.remove(i));
                        } else {
                            i += 1;
                        }
                    }
                }
                (kind, group)
            };
            here.inflight.set(here.inflight.get() + 1);
            self.inflight.set(self.inflight.get() + 1);
            if let Some(k) = &kind {
                here.kinds.borrow_mut().push(k.clone());
            }
            let lp = self.clone();
            tokio::task::spawn_local(async move {
                let mut group = group;
                match &kind {
                    Some(k) if group.len() > 1 => lp.run_batch(d, k, group).await,
                    _ => lp.run_one(group.pop().expect("a group has a request")).await,
                }
                let here = &lp.dbs[d];
                if let Some(k) = kind {
                    let mut kinds = here.kinds.borrow_mut();
                    if let Some(i) = kinds.iter().position(|x| *x == k) {
                        kinds.swap_remove(i);
                    }
                }
                here.inflight.set(here.inflight.get() - 1);
                lp.inflight.set(lp.inflight.get() - 1);
                lp.kick(d);
            });
        }
    }

    /// A request waited longer than `queue_timeout_ms` for a statement.
    fn too_late(&self, p: &Pending, now: u64) -> Option<Reply> {
        let ms = self.shared.config.server.queue_timeout_ms;
        (ms > 0 && now.saturating_sub(p.t_enqueue) > ms * 1_000_000)
            .then(|| Reply::Error(format!("TRYAGAIN the request waited more than {ms} ms for the database")))
    }

    async fn run_one(self: &Rc<Self>, p: Pending) {
        let t_dequeue = now_ns();
        let mut db = DbFacts::default();
        let outcome = match self.too_late(&p, t_dequeue) {
            Some(r) => Outcome::Reply(r, Vec::new(), "server_error"),
            None => {
                let core = Core::new(&self.shared);
                let r = core.carry(&LoopDbs(self), Some(p.db), &p.cmd, &*p.sess, &mut db).await;
                core.settled(r, &mut db)
            }
        };
        let busy = now_ns().saturating_sub(t_dequeue);
        self.deliver(p.tx, Carried { outcome, db, t_dequeue, busy });
    }

    #[allow(clippy::vec_box)]
    async fn run_batch(self: &Rc<Self>, d: usize, kind: &Batch, group: Vec<Pending>) {
        let t_dequeue = now_ns();
        let n = group.len();
        let mut replies: Vec<Answer> =
            group.iter().map(|p| self.too_late(p, t_dequeue).map(|r| (r, "server_error", 0))).collect();
        let live: Vec<usize> = (0..n).filter(|i| replies[*i].is_none()).collect();
        let mut leases: Vec<Vec<LeaseRef>> = vec![Vec::new(); n];
        let mut db = DbFacts::default();
        if !live.is_empty() {
            let core = Core::new(&self.shared);
            let batched = {
                let items: Vec<(&Command, &Sess)> = live.iter().map(|i| (&group[*i].cmd, &*group[*i].sess)).collect();
                core.carry_batch(&LoopDbs(self), d, kind, &items, &mut db).await
            };
            if !batched.place(&live, &mut replies, &mut leases) {
                for p in group {
                    self.run_one(p).await;
                }
                return;
            }
        }
        let busy = now_ns().saturating_sub(t_dequeue) / n as u64;
        for (i, (p, l)) in group.into_iter().zip(leases).enumerate() {
            let (reply, status, hits) =
                replies[i].take().unwrap_or((Reply::err("internal: no reply"), "server_error", 0));
            let facts = db.share(i, hits);
            self.deliver(p.tx, Carried { outcome: Outcome::Reply(reply, l, status), db: facts, t_dequeue, busy });
        }
    }

    /// Hands a request's outcome to its client; leases of a client that left are given back.
    fn deliver(self: &Rc<Self>, tx: oneshot::Sender<Carried>, carried: Carried) {
        if let Err(Carried { outcome: Outcome::Reply(_, leases, _), .. }) = tx.send(carried) {
            if !leases.is_empty() {
                release(self, leases);
            }
        }
    }

    /// Runs `f` on a connection within the statement deadline, noting
    /// when it had the connection and when the database answered.
    async fn on_connection<T>(
        self: &Rc<Self>,
        d: usize,
        db: &mut DbFacts,
        f: impl AsyncFnOnce(&PgConn, &mut DbFacts) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        db.db = d;
        let r = match self.connection(d).await {
            Err(e) => Err(e),
            Ok((pg, _busy)) => {
                let now = now_ns();
                db.t_pool = Some(now);
                db.t_send = Some(now);
                self.deadline(d, &pg, f(&pg, db)).await
            }
        };
        db.t_done = Some(now_ns());
        r
    }

    /// Runs `f` within the statement deadline; past it the connection is
    /// given up (its socket closed) and the request told to try again.
    async fn deadline<T>(
        &self,
        d: usize,
        pg: &PgConn,
        f: impl std::future::Future<Output = Result<T, DbError>>,
    ) -> Result<T, DbError> {
        match self.shared.config.statement_deadline() {
            None => f.await,
            Some(limit) => match tokio::time::timeout(limit, f).await {
                Ok(r) => r,
                Err(_) => {
                    pg.set_broken();
                    self.shared.pool[d].watch.cut.fetch_add(1, Ordering::Relaxed);
                    self.forget_broken(d);
                    Err(DbError::Unavailable(format!("the database did not answer within {} ms", limit.as_millis())))
                }
            },
        }
    }

    /// Drops broken connections (their sockets close at once).
    fn forget_broken(&self, d: usize) {
        for s in self.dbs[d].slots.borrow_mut().iter_mut() {
            if s.pg.as_ref().is_some_and(|(pg, _)| pg.broken()) {
                if let Some((_, driver)) = s.pg.take() {
                    driver.abort();
                }
                NetCounters::add(&self.shared.pool[d].counters.lost, 1);
            }
        }
    }

    /// A database connection for a statement: the next one in turn, opened
    /// first when it is not open (after a failure, not before its backoff).
    async fn connection(self: &Rc<Self>, d: usize) -> Result<(Rc<PgConn>, Busy), DbError> {
        self.forget_broken(d);
        let here = &self.dbs[d];
        let n = here.slots.borrow().len();
        // The first connection with room in its pipeline (the first one,
        // unless statements are slow): else the one with the fewest in flight.
        let i = {
            let slots = here.slots.borrow();
            let pipeline = self.pipeline;
            let idle = slots.iter().position(|s| s.pg.is_some() && s.busy.get() < pipeline);
            let closed = slots.iter().position(|s| s.pg.is_none());
            idle.or(closed).unwrap_or_else(|| (0..n).min_by_key(|i| slots[*i].busy.get()).unwrap_or(0))
        };
        loop {
            let wait = {
                let mut slots = here.slots.borrow_mut();
                if let Some((pg, _)) = &slots[i].pg {
                    return Ok((pg.clone(), Busy::on(&slots[i].busy)));
                }
                // Any open connection will do while this one is not.
                let other = slots.iter().find_map(|s| s.pg.as_ref().map(|(pg, _)| (pg.clone(), Busy::on(&s.busy))));
                let s = &mut slots[i];
                if s.next_attempt.is_some_and(|t| Instant::now() < t) {
                    let e = s.last_error.clone().unwrap_or_else(|| "reconnecting".into());
                    return other.ok_or_else(|| crate::db::unavailable(&e));
                }
                if s.opening {
                    if let Some(pg) = other {
                        return Ok(pg);
                    }
                    true
                } else {
                    s.opening = true;
                    false
                }
            };
            if !wait {
                break;
            }
            // Another statement opens this slot: wait for it.
            here.slot_changed.notified().await;
        }
        let cfg = &here.cfg;
        let limit = Duration::from_millis(cfg.database.connect_timeout_ms)
            + cfg.statement_deadline().unwrap_or(Duration::from_secs(30));
        let opened = match tokio::time::timeout(limit, PgConn::open(cfg)).await {
            Ok(r) => r,
            Err(_) => Err(format!("the database did not finish opening a connection within {} ms", limit.as_millis())),
        };
        let counters = &self.shared.pool[d].counters;
        let result = {
            let mut slots = here.slots.borrow_mut();
            let s = &mut slots[i];
            s.opening = false;
            match opened {
                Ok((mut pg, driver)) => {
                    counters.connects.fetch_add(1, Ordering::Relaxed);
                    counters.primary.opened(&pg.server);
                    pg.db = d;
                    let driver = tokio::task::spawn_local(driver).abort_handle();
                    let pg = Rc::new(pg);
                    s.pg = Some((pg.clone(), driver));
                    s.next_attempt = None;
                    s.backoff = Duration::from_millis(cfg.database.retry_min_ms);
                    s.last_error = None;
                    Ok((pg, Busy::on(&s.busy)))
                }
                Err(e) => {
                    counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                    if s.last_error.as_deref() != Some(e.as_str()) {
                        tracing::warn!("cannot connect to the database: {e}");
                    }
                    s.backoff = s.backoff.max(Duration::from_millis(cfg.database.retry_min_ms));
                    s.next_attempt = Some(Instant::now() + s.backoff);
                    s.backoff = (s.backoff * 2).min(Duration::from_millis(cfg.database.retry_max_ms));
                    s.last_error = Some(e.clone());
                    Err(crate::db::unavailable(&e))
                }
            }
        };
        here.slot_changed.notify_waiters();
        result
    }
}
