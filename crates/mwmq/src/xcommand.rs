//! Redis Streams' commands as Redis 7.0 parses them: from a request's
//! arguments to a checked [`XCmd`], or the error text Redis gives for the
//! same arguments (`Invalid stream ID specified as stream command
//! argument`, `syntax error`, `Unbalanced XREAD list of streams`, ...).
//! What each command then does is in `commands/streams.rs` and the
//! database functions of `db/streams.rs`.
//!
//! Ids are stored as two PostgreSQL `bigint`s, so their parts go up to
//! 2^63−1 (Redis's up to 2^64−1): a larger part in XADD, XGROUP or XCLAIM
//! is refused as an invalid id; in a range bound it means "the largest".

use crate::resp::Reply;

/// A stream entry's id: milliseconds and a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Sid {
    /// Milliseconds part.
    pub ms: i64,
    /// Sequence part.
    pub seq: i64,
}

impl Sid {
    /// The largest id.
    pub const MAX: Sid = Sid { ms: i64::MAX, seq: i64::MAX };
    /// `0-0`.
    pub const ZERO: Sid = Sid { ms: 0, seq: 0 };

    /// The next id, if any.
    pub fn next(self) -> Option<Sid> {
        if self.seq < i64::MAX {
            Some(Sid { ms: self.ms, seq: self.seq + 1 })
        } else if self.ms < i64::MAX {
            Some(Sid { ms: self.ms + 1, seq: 0 })
        } else {
            None
        }
    }

    /// The previous id, if any.
    pub fn prev(self) -> Option<Sid> {
        if self.seq > 0 {
            Some(Sid { ms: self.ms, seq: self.seq - 1 })
        } else if self.ms > 0 {
            Some(Sid { ms: self.ms - 1, seq: i64::MAX })
        } else {
            None
        }
    }

    /// As Redis writes it: `ms-seq`.
    pub fn text(self) -> String {
        format!("{}-{}", self.ms, self.seq)
    }

    /// As a bulk string reply.
    pub fn reply(self) -> Reply {
        Reply::text(self.text())
    }
}

/// The id XADD is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddId {
    /// `*`: the stream's clock.
    Auto,
    /// `ms-*`: the next sequence number at `ms`.
    AtMs(i64),
    /// `ms-seq` (or `ms`, meaning `ms-0`).
    Exact(Sid),
}

/// How a stream is trimmed (XADD's and XTRIM's MAXLEN / MINID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trim {
    /// Keep at most this many entries.
    MaxLen(i64),
    /// Remove the entries with smaller ids.
    MinId(Sid),
}

/// A trim with its `~` and LIMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trimming {
    /// What to keep.
    pub trim: Trim,
    /// `~`: mwmq trims exactly (Redis trims whole nodes only), at most `limit` entries.
    pub approx: bool,
    /// Most entries removed (`None`: no limit).
    pub limit: Option<i64>,
}

/// Where an XREAD starts in one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// After this id.
    After(Sid),
    /// `$`: after the stream's last id when the command arrived.
    Last,
}

/// What an XREADGROUP reads in one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRead {
    /// `>`: entries never delivered to the group.
    New,
    /// The consumer's own pending entries after this id.
    History(Sid),
}

/// XPENDING's extended form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRange {
    /// Only entries idle at least this long (ms).
    pub idle: Option<i64>,
    /// First id (inclusive).
    pub start: Sid,
    /// Last id (inclusive).
    pub end: Sid,
    /// Most entries.
    pub count: i64,
    /// Only this consumer's.
    pub consumer: Option<String>,
}

/// XCLAIM's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Stream.
    pub key: String,
    /// Group.
    pub group: String,
    /// The new owner.
    pub consumer: String,
    /// Only entries idle at least this long.
    pub min_idle: i64,
    /// The entries.
    pub ids: Vec<Sid>,
    /// IDLE ms (the new idle time).
    pub idle: Option<i64>,
    /// TIME ms (the delivery time, Unix ms).
    pub time: Option<i64>,
    /// RETRYCOUNT n.
    pub retry: Option<i64>,
    /// FORCE: create missing pending entries.
    pub force: bool,
    /// JUSTID: ids only, delivery count unchanged.
    pub justid: bool,
    /// LASTID: the group's last id is raised to it.
    pub lastid: Option<Sid>,
    /// A refusal of the arguments after the ids (given once the group was checked).
    pub bad: Option<String>,
}

/// The group id of XGROUP CREATE / SETID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupStart {
    /// An id.
    At(Sid),
    /// `$`: the stream's last id.
    Last,
    /// Not an id: this refusal, once the stream was looked up.
    Bad(String),
}

