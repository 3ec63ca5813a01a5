//! memcached's binary protocol, as a proxy speaks it to its clients.
//!
//! A binary request is turned into the request the text and meta parsers
//! produce ([`parse_binary`]): gets, touches and stores become meta commands
//! (`mg`, `ms`, `md`, `ma`), which carry what the binary protocol carries and
//! the text commands do not — the cas unique of every stored item, flags and
//! cas in one reply, an increment that creates its item. `flush`, `version`
//! and `stat` become their text commands. The request's [`Ctx`] (opcode,
//! opaque, key, quiet) travels with it, and [`reply`] turns the text or meta
//! reply the proxy built back into the binary response memcached would send:
//! its status code and message, extras, cas, key and value; nothing at all for
//! a quiet command that succeeded or a quiet get that missed.
//!
//! The rules for refusing input are memcached 1.6's (`proto_bin.c`): a request
//! whose magic byte is not 0x80 closes the connection silently; a key or
//! extras longer than the body, an unauthenticated command (with SASL), a key
//! over 250 bytes, or a body of the wrong shape for its opcode are answered
//! and the connection closed; an unknown opcode is answered and its body
//! skipped; a value over the limit gets "Too large." and its body is skipped.
//! Beyond memcached, before login a frame is judged by its header alone: an
//! opcode other than SASL's and `version`, or a key or body larger than a
//! SASL exchange needs ([`MAX_UNAUTHENTICATED_BODY`]), closes the connection
//! before any of its body is buffered.

use base64::Engine as _;

use crate::number::{push_i64, push_u64};
use crate::parse::Limits;
use crate::request::{MetaKind, Request};
use crate::response::{parse_response, Response};

/// The first byte of every request.
pub const REQUEST_MAGIC: u8 = 0x80;
/// The first byte of every response.
pub const RESPONSE_MAGIC: u8 = 0x81;
/// Length of a request or response header.
pub const HEADER_LEN: usize = 24;
/// The longest SASL mechanism name memcached accepts.
const MAX_MECH_LEN: usize = 32;
/// The largest SASL authentication data accepted (a PLAIN login).
pub const MAX_SASL_DATA: usize = 1024;
/// The largest body a request may declare before its connection has logged
/// in (a SASL mechanism and its data): a frame declaring more closes the
/// connection at its header, before any of its body is buffered — as the
/// text protocol closes an over-long line before login.
pub const MAX_UNAUTHENTICATED_BODY: usize = MAX_MECH_LEN + MAX_SASL_DATA;

/// Opcodes (memcached's `protocol_binary.h`).
pub mod op {
    #![allow(missing_docs)]
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// Response status codes.
pub mod status {
    #![allow(missing_docs)]
    pub const SUCCESS: u16 = 0x00;
    pub const KEY_ENOENT: u16 = 0x01;
    pub const KEY_EEXISTS: u16 = 0x02;
    pub const E2BIG: u16 = 0x03;
    pub const EINVAL: u16 = 0x04;
    pub const NOT_STORED: u16 = 0x05;
    pub const DELTA_BADVAL: u16 = 0x06;
    pub const AUTH_ERROR: u16 = 0x20;
    pub const AUTH_CONTINUE: u16 = 0x21;
    pub const UNKNOWN_COMMAND: u16 = 0x81;
    pub const ENOMEM: u16 = 0x82;
    pub const NOT_SUPPORTED: u16 = 0x83;
    pub const EINTERNAL: u16 = 0x84;
    pub const EBUSY: u16 = 0x85;
    pub const ETMPFAIL: u16 = 0x86;
}

/// memcached's message for an error status (its `write_bin_error`).
pub fn message(status: u16) -> &'static [u8] {
    match status {
        status::ENOMEM => b"Out of memory",
        status::UNKNOWN_COMMAND => b"Unknown command",
        status::KEY_ENOENT => b"Not found",
        status::EINVAL => b"Invalid arguments",
        status::KEY_EEXISTS => b"Data exists for key.",
        status::E2BIG => b"Too large.",
        status::DELTA_BADVAL => b"Non-numeric server-side value for incr or decr",
        status::NOT_STORED => b"Not stored.",
        status::AUTH_ERROR => b"Auth failure.",
        _ => b"",
    }
}

