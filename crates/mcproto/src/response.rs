//! Responses of the memcached text protocol: parsing them from a server's bytes
//! without copying, and composing them for a client.
//!
//! A response is parsed without knowing which request it answers: a `VALUE`
//! line starts a retrieval reply that runs to `END`, a `STAT` line a statistics
//! reply that runs to `END`, digits are an incr/decr result and every other
//! line stands alone. That is enough for a proxy, which sends exactly one
//! request per expected reply, and for a load generator.

use memchr::memchr;

use crate::number::{parse_u32, parse_u64, push_u64};

/// One item of a retrieval reply, borrowed from the read buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRef<'a> {
    /// The item's key.
    pub key: &'a [u8],
    /// The item's client flags.
    pub flags: u32,
    /// The cas unique, present in replies to gets/gats.
    pub cas: Option<u64>,
    /// The value, without the trailing `\r\n`.
    pub data: &'a [u8],
}

/// A parsed response, borrowed from the read buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// Zero or more `VALUE` items followed by `END`.
    Values(Vec<ValueRef<'a>>),
    /// One or more `STAT name value` lines followed by `END`.
    Stats(Vec<(&'a [u8], &'a [u8])>),
    /// `STORED`
    Stored,
    /// `NOT_STORED`
    NotStored,
    /// `EXISTS`
    Exists,
    /// `NOT_FOUND`
    NotFound,
    /// `DELETED`
    Deleted,
    /// `TOUCHED`
    Touched,
    /// `OK`
    Ok,
    /// The new value after incr/decr.
    Number(u64),
    /// `VERSION <text>`
    Version(&'a [u8]),
    /// `ERROR`
    Error,
    /// `CLIENT_ERROR <message>`
    ClientError(&'a [u8]),
    /// `SERVER_ERROR <message>`
    ServerError(&'a [u8]),
    /// A meta `VA <datalen> <flags>*` line and its data block.
    MetaValue {
        /// The line without its `\r\n`.
        line: &'a [u8],
        /// The data.
        data: &'a [u8],
    },
    /// Any other single line (e.g. `RESET`, or a meta `HD`, `EN`, `MN`).
    Other(&'a [u8]),
}

/// Bytes that cannot be a memcached response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedResponse(pub String);

impl std::fmt::Display for MalformedResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed response: {}", self.0)
    }
}

impl std::error::Error for MalformedResponse {}

impl Response<'_> {
    /// Whether the reply reports that the command took effect (used to compare
    /// the answers of replicas).
    pub fn is_success(&self) -> bool {
        matches!(
            self,
            Response::Values(_)
                | Response::Stats(_)
                | Response::Stored
                | Response::Deleted
                | Response::Touched
                | Response::Ok
                | Response::Number(_)
                | Response::Version(_)
        )
    }

    /// Whether the reply is an error line.
    pub fn is_error(&self) -> bool {
        matches!(self, Response::Error | Response::ClientError(_) | Response::ServerError(_))
    }

    /// Appends the response in wire form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let line: &[u8] = match self {
            Response::Values(values) => {
                for v in values {
                    encode_value(out, v);
                }
                b"END"
            }
            Response::Stats(stats) => {
                for (name, value) in stats {
                    out.extend_from_slice(b"STAT ");
                    out.extend_from_slice(name);
                    out.push(b' ');
                    out.extend_from_slice(value);
                    out.extend_from_slice(b"\r\n");
                }
                b"END"
            }
            Response::Stored => b"STORED",
            Response::NotStored => b"NOT_STORED",
            Response::Exists => b"EXISTS",
            Response::NotFound => b"NOT_FOUND",
            Response::Deleted => b"DELETED",
            Response::Touched => b"TOUCHED",
            Response::Ok => b"OK",
            Response::Number(n) => {
                push_u64(out, *n);
                b""
            }
            Response::Version(v) => {
                out.extend_from_slice(b"VERSION ");
                v
            }
            Response::Error => b"ERROR",
            Response::ClientError(m) => {
                out.extend_from_slice(b"CLIENT_ERROR ");
                m
            }
            Response::ServerError(m) => {
                out.extend_from_slice(b"SERVER_ERROR ");
                m
            }
            Response::MetaValue { line, data } => {
                out.extend_from_slice(line);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(data);
                b""
            }
            Response::Other(l) => l,
        };
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends one `VALUE` item (with its cas unique when it has one).
pub fn encode_value(out: &mut Vec<u8>, v: &ValueRef<'_>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(v.key);
    out.push(b' ');
    push_u64(out, u64::from(v.flags));
    out.push(b' ');
    push_u64(out, v.data.len() as u64);
    if let Some(cas) = v.cas {
        out.push(b' ');
        push_u64(out, cas);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(v.data);
    out.extend_from_slice(b"\r\n");
}

/// Splits off one line (without its `\r\n`) starting at `at`; returns it and
/// the offset after its `\n`.
fn line_at(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let nl = memchr(b'\n', &buf[at..])? + at;
    let mut line = &buf[at..nl];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    Some((line, nl + 1))
}

fn malformed(what: &str, line: &[u8]) -> MalformedResponse {
    let shown: String = String::from_utf8_lossy(&line[..line.len().min(80)]).into_owned();
    MalformedResponse(format!("{what}: {shown:?}"))
}

/// Parses the response at the front of `buf`: `Ok(None)` when more bytes are
/// needed, otherwise the response and the number of bytes it used.
pub fn parse_response(buf: &[u8]) -> Result<Option<(Response<'_>, usize)>, MalformedResponse> {
    scan(buf, true)
}

/// The length of the whole response at the front of `buf` (`Ok(None)` while
/// incomplete), checked like [`parse_response`] but without collecting the
/// items of a retrieval or statistics reply.
pub fn response_len(buf: &[u8]) -> Result<Option<usize>, MalformedResponse> {
    Ok(scan(buf, false)?.map(|(_, n)| n))
}

/// The length of a reply to a retrieval (`get`, `gets`, `gat`, `gats`) at the
/// front of `buf` (`Ok(None)` while incomplete): values and `END`, or an error
/// line. Anything else is malformed, so a proxy notices a server that answers
/// something that cannot be the reply to what it asked.
pub fn retrieval_reply_len(buf: &[u8]) -> Result<Option<usize>, MalformedResponse> {
    expect(buf, |r| matches!(r, Response::Values(_)))
}

/// The length of a reply to a storage, `delete`, `touch`, `incr`/`decr`,
/// `flush_all` or `verbosity` command at the front of `buf` (`Ok(None)` while
/// incomplete): one status line, a number, or an error line; anything else is malformed.
pub fn status_reply_len(buf: &[u8]) -> Result<Option<usize>, MalformedResponse> {
    expect(buf, |r| {
        matches!(
            r,
            Response::Stored
                | Response::NotStored
                | Response::Exists
                | Response::NotFound
                | Response::Deleted
                | Response::Touched
                | Response::Ok
                | Response::Number(_)
        )
    })
}

/// The length of a reply to a repair at the front of `buf` (`Ok(None)` while
/// incomplete): to a `delete`, to the `md <key> b` that deletes a key no
/// text token can carry, or to a `flush_all` — `DELETED`, `NOT_FOUND`, `HD`,
/// `NF`, `OK` or an error line.
pub fn delete_reply_len(buf: &[u8]) -> Result<Option<usize>, MalformedResponse> {
    expect(buf, |r| {
        matches!(r, Response::Deleted | Response::NotFound | Response::Ok)
            || matches!(r, Response::Other(l) if l.starts_with(b"HD") || l.starts_with(b"NF"))
    })
}

/// Delimits one response and checks that it is an error line or passes `fits`.
fn expect(buf: &[u8], fits: impl Fn(&Response<'_>) -> bool) -> Result<Option<usize>, MalformedResponse> {
    match scan(buf, false)? {
        None => Ok(None),
        Some((r, n)) if r.is_error() || fits(&r) => Ok(Some(n)),
        Some((_, n)) => Err(malformed("unexpected reply", &buf[..n.min(buf.len())])),
    }
}

/// The length of the responses at the front of `buf` up to and including the
/// first `MN` (`Ok(None)` while incomplete). A proxy that sends a meta command
/// followed by `mn` reads this much: whatever the server answered (nothing in
/// quiet mode, or two replies for a refused line and its data) is what lies
/// before the `MN`.
pub fn meta_reply_len(buf: &[u8]) -> Result<Option<usize>, MalformedResponse> {
    let mut at = 0;
    loop {
        let Some((r, n)) = scan(&buf[at..], false)? else {
            return Ok(None);
        };
        at += n;
        if matches!(r, Response::Other(b"MN")) {
            return Ok(Some(at));
        }
    }
}

/// Delimits (and, with `keep`, collects) the response at the front of `buf`.
fn scan(buf: &[u8], keep: bool) -> Result<Option<(Response<'_>, usize)>, MalformedResponse> {
    let Some((line, next)) = line_at(buf, 0) else {
        return Ok(None);
    };
    if line.starts_with(b"VALUE ") || line == b"END" {
        return parse_values(buf, keep);
    }
    if line.starts_with(b"STAT ") {
        return parse_stats(buf, keep);
    }
    if let Some(rest) = line.strip_prefix(b"VA ") {
        let len =
            rest.split(|&b| b == b' ').next().and_then(parse_u64).ok_or_else(|| malformed("bad VA line", line))?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| next.checked_add(l))
            .ok_or_else(|| malformed("VA too long", line))?;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(malformed("VA data without CRLF", line));
        }
        return Ok(Some((Response::MetaValue { line, data: &buf[next..end] }, end + 2)));
    }
    let r = match line {
        b"STORED" => Response::Stored,
        b"NOT_STORED" => Response::NotStored,
        b"EXISTS" => Response::Exists,
        b"NOT_FOUND" => Response::NotFound,
        b"DELETED" => Response::Deleted,
        b"TOUCHED" => Response::Touched,
        b"OK" => Response::Ok,
        b"ERROR" => Response::Error,
        _ => {
            if let Some(m) = line.strip_prefix(b"CLIENT_ERROR ") {
                Response::ClientError(m)
            } else if let Some(m) = line.strip_prefix(b"SERVER_ERROR ") {
                Response::ServerError(m)
            } else if let Some(v) = line.strip_prefix(b"VERSION ") {
                Response::Version(v)
            } else if !line.is_empty() && line.iter().all(u8::is_ascii_digit) {
                Response::Number(parse_u64(line).ok_or_else(|| malformed("number out of range", line))?)
            } else {
                Response::Other(line)
            }
        }
    };
    Ok(Some((r, next)))
}

fn parse_values(buf: &[u8], keep: bool) -> Result<Option<(Response<'_>, usize)>, MalformedResponse> {
    let mut values = Vec::new();
    let mut at = 0;
    loop {
        let Some((line, next)) = line_at(buf, at) else {
            return Ok(None);
        };
        if line == b"END" {
            return Ok(Some((Response::Values(values), next)));
        }
        let mut parts = line.split(|&b| b == b' ');
        let (Some(b"VALUE"), Some(key), Some(flags), Some(bytes)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("expected VALUE or END", line));
        };
        let flags = parse_u32(flags).ok_or_else(|| malformed("bad flags", line))?;
        let bytes = parse_u64(bytes).ok_or_else(|| malformed("bad length", line))? as usize;
        let cas = match parts.next() {
            Some(c) => Some(parse_u64(c).ok_or_else(|| malformed("bad cas", line))?),
            None => None,
        };
        let end = next + bytes + 2;
        if buf.len() < end {
            return Ok(None);
        }
        if &buf[next + bytes..end] != b"\r\n" {
            return Err(malformed("data block not terminated", line));
        }
        if keep {
            values.push(ValueRef { key, flags, cas, data: &buf[next..next + bytes] });
        }
        at = end;
    }
}

