//! mwmq's commands: from a request's arguments to a checked [`Command`], or
//! the error a Redis user expects (`wrong number of arguments`, `unknown
//! command`, `syntax error`, `value is not an integer or out of range`).

use crate::resp::Reply;
use crate::xcommand::XCmd;

pub use crate::policies::{Backoff, MAX_PRIORITY};
pub use crate::schedule::Schedule;
pub use crate::words::{shown, MAX_DELAY_MS, MAX_NAME};
/// Most messages one RECV may lease.
pub const MAX_COUNT: u32 = 1000;

/// A checked command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `PING [message]`
    Ping(Option<Vec<u8>>),
    /// `QUIT`
    Quit,
    /// `CLIENT SETNAME name`
    SetName(String),
    /// `CLIENT GETNAME`
    GetName,
    /// `CLIENT ID`
    ClientId,
    /// `CLIENT SETINFO ...` (what client libraries send on connecting): accepted.
    ClientInfo,
    /// `SELECT 0`: the only database.
    Select,
    /// `COMMAND ...` (what redis-cli asks on start): an empty answer.
    CommandDocs,
    /// `INFO [section]`
    Info,
    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`
    Hello {
        /// The protocol asked for (2 or 3).
        proto: Option<u8>,
        /// A name for the connection.
        setname: Option<String>,
        /// Log in first.
        auth: Option<Credentials>,
    },
    /// `AUTH [user] password`
    Auth(Credentials),
    /// `QCREATE q [MAXDELIVERIES n] [DEADLETTER q2] [MAXMESSAGES n] [MAXBYTES n] [CONCURRENCY n] [RATE n/s]`
    Create(String, QueueOptions),
    /// `QALTER q [MAXDELIVERIES n] [DEADLETTER q2 | NODEADLETTER] ...` (as QCREATE)
    Alter(String, QueueOptions),
    /// `QPAUSE q` (true) or `QRESUME q` (false)
    Pause(String, bool),
    /// `QARCHIVE q [COUNT n]`: the latest acknowledged messages kept
    Archive {
        /// The queue.
        queue: String,
        /// Most messages returned.
        count: u32,
    },
    /// `QDEAD q [COUNT n]`: the latest dead letters of a queue (those it
    /// holds as a dead-letter queue, and its own in its dead-letter queue)
    DeadLetters {
        /// The queue.
        queue: String,
        /// Most messages returned.
        count: u32,
    },
    /// `QINFO q`
    QueueInfo(String),
    /// `REDRIVE q2 [TO q] [COUNT n]`
    Redrive {
        /// The dead-letter queue.
        queue: String,
        /// Where to (default: the queue each message came from).
        to: Option<String>,
        /// Most messages moved.
        count: u32,
    },
    /// `TOUCH q id lease ms`
    Touch {
        /// Queue.
        queue: String,
        /// Message id.
        id: i64,
        /// The lease RECV gave.
        lease: i64,
        /// Invisible for this long from now.
        ms: u64,
    },
    /// `QDROP q`
    Drop(String),
    /// `QLEN q`
    Len(String),
    /// `QLIST` or `QLIST PENDING`
    List {
        /// Only queues with messages this client may receive now.
        pending: bool,
    },
    /// `SEND q body [TO name] [DELAY ms] [KEY k] [GROUP g] [PRIORITY n]`
    Send(Send),
    /// `RECV q [FROM sender] [VT ms] [COUNT n] [WAIT ms]`
    Recv(Recv),
    /// `ACK q id lease`
    Ack {
        /// Queue.
        queue: String,
        /// Message id.
        id: i64,
        /// The lease RECV gave.
        lease: i64,
    },
    /// `NACK q id lease [DELAY ms]`
    Nack {
        /// Queue.
        queue: String,
        /// Message id.
        id: i64,
        /// The lease RECV gave.
        lease: i64,
        /// Visible again after this long (`None`: no DELAY given, so
        /// after the queue's backoff, or at once without one).
        delay_ms: Option<u64>,
    },
    /// `POP q [FROM sender]`
    Pop {
        /// Queue.
        queue: String,
        /// Only messages of this sender.
        from: Option<String>,
    },
    /// `PEEK q [FROM sender]`
    Peek {
        /// Queue.
        queue: String,
        /// Only messages of this sender.
        from: Option<String>,
    },
    /// `QSCHEDULE name q "cron" body [TZ zone] [KEY prefix] [CATCHUP none|one|all] [PRIORITY n] [GROUP g] [DELAY ms]`
    Schedule(Box<Schedule>),
    /// `QUNSCHEDULE name`
    Unschedule(String),
    /// `QSCHEDULES`
    Schedules,
    /// A Redis Streams command (`xcommand.rs`).
    Stream(XCmd),
}

/// Dead-letter settings of a queue (`QCREATE`, `QALTER`): `None` leaves a
/// setting as it is (off, for a new queue).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueOptions {
    /// Deliveries without an ACK after which a message is dead-lettered (0: never).
    pub max_deliveries: Option<u32>,
    /// Where dead-lettered messages go (`Some(None)`: dropped and counted).
    pub dead_letter: Option<Option<String>>,
    /// Most messages the queue may hold (`Some(0)`: no limit).
    pub max_messages: Option<u64>,
    /// Most bytes of bodies the queue may hold (`Some(0)`: no limit).
    pub max_bytes: Option<u64>,
    /// Most messages leased at once (`Some(0)`: no limit).
    pub concurrency: Option<u32>,
    /// Most deliveries per 1,000 seconds (`Some(0)`: no limit); RATE's
    /// `n/s` times 1,000, kept whole so that options compare exactly.
    pub rate_milli: Option<u64>,
    /// How long acknowledged messages are kept, ms (`Some(0)`: not kept).
    pub retain_ms: Option<u64>,
    /// The wait before a message is handed out again (`Some(None)`: no backoff).
    pub backoff: Option<Option<Backoff>>,
}

impl QueueOptions {
    /// RATE as deliveries per second, when given (0: no limit).
    pub fn rate_per_s(&self) -> Option<f64> {
        self.rate_milli.map(|r| r as f64 / 1000.0)
    }
}

/// The longest RETAIN: a year.
pub const MAX_RETAIN_MS: u64 = 366 * 24 * 3600 * 1000;
/// Most messages one QARCHIVE or QDEAD returns.
pub const MAX_ARCHIVE_COUNT: i64 = 1000;
/// The highest CONCURRENCY a queue may have.
pub const MAX_CONCURRENCY: i64 = 1_000_000;
/// Most deliveries a queue may allow before dead-lettering.
pub const MAX_DELIVERIES: i64 = 1_000_000;
/// Most messages one REDRIVE moves.
pub const MAX_REDRIVE: u32 = 100_000;

/// A user and a password (`AUTH`, `HELLO ... AUTH`).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user (`default` when `AUTH` gives only a password, as Redis 6).
    pub user: String,
    /// The password.
    pub password: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Credentials").field("user", &self.user).finish_non_exhaustive()
    }
}

/// `SEND`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Send {
    /// Queue.
    pub queue: String,
    /// The message.
    pub body: Vec<u8>,
    /// Only this receiver may take it.
    pub to: Option<String>,
    /// Invisible for this long.
    pub delay_ms: u64,
    /// A repeated key within the queue returns the first message's id.
    pub key: Option<String>,
    /// Its ordered group: handed out after the group's older messages are gone.
    pub group: Option<String>,
    /// Higher is handed out first (0 to [`MAX_PRIORITY`]; 0 without PRIORITY).
    pub priority: u8,
}

/// `RECV`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recv {
    /// Queue.
    pub queue: String,
    /// Only messages of this sender.
    pub from: Option<String>,
    /// Lease length (visibility timeout).
    pub vt_ms: u64,
    /// Most messages.
    pub count: u32,
    /// Wait this long for a message when none is there.
    pub wait_ms: u64,
}

pub use mwstats::ops::MqOp;

/// The commands answered without the database, as a pattern
/// (`local_command!() => ...`): the connection's own affairs. Every match
/// that must decide about a command names the others one by one.
macro_rules! local_command {
    () => {
        $crate::command::Command::Ping(_)
            | $crate::command::Command::Quit
            | $crate::command::Command::SetName(_)
            | $crate::command::Command::GetName
            | $crate::command::Command::ClientId
            | $crate::command::Command::ClientInfo
            | $crate::command::Command::Select
            | $crate::command::Command::CommandDocs
            | $crate::command::Command::Info
            | $crate::command::Command::Hello { .. }
            | $crate::command::Command::Auth(_)
    };
}
pub(crate) use local_command;

impl Command {
    /// Its class in the results format.
    pub fn op(&self) -> MqOp {
        match self {
            Command::Send(_) => MqOp::Send,
            Command::Recv(_) => MqOp::Recv,
            Command::Ack { .. } => MqOp::Ack,
            Command::Nack { .. } => MqOp::Nack,
            Command::Pop { .. } => MqOp::Pop,
            Command::Peek { .. } => MqOp::Peek,
            Command::Create(..)
            | Command::Alter(..)
            | Command::Pause(..)
            | Command::Archive { .. }
            | Command::DeadLetters { .. }
            | Command::QueueInfo(_)
            | Command::Redrive { .. }
            | Command::Touch { .. }
            | Command::Drop(_)
            | Command::Len(_)
            | Command::List { .. }
            | Command::Schedule(_)
            | Command::Unschedule(_)
            | Command::Schedules => MqOp::Queue,
            Command::Stream(x) => x.op(),
            local_command!() => MqOp::Other,
        }
    }

    /// Whether it needs the database.
    pub fn uses_database(&self) -> bool {
        !matches!(self.op(), MqOp::Other)
    }

    /// The queue it names, whose database its statement runs on (`None`:
    /// QLIST, which asks every database, and the commands without one).
    pub fn queue(&self) -> Option<&str> {
        match self {
            Command::Send(x) => Some(&x.queue),
            Command::Recv(r) => Some(&r.queue),
            Command::Create(q, _)
            | Command::Alter(q, _)
            | Command::Pause(q, _)
            | Command::Archive { queue: q, .. }
            | Command::DeadLetters { queue: q, .. }
            | Command::QueueInfo(q)
            | Command::Drop(q)
            | Command::Len(q)
            | Command::Redrive { queue: q, .. }
            | Command::Touch { queue: q, .. }
            | Command::Ack { queue: q, .. }
            | Command::Nack { queue: q, .. }
            | Command::Pop { queue: q, .. }
            | Command::Peek { queue: q, .. } => Some(q),
            Command::Stream(x) => x.first_key(),
            // A schedule lives with its queue.
            Command::Schedule(x) => Some(&x.queue),
            // (QLIST, QUNSCHEDULE and QSCHEDULES ask every database.)
            Command::List { .. } | Command::Unschedule(_) | Command::Schedules => None,
            local_command!() => None,
        }
    }

    /// What it may wait for when it finds nothing (RECV ... WAIT, XREAD
    /// and XREADGROUP ... BLOCK): the names whose new messages wake it and
    /// how long (ms).
    pub fn wait(&self) -> Option<(Vec<&str>, u64)> {
        match self {
            Command::Recv(r) => (r.wait_ms > 0).then(|| (vec![r.queue.as_str()], r.wait_ms)),
            Command::Stream(x) => x.block_ms().map(|ms| (x.keys(), ms)),
            Command::Send(_)
            | Command::Ack { .. }
            | Command::Nack { .. }
            | Command::Pop { .. }
            | Command::Peek { .. }
            | Command::Touch { .. }
            | Command::Create(..)
            | Command::Alter(..)
            | Command::Pause(..)
            | Command::Archive { .. }
            | Command::DeadLetters { .. }
            | Command::QueueInfo(_)
            | Command::Redrive { .. }
            | Command::Drop(_)
            | Command::Len(_)
            | Command::List { .. }
            | Command::Schedule(_)
            | Command::Unschedule(_)
            | Command::Schedules
            | local_command!() => None,
        }
    }
}

/// One request of every command mwmq knows, as a client types it (words
/// apart by single spaces). The tests walk them: this file's unit test
/// checks that the list names every variant of [`Command`] and [`XCmd`]
/// and that each parses and has a class and a queue; `tests/auth.rs` that a
/// user without rights is refused every one that reaches a queue or a
/// stream. A new command adds its line here.
pub const EVERY_COMMAND: &[&str] = &[
    "PING",
    "QUIT",
    "CLIENT SETNAME me",
    "CLIENT GETNAME",
    "CLIENT ID",
    "CLIENT SETINFO lib-name x",
    "SELECT 0",
    "COMMAND DOCS",
    "INFO",
    "HELLO 2",
    "AUTH nobody-password",
    "QCREATE q",
    "QALTER q MAXDELIVERIES 3",
    "QPAUSE q",
    "QRESUME q",
    "QARCHIVE q",
    "QDEAD q",
    "QINFO q",
    "REDRIVE q",
    "TOUCH q 1 1 100",
    "QDROP q",
    "QLEN q",
    "QLIST",
    "SEND q hi",
    "RECV q",
    "ACK q 1 1",
    "NACK q 1 1",
    "POP q",
    "PEEK q",
    "QSCHEDULE s q @hourly hi",
    "QUNSCHEDULE s",
    "QSCHEDULES",
    "XADD s * f v",
    "XLEN s",
    "XRANGE s - +",
    "XREAD STREAMS s 0",
    "XDEL s 1-1",
    "XTRIM s MAXLEN 10",
    "XGROUP CREATE s g $",
    "XGROUP SETID s g $",
    "XGROUP DEADLETTER s g 3 dead",
    "XGROUP DESTROY s g",
    "XGROUP CREATECONSUMER s g c",
    "XGROUP DELCONSUMER s g c",
    "XREADGROUP GROUP g c STREAMS s >",
    "XACK s g 1-1",
    "XPENDING s g",
    "XCLAIM s g c 0 1-1",
    "XAUTOCLAIM s g c 0 0",
    "XINFO STREAM s",
    "XINFO GROUPS s",
    "XINFO CONSUMERS s g",
    "TYPE s",
    "EXISTS s",
    "DEL s",
];

/// Why a request is not a command (the reply says it).
pub type Refusal = Reply;

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

fn arity(name: &str) -> Refusal {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

fn syntax() -> Refusal {
    Reply::err("syntax error")
}

fn not_integer() -> Refusal {
    Reply::err("value is not an integer or out of range")
}

/// A queue or client name: 1 to [`MAX_NAME`] bytes of UTF-8 without spaces or control characters.
fn name(b: &[u8], what: &str) -> Result<String, Refusal> {
    let s = std::str::from_utf8(b).map_err(|_| Reply::err(format!("{what} must be UTF-8")))?;
    if s.is_empty() || s.len() > MAX_NAME || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Reply::err(format!("{what} must be 1 to {MAX_NAME} bytes without spaces or control characters")));
    }
    Ok(s.to_string())
}

/// The one argument of a command that names a queue and nothing else.
fn one_queue(cmd: &str, rest: &[Vec<u8>]) -> Result<String, Refusal> {
    match rest {
        [q] => name(q, "a queue name"),
        _ => Err(arity(cmd)),
    }
}

fn int(b: &[u8]) -> Result<i64, Refusal> {
    std::str::from_utf8(b).ok().and_then(|s| s.parse::<i64>().ok()).ok_or_else(not_integer)
}

fn millis(b: &[u8], what: &str, max: u64) -> Result<u64, Refusal> {
    let v = int(b)?;
    if v < 0 || v as u64 > max {
        return Err(Reply::err(format!("{what} must be between 0 and {max} ms")));
    }
    Ok(v as u64)
}

/// The options of a QCREATE or QALTER given so far: each at most once, and
/// not with its opposite (`BACKOFF` and `NOBACKOFF`), which Redis refuses
/// as `SET k v EX 1 EX 2` (a bare `syntax error` there; this one says which).
#[derive(Default)]
struct Given(Vec<(&'static str, String)>);

impl Given {
    /// Refuses `word` if it, or its opposite, was given already.
    fn once(&mut self, word: &str) -> Result<(), Refusal> {
        let slot = match word {
            "NODEADLETTER" => "DEADLETTER",
            "NOBACKOFF" => "BACKOFF",
            w => match [
                "MAXDELIVERIES",
                "DEADLETTER",
                "MAXMESSAGES",
                "MAXBYTES",
                "CONCURRENCY",
                "RATE",
                "RETAIN",
                "BACKOFF",
            ]
            .into_iter()
            .find(|o| *o == w)
            {
                Some(o) => o,
                // (Not an option: the parser says so.)
                None => return Ok(()),
            },
        };
        match self.0.iter().find(|(s, _)| *s == slot) {
            Some((_, before)) if before == word => Err(Reply::err(crate::schedule::given_twice(word))),
            Some((_, before)) => Err(Reply::err(format!("syntax error: {before} and {word} together"))),
            None => {
                self.0.push((slot, word.to_string()));
                Ok(())
            }
        }
    }
}

/// The option word `w` of a SEND, RECV or REDRIVE in capitals, refused if
/// `seen` has it already: as QCREATE's and QSCHEDULE's, an option given
/// twice is refused (`SEND q b PRIORITY 3 PRIORITY 4` used to send at 4).
fn first_time<'a>(seen: &'a mut Vec<String>, w: &[u8]) -> Result<&'a str, Refusal> {
    let w = upper(w);
    if seen.contains(&w) {
        return Err(Reply::err(crate::schedule::given_twice(&w)));
    }
    seen.push(w);
    Ok(seen.last().map(String::as_str).unwrap_or_default())
}

/// Limits that depend on the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Default lease length.
    pub default_vt_ms: u64,
    /// Longest WAIT.
    pub max_wait_ms: u64,
}

/// Checks a request's arguments (command name first).
pub fn parse(args: &[Vec<u8>], limits: &Limits) -> Result<Command, Refusal> {
    let cmd = upper(&args[0]);
    let rest = &args[1..];
    let n = rest.len();
    let c = match cmd.as_str() {
        x if crate::xcommand::is_stream_command(x) => Command::Stream(crate::xcommand::parse(x, args)?),
        "PING" => match n {
            0 => Command::Ping(None),
            1 => Command::Ping(Some(rest[0].clone())),
            _ => return Err(arity("PING")),
        },
        "QUIT" => Command::Quit,
        "CLIENT" => {
            if n == 0 {
                return Err(arity("CLIENT"));
            }
            match upper(&rest[0]).as_str() {
                "SETNAME" if n == 2 => Command::SetName(name(&rest[1], "a client name")?),
                "SETNAME" => return Err(arity("CLIENT|SETNAME")),
                "GETNAME" if n == 1 => Command::GetName,
                "ID" if n == 1 => Command::ClientId,
                "SETINFO" if n == 3 => Command::ClientInfo,
                "GETNAME" | "ID" | "SETINFO" => return Err(arity(&format!("CLIENT|{}", upper(&rest[0])))),
                other => {
                    return Err(Reply::err(format!(
                        "unknown subcommand '{}'. Try CLIENT SETNAME, CLIENT GETNAME, CLIENT ID",
                        shown(other.to_lowercase().as_bytes())
                    )))
                }
            }
        }
        "SELECT" => match n {
            1 if int(&rest[0]) == Ok(0) => Command::Select,
            1 => return Err(Reply::err("DB index is out of range (mwmq has database 0 only)")),
            _ => return Err(arity("SELECT")),
        },
        "COMMAND" => Command::CommandDocs,
        "INFO" => Command::Info,
        "HELLO" => {
            let proto = match rest.first() {
                None => None,
                Some(v) => match int(v) {
                    Ok(2) => Some(2),
                    Ok(3) => Some(3),
                    Ok(_) => return Err(Reply::Error("NOPROTO sorry, this protocol version is not supported".into())),
                    Err(_) => return Err(Reply::err("Protocol version is not an integer or out of range")),
                },
            };
            let mut setname = None;
            let mut auth = None;
            let mut i = 1;
            while i < n {
                match upper(&rest[i]).as_str() {
                    "AUTH" if i + 2 < n => {
                        let user = String::from_utf8_lossy(&rest[i + 1]).into_owned();
                        auth = Some(Credentials { user, password: rest[i + 2].clone() });
                        i += 3;
                    }
                    "SETNAME" if i + 1 < n => {
                        setname = Some(name(&rest[i + 1], "a client name")?);
                        i += 2;
                    }
                    _ => return Err(syntax()),
                }
            }
            Command::Hello { proto, setname, auth }
        }
        "AUTH" => match n {
            0 => return Err(arity("AUTH")),
            1 => Command::Auth(Credentials { user: "default".into(), password: rest[0].clone() }),
            2 => Command::Auth(Credentials {
                user: String::from_utf8_lossy(&rest[0]).into_owned(),
                password: rest[1].clone(),
            }),
            _ => return Err(syntax()),
        },
        "QDROP" => Command::Drop(one_queue(&cmd, rest)?),
        "QSCHEDULE" => Command::Schedule(Box::new(Schedule::parse(rest).map_err(|e| match e {
            None => arity("QSCHEDULE"),
            Some(e) => Reply::err(e),
        })?)),
        "QUNSCHEDULE" => match rest {
            [n] => Command::Unschedule(crate::schedule::schedule_name(n).map_err(Reply::err)?),
            _ => return Err(arity("QUNSCHEDULE")),
        },
        "QSCHEDULES" if n == 0 => Command::Schedules,
        "QSCHEDULES" => return Err(arity("QSCHEDULES")),
        "QLEN" => Command::Len(one_queue(&cmd, rest)?),
        "QINFO" => Command::QueueInfo(one_queue(&cmd, rest)?),
        "QPAUSE" => Command::Pause(one_queue(&cmd, rest)?, true),
        "QRESUME" => Command::Pause(one_queue(&cmd, rest)?, false),
        "QARCHIVE" | "QDEAD" => {
            if n != 1 && n != 3 {
                return Err(arity(&cmd));
            }
            let queue = name(&rest[0], "a queue name")?;
            let mut count = 10;
            if n == 3 {
                if upper(&rest[1]) != "COUNT" {
                    return Err(syntax());
                }
                let c = int(&rest[2])?;
                if !(1..=MAX_ARCHIVE_COUNT).contains(&c) {
                    return Err(Reply::err(format!("COUNT must be between 1 and {MAX_ARCHIVE_COUNT}")));
                }
                count = c as u32;
            }
            if cmd == "QDEAD" {
                Command::DeadLetters { queue, count }
            } else {
                Command::Archive { queue, count }
            }
        }
        "QCREATE" | "QALTER" => {
            if n == 0 || (cmd == "QALTER" && n == 1) {
                return Err(arity(&cmd));
            }
            let q = name(&rest[0], "a queue name")?;
            let mut o = QueueOptions::default();
            let mut given = Given::default();
            let mut i = 1;
            while i < n {
                given.once(&upper(&rest[i]))?;
                match upper(&rest[i]).as_str() {
                    "MAXDELIVERIES" if i + 1 < n => {
                        let m = int(&rest[i + 1])?;
                        if !(0..=MAX_DELIVERIES).contains(&m) {
                            return Err(Reply::err(format!(
                                "MAXDELIVERIES must be between 0 (never) and {MAX_DELIVERIES}"
                            )));
                        }
                        o.max_deliveries = Some(m as u32);
                        i += 2;
                    }
                    "DEADLETTER" if i + 1 < n => {
                        let d = name(&rest[i + 1], "a queue name")?;
                        if d == q {
                            return Err(Reply::err("a queue cannot be its own dead-letter queue"));
                        }
                        o.dead_letter = Some(Some(d));
                        i += 2;
                    }
                    q @ ("MAXMESSAGES" | "MAXBYTES") if i + 1 < n => {
                        let m = int(&rest[i + 1])?;
                        if m < 0 {
                            return Err(Reply::err(format!("{q} must be 0 (no limit) or more")));
                        }
                        if q == "MAXMESSAGES" {
                            o.max_messages = Some(m as u64);
                        } else {
                            o.max_bytes = Some(m as u64);
                        }
                        i += 2;
                    }
                    "CONCURRENCY" if i + 1 < n => {
                        let m = int(&rest[i + 1])?;
                        if !(0..=MAX_CONCURRENCY).contains(&m) {
                            return Err(Reply::err(format!(
                                "CONCURRENCY must be between 0 (no limit) and {MAX_CONCURRENCY}"
                            )));
                        }
                        o.concurrency = Some(m as u32);
                        i += 2;
                    }
                    "RATE" if i + 1 < n => {
                        let text = String::from_utf8_lossy(&rest[i + 1]).into_owned();
                        let per_s = crate::limits::parse_rate(&text).map_err(Reply::err)?;
                        o.rate_milli = Some((per_s * 1000.0).round() as u64);
                        if per_s > 0.0 && o.rate_milli == Some(0) {
                            return Err(Reply::err(format!("RATE {text}: at least 3.6/h")));
                        }
                        i += 2;
                    }
                    "RETAIN" if i + 1 < n => {
                        o.retain_ms = Some(millis(&rest[i + 1], "RETAIN", MAX_RETAIN_MS)?);
                        i += 2;
                    }
                    "NODEADLETTER" if cmd == "QALTER" => {
                        o.dead_letter = Some(None);
                        i += 1;
                    }
                    "NOBACKOFF" => {
                        o.backoff = Some(None);
                        i += 1;
                    }
                    "BACKOFF" if i + 2 < n => {
                        let (base, max) = (int(&rest[i + 1])?, int(&rest[i + 2])?);
                        let jitter = match rest.get(i + 3).map(|w| upper(w)) {
                            Some(w) if w == "JITTER" => Some(int(rest.get(i + 4).ok_or_else(syntax)?)?),
                            _ => None,
                        };
                        o.backoff = Some(Some(Backoff::new(base, max, jitter.unwrap_or(0)).map_err(Reply::err)?));
                        i += if jitter.is_some() { 5 } else { 3 };
                    }
                    "BACKOFF" => {
                        return Err(Reply::err("BACKOFF takes base_ms and max_ms (and JITTER pct): BACKOFF 500 60000"))
                    }
                    "JITTER" => {
                        return Err(Reply::err(
                            "JITTER goes after BACKOFF's base_ms and max_ms: BACKOFF 500 60000 JITTER 20",
                        ))
                    }
                    _ => return Err(syntax()),
                }
            }
            if cmd == "QCREATE" {
                Command::Create(q, o)
            } else {
                Command::Alter(q, o)
            }
        }
        "REDRIVE" => {
            if n.is_multiple_of(2) {
                return Err(arity("REDRIVE"));
            }
            let (mut to, mut count) = (None, MAX_REDRIVE);
            let queue = name(&rest[0], "a queue name")?;
            let mut seen = Vec::new();
            for pair in rest[1..].chunks(2) {
                match first_time(&mut seen, &pair[0])? {
                    "TO" => to = Some(name(&pair[1], "a queue name")?),
                    "COUNT" => {
                        let c = int(&pair[1])?;
                        if !(1..=i64::from(MAX_REDRIVE)).contains(&c) {
                            return Err(Reply::err(format!("COUNT must be between 1 and {MAX_REDRIVE}")));
                        }
                        count = c as u32;
                    }
                    _ => return Err(syntax()),
                }
            }
            Command::Redrive { queue, to, count }
        }
        "TOUCH" => {
            if n != 4 {
                return Err(arity("TOUCH"));
            }
            Command::Touch {
                queue: name(&rest[0], "a queue name")?,
                id: int(&rest[1])?,
                lease: int(&rest[2])?,
                ms: millis(&rest[3], "the lease", MAX_DELAY_MS)?,
            }
        }
        "QLIST" => match n {
            0 => Command::List { pending: false },
            1 if upper(&rest[0]) == "PENDING" => Command::List { pending: true },
            1 => return Err(syntax()),
            _ => return Err(arity("QLIST")),
        },
        "SEND" => {
            if n < 2 || !n.is_multiple_of(2) {
                return Err(arity("SEND"));
            }
            let mut s = Send {
                queue: name(&rest[0], "a queue name")?,
                body: rest[1].clone(),
                to: None,
                delay_ms: 0,
                key: None,
                group: None,
                priority: 0,
            };
            let mut seen = Vec::new();
            for pair in rest[2..].chunks(2) {
                match first_time(&mut seen, &pair[0])? {
                    "TO" => s.to = Some(name(&pair[1], "a receiver name")?),
                    "DELAY" => s.delay_ms = millis(&pair[1], "DELAY", MAX_DELAY_MS)?,
                    "KEY" => s.key = Some(name(&pair[1], "a KEY")?),
                    "GROUP" => s.group = Some(name(&pair[1], "a GROUP")?),
                    "PRIORITY" => s.priority = crate::policies::priority(int(&pair[1])?).map_err(Reply::err)?,
                    _ => return Err(syntax()),
                }
            }
            Command::Send(s)
        }
        "RECV" => {
            if n.is_multiple_of(2) {
                return Err(arity("RECV"));
            }
            let mut r = Recv {
                queue: name(&rest[0], "a queue name")?,
                from: None,
                vt_ms: limits.default_vt_ms,
                count: 1,
                wait_ms: 0,
            };
            let mut seen = Vec::new();
            for pair in rest[1..].chunks(2) {
                match first_time(&mut seen, &pair[0])? {
                    "FROM" => r.from = Some(name(&pair[1], "a sender name")?),
                    "VT" => {
                        r.vt_ms = millis(&pair[1], "VT", MAX_DELAY_MS)?;
                        if r.vt_ms == 0 {
                            return Err(Reply::err("VT must be at least 1 ms"));
                        }
                    }
                    "COUNT" => {
                        let c = int(&pair[1])?;
                        if !(1..=i64::from(MAX_COUNT)).contains(&c) {
                            return Err(Reply::err(format!("COUNT must be between 1 and {MAX_COUNT}")));
                        }
                        r.count = c as u32;
                    }
                    "WAIT" => r.wait_ms = millis(&pair[1], "WAIT", limits.max_wait_ms)?,
                    _ => return Err(syntax()),
                }
            }
            Command::Recv(r)
        }
        "ACK" => {
            if n != 3 {
                return Err(arity("ACK"));
            }
            Command::Ack { queue: name(&rest[0], "a queue name")?, id: int(&rest[1])?, lease: int(&rest[2])? }
        }
        "NACK" => {
            if n != 3 && n != 5 {
                return Err(arity("NACK"));
            }
            let delay_ms = if n == 5 {
                if upper(&rest[3]) != "DELAY" {
                    return Err(syntax());
                }
                Some(millis(&rest[4], "DELAY", MAX_DELAY_MS)?)
            } else {
                None
            };
            Command::Nack {
                queue: name(&rest[0], "a queue name")?,
                id: int(&rest[1])?,
                lease: int(&rest[2])?,
                delay_ms,
            }
        }
        "POP" | "PEEK" => {
            if n != 1 && n != 3 {
                return Err(arity(&cmd));
            }
            let queue = name(&rest[0], "a queue name")?;
            let from = if n == 3 {
                if upper(&rest[1]) != "FROM" {
                    return Err(syntax());
                }
                Some(name(&rest[2], "a sender name")?)
            } else {
                None
            };
            if cmd == "POP" {
                Command::Pop { queue, from }
            } else {
                Command::Peek { queue, from }
            }
        }
        _ => return Err(Reply::err(format!("unknown command '{}'", shown(&args[0])))),
    };
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { default_vt_ms: 30_000, max_wait_ms: 60_000 };

    fn p(line: &str) -> Result<Command, Refusal> {
        let args: Vec<Vec<u8>> = line.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        parse(&args, &L)
    }

    fn err(line: &str) -> String {
        match p(line) {
            Err(Reply::Error(e)) => e,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn commands_and_options() {
        assert_eq!(
            p("send q hi to bob delay 50 key k1 group g7").unwrap(),
            Command::Send(Send {
                queue: "q".into(),
                body: b"hi".to_vec(),
                to: Some("bob".into()),
                delay_ms: 50,
                key: Some("k1".into()),
                group: Some("g7".into()),
                priority: 0
            })
        );
        assert_eq!(
            p("RECV q COUNT 5 WAIT 100 FROM alice").unwrap(),
            Command::Recv(Recv {
                queue: "q".into(),
                from: Some("alice".into()),
                vt_ms: 30_000,
                count: 5,
                wait_ms: 100
            })
        );
        assert_eq!(p("ACK q 12 99").unwrap(), Command::Ack { queue: "q".into(), id: 12, lease: 99 });
        assert_eq!(
            p("NACK q 12 99 DELAY 10").unwrap(),
            Command::Nack { queue: "q".into(), id: 12, lease: 99, delay_ms: Some(10) }
        );
        assert_eq!(p("qlist pending").unwrap(), Command::List { pending: true });
        assert_eq!(p("POP q FROM a").unwrap(), Command::Pop { queue: "q".into(), from: Some("a".into()) });
        assert_eq!(p("CLIENT SETNAME me").unwrap(), Command::SetName("me".into()));
        assert_eq!(p("SEND q hi").unwrap().op(), MqOp::Send);
        assert!(!p("PING").unwrap().uses_database());
    }

    /// Which variant a command is (exhaustive: a new command must be given
    /// a number here, and [`COMMANDS`] counted up, and then a line in
    /// [`EVERY_COMMAND`] for the test below to pass; QPAUSE and QRESUME
    /// are one variant).
    fn variant(c: &Command) -> usize {
        match c {
            Command::Ping(_) => 0,
            Command::Quit => 1,
            Command::SetName(_) => 2,
            Command::GetName => 3,
            Command::ClientId => 4,
            Command::ClientInfo => 5,
            Command::Select => 6,
            Command::CommandDocs => 7,
            Command::Info => 8,
            Command::Hello { .. } => 9,
            Command::Auth(_) => 10,
            Command::Create(..) => 11,
            Command::Alter(..) => 12,
            Command::Pause(..) => 13,
            Command::Archive { .. } => 14,
            Command::DeadLetters { .. } => 15,
            Command::QueueInfo(_) => 16,
            Command::Redrive { .. } => 17,
            Command::Touch { .. } => 18,
            Command::Drop(_) => 19,
            Command::Len(_) => 20,
            Command::List { .. } => 21,
            Command::Send(_) => 22,
            Command::Recv(_) => 23,
            Command::Ack { .. } => 24,
            Command::Nack { .. } => 25,
            Command::Pop { .. } => 26,
            Command::Peek { .. } => 27,
            Command::Schedule(_) => 28,
            Command::Unschedule(_) => 29,
            Command::Schedules => 30,
            Command::Stream(x) => {
                31 + match x {
                    XCmd::Add { .. } => 0,
                    XCmd::Len(_) => 1,
                    XCmd::Range { .. } => 2,
                    XCmd::Read { .. } => 3,
                    XCmd::Del { .. } => 4,
                    XCmd::Trim { .. } => 5,
                    XCmd::GroupCreate { .. } => 6,
                    XCmd::GroupSetId { .. } => 7,
                    XCmd::GroupDeadLetter { .. } => 8,
                    XCmd::GroupDestroy { .. } => 9,
                    XCmd::CreateConsumer { .. } => 10,
                    XCmd::DelConsumer { .. } => 11,
                    XCmd::ReadGroup { .. } => 12,
                    XCmd::Ack { .. } => 13,
                    XCmd::Pending { .. } => 14,
                    XCmd::Claim(_) => 15,
                    XCmd::AutoClaim { .. } => 16,
                    XCmd::InfoStream { .. } => 17,
                    XCmd::InfoGroups(_) => 18,
                    XCmd::InfoConsumers { .. } => 19,
                    XCmd::Type(_) => 20,
                    XCmd::Exists(_) => 21,
                    XCmd::DelKeys(_) => 22,
                }
            }
        }
    }

    /// Variants of [`Command`] (a stream command counted per [`XCmd`] variant).
    const COMMANDS: usize = 31 + 23;

    #[test]
    fn every_command_is_listed_parses_and_has_a_class_and_a_home() {
        let mut seen = vec![Vec::new(); COMMANDS];
        for line in EVERY_COMMAND {
            let c = p(line).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            seen[variant(&c)].push(*line);
            // A command that needs the database names the queue or stream
            // whose database runs it (QLIST asks every database).
            let everywhere = matches!(c, Command::List { .. } | Command::Unschedule(_) | Command::Schedules);
            if c.uses_database() && !everywhere {
                assert!(c.queue().is_some(), "{line}: no queue, so no database");
            }
            if !c.uses_database() {
                assert!(c.queue().is_none() && c.wait().is_none(), "{line}");
            }
        }
        for (i, lines) in seen.iter().enumerate() {
            assert!(!lines.is_empty(), "variant {i} of Command has no line in EVERY_COMMAND");
        }
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        assert_eq!(err("SEND q"), "ERR wrong number of arguments for 'SEND' command");
        assert_eq!(err("SEND q hi TO"), "ERR wrong number of arguments for 'SEND' command");
        assert_eq!(err("SEND q hi PRIORITY"), "ERR wrong number of arguments for 'SEND' command");
        assert_eq!(err("SEND q hi PRIORITY 10"), "ERR PRIORITY must be between 0 and 9 (higher is handed out first)");
        assert_eq!(err("SEND q hi PRIORITY -1"), "ERR PRIORITY must be between 0 and 9 (higher is handed out first)");
        assert_eq!(err("SEND q hi PRIORITY x"), "ERR value is not an integer or out of range");
        assert_eq!(err("SEND q hi PRIORITY 3 FOO 1"), "ERR syntax error");
        // Each option once, as QCREATE's: the last one no longer wins silently.
        assert_eq!(err("SEND q hi PRIORITY 3 priority 4"), "ERR syntax error: PRIORITY is given more than once");
        for o in ["TO a", "DELAY 5", "KEY k", "GROUP g"] {
            assert_eq!(
                err(&format!("SEND q hi {o} PRIORITY 1 {o}")),
                format!("ERR syntax error: {} is given more than once", &o[..o.find(' ').unwrap()])
            );
        }
        for o in ["FROM a", "VT 5", "COUNT 2", "WAIT 5"] {
            let word = &o[..o.find(' ').unwrap()];
            assert_eq!(err(&format!("RECV q {o} {o}")), format!("ERR syntax error: {word} is given more than once"));
        }
        assert_eq!(err("REDRIVE d COUNT 1 COUNT 2"), "ERR syntax error: COUNT is given more than once");
        assert!(p("SEND q hi TO a DELAY 5 KEY k GROUP g PRIORITY 1").is_ok());
        assert!(matches!(p("SEND q hi PRIORITY 9").unwrap(), Command::Send(s) if s.priority == 9));
        assert_eq!(
            p("NACK q 1 2").unwrap(),
            Command::Nack { queue: "q".into(), id: 1, lease: 2, delay_ms: None },
            "no DELAY: the queue's backoff decides"
        );
        assert_eq!(
            p("QALTER q BACKOFF 100 5000 JITTER 20 RETAIN 5").unwrap(),
            Command::Alter(
                "q".into(),
                QueueOptions {
                    backoff: Some(Some(Backoff { base_ms: 100, max_ms: 5000, jitter_pct: 20 })),
                    retain_ms: Some(5),
                    ..Default::default()
                }
            )
        );
        assert_eq!(
            p("QALTER q BACKOFF 100 5000").unwrap(),
            Command::Alter(
                "q".into(),
                QueueOptions {
                    backoff: Some(Some(Backoff { base_ms: 100, max_ms: 5000, jitter_pct: 0 })),
                    ..Default::default()
                }
            )
        );
        assert_eq!(
            p("QALTER q NOBACKOFF").unwrap(),
            Command::Alter("q".into(), QueueOptions { backoff: Some(None), ..Default::default() })
        );
        assert_eq!(
            err("QALTER q BACKOFF 100"),
            "ERR BACKOFF takes base_ms and max_ms (and JITTER pct): BACKOFF 500 60000"
        );
        assert_eq!(err("QALTER q BACKOFF 100 5000 JITTER"), "ERR syntax error");
        assert_eq!(
            err("QALTER q JITTER 20"),
            "ERR JITTER goes after BACKOFF's base_ms and max_ms: BACKOFF 500 60000 JITTER 20"
        );
        assert!(err("QALTER q BACKOFF 0 5000").contains("BACKOFF's base must be between 1 and"));
        assert!(err("QALTER q BACKOFF 500 100").contains("BACKOFF's max (100 ms) must be at least its base (500 ms)"));
        assert!(err("QALTER q BACKOFF 100 5000 JITTER 101").contains("JITTER must be between 0 and 100"));
        // Each option once, not with its opposite: the last one no longer wins silently.
        assert_eq!(
            err("QALTER q BACKOFF 100 5000 RETAIN 5 BACKOFF 200 9000"),
            "ERR syntax error: BACKOFF is given more than once"
        );
        assert_eq!(err("QALTER q BACKOFF 100 5000 NOBACKOFF"), "ERR syntax error: BACKOFF and NOBACKOFF together");
        assert_eq!(err("QALTER q NODEADLETTER DEADLETTER d"), "ERR syntax error: NODEADLETTER and DEADLETTER together");
        assert_eq!(err("QCREATE q RATE 5/s rate 6/s"), "ERR syntax error: RATE is given more than once");
        for o in ["MAXDELIVERIES", "MAXMESSAGES", "MAXBYTES", "CONCURRENCY", "RETAIN"] {
            assert_eq!(err(&format!("QALTER q {o} 1 {o} 2")), format!("ERR syntax error: {o} is given more than once"));
        }
        assert_eq!(err("FLUSHALL"), "ERR unknown command 'FLUSHALL'");
        assert_eq!(err("ACK q x 1"), "ERR value is not an integer or out of range");
        assert!(err("RECV q COUNT 0").contains("COUNT must be between 1 and 1000"));
        assert!(err("RECV q WAIT 999999999").contains("WAIT must be between 0 and 60000"));
        assert!(err("RECV q VT 0").contains("VT must be at least 1 ms"));
        assert!(err("QCREATE \u{1}").contains("a queue name must be"));
        assert!(err("HELLO 4").starts_with("NOPROTO"));
        assert_eq!(
            p("HELLO 3 AUTH default x SETNAME me").unwrap(),
            Command::Hello {
                proto: Some(3),
                setname: Some("me".into()),
                auth: Some(Credentials { user: "default".into(), password: b"x".to_vec() })
            }
        );
        assert_eq!(
            p("AUTH pw").unwrap(),
            Command::Auth(Credentials { user: "default".into(), password: b"pw".to_vec() })
        );
        assert_eq!(err("AUTH a b c"), "ERR syntax error");
        assert!(err("SELECT 3").contains("database 0 only"));
    }
}