/// A request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The magic byte (0x80 for a request).
    pub magic: u8,
    /// The command.
    pub opcode: u8,
    /// Length of the key.
    pub keylen: u16,
    /// Length of the extras.
    pub extlen: u8,
    /// Length of extras, key and value together.
    pub bodylen: u32,
    /// Echoed in the response.
    pub opaque: u32,
    /// The cas unique to compare against (0: none).
    pub cas: u64,
}

impl Header {
    /// Reads a header from the first [`HEADER_LEN`] bytes of `buf`.
    pub fn read(buf: &[u8]) -> Option<Header> {
        let h = buf.get(..HEADER_LEN)?;
        Some(Header {
            magic: h[0],
            opcode: h[1],
            keylen: u16::from_be_bytes([h[2], h[3]]),
            extlen: h[4],
            bodylen: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
            opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
            cas: u64::from_be_bytes(h[16..24].try_into().expect("8 bytes")),
        })
    }

    /// Appends the header in wire form (a request: the load generator and tests send them).
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(self.magic);
        out.push(self.opcode);
        out.extend_from_slice(&self.keylen.to_be_bytes());
        out.push(self.extlen);
        out.push(0);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.bodylen.to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
    }
}

/// Appends a whole request (for clients and tests).
pub fn encode_request(out: &mut Vec<u8>, opcode: u8, opaque: u32, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
    let h = Header {
        magic: REQUEST_MAGIC,
        opcode,
        keylen: key.len() as u16,
        extlen: extras.len() as u8,
        bodylen: (extras.len() + key.len() + value.len()) as u32,
        opaque,
        cas,
    };
    h.write(out);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// One response frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The request's opcode.
    pub opcode: u8,
    /// The status code.
    pub status: u16,
    /// The request's opaque.
    pub opaque: u32,
    /// The item's cas unique (0 when none).
    pub cas: u64,
    /// Extras (the flags of a value).
    pub extras: &'a [u8],
    /// The key (for getk and stats).
    pub key: &'a [u8],
    /// The value or the error message.
    pub value: &'a [u8],
}

impl Frame<'_> {
    /// Appends the response in wire form.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(RESPONSE_MAGIC);
        out.push(self.opcode);
        out.extend_from_slice(&(self.key.len() as u16).to_be_bytes());
        out.push(self.extras.len() as u8);
        out.push(0);
        out.extend_from_slice(&self.status.to_be_bytes());
        let body = self.extras.len() + self.key.len() + self.value.len();
        out.extend_from_slice(&(body as u32).to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
        out.extend_from_slice(self.extras);
        out.extend_from_slice(self.key);
        out.extend_from_slice(self.value);
    }

    /// Reads the response at the front of `buf`: the frame and its length,
    /// `None` while incomplete. (Clients and tests read responses with it.)
    pub fn read(buf: &[u8]) -> Option<(Frame<'_>, usize)> {
        let h = buf.get(..HEADER_LEN)?;
        let keylen = usize::from(u16::from_be_bytes([h[2], h[3]]));
        let extlen = usize::from(h[4]);
        let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let total = HEADER_LEN.checked_add(body)?;
        let b = buf.get(HEADER_LEN..total)?;
        let frame = Frame {
            opcode: h[1],
            status: u16::from_be_bytes([h[6], h[7]]),
            opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
            cas: u64::from_be_bytes(h[16..24].try_into().expect("8 bytes")),
            extras: b.get(..extlen)?,
            key: b.get(extlen..extlen + keylen)?,
            value: b.get(extlen + keylen..)?,
        };
        Some((frame, total))
    }
}

/// An error response with memcached's message for `status`.
pub fn error(opcode: u8, opaque: u32, status: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 48);
    Frame { opcode, status, opaque, cas: 0, extras: &[], key: &[], value: message(status) }.write(&mut out);
    out
}

/// An error response with a message of its own (a throttled login's "retry in 3 s").
pub fn error_with(opcode: u8, opaque: u32, status: u16, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + message.len());
    Frame { opcode, status, opaque, cas: 0, extras: &[], key: &[], value: message }.write(&mut out);
    out
}

/// A success response without a body (noop, quit).
pub fn success(opcode: u8, opaque: u32) -> Vec<u8> {
    success_with(opcode, opaque, &[])
}

/// A success response carrying `value` (SASL's mechanisms, "Authenticated").
pub fn success_with(opcode: u8, opaque: u32, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + value.len());
    Frame { opcode, status: status::SUCCESS, opaque, cas: 0, extras: &[], key: &[], value }.write(&mut out);
    out
}