/// A stream command, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XCmd {
    /// XADD
    Add {
        /// Stream.
        key: String,
        /// NOMKSTREAM
        nomkstream: bool,
        /// MAXLEN / MINID
        trim: Option<Trimming>,
        /// The id.
        id: AddId,
        /// Field, value, field, value, ...
        fields: Vec<Vec<u8>>,
    },
    /// XLEN
    Len(String),
    /// XRANGE / XREVRANGE (bounds inclusive, already adjusted for `(`).
    Range {
        /// Stream.
        key: String,
        /// Lowest id.
        start: Sid,
        /// Highest id.
        end: Sid,
        /// Most entries (`None`: all).
        count: Option<i64>,
        /// XREVRANGE.
        rev: bool,
    },
    /// XREAD
    Read {
        /// Most entries per stream (`None`: all).
        count: Option<i64>,
        /// BLOCK ms (0: as long as mwmq lets a request wait).
        block: Option<u64>,
        /// Streams and where to read from.
        streams: Vec<(String, ReadFrom)>,
        /// Per stream, the refusal of its id (given once its type was checked).
        bad: Vec<Option<String>>,
    },
    /// XDEL
    Del {
        /// Stream.
        key: String,
        /// Entries.
        ids: Vec<Sid>,
    },
    /// XTRIM
    Trim {
        /// Stream.
        key: String,
        /// How.
        trim: Trimming,
    },
    /// XGROUP CREATE
    GroupCreate {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// Its last-delivered id.
        start: GroupStart,
        /// MKSTREAM
        mkstream: bool,
        /// ENTRIESREAD
        entries_read: Option<i64>,
    },
    /// XGROUP SETID
    GroupSetId {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// Its new last-delivered id.
        start: GroupStart,
        /// ENTRIESREAD
        entries_read: Option<i64>,
    },
    /// XGROUP DEADLETTER (mwmq's extension): entries delivered `max` times
    /// go to `target` instead of being delivered again.
    GroupDeadLetter {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// Deliveries allowed (`None`: off).
        max: Option<i64>,
        /// The dead-letter stream.
        target: Option<String>,
    },
    /// XGROUP DESTROY
    GroupDestroy {
        /// Stream.
        key: String,
        /// Group.
        group: String,
    },
    /// XGROUP CREATECONSUMER
    CreateConsumer {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// Consumer.
        consumer: String,
    },
    /// XGROUP DELCONSUMER
    DelConsumer {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// Consumer.
        consumer: String,
    },
    /// XREADGROUP
    ReadGroup {
        /// Group.
        group: String,
        /// Consumer.
        consumer: String,
        /// Most entries per stream.
        count: Option<i64>,
        /// BLOCK ms.
        block: Option<u64>,
        /// NOACK
        noack: bool,
        /// Streams and what to read.
        streams: Vec<(String, GroupRead)>,
        /// Per stream, the refusal of its id (given once its group was checked).
        bad: Vec<Option<String>>,
    },
    /// XACK
    Ack {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// Entries.
        ids: Vec<Sid>,
        /// One of the ids is not an id (refused if the group exists).
        invalid: bool,
    },
    /// XPENDING
    Pending {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// The extended form.
        range: Option<PendingRange>,
    },
    /// XCLAIM
    Claim(Box<Claim>),
    /// XAUTOCLAIM
    AutoClaim {
        /// Stream.
        key: String,
        /// Group.
        group: String,
        /// The new owner.
        consumer: String,
        /// Only entries idle at least this long.
        min_idle: i64,
        /// Scan from this id.
        start: Sid,
        /// Most entries.
        count: i64,
        /// JUSTID
        justid: bool,
    },
    /// XINFO STREAM [FULL [COUNT n]]
    InfoStream {
        /// Stream.
        key: String,
        /// FULL, with its COUNT (0: all).
        full: Option<i64>,
    },
    /// XINFO GROUPS
    InfoGroups(String),
    /// XINFO CONSUMERS
    InfoConsumers {
        /// Stream.
        key: String,
        /// Group.
        group: String,
    },
    /// TYPE
    Type(String),
    /// EXISTS
    Exists(Vec<String>),
    /// DEL (streams)
    DelKeys(Vec<String>),
}

/// The longest BLOCK (BLOCK 0, "for ever", waits this long).
pub const MAX_BLOCK_MS: u64 = 30 * 24 * 3600 * 1000;

/// The stream commands that name one stream and never wait, as a pattern
/// (`one_stream!() => ...`).
macro_rules! one_stream {
    () => {
        $crate::xcommand::XCmd::Add { .. }
            | $crate::xcommand::XCmd::Len(_)
            | $crate::xcommand::XCmd::Range { .. }
            | $crate::xcommand::XCmd::Del { .. }
            | $crate::xcommand::XCmd::Trim { .. }
            | $crate::xcommand::XCmd::GroupCreate { .. }
            | $crate::xcommand::XCmd::GroupSetId { .. }
            | $crate::xcommand::XCmd::GroupDeadLetter { .. }
            | $crate::xcommand::XCmd::GroupDestroy { .. }
            | $crate::xcommand::XCmd::CreateConsumer { .. }
            | $crate::xcommand::XCmd::DelConsumer { .. }
            | $crate::xcommand::XCmd::Ack { .. }
            | $crate::xcommand::XCmd::Pending { .. }
            | $crate::xcommand::XCmd::Claim(_)
            | $crate::xcommand::XCmd::AutoClaim { .. }
            | $crate::xcommand::XCmd::InfoStream { .. }
            | $crate::xcommand::XCmd::InfoGroups(_)
            | $crate::xcommand::XCmd::InfoConsumers { .. }
            | $crate::xcommand::XCmd::Type(_)
    };
}
pub(crate) use one_stream;

