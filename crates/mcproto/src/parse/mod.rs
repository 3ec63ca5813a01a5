//! Parsing requests from bytes, with memcached 1.6's limits and error replies.
//!
//! [`parse_request`] looks at the front of a connection's read buffer and says one
//! of three things: not enough bytes yet ([`Parsed::Incomplete`], a normal outcome),
//! a request and how many bytes it used, or a rejection carrying the exact reply
//! memcached would have sent, how many bytes to drop and what to do next
//! (swallow a data block that follows, or close the connection). The rules follow
//! memcached's text protocol handler: lines end at `\n` with an optional `\r`,
//! tokens are separated by spaces only, a line stops at its first NUL byte, the
//! number of tokens decides between `ERROR` and a command, and `noreply`, when it
//! is the last token, silences error replies too.

use memchr::memchr;

use crate::number::{parse_i32, parse_u32, parse_u64};
use crate::request::{ArithKind, GetKind, MetaKind, Request, StoreKind};

/// memcached's key length limit.
pub const MAX_KEY_LEN: usize = 250;

/// Limits applied while parsing; the defaults are memcached's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key accepted (memcached: 250 bytes).
    pub max_key_len: usize,
    /// Largest data block accepted; larger ones are swallowed and refused with
    /// `SERVER_ERROR object too large for cache`.
    pub max_value_len: usize,
    /// A line still without `\n` after this many bytes closes the connection,
    /// unless it starts with `get ` or `gets ` (memcached: 2048).
    pub max_line_len: usize,
    /// Bound for those long retrieval lines, so one client cannot grow a buffer
    /// without end (memcached has none).
    pub max_get_line_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_len: MAX_KEY_LEN,
            max_value_len: 1024 * 1024,
            max_line_len: 2048,
            max_get_line_len: 1024 * 1024,
        }
    }
}

/// The outcome of looking at the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed; nothing was consumed.
    Incomplete,
    /// A whole request that used the first `consumed` bytes.
    Request {
        /// The request.
        request: Request,
        /// Bytes used, including any data block.
        consumed: usize,
    },
    /// Input memcached would refuse; see [`Rejection`].
    Reject(Rejection),
}

/// A refused input: what to answer and how to move on.
#[derive(Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The reply line without `\r\n`, or `None` when nothing is sent (the
    /// request said `noreply`, or the connection is closed silently).
    pub reply: Option<&'static str>,
    /// Bytes to drop from the front of the buffer now (always > 0 unless `close`).
    pub consumed: usize,
    /// Further bytes to drop as they arrive (the data block of a value that is too large).
    pub swallow: usize,
    /// Close the connection after sending the reply.
    pub close: bool,
    /// A `set` whose value was too large: memcached also drops the key's old
    /// value so that a stale one is not served; a proxy should do the same.
    pub stale_key: Option<Vec<u8>>,
}

impl Rejection {
    fn reply(reply: &'static str, noreply: bool, consumed: usize) -> Parsed {
        Parsed::Reject(Rejection {
            reply: if noreply { None } else { Some(reply) },
            consumed,
            swallow: 0,
            close: false,
            stale_key: None,
        })
    }

    /// A value over the maximum: refuse it after its line, swallow its data
    /// block as it arrives, and say which key's old value to drop.
    fn too_large(noreply: bool, line_len: usize, vlen: usize, stale_key: Option<Vec<u8>>) -> Parsed {
        Parsed::Reject(Rejection {
            reply: if noreply { None } else { Some(TOO_LARGE) },
            consumed: line_len,
            swallow: vlen + 2,
            close: false,
            stale_key,
        })
    }

    fn close() -> Parsed {
        Parsed::Reject(Rejection { reply: None, consumed: 0, swallow: 0, close: true, stale_key: None })
    }
}

/// memcached's reply for a malformed command line.
pub const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
/// memcached's reply for a data block not ending in `\r\n`.
pub const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk";
/// memcached's reply for a value over the item size limit.
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
/// memcached's reply for a bad incr/decr amount.
pub const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument";
/// memcached's reply for a bad expiry time.
pub const BAD_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";
/// memcached's reply for an unknown command or a wrong number of tokens.
pub const ERROR: &str = "ERROR";
const BAD_DELETE: &str = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";