/// What a request is, for answering it: the opcode as sent, its opaque, and
/// the key when the reply carries it (getk, gatk).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ctx {
    /// The opcode as the client sent it (quiet or not).
    pub opcode: u8,
    /// Echoed in every response.
    pub opaque: u32,
    /// The key, for the opcodes whose reply carries it; empty otherwise.
    pub key: Vec<u8>,
}

impl Ctx {
    /// Whether success (and a get's miss) goes unanswered: a quiet variant.
    pub fn quiet(&self) -> bool {
        base(self.opcode) != self.opcode
    }

    /// The opcode without its quiet variant.
    pub fn base(&self) -> u8 {
        base(self.opcode)
    }

    fn error(&self, status: u16) -> Vec<u8> {
        error(self.opcode, self.opaque, status)
    }

    fn frame(&self, status: u16, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + extras.len() + key.len() + value.len());
        Frame { opcode: self.opcode, status, opaque: self.opaque, cas, extras, key, value }.write(&mut out);
        out
    }
}

/// An opcode without its quiet variant (GETQ -> GET, ...); others unchanged.
pub fn base(opcode: u8) -> u8 {
    match opcode {
        op::GETQ => op::GET,
        op::GETKQ => op::GETK,
        op::GATQ => op::GAT,
        op::GATKQ => op::GATK,
        op::SETQ => op::SET,
        op::ADDQ => op::ADD,
        op::REPLACEQ => op::REPLACE,
        op::DELETEQ => op::DELETE,
        op::INCREMENTQ => op::INCREMENT,
        op::DECREMENTQ => op::DECREMENT,
        op::QUITQ => op::QUIT,
        op::FLUSHQ => op::FLUSH,
        op::APPENDQ => op::APPEND,
        op::PREPENDQ => op::PREPEND,
        o => o,
    }
}

/// The outcome of looking at the front of a binary connection's buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Binary {
    /// More bytes are needed; nothing was consumed.
    Incomplete,
    /// A request for the proxy to carry out, and how to answer it.
    Request {
        /// What the text and meta parsers would have produced.
        request: Request,
        /// How to turn its reply into a binary response.
        ctx: Ctx,
        /// Bytes used.
        consumed: usize,
    },
    /// `noop`: answered at once, after every earlier reply.
    Noop {
        /// Its response.
        reply: Vec<u8>,
        /// Bytes used.
        consumed: usize,
    },
    /// `quit` or `quitq`: answered (or not) and the connection closed.
    Quit {
        /// Its response (empty for quitq).
        reply: Vec<u8>,
    },
    /// A SASL command, for the proxy's logins.
    Sasl {
        /// `SASL_LIST_MECHS`, `SASL_AUTH` or `SASL_STEP`.
        opcode: u8,
        /// Echoed in the response.
        opaque: u32,
        /// The mechanism named (auth and step).
        mechanism: Vec<u8>,
        /// The authentication data.
        data: Vec<u8>,
        /// Bytes used.
        consumed: usize,
    },
    /// Input memcached refuses: an answer, then skip bytes or close.
    Refuse {
        /// The response; empty when the connection closes silently.
        reply: Vec<u8>,
        /// Bytes to drop now.
        consumed: usize,
        /// Further bytes to drop as they arrive.
        swallow: usize,
        /// Close the connection after the reply.
        close: bool,
        /// A `set` whose value was too large: the key's old value must go
        /// too, as with the text protocol.
        stale_key: Option<Vec<u8>>,
    },
}

impl Binary {
    fn refuse(h: &Header, status: u16, consumed: usize, swallow: usize, close: bool) -> Binary {
        Binary::Refuse { reply: error(h.opcode, h.opaque, status), consumed, swallow, close, stale_key: None }
    }
}