impl XCmd {
    /// The first stream it names, whose database its statement runs on.
    pub fn first_key(&self) -> Option<&str> {
        match self {
            XCmd::Read { streams, .. } => streams.first().map(|(k, _)| k.as_str()),
            XCmd::ReadGroup { streams, .. } => streams.first().map(|(k, _)| k.as_str()),
            XCmd::Exists(keys) | XCmd::DelKeys(keys) => keys.first().map(String::as_str),
            XCmd::Claim(c) => Some(&c.key),
            XCmd::Len(k) | XCmd::InfoGroups(k) | XCmd::Type(k) => Some(k),
            XCmd::Add { key, .. }
            | XCmd::Range { key, .. }
            | XCmd::Del { key, .. }
            | XCmd::Trim { key, .. }
            | XCmd::GroupCreate { key, .. }
            | XCmd::GroupSetId { key, .. }
            | XCmd::GroupDestroy { key, .. }
            | XCmd::GroupDeadLetter { key, .. }
            | XCmd::CreateConsumer { key, .. }
            | XCmd::DelConsumer { key, .. }
            | XCmd::Ack { key, .. }
            | XCmd::Pending { key, .. }
            | XCmd::AutoClaim { key, .. }
            | XCmd::InfoStream { key, .. }
            | XCmd::InfoConsumers { key, .. } => Some(key),
        }
    }

    /// Its class in the results format.
    pub fn op(&self) -> mwstats::ops::MqOp {
        use mwstats::ops::MqOp;
        match self {
            XCmd::Add { .. } => MqOp::Send,
            XCmd::Read { .. } | XCmd::ReadGroup { .. } => MqOp::Recv,
            XCmd::Ack { .. } => MqOp::Ack,
            XCmd::Len(_)
            | XCmd::Range { .. }
            | XCmd::Del { .. }
            | XCmd::Trim { .. }
            | XCmd::GroupCreate { .. }
            | XCmd::GroupSetId { .. }
            | XCmd::GroupDeadLetter { .. }
            | XCmd::GroupDestroy { .. }
            | XCmd::CreateConsumer { .. }
            | XCmd::DelConsumer { .. }
            | XCmd::Pending { .. }
            | XCmd::Claim(_)
            | XCmd::AutoClaim { .. }
            | XCmd::InfoStream { .. }
            | XCmd::InfoGroups(_)
            | XCmd::InfoConsumers { .. }
            | XCmd::Type(_)
            | XCmd::Exists(_)
            | XCmd::DelKeys(_) => MqOp::Queue,
        }
    }

    /// The streams it names (the first decides the database; all must share it).
    pub fn keys(&self) -> Vec<&str> {
        match self {
            XCmd::Read { streams, .. } => streams.iter().map(|(k, _)| k.as_str()).collect(),
            XCmd::ReadGroup { streams, .. } => streams.iter().map(|(k, _)| k.as_str()).collect(),
            XCmd::Exists(keys) | XCmd::DelKeys(keys) => keys.iter().map(String::as_str).collect(),
            one_stream!() => self.first_key().into_iter().collect(),
        }
    }

    /// How long it may wait for entries (XREAD / XREADGROUP BLOCK on new entries only).
    pub fn block_ms(&self) -> Option<u64> {
        let ms = |b: &Option<u64>| b.map(|ms| if ms == 0 { MAX_BLOCK_MS } else { ms.min(MAX_BLOCK_MS) });
        match self {
            XCmd::Read { block, bad, .. } => {
                if bad.iter().all(Option::is_none) {
                    ms(block)
                } else {
                    None
                }
            }
            XCmd::ReadGroup { block, streams, bad, .. } => {
                let new_only = streams.iter().all(|(_, r)| *r == GroupRead::New);
                if new_only && bad.iter().all(Option::is_none) {
                    ms(block)
                } else {
                    None
                }
            }
            one_stream!() | XCmd::Exists(_) | XCmd::DelKeys(_) => None,
        }
    }
}

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

fn arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{}' command", name.to_lowercase()))
}

fn syntax() -> Reply {
    Reply::err("syntax error")
}

/// Redis's refusal of a subcommand's arguments it cannot parse.
fn subcommand_syntax(sub: &[u8], cmd: &str) -> Reply {
    Reply::err(format!(
        "unknown subcommand or wrong number of arguments for '{}'. Try {cmd} HELP.",
        crate::words::shown(sub)
    ))
}

fn not_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

fn invalid_id() -> Reply {
    Reply::err("Invalid stream ID specified as stream command argument")
}

fn int(b: &[u8]) -> Result<i64, Reply> {
    std::str::from_utf8(b).ok().and_then(|s| s.parse::<i64>().ok()).ok_or_else(not_integer)
}

fn key(b: &[u8]) -> Result<String, Reply> {
    let s = std::str::from_utf8(b).map_err(|_| Reply::err("a stream name must be UTF-8"))?;
    if s.is_empty() || s.len() > crate::words::MAX_NAME || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Reply::err(format!(
            "a stream name must be 1 to {} bytes without spaces or control characters",
            crate::words::MAX_NAME
        )));
    }
    Ok(s.to_string())
}

/// A group or consumer name (any bytes Redis takes; mwmq keeps UTF-8 text).
fn label(b: &[u8]) -> Result<String, Reply> {
    let s = std::str::from_utf8(b).map_err(|_| Reply::err("a group or consumer name must be UTF-8"))?;
    if s.len() > crate::words::MAX_NAME {
        return Err(Reply::err(format!("a group or consumer name must be at most {} bytes", crate::words::MAX_NAME)));
    }
    Ok(s.to_string())
}

