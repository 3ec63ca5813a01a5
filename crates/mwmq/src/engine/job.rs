//! What travels through mwmq: a request with its timestamps ([`Job`]), what
//! the request queue carries ([`Work`]), and a worker's word to the net
//! thread that a connection's request is answered ([`Done`]).

use std::sync::Arc;
use std::time::Instant;

use crate::command::Command;
use crate::db::LeaseRef;
use crate::engine::conn::ClientConn;
use crate::resp::Reply;

/// One request on its way through mwmq.
pub struct Job {
    /// The client's connection.
    pub conn: Arc<ClientConn>,
    /// The net thread's handle on the connection.
    pub token: usize,
    /// The command, or the reply refusing the request.
    pub cmd: Result<Command, Reply>,
    /// Unique per process (trace sampling uses it).
    pub request_id: u64,
    /// When the read that completed the request returned (ns, `mwstats::clock`).
    pub t_recv: u64,
    /// Parsed.
    pub t_parsed: u64,
    /// Put on the request queue.
    pub t_enqueue: u64,
    /// Input-budget bytes the request holds until it is answered.
    pub size: usize,
    /// What its reply may weigh, reserved of the output budget before its
    /// statement (`output.rs`), until its reply is handed to the connection.
    pub reply: Option<crate::output::Share>,
    /// A RECV ... WAIT waits for messages until then.
    pub wait_until: Option<Instant>,
    /// Time spent parked waiting for messages so far (ns).
    pub parked_ns: u64,
    /// When it was last parked (ns), while it is.
    pub parked_at: Option<u64>,
    /// The wait is over: answer with whatever there is.
    pub last_try: bool,
    /// A login checked by a login thread: its outcome.
    pub login: Option<crate::users::Checked>,
}

/// What the request queue carries.
pub enum Work {
    /// A client's request (also a parked RECV that woke up).
    Request(Box<Job>),
    /// Leases whose replies never reached their client: give them back.
    Release(Vec<LeaseRef>),
}

/// A worker tells the net thread that a connection's request is answered
/// (only when the net thread waits for it: see `ClientConn::finish_request`).
#[derive(Debug, Clone, Copy)]
pub struct Done {
    /// The connection's token.
    pub token: usize,
    /// Its id (tokens are reused).
    pub conn_id: u64,
}