/// Parses the binary request at the front of `buf`. `authenticated` is false
/// while a login is required: then only the SASL commands and `version` are
/// served, as memcached with `-S` does. `sasl` says whether logins exist at
/// all (without them the SASL commands are unknown, as in memcached built
/// without SASL).
pub fn parse_binary(buf: &[u8], limits: &Limits, sasl: bool, authenticated: bool) -> Binary {
    let Some(h) = Header::read(buf) else {
        return Binary::Incomplete;
    };
    if h.magic != REQUEST_MAGIC {
        return Binary::Refuse { reply: Vec::new(), consumed: 0, swallow: 0, close: true, stale_key: None };
    }
    let (extlen, keylen, bodylen) = (usize::from(h.extlen), usize::from(h.keylen), h.bodylen as usize);
    // Before login, judged by the header alone: nothing of a refused frame is buffered.
    let public = matches!(h.opcode, op::SASL_LIST_MECHS | op::SASL_AUTH | op::SASL_STEP | op::VERSION);
    if sasl && !authenticated && !public {
        return Binary::refuse(&h, status::AUTH_ERROR, 0, 0, true);
    }
    if sasl && !authenticated && (keylen > MAX_MECH_LEN || bodylen > MAX_UNAUTHENTICATED_BODY) {
        return Binary::refuse(&h, status::EINVAL, 0, 0, true);
    }
    if buf.len() < HEADER_LEN + extlen + keylen {
        return Binary::Incomplete;
    }
    if keylen > bodylen || keylen + extlen > bodylen {
        return Binary::refuse(&h, status::UNKNOWN_COMMAND, 0, 0, true);
    }
    if keylen > limits.max_key_len.min(crate::parse::MAX_KEY_LEN) {
        return Binary::refuse(&h, status::EINVAL, 0, 0, true);
    }
    let ctx = |key: &[u8]| Ctx { opcode: h.opcode, opaque: h.opaque, key: key.to_vec() };
    let extras = &buf[HEADER_LEN..HEADER_LEN + extlen];
    let key = &buf[HEADER_LEN + extlen..HEADER_LEN + extlen + keylen];
    let head = HEADER_LEN + extlen + keylen;
    let vlen = bodylen - extlen - keylen;
    let total = HEADER_LEN + bodylen;
    let invalid = || Binary::refuse(&h, status::EINVAL, 0, 0, true);
    let shape = |ext: usize, value: bool| extlen == ext && keylen > 0 && (value || vlen == 0);
    let bare = extlen == 0 && keylen == 0 && bodylen == 0;
    let exptime = |e: &[u8]| u32::from_be_bytes(e[..4].try_into().expect("4 bytes"));
    let ask = |request: Request, key: &[u8]| Binary::Request { request, ctx: ctx(key), consumed: total };
    let base = base(h.opcode);
    match base {
        op::GET | op::GETK => {
            if !shape(0, false) {
                return invalid();
            }
            let k = if base == op::GETK { key } else { &[][..] };
            ask(meta_get(key, None, true), k)
        }
        op::GAT | op::GATK | op::TOUCH => {
            if extlen != 4 || keylen == 0 {
                return invalid();
            }
            if buf.len() < total {
                return Binary::Incomplete;
            }
            let k = if base == op::GATK { key } else { &[][..] };
            ask(meta_get(key, Some(exptime(extras)), base != op::TOUCH), k)
        }
        op::SET | op::ADD | op::REPLACE | op::APPEND | op::PREPEND => {
            let ext = if matches!(base, op::APPEND | op::PREPEND) { 0 } else { 8 };
            if !shape(ext, true) {
                return invalid();
            }
            if vlen > limits.max_value_len {
                let stale_key = (base == op::SET).then(|| key.to_vec());
                return Binary::Refuse {
                    reply: error(h.opcode, h.opaque, status::E2BIG),
                    consumed: head,
                    swallow: vlen,
                    close: false,
                    stale_key,
                };
            }
            if buf.len() < total {
                return Binary::Incomplete;
            }
            let (flags, exp) = if ext == 8 {
                (u32::from_be_bytes(extras[..4].try_into().expect("4 bytes")), Some(exptime(&extras[4..])))
            } else {
                (0, None)
            };
            let mode = match (base, h.cas) {
                (op::APPEND, _) => b'A',
                (op::PREPEND, _) => b'P',
                // memcached turns any store with a cas into a cas.
                (_, c) if c != 0 => b'S',
                (op::ADD, _) => b'E',
                (op::REPLACE, _) => b'R',
                _ => b'S',
            };
            ask(meta_set(key, &buf[head..total], flags, exp, h.cas, mode), &[])
        }
        op::DELETE => {
            if !shape(0, false) {
                return invalid();
            }
            let mut raw = meta_line(b"md", key);
            if h.cas != 0 {
                push_flag(&mut raw, b'C', h.cas);
            }
            raw.extend_from_slice(b"\r\n");
            ask(Request::Meta { kind: MetaKind::Delete, key: key.to_vec(), raw }, &[])
        }
        op::INCREMENT | op::DECREMENT => {
            if !shape(20, false) {
                return invalid();
            }
            let delta = u64::from_be_bytes(extras[..8].try_into().expect("8 bytes"));
            let initial = u64::from_be_bytes(extras[8..16].try_into().expect("8 bytes"));
            let exp = exptime(&extras[16..]);
            let mut raw = meta_line(b"ma", key);
            raw.extend_from_slice(if base == op::INCREMENT { b" MI" } else { b" MD" });
            push_flag(&mut raw, b'D', delta);
            raw.extend_from_slice(b" v c");
            if exp != u32::MAX {
                raw.extend_from_slice(b" N");
                push_exptime(&mut raw, exp);
                push_flag(&mut raw, b'J', initial);
            }
            if h.cas != 0 {
                push_flag(&mut raw, b'C', h.cas);
            }
            raw.extend_from_slice(b"\r\n");
            ask(Request::Meta { kind: MetaKind::Arith, key: key.to_vec(), raw }, &[])
        }
        op::FLUSH => {
            if !(keylen == 0 && bodylen == extlen && (extlen == 0 || extlen == 4)) {
                return invalid();
            }
            if buf.len() < total {
                return Binary::Incomplete;
            }
            let delay = (extlen == 4).then(|| exptime(extras) as i32);
            ask(Request::FlushAll { delay, noreply: false }, &[])
        }
        op::VERSION => {
            if !bare {
                return invalid();
            }
            ask(Request::Version, &[])
        }
        op::NOOP => {
            if !bare {
                return invalid();
            }
            Binary::Noop { reply: success(h.opcode, h.opaque), consumed: total }
        }
        op::QUIT => {
            if !bare {
                return invalid();
            }
            let reply = if h.opcode == op::QUITQ { Vec::new() } else { success(h.opcode, h.opaque) };
            Binary::Quit { reply }
        }
        op::STAT => {
            if extlen != 0 || vlen != 0 {
                return invalid();
            }
            let args = key.split(|&b| b == b' ').filter(|w| !w.is_empty()).map(<[u8]>::to_vec).collect();
            ask(Request::Stats { args }, key)
        }
        op::SASL_LIST_MECHS | op::SASL_AUTH | op::SASL_STEP if sasl => {
            let listing = h.opcode == op::SASL_LIST_MECHS;
            if (listing && !bare) || (!listing && (extlen != 0 || keylen == 0)) {
                return invalid();
            }
            if keylen > MAX_MECH_LEN || vlen > MAX_SASL_DATA {
                return Binary::refuse(&h, status::EINVAL, head, vlen, false);
            }
            if buf.len() < total {
                return Binary::Incomplete;
            }
            Binary::Sasl {
                opcode: h.opcode,
                opaque: h.opaque,
                mechanism: key.to_vec(),
                data: buf[head..total].to_vec(),
                consumed: total,
            }
        }
        _ => Binary::refuse(&h, status::UNKNOWN_COMMAND, HEADER_LEN, bodylen, false),
    }
}