/// An unsigned part of an id: digits only, as Redis's `string2ull`; above
/// 2^63−1 it is `None` (see the module's note).
fn part(s: &str) -> Result<Option<i64>, Reply> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid_id());
    }
    match s.parse::<u64>() {
        Ok(v) => Ok(i64::try_from(v).ok()),
        Err(_) => Err(invalid_id()),
    }
}

/// An id as Redis's `streamGenericParseIDOrReply`: `ms-seq`, or `ms` with
/// `missing_seq`; `-` and `+` unless `strict`. Parts above 2^63−1 are
/// clamped when `clamp`, refused otherwise.
fn parse_id(b: &[u8], missing_seq: i64, strict: bool, clamp: bool) -> Result<Sid, Reply> {
    let s = std::str::from_utf8(b).map_err(|_| invalid_id())?;
    if s.len() > 127 {
        return Err(invalid_id());
    }
    if !strict && s == "-" {
        return Ok(Sid::ZERO);
    }
    if !strict && s == "+" {
        return Ok(Sid::MAX);
    }
    let (ms, seq) = match s.split_once('-') {
        Some((m, q)) => (part(m)?, part(q)?),
        None => (part(s)?, Some(missing_seq)),
    };
    match (ms, seq) {
        (Some(ms), Some(seq)) => Ok(Sid { ms, seq }),
        (None, _) if clamp => Ok(Sid::MAX),
        (Some(ms), None) if clamp => Ok(Sid { ms, seq: i64::MAX }),
        _ => Err(invalid_id()),
    }
}

/// An id that names an entry (XDEL, XACK, XCLAIM, SETID...): strict.
fn entry_id(b: &[u8]) -> Result<Sid, Reply> {
    parse_id(b, 0, true, false)
}

/// A range bound: `(` makes it exclusive (then strict); `missing_seq` fills `ms` alone.
fn bound(b: &[u8], missing_seq: i64, start: bool) -> Result<Sid, Reply> {
    if b.len() > 1 && b[0] == b'(' {
        let id = parse_id(&b[1..], missing_seq, true, true)?;
        let moved = if start { id.next() } else { id.prev() };
        return moved.ok_or_else(|| {
            Reply::err(if start { "invalid start ID for the interval" } else { "invalid end ID for the interval" })
        });
    }
    parse_id(b, missing_seq, false, true)
}