fn parse_stats(buf: &[u8], keep: bool) -> Result<Option<(Response<'_>, usize)>, MalformedResponse> {
    let mut stats = Vec::new();
    let mut at = 0;
    loop {
        let Some((line, next)) = line_at(buf, at) else {
            return Ok(None);
        };
        if line == b"END" {
            return Ok(Some((Response::Stats(stats), next)));
        }
        let rest = line.strip_prefix(b"STAT ").ok_or_else(|| malformed("expected STAT or END", line))?;
        let split = memchr(b' ', rest).unwrap_or(rest.len());
        let value = if split < rest.len() { &rest[split + 1..] } else { &rest[rest.len()..] };
        if keep {
            stats.push((&rest[..split], value));
        }
        at = next;
    }
}

#[cfg(test)]
mod meta_tests {
    use super::*;

    #[test]
    fn meta_values_are_framed_by_their_length() {
        let buf = b"VA 4 f1 t-1\r\na\r\nb\r\nHD\r\n";
        let (r, n) = parse_response(buf).unwrap().unwrap();
        assert_eq!(r, Response::MetaValue { line: b"VA 4 f1 t-1", data: b"a\r\nb" });
        assert_eq!(n, 19);
        let mut again = Vec::new();
        r.encode(&mut again);
        assert_eq!(again, &buf[..19]);
        assert_eq!(response_len(&buf[..18]), Ok(None));
        assert!(response_len(b"VA x\r\n").is_err());
        assert!(response_len(b"VA 1\r\nab\r\n").is_err());
    }