/// The length of the request whose header is at the front of `buf` (header
/// and declared body), once the header is there: what buffering it whole
/// will cost.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    Header::read(buf).map(|h| HEADER_LEN + h.bodylen as usize)
}

/// Whether a key can be written as a token of a text command; other keys go
/// in base64 with the meta `b` flag.
pub fn key_is_text(key: &[u8]) -> bool {
    key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// Appends the command that deletes `key`: `delete <key>`, or `md <base64> b`
/// for a key no text token can carry (its reply: [`crate::delete_reply_len`]).
pub fn encode_delete(out: &mut Vec<u8>, key: &[u8]) {
    if key_is_text(key) {
        out.extend_from_slice(b"delete ");
        out.extend_from_slice(key);
    } else {
        out.extend_from_slice(&meta_line(b"md", key));
    }
    out.extend_from_slice(b"\r\n");
}

/// `<cmd> <key>` (base64 and ` b` for a key that is not a text token).
fn meta_line(cmd: &[u8], key: &[u8]) -> Vec<u8> {
    meta_line_with(cmd, key, b"")
}

/// `<cmd> <key><after>`, then ` b` when the key went in base64 (`ms` needs
/// its length right after the key, before any flag).
fn meta_line_with(cmd: &[u8], key: &[u8], after: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(cmd.len() + key.len() * 2 + after.len() + 32);
    raw.extend_from_slice(cmd);
    raw.push(b' ');
    if key_is_text(key) {
        raw.extend_from_slice(key);
        raw.extend_from_slice(after);
    } else {
        raw.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(key).as_bytes());
        raw.extend_from_slice(after);
        raw.extend_from_slice(b" b");
    }
    raw
}