/// Parses the request at the front of `buf`.
pub fn parse_request(buf: &[u8], limits: &Limits) -> Parsed {
    let Some(nl) = memchr(b'\n', buf) else {
        return incomplete_line(buf, limits);
    };
    let consumed = nl + 1;
    let mut line = &buf[..nl];
    if line.len() > 1 && line[line.len() - 1] == b'\r' {
        line = &line[..line.len() - 1];
    }
    if let Some(nul) = memchr(0, line) {
        line = &line[..nul];
    }
    let tokens: Vec<&[u8]> = line.split(|&b| b == b' ').filter(|t| !t.is_empty()).collect();
    if tokens.is_empty() || tokens[0].len() < 2 {
        return Rejection::reply(ERROR, false, consumed);
    }
    let noreply = tokens.len() > 1 && tokens[tokens.len() - 1] == b"noreply";
    let args = &tokens[1..];
    match tokens[0] {
        b"get" | b"bget" => parse_get(GetKind::Get, args, consumed, limits),
        b"gets" => parse_get(GetKind::Gets, args, consumed, limits),
        b"gat" => parse_get(GetKind::Gat, args, consumed, limits),
        b"gats" => parse_get(GetKind::Gats, args, consumed, limits),
        b"set" => parse_store(StoreKind::Set, args, noreply, buf, consumed, limits),
        b"add" => parse_store(StoreKind::Add, args, noreply, buf, consumed, limits),
        b"replace" => parse_store(StoreKind::Replace, args, noreply, buf, consumed, limits),
        b"append" => parse_store(StoreKind::Append, args, noreply, buf, consumed, limits),
        b"prepend" => parse_store(StoreKind::Prepend, args, noreply, buf, consumed, limits),
        b"cas" => parse_store(StoreKind::Cas, args, noreply, buf, consumed, limits),
        b"incr" => parse_arith(ArithKind::Incr, args, noreply, consumed, limits),
        b"decr" => parse_arith(ArithKind::Decr, args, noreply, consumed, limits),
        b"delete" => parse_delete(args, noreply, consumed, limits),
        b"touch" => parse_touch(args, noreply, consumed, limits),
        b"flush_all" => parse_flush_all(args, noreply, consumed),
        b"verbosity" => parse_verbosity(args, noreply, consumed),
        b"cache_memlimit" => parse_memlimit(args, noreply, consumed),
        b"version" => done(Request::Version, consumed),
        b"quit" => done(Request::Quit, consumed),
        b"stats" => done(Request::Stats { args: args.iter().map(|a| a.to_vec()).collect() }, consumed),
        b"mg" => parse_meta(MetaKind::Get, &tokens, buf, consumed, limits),
        b"md" => parse_meta(MetaKind::Delete, &tokens, buf, consumed, limits),
        b"ma" => parse_meta(MetaKind::Arith, &tokens, buf, consumed, limits),
        b"me" => parse_meta(MetaKind::Debug, &tokens, buf, consumed, limits),
        b"ms" => parse_meta_set(&tokens, buf, consumed, limits),
        b"mn" => done(Request::Meta { kind: MetaKind::Noop, key: Vec::new(), raw: buf[..consumed].to_vec() }, consumed),
        _ if tokens[tokens.len() - 1].starts_with(b"HTTP/") => Rejection::close(),
        _ => Rejection::reply(ERROR, false, consumed),
    }
}

/// The length of the storage request whose command line is at the front of
/// `buf` — its line, data block and `\r\n` — once the line is there; `None`
/// for a line still coming or another command. (What buffering the request
/// whole will cost, known before its data block arrives.)
pub fn declared_len(buf: &[u8]) -> Option<usize> {
    let nl = memchr(b'\n', buf)?;
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    let tokens: Vec<&[u8]> = line.split(|&b| b == b' ').filter(|t| !t.is_empty()).take(5).collect();
    let vlen = match tokens.first().copied()? {
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => tokens.get(4)?,
        b"ms" => tokens.get(2)?,
        _ => return None,
    };
    let vlen = usize::try_from(parse_i32(vlen)?).ok()?;
    Some(nl + 1 + vlen + 2)
}

fn done(request: Request, consumed: usize) -> Parsed {
    Parsed::Request { request, consumed }
}

/// A line without `\n` yet: wait, unless it is already too long to be a command.
fn incomplete_line(buf: &[u8], limits: &Limits) -> Parsed {
    if buf.len() <= limits.max_line_len {
        return Parsed::Incomplete;
    }
    let spaces = buf.iter().take_while(|&&b| b == b' ').count();
    let rest = &buf[spaces..];
    let is_get = rest.starts_with(b"get ") || rest.starts_with(b"gets ");
    if spaces <= 100 && is_get && buf.len() <= limits.max_get_line_len {
        Parsed::Incomplete
    } else {
        Rejection::close()
    }
}