    #[test]
    fn replies_are_checked_against_what_was_asked() {
        assert_eq!(retrieval_reply_len(b"VALUE k 0 1\r\nx\r\nEND\r\n"), Ok(Some(21)));
        assert_eq!(retrieval_reply_len(b"END\r\n"), Ok(Some(5)));
        assert_eq!(retrieval_reply_len(b"SERVER_ERROR busy\r\n"), Ok(Some(19)));
        assert_eq!(retrieval_reply_len(b"VALUE k 0 10\r\nx"), Ok(None));
        assert!(retrieval_reply_len(b"STORED\r\n").is_err());
        assert!(retrieval_reply_len(b"\x17garbage\r\n").is_err());
        assert_eq!(status_reply_len(b"STORED\r\n"), Ok(Some(8)));
        assert_eq!(status_reply_len(b"42\r\n"), Ok(Some(4)));
        assert_eq!(status_reply_len(b"CLIENT_ERROR bad\r\n"), Ok(Some(18)));
        assert!(status_reply_len(b"END\r\n").is_err());
        assert!(status_reply_len(b"garbage\r\n").is_err());
        for reply in [&b"DELETED\r\n"[..], b"NOT_FOUND\r\n", b"HD\r\n", b"NF\r\n", b"OK\r\n", b"ERROR\r\n"] {
            assert_eq!(delete_reply_len(reply), Ok(Some(reply.len())));
        }
        assert!(delete_reply_len(b"STORED\r\n").is_err());
    }

    #[test]
    fn a_meta_reply_runs_to_the_first_mn() {
        assert_eq!(meta_reply_len(b"MN\r\n"), Ok(Some(4)));
        assert_eq!(meta_reply_len(b"VA 2\r\nMN\r\nMN\r\nxx"), Ok(Some(14)), "MN inside a value is data");
        assert_eq!(meta_reply_len(b"CLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n"), Ok(Some(40)));
        assert_eq!(meta_reply_len(b"HD\r\nMN"), Ok(None));
        assert_eq!(meta_reply_len(b"EN\r\n"), Ok(None));
    }
}