/// ` <flag><n>`, a meta flag with a number.
fn push_flag(out: &mut Vec<u8>, flag: u8, n: u64) {
    out.push(b' ');
    out.push(flag);
    push_u64(out, n);
}

/// An expiry as a meta token: memcached reads it as a signed 32-bit number,
/// so a binary expiry past 2^31 - 1 (an absolute time after 2038) is kept at that.
fn push_exptime(out: &mut Vec<u8>, exptime: u32) {
    push_i64(out, i64::from(exptime.min(i32::MAX as u32)));
}

/// `mg <key> [T<exptime>] f c [v]`: flags, cas unique and (unless a touch) the value.
fn meta_get(key: &[u8], touch: Option<u32>, value: bool) -> Request {
    let mut raw = meta_line(b"mg", key);
    if let Some(exp) = touch {
        raw.extend_from_slice(b" T");
        push_exptime(&mut raw, exp);
    }
    raw.extend_from_slice(if value { b" f c v\r\n" } else { b" f c\r\n" });
    Request::Meta { kind: MetaKind::Get, key: key.to_vec(), raw }
}

/// `ms <key> <len> c M<mode> [F<flags> T<exptime>] [C<cas>]` and the data block.
fn meta_set(key: &[u8], value: &[u8], flags: u32, exptime: Option<u32>, cas: u64, mode: u8) -> Request {
    let mut len = Vec::with_capacity(12);
    len.push(b' ');
    push_u64(&mut len, value.len() as u64);
    let mut raw = meta_line_with(b"ms", key, &len);
    raw.reserve(value.len() + 48);
    raw.extend_from_slice(b" c M");
    raw.push(mode);
    if let Some(exp) = exptime {
        push_flag(&mut raw, b'F', u64::from(flags));
        raw.extend_from_slice(b" T");
        push_exptime(&mut raw, exp);
    }
    if cas != 0 {
        push_flag(&mut raw, b'C', cas);
    }
    raw.extend_from_slice(b"\r\n");
    raw.extend_from_slice(value);
    raw.extend_from_slice(b"\r\n");
    Request::Meta { kind: MetaKind::Set, key: key.to_vec(), raw }
}

/// The value of a meta return flag (`f123` -> `123`).
fn meta_flag(line: &[u8], flag: u8) -> Option<&[u8]> {
    line.split(|&b| b == b' ').skip(1).find(|t| t.first() == Some(&flag)).map(|t| &t[1..])
}

fn meta_number<T: std::str::FromStr>(line: &[u8], flag: u8) -> Option<T> {
    std::str::from_utf8(meta_flag(line, flag)?).ok()?.parse().ok()
}