fn key_too_long(key: &[u8], limits: &Limits) -> bool {
    key.len() > limits.max_key_len
}

fn parse_get(kind: GetKind, args: &[&[u8]], consumed: usize, limits: &Limits) -> Parsed {
    if args.is_empty() {
        return Rejection::reply(ERROR, false, consumed);
    }
    let (exptime, keys) = if kind.touches() {
        match parse_i32(args[0]) {
            Some(e) => (e, &args[1..]),
            None => return Rejection::reply(BAD_EXPTIME, false, consumed),
        }
    } else {
        (0, args)
    };
    if keys.iter().any(|k| key_too_long(k, limits)) {
        return Rejection::reply(BAD_FORMAT, false, consumed);
    }
    let keys = keys.iter().map(|k| k.to_vec()).collect();
    done(Request::Get { kind, exptime, keys }, consumed)
}

fn parse_store(kind: StoreKind, args: &[&[u8]], noreply: bool, buf: &[u8], line_len: usize, limits: &Limits) -> Parsed {
    let base = if kind == StoreKind::Cas { 5 } else { 4 };
    if args.len() != base && args.len() != base + 1 {
        return Rejection::reply(ERROR, false, line_len);
    }
    let key = args[0];
    if key_too_long(key, limits) {
        return Rejection::reply(BAD_FORMAT, noreply, line_len);
    }
    let (Some(flags), Some(exptime), Some(vlen)) = (parse_u32(args[1]), parse_i32(args[2]), parse_i32(args[3])) else {
        return Rejection::reply(BAD_FORMAT, noreply, line_len);
    };
    let cas = if kind == StoreKind::Cas {
        match parse_u64(args[4]) {
            Some(c) => c,
            None => return Rejection::reply(BAD_FORMAT, noreply, line_len),
        }
    } else {
        0
    };
    if !(0..=i32::MAX - 2).contains(&vlen) {
        return Rejection::reply(BAD_FORMAT, noreply, line_len);
    }
    let vlen = vlen as usize;
    if vlen > limits.max_value_len {
        return Rejection::too_large(noreply, line_len, vlen, (kind == StoreKind::Set).then(|| key.to_vec()));
    }
    let total = line_len + vlen + 2;
    if buf.len() < total {
        return Parsed::Incomplete;
    }
    if &buf[line_len + vlen..total] != b"\r\n" {
        return Rejection::reply(BAD_CHUNK, noreply, total);
    }
    let request = Request::Store {
        kind,
        key: key.to_vec(),
        flags,
        exptime,
        cas,
        data: buf[line_len..line_len + vlen].to_vec(),
        noreply,
    };
    done(request, total)
}

/// The key a meta command is placed by: with the `b` flag the key is base64
/// and is placed by what it decodes to (as the server stores it); a key that
/// does not decode is placed as sent and the server refuses it.
fn meta_key(key: &[u8], flags: &[&[u8]]) -> Vec<u8> {
    use base64::Engine as _;
    if flags.iter().any(|f| *f == b"b") {
        if let Ok(k) = base64::engine::general_purpose::STANDARD.decode(key) {
            return k;
        }
    }
    key.to_vec()
}

/// `mg`, `md`, `ma`, `me`: the key is checked here, the flags by the server.
fn parse_meta(kind: MetaKind, tokens: &[&[u8]], buf: &[u8], consumed: usize, limits: &Limits) -> Parsed {
    if tokens.len() < 2 {
        // memcached answers a bare `me` differently from the others.
        let reply = if kind == MetaKind::Debug { BAD_FORMAT } else { ERROR };
        return Rejection::reply(reply, false, consumed);
    }
    if key_too_long(tokens[1], limits) {
        return Rejection::reply(BAD_FORMAT, false, consumed);
    }
    let key = meta_key(tokens[1], &tokens[2..]);
    done(Request::Meta { kind, key, raw: buf[..consumed].to_vec() }, consumed)
}