/// XADD's and XTRIM's MAXLEN / MINID, from `args[*i]` on; `None`: not a trim option.
fn trim_option(
    args: &[Vec<u8>],
    i: &mut usize,
    t: &mut Option<Trimming>,
    limit: &mut Option<i64>,
) -> Result<bool, Reply> {
    let opt = upper(&args[*i]);
    let more = args.len() - *i - 1;
    match opt.as_str() {
        "MAXLEN" | "MINID" if more >= 1 => {
            if let Some(prev) = t {
                let other = matches!(prev.trim, Trim::MaxLen(_)) != (opt == "MAXLEN");
                if other {
                    return Err(Reply::err(
                        "syntax error, MAXLEN and MINID options at the same time are not compatible",
                    ));
                }
            }
            let mut approx = false;
            let mut at = *i + 1;
            if more >= 2 && (args[at] == b"~" || args[at] == b"=") {
                approx = args[at] == b"~";
                at += 1;
            }
            let trim = if opt == "MAXLEN" {
                let n = int(&args[at])?;
                if n < 0 {
                    return Err(Reply::err("The MAXLEN argument must be >= 0."));
                }
                Trim::MaxLen(n)
            } else {
                Trim::MinId(parse_id(&args[at], 0, true, true)?)
            };
            *t = Some(Trimming { trim, approx, limit: None });
            *i = at;
            Ok(true)
        }
        "LIMIT" if more >= 1 => {
            let n = int(&args[*i + 1])?;
            if n < 0 {
                return Err(Reply::err("The LIMIT argument must be >= 0."));
            }
            *limit = Some(n);
            *i += 1;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Completes a trim: LIMIT only with `~`; `~` without LIMIT removes at
/// most 100 × 100 entries (Redis's default node size × 100), LIMIT 0: no limit.
fn finish_trim(t: Option<Trimming>, limit: Option<i64>) -> Result<Option<Trimming>, Reply> {
    let Some(mut t) = t else {
        return match limit {
            Some(_) => Err(Reply::err("syntax error, LIMIT cannot be used without the special ~ option")),
            None => Ok(None),
        };
    };
    if limit.is_some() && !t.approx {
        return Err(Reply::err("syntax error, LIMIT cannot be used without the special ~ option"));
    }
    t.limit = match (t.approx, limit) {
        (false, _) | (true, Some(0)) => None,
        (true, Some(n)) => Some(n),
        (true, None) => Some(10_000),
    };
    Ok(Some(t))
}

fn count_arg(b: &[u8]) -> Result<i64, Reply> {
    Ok(int(b)?.max(0))
}

fn block_arg(b: &[u8]) -> Result<u64, Reply> {
    let ms = std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| Reply::err("timeout is not an integer or out of range"))?;
    if ms < 0 {
        return Err(Reply::err("timeout is negative"));
    }
    Ok(ms as u64)
}

/// The minimal arity of each command (Redis's command table; negative: at least).
fn min_args(cmd: &str) -> Option<usize> {
    Some(match cmd {
        "XADD" => 5,
        "XLEN" | "TYPE" => 2,
        "XRANGE" | "XREVRANGE" => 4,
        "XREAD" => 4,
        "XDEL" | "XTRIM" | "XACK" => 3,
        "XREADGROUP" => 7,
        "XPENDING" => 3,
        "XCLAIM" => 6,
        "XAUTOCLAIM" => 6,
        "EXISTS" | "DEL" => 2,
        "XGROUP" | "XINFO" => 2,
        _ => return None,
    })
}

/// Whether `cmd` (upper case) is a stream command parsed here.
pub fn is_stream_command(cmd: &str) -> bool {
    min_args(cmd).is_some()
}

/// Checks a stream command's arguments (command name first, upper case in `cmd`).
pub fn parse(cmd: &str, args: &[Vec<u8>]) -> Result<XCmd, Reply> {
    let argc = args.len();
    let min = min_args(cmd).unwrap_or(1);
    if argc < min || ((cmd == "XLEN" || cmd == "TYPE") && argc != 2) || (cmd == "XACK" && argc < 4) {
        return Err(arity(cmd));
    }
    match cmd {
        "XADD" => parse_xadd(args),
        "XLEN" => Ok(XCmd::Len(key(&args[1])?)),
        "TYPE" => Ok(XCmd::Type(key(&args[1])?)),
        "EXISTS" => Ok(XCmd::Exists(args[1..].iter().map(|k| key(k)).collect::<Result<_, _>>()?)),
        "DEL" => Ok(XCmd::DelKeys(args[1..].iter().map(|k| key(k)).collect::<Result<_, _>>()?)),
        "XRANGE" | "XREVRANGE" => {
            let rev = cmd == "XREVRANGE";
            let k = key(&args[1])?;
            let (a, b) = if rev { (&args[3], &args[2]) } else { (&args[2], &args[3]) };
            let start = bound(a, 0, true)?;
            let end = bound(b, i64::MAX, false)?;
            let mut count = None;
            let mut j = 4;
            while j < argc {
                if upper(&args[j]) == "COUNT" && j + 1 < argc {
                    count = Some(count_arg(&args[j + 1])?);
                    j += 2;
                } else {
                    return Err(syntax());
                }
            }
            Ok(XCmd::Range { key: k, start, end, count, rev })
        }
        "XREAD" | "XREADGROUP" => parse_read(cmd, args),
        "XDEL" => {
            Ok(XCmd::Del { key: key(&args[1])?, ids: args[2..].iter().map(|b| entry_id(b)).collect::<Result<_, _>>()? })
        }
        "XACK" => {
            // (Redis answers 0 for a missing group before it looks at the ids.)
            let ids: Result<Vec<Sid>, Reply> = args[3..].iter().map(|b| entry_id(b)).collect();
            Ok(XCmd::Ack {
                key: key(&args[1])?,
                group: label(&args[2])?,
                invalid: ids.is_err(),
                ids: ids.unwrap_or_default(),
            })
        }
        "XTRIM" => {
            let k = key(&args[1])?;
            let (mut t, mut limit) = (None, None);
            let mut i = 2;
            while i < argc {
                if !trim_option(args, &mut i, &mut t, &mut limit)? {
                    return Err(syntax());
                }
                i += 1;
            }
            match finish_trim(t, limit)? {
                Some(trim) => Ok(XCmd::Trim { key: k, trim }),
                None => Err(syntax()),
            }
        }
        "XGROUP" => parse_xgroup(args),
        "XPENDING" => parse_xpending(args),
        "XCLAIM" => parse_xclaim(args),
        "XAUTOCLAIM" => {
            let (k, group, consumer) = (key(&args[1])?, label(&args[2])?, label(&args[3])?);
            let min_idle =
                int(&args[4]).map_err(|_| Reply::err("Invalid min-idle-time argument for XAUTOCLAIM"))?.max(0);
            let start = bound(&args[5], 0, true)?;
            let (mut count, mut justid) = (100, false);
            let mut j = 6;
            while j < argc {
                match upper(&args[j]).as_str() {
                    "COUNT" if j + 1 < argc => {
                        let c = int(&args[j + 1]).unwrap_or(-1);
                        if !(1..=i64::MAX / 10).contains(&c) {
                            return Err(Reply::err("COUNT must be > 0"));
                        }
                        count = c;
                        j += 2;
                    }
                    "JUSTID" => {
                        justid = true;
                        j += 1;
                    }
                    _ => return Err(syntax()),
                }
            }
            Ok(XCmd::AutoClaim { key: k, group, consumer, min_idle, start, count, justid })
        }
        "XINFO" => {
            let sub = upper(&args[1]);
            match sub.as_str() {
                "STREAM" if argc == 3 => Ok(XCmd::InfoStream { key: key(&args[2])?, full: None }),
                "STREAM" if argc >= 4 => {
                    if upper(&args[3]) != "FULL" {
                        return Err(subcommand_syntax(&args[1], "XINFO"));
                    }
                    let mut count = 10;
                    if argc == 6 && upper(&args[4]) == "COUNT" {
                        count = int(&args[5])?.max(0);
                    } else if argc != 4 {
                        return Err(subcommand_syntax(&args[1], "XINFO"));
                    }
                    Ok(XCmd::InfoStream { key: key(&args[2])?, full: Some(count) })
                }
                "GROUPS" if argc == 3 => Ok(XCmd::InfoGroups(key(&args[2])?)),
                "CONSUMERS" if argc == 4 => Ok(XCmd::InfoConsumers { key: key(&args[2])?, group: label(&args[3])? }),
                "STREAM" | "GROUPS" | "CONSUMERS" => Err(arity(&format!("xinfo|{}", sub.to_lowercase()))),
                _ => {
                    Err(Reply::err(format!("unknown subcommand '{}'. Try XINFO HELP.", crate::words::shown(&args[1]))))
                }
            }
        }
        _ => Err(Reply::err(format!("unknown command '{}'", crate::words::shown(cmd.as_bytes())))),
    }
}

fn parse_xadd(args: &[Vec<u8>]) -> Result<XCmd, Reply> {
    let argc = args.len();
    let k = key(&args[1])?;
    let (mut t, mut limit, mut nomkstream) = (None, None, false);
    let mut id = None;
    let mut i = 2;
    while i < argc {
        if args[i] == b"*" {
            id = Some(AddId::Auto);
            break;
        }
        if trim_option(args, &mut i, &mut t, &mut limit)? {
            i += 1;
            continue;
        }
        if upper(&args[i]) == "NOMKSTREAM" {
            nomkstream = true;
            i += 1;
            continue;
        }
        let s = &args[i];
        id = Some(if s.len() > 2 && s.ends_with(b"-*") {
            let ms = parse_id(&s[..s.len() - 2], 0, true, false)?;
            if ms.seq != 0 || s[..s.len() - 2].contains(&b'-') {
                return Err(invalid_id());
            }
            AddId::AtMs(ms.ms)
        } else {
            AddId::Exact(parse_id(s, 0, true, false)?)
        });
        break;
    }
    let fields_at = i + 1;
    if fields_at > argc || argc - fields_at < 2 || !(argc - fields_at).is_multiple_of(2) {
        return Err(arity("XADD"));
    }
    let trim = finish_trim(t, limit)?;
    let id = id.ok_or_else(|| arity("XADD"))?;
    if id == AddId::Exact(Sid::ZERO) {
        return Err(Reply::err("The ID specified in XADD must be greater than 0-0"));
    }
    Ok(XCmd::Add { key: k, nomkstream, trim, id, fields: args[fields_at..].to_vec() })
}

fn parse_read(cmd: &str, args: &[Vec<u8>]) -> Result<XCmd, Reply> {
    let argc = args.len();
    let group_read = cmd == "XREADGROUP";
    let (mut count, mut block, mut noack, mut group) = (None, None, false, None);
    let mut streams_at = 0;
    let mut i = 1;
    while i < argc {
        let more = argc - i - 1;
        match upper(&args[i]).as_str() {
            "BLOCK" if more >= 1 => {
                block = Some(block_arg(&args[i + 1])?);
                i += 2;
            }
            "COUNT" if more >= 1 => {
                let c = count_arg(&args[i + 1])?;
                count = (c > 0).then_some(c);
                i += 2;
            }
            "STREAMS" if more >= 1 => {
                streams_at = i + 1;
                let n = argc - streams_at;
                if !n.is_multiple_of(2) {
                    return Err(Reply::err(format!(
                        "Unbalanced {cmd} list of streams: for each stream key an ID or '$' must be specified."
                    )));
                }
                break;
            }
            "GROUP" if group_read && more >= 2 => {
                group = Some((label(&args[i + 1])?, label(&args[i + 2])?));
                i += 3;
            }
            "NOACK" if group_read => {
                noack = true;
                i += 1;
            }
            _ => return Err(syntax()),
        }
    }
    if streams_at == 0 {
        return Err(syntax());
    }
    if group_read && group.is_none() {
        return Err(Reply::err("Missing GROUP option for XREADGROUP"));
    }
    let n = (argc - streams_at) / 2;
    let keys = &args[streams_at..streams_at + n];
    let ids = &args[streams_at + n..];
    // (A wrong id is refused where Redis refuses it: after the stream's
    // type and group were checked, so it travels to the database.)
    let mut bad = Vec::with_capacity(n);
    if let Some((group, consumer)) = group {
        let mut streams = Vec::with_capacity(n);
        for (k, id) in keys.iter().zip(ids) {
            let from = if id.as_slice() == b">" {
                Ok(GroupRead::New)
            } else if id.as_slice() == b"$" {
                Err(Reply::err(
                    "The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just return an empty result set.",
                ))
            } else {
                parse_id(id, 0, true, true).map(GroupRead::History)
            };
            bad.push(from.as_ref().err().map(error_text));
            streams.push((key(k)?, from.unwrap_or(GroupRead::New)));
        }
        return Ok(XCmd::ReadGroup { group, consumer, count, block, noack, streams, bad });
    }
    let mut streams = Vec::with_capacity(n);
    for (k, id) in keys.iter().zip(ids) {
        let from = match id.as_slice() {
            b"$" => Ok(ReadFrom::Last),
            b">" => Err(Reply::err(
                "The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option.",
            )),
            _ => parse_id(id, 0, true, true).map(ReadFrom::After),
        };
        bad.push(from.as_ref().err().map(error_text));
        streams.push((key(k)?, from.unwrap_or(ReadFrom::Last)));
    }
    Ok(XCmd::Read { count, block, streams, bad })
}

/// An error reply's text.
fn error_text(r: &Reply) -> String {
    match r {
        Reply::Error(s) => s.clone(),
        other => format!("ERR {other:?}"),
    }
}

fn group_start(b: &[u8]) -> Result<GroupStart, Reply> {
    if b == b"$" {
        Ok(GroupStart::Last)
    } else {
        // (Refused after the stream was looked up, as Redis does.)
        Ok(entry_id(b).map(GroupStart::At).unwrap_or_else(|e| GroupStart::Bad(error_text(&e))))
    }
}

fn entries_read(b: &[u8]) -> Result<i64, Reply> {
    let n = int(b)?;
    if n < 0 && n != -1 {
        return Err(Reply::err("value for ENTRIESREAD must be positive or -1"));
    }
    Ok(n)
}

fn parse_xgroup(args: &[Vec<u8>]) -> Result<XCmd, Reply> {
    let argc = args.len();
    let sub = upper(&args[1]);
    let wrong = || arity(&format!("xgroup|{}", sub.to_lowercase()));
    match sub.as_str() {
        "CREATE" => {
            if !(5..=8).contains(&argc) {
                return Err(wrong());
            }
            let (mut mkstream, mut er) = (false, None);
            let mut i = 5;
            while i < argc {
                match upper(&args[i]).as_str() {
                    "MKSTREAM" => {
                        mkstream = true;
                        i += 1;
                    }
                    "ENTRIESREAD" if i + 1 < argc => {
                        er = Some(entries_read(&args[i + 1])?);
                        i += 2;
                    }
                    _ => return Err(subcommand_syntax(&args[1], "XGROUP")),
                }
            }
            Ok(XCmd::GroupCreate {
                key: key(&args[2])?,
                group: label(&args[3])?,
                start: group_start(&args[4])?,
                mkstream,
                entries_read: er,
            })
        }
        "SETID" => {
            if argc != 5 && argc != 7 {
                return Err(wrong());
            }
            let er = if argc == 7 {
                if upper(&args[5]) != "ENTRIESREAD" {
                    return Err(syntax());
                }
                Some(entries_read(&args[6])?)
            } else {
                None
            };
            Ok(XCmd::GroupSetId {
                key: key(&args[2])?,
                group: label(&args[3])?,
                start: group_start(&args[4])?,
                entries_read: er,
            })
        }
        "DESTROY" if argc == 4 => Ok(XCmd::GroupDestroy { key: key(&args[2])?, group: label(&args[3])? }),
        // mwmq's extension: XGROUP DEADLETTER key group maxdeliveries target | XGROUP DEADLETTER key group 0
        "DEADLETTER" if argc == 5 || argc == 6 => {
            let (k, group) = (key(&args[2])?, label(&args[3])?);
            let max = int(&args[4])?;
            if !(0..=1_000_000).contains(&max) {
                return Err(Reply::err("the number of deliveries must be 0 (no dead letters) to 1000000"));
            }
            let target = match (max, args.get(5)) {
                (0, None) => None,
                (0, Some(_)) => {
                    return Err(Reply::err("XGROUP DEADLETTER key group 0 turns dead letters off: no target"))
                }
                (_, None) => return Err(Reply::err("XGROUP DEADLETTER key group maxdeliveries needs a target stream")),
                (_, Some(t)) => Some(key(t)?),
            };
            if target.as_deref() == Some(k.as_str()) {
                return Err(Reply::err("a stream cannot be its own dead-letter stream"));
            }
            Ok(XCmd::GroupDeadLetter { key: k, group, max: (max > 0).then_some(max), target })
        }
        "CREATECONSUMER" if argc == 5 => {
            Ok(XCmd::CreateConsumer { key: key(&args[2])?, group: label(&args[3])?, consumer: label(&args[4])? })
        }
        "DELCONSUMER" if argc == 5 => {
            Ok(XCmd::DelConsumer { key: key(&args[2])?, group: label(&args[3])?, consumer: label(&args[4])? })
        }
        "DESTROY" | "CREATECONSUMER" | "DELCONSUMER" | "DEADLETTER" => Err(wrong()),
        _ => Err(Reply::err(format!("unknown subcommand '{}'. Try XGROUP HELP.", crate::words::shown(&args[1])))),
    }
}

fn parse_xpending(args: &[Vec<u8>]) -> Result<XCmd, Reply> {
    let argc = args.len();
    let (k, group) = (key(&args[1])?, label(&args[2])?);
    if argc == 3 {
        return Ok(XCmd::Pending { key: k, group, range: None });
    }
    if !(6..=9).contains(&argc) {
        return Err(syntax());
    }
    let mut i = 3;
    let mut idle = None;
    if upper(&args[3]) == "IDLE" {
        idle = Some(int(&args[4])?.max(0));
        i = 5;
        if argc < 8 {
            return Err(syntax());
        }
    }
    let start = bound(&args[i], 0, true)?;
    let end = bound(&args[i + 1], i64::MAX, false)?;
    let count = int(&args[i + 2])?.max(0);
    let consumer = match argc - (i + 3) {
        0 => None,
        1 => Some(label(&args[i + 3])?),
        _ => return Err(syntax()),
    };
    Ok(XCmd::Pending { key: k, group, range: Some(PendingRange { idle, start, end, count, consumer }) })
}

fn parse_xclaim(args: &[Vec<u8>]) -> Result<XCmd, Reply> {
    let argc = args.len();
    let (k, group, consumer) = (key(&args[1])?, label(&args[2])?, label(&args[3])?);
    // (Redis looks the group up before it reads min-idle-time: the refusal travels.)
    let min_idle = int(&args[4]).map_err(|_| Reply::err("Invalid min-idle-time argument for XCLAIM"));
    let mut ids = Vec::new();
    let mut j = 5;
    while j < argc {
        match entry_id(&args[j]) {
            Ok(id) => ids.push(id),
            Err(_) => break,
        }
        j += 1;
    }
    let mut c = Claim {
        key: k,
        group,
        consumer,
        min_idle: *min_idle.as_ref().unwrap_or(&0).max(&0),
        ids,
        idle: None,
        time: None,
        retry: None,
        force: false,
        justid: false,
        lastid: None,
        bad: min_idle.err().map(|e| error_text(&e)),
    };
    let options = claim_options(args, j, &mut c);
    if let (None, Err(e)) = (&c.bad, options) {
        c.bad = Some(error_text(&e));
    }
    if c.ids.is_empty() && c.bad.is_none() {
        c.bad = Some(error_text(&invalid_id()));
    }
    Ok(XCmd::Claim(Box::new(c)))
}

/// XCLAIM's options from `args[j]` on.
fn claim_options(args: &[Vec<u8>], mut j: usize, c: &mut Claim) -> Result<(), Reply> {
    let argc = args.len();
    while j < argc {
        let more = argc - j - 1;
        match upper(&args[j]).as_str() {
            "FORCE" => c.force = true,
            "JUSTID" => c.justid = true,
            "IDLE" if more >= 1 => {
                j += 1;
                c.idle = Some(int(&args[j]).map_err(|_| Reply::err("Invalid IDLE option argument for XCLAIM"))?);
            }
            "TIME" if more >= 1 => {
                j += 1;
                c.time = Some(int(&args[j]).map_err(|_| Reply::err("Invalid TIME option argument for XCLAIM"))?);
            }
            "RETRYCOUNT" if more >= 1 => {
                j += 1;
                c.retry = Some(int(&args[j]).map_err(|_| Reply::err("Invalid RETRYCOUNT option argument for XCLAIM"))?);
            }
            "LASTID" if more >= 1 => {
                j += 1;
                c.lastid = Some(entry_id(&args[j])?);
            }
            _ => return Err(Reply::err(format!("Unrecognized XCLAIM option '{}'", crate::words::shown(&args[j])))),
        }
        j += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<XCmd, Reply> {
        let args: Vec<Vec<u8>> = s.split(' ').map(|a| a.as_bytes().to_vec()).collect();
        parse(&upper(&args[0]), &args)
    }

    fn err(s: &str) -> String {
        match p(s) {
            Err(Reply::Error(e)) => e,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn xadd_ids_and_errors_as_redis() {
        assert!(matches!(p("XADD s * a 1"), Ok(XCmd::Add { id: AddId::Auto, .. })));
        assert!(matches!(p("XADD s 5-* a 1"), Ok(XCmd::Add { id: AddId::AtMs(5), .. })));
        assert!(matches!(p("XADD s 5 a 1"), Ok(XCmd::Add { id: AddId::Exact(Sid { ms: 5, seq: 0 }), .. })));
        assert_eq!(err("XADD s 0-0 a 1"), "ERR The ID specified in XADD must be greater than 0-0");
        assert_eq!(err("XADD s abc a 1"), "ERR Invalid stream ID specified as stream command argument");
        assert_eq!(err("XADD s * a"), "ERR wrong number of arguments for 'xadd' command");
        assert_eq!(
            err("XADD s MAXLEN 1 LIMIT 5 * a 1"),
            "ERR syntax error, LIMIT cannot be used without the special ~ option"
        );
        assert_eq!(err("XADD s MAXLEN -1 * a 1"), "ERR The MAXLEN argument must be >= 0.");
        assert_eq!(err("XADD s MINID -5 * a 1"), "ERR Invalid stream ID specified as stream command argument");
    }

    #[test]
    fn ranges_and_reads() {
        assert!(matches!(
            p("XRANGE s (5 +"),
            Ok(XCmd::Range { start: Sid { ms: 5, seq: 1 }, end: Sid::MAX, count: None, rev: false, .. })
        ));
        assert!(matches!(p("XREVRANGE s 7 (3-0"), Ok(XCmd::Range { start: Sid { ms: 3, seq: 1 }, .. })));
        assert_eq!(err("XRANGE s (- +"), "ERR Invalid stream ID specified as stream command argument");
    }

    #[test]
    fn xread_forms() {
        assert!(err("XREAD STREAMS s 0 0").starts_with("ERR Unbalanced XREAD list of streams"));
        let bad = |s: &str| match p(s) {
            Ok(XCmd::Read { bad, .. } | XCmd::ReadGroup { bad, .. }) => bad[0].clone().unwrap_or_default(),
            other => panic!("{other:?}"),
        };
        assert!(bad("XREAD STREAMS s >").starts_with("ERR The > ID can be specified only"));
        assert!(bad("XREADGROUP GROUP g c STREAMS s $").starts_with("ERR The $ ID is meaningless"));
        let c = p("XREADGROUP GROUP g c COUNT 2 BLOCK 0 NOACK STREAMS a b > 0").unwrap();
        assert_eq!(c.keys(), vec!["a", "b"]);
        assert_eq!(c.block_ms(), None, "a history read never blocks");
    }
}