/// Turns the text or meta reply the proxy built for a request into the
/// binary response memcached would send for `ctx` (empty when a quiet
/// command has nothing to say).
pub fn reply(ctx: &Ctx, text: &[u8]) -> Vec<u8> {
    let base = ctx.base();
    let parsed = match parse_response(text) {
        Ok(Some((r, _))) => r,
        _ => return ctx.frame(status::EINTERNAL, 0, &[], &[], b"malformed reply"),
    };
    if let Some(status) = failure(&parsed) {
        let msg = match (&parsed, status) {
            (Response::ServerError(m), status::ETMPFAIL | status::EINTERNAL) => *m,
            _ => message(status),
        };
        return ctx.frame(status, 0, &[], &[], msg);
    }
    let quiet = ctx.quiet();
    match base {
        op::GET | op::GETK | op::GAT | op::GATK | op::TOUCH => {
            let (line, data) = match parsed {
                Response::MetaValue { line, data } => (line, data),
                Response::Other(l) if code(&parsed) == b"HD" => (l, &[][..]),
                Response::Other(_) if code(&parsed) == b"EN" => {
                    return match (quiet, base) {
                        (true, _) => Vec::new(),
                        (false, op::GETK | op::GATK) => ctx.frame(status::KEY_ENOENT, 0, &[], &ctx.key, &[]),
                        _ => ctx.error(status::KEY_ENOENT),
                    };
                }
                _ => return ctx.error(status::EINTERNAL),
            };
            let flags: u32 = meta_number(line, b'f').unwrap_or(0);
            let cas: u64 = meta_number(line, b'c').unwrap_or(0);
            let value = if base == op::TOUCH { &[][..] } else { data };
            ctx.frame(status::SUCCESS, cas, &flags.to_be_bytes(), &ctx.key, value)
        }
        op::SET | op::ADD | op::REPLACE | op::APPEND | op::PREPEND => match parsed {
            Response::Other(l) if code(&parsed) == b"HD" => {
                if quiet {
                    return Vec::new();
                }
                ctx.frame(status::SUCCESS, meta_number(l, b'c').unwrap_or(0), &[], &[], &[])
            }
            Response::Other(_) if code(&parsed) == b"NS" => ctx.error(match base {
                op::ADD => status::KEY_EEXISTS,
                op::REPLACE => status::KEY_ENOENT,
                _ => status::NOT_STORED,
            }),
            _ => ctx.error(status::EINTERNAL),
        },
        op::DELETE => match parsed {
            Response::Other(_) if code(&parsed) == b"HD" => {
                if quiet {
                    Vec::new()
                } else {
                    ctx.frame(status::SUCCESS, 0, &[], &[], &[])
                }
            }
            _ => ctx.error(status::EINTERNAL),
        },
        op::INCREMENT | op::DECREMENT => match parsed {
            Response::MetaValue { line, data } => {
                let Some(n) = std::str::from_utf8(data).ok().and_then(|d| d.parse::<u64>().ok()) else {
                    return ctx.error(status::EINTERNAL);
                };
                if quiet {
                    return Vec::new();
                }
                ctx.frame(status::SUCCESS, meta_number(line, b'c').unwrap_or(0), &[], &[], &n.to_be_bytes())
            }
            Response::Other(_) if code(&parsed) == b"NS" => ctx.error(status::NOT_STORED),
            _ => ctx.error(status::EINTERNAL),
        },
        op::FLUSH => match (parsed, quiet) {
            (Response::Ok, true) => Vec::new(),
            (Response::Ok, false) => ctx.frame(status::SUCCESS, 0, &[], &[], &[]),
            _ => ctx.error(status::EINTERNAL),
        },
        op::VERSION => match parsed {
            Response::Version(v) => ctx.frame(status::SUCCESS, 0, &[], &[], v),
            _ => ctx.error(status::EINTERNAL),
        },
        op::STAT => {
            let mut out = Vec::new();
            if let Response::Stats(stats) = parsed {
                for (name, value) in stats {
                    Frame { opcode: ctx.opcode, status: 0, opaque: ctx.opaque, cas: 0, extras: &[], key: name, value }
                        .write(&mut out);
                }
            }
            // `stats reset`, `stats detail on`: only the end.
            out.extend_from_slice(&ctx.frame(status::SUCCESS, 0, &[], &[], &[]));
            out
        }
        _ => ctx.error(status::UNKNOWN_COMMAND),
    }
}

/// The status word of a meta reply line (`NF` of `NF c0`).
fn code<'a>(r: &Response<'a>) -> &'a [u8] {
    match r {
        Response::Other(l) => l.split(|&b| b == b' ').next().unwrap_or_default(),
        _ => &[],
    }
}

/// The status of a reply that reports a failure, `None` for the others.
fn failure(r: &Response<'_>) -> Option<u16> {
    Some(match (r, code(r)) {
        (_, b"NF") | (Response::NotFound | Response::Error, _) => status::KEY_ENOENT,
        (_, b"EX") | (Response::Exists, _) => status::KEY_EEXISTS,
        (Response::NotStored, _) => status::NOT_STORED,
        (Response::ClientError(m), _) if m.starts_with(b"cannot increment or decrement") => status::DELTA_BADVAL,
        (Response::ClientError(_), _) => status::EINVAL,
        (Response::ServerError(m), _) if m.starts_with(b"object too large") => status::E2BIG,
        (Response::ServerError(m), _) if m.starts_with(b"out of memory") || m.starts_with(b"Out of memory") => {
            status::ENOMEM
        }
        // The proxy's own failures: a server down, stalled or lost.
        (Response::ServerError(m), _) if m.starts_with(b"backend") => status::ETMPFAIL,
        (Response::ServerError(_), _) => status::EINTERNAL,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