/// `ms <key> <datalen> <flags>*` and its data block.
fn parse_meta_set(tokens: &[&[u8]], buf: &[u8], line_len: usize, limits: &Limits) -> Parsed {
    if tokens.len() < 2 {
        return Rejection::reply(ERROR, false, line_len);
    }
    let key = tokens[1];
    if key_too_long(key, limits) || tokens.len() < 3 {
        return Rejection::reply(BAD_FORMAT, false, line_len);
    }
    let Some(vlen) = parse_i32(tokens[2]).filter(|v| (0..=i32::MAX - 2).contains(v)) else {
        return Rejection::reply(BAD_FORMAT, false, line_len);
    };
    let vlen = vlen as usize;
    let key = meta_key(key, &tokens[3..]);
    if vlen > limits.max_value_len {
        return Rejection::too_large(false, line_len, vlen, Some(key));
    }
    let total = line_len + vlen + 2;
    if buf.len() < total {
        return Parsed::Incomplete;
    }
    if &buf[line_len + vlen..total] != b"\r\n" {
        return Rejection::reply(BAD_CHUNK, false, total);
    }
    done(Request::Meta { kind: MetaKind::Set, key, raw: buf[..total].to_vec() }, total)
}

fn parse_arith(kind: ArithKind, args: &[&[u8]], noreply: bool, consumed: usize, limits: &Limits) -> Parsed {
    if args.len() != 2 && args.len() != 3 {
        return Rejection::reply(ERROR, false, consumed);
    }
    if key_too_long(args[0], limits) {
        return Rejection::reply(BAD_FORMAT, noreply, consumed);
    }
    match parse_u64(args[1]) {
        Some(delta) => done(Request::Arith { kind, key: args[0].to_vec(), delta, noreply }, consumed),
        None => Rejection::reply(BAD_DELTA, noreply, consumed),
    }
}

fn parse_delete(args: &[&[u8]], noreply: bool, consumed: usize, limits: &Limits) -> Parsed {
    if args.is_empty() || args.len() > 3 {
        return Rejection::reply(ERROR, false, consumed);
    }
    if args.len() > 1 {
        let hold_is_zero = args[1] == b"0";
        let valid = (args.len() == 2 && (hold_is_zero || noreply)) || (args.len() == 3 && hold_is_zero && noreply);
        if !valid {
            return Rejection::reply(BAD_DELETE, noreply, consumed);
        }
    }
    if key_too_long(args[0], limits) {
        return Rejection::reply(BAD_FORMAT, noreply, consumed);
    }
    done(Request::Delete { key: args[0].to_vec(), noreply }, consumed)
}

fn parse_touch(args: &[&[u8]], noreply: bool, consumed: usize, limits: &Limits) -> Parsed {
    if args.len() != 2 && args.len() != 3 {
        return Rejection::reply(ERROR, false, consumed);
    }
    if key_too_long(args[0], limits) {
        return Rejection::reply(BAD_FORMAT, noreply, consumed);
    }
    match parse_i32(args[1]) {
        Some(exptime) => done(Request::Touch { key: args[0].to_vec(), exptime, noreply }, consumed),
        None => Rejection::reply(BAD_EXPTIME, noreply, consumed),
    }
}

fn parse_flush_all(args: &[&[u8]], noreply: bool, consumed: usize) -> Parsed {
    if args.len() > 2 {
        return Rejection::reply(ERROR, false, consumed);
    }
    let delay = if args.len() != usize::from(noreply) {
        match parse_i32(args[0]) {
            Some(d) => Some(d),
            None => return Rejection::reply(BAD_EXPTIME, noreply, consumed),
        }
    } else {
        None
    };
    done(Request::FlushAll { delay, noreply }, consumed)
}

fn parse_verbosity(args: &[&[u8]], noreply: bool, consumed: usize) -> Parsed {
    if args.is_empty() || args.len() > 2 {
        return Rejection::reply(ERROR, false, consumed);
    }
    match parse_u32(args[0]) {
        Some(level) => done(Request::Verbosity { level, noreply }, consumed),
        None => Rejection::reply(BAD_FORMAT, noreply, consumed),
    }
}

/// `cache_memlimit <megabytes> [noreply]`: a number memcached cannot read is `ERROR`.
fn parse_memlimit(args: &[&[u8]], noreply: bool, consumed: usize) -> Parsed {
    if args.is_empty() || args.len() > 2 {
        return Rejection::reply(ERROR, false, consumed);
    }
    match parse_u32(args[0]) {
        Some(megabytes) => done(Request::CacheMemlimit { megabytes, noreply }, consumed),
        None => Rejection::reply(ERROR, noreply, consumed),
    }
}

#[cfg(test)]
mod tests;
