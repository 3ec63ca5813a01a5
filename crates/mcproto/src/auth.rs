//! memcached's text-protocol authentication (`memcached -Y FILE`), without I/O.
//!
//! Until a connection has authenticated, memcached reads each command line
//! as a possible login: `set <key> <flags> <exptime> <bytes>` followed by a
//! data block of `<user> <password>`. Any other line is answered
//! `CLIENT_ERROR unauthenticated` (the connection stays open); a data block
//! not ending in `\r\n` gets `CLIENT_ERROR bad command line termination`, one
//! with fewer than two words `CLIENT_ERROR bad authentication token format`;
//! right credentials get `STORED` (also with `noreply`), wrong ones
//! `CLIENT_ERROR authentication failure`. A line longer than 2048 bytes
//! without a newline closes the connection. Words are separated by spaces,
//! runs of spaces count as one, as memcached's tokenizer reads them.
//!
//! [`parse_auth`] reads one such exchange from the front of a buffer; the
//! caller checks the credentials. [`login`] is what a client (mwproxy
//! talking to such a server) sends.

use crate::number::parse_u32;

/// A login attempt's data longer than this closes the connection (memcached
/// would keep reading; a proxy keeps its memory bounded).
pub const MAX_TOKEN: usize = 1024;

/// memcached's answer to anything but a login before authenticating.
pub const UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";
/// The answer to right credentials.
pub const STORED: &[u8] = b"STORED\r\n";
/// The answer to wrong credentials.
pub const FAILURE: &[u8] = b"CLIENT_ERROR authentication failure\r\n";
const BAD_TERMINATION: &[u8] = b"CLIENT_ERROR bad command line termination\r\n";
const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad authentication token format\r\n";

/// What the front of an unauthenticated connection's input is.
#[derive(Debug, PartialEq, Eq)]
pub enum Auth<'a> {
    /// More bytes are needed.
    Incomplete,
    /// The connection must be closed (a line without end, a login too large).
    Close,
    /// Answered without looking at credentials; `consumed` bytes used.
    Refused {
        /// Bytes of input used.
        consumed: usize,
        /// The reply.
        reply: &'static [u8],
    },
    /// A login: answer [`STORED`] when the credentials are right, else [`FAILURE`].
    Credentials {
        /// Bytes of input used.
        consumed: usize,
        /// The user.
        user: &'a [u8],
        /// The password.
        password: &'a [u8],
    },
}

/// The words of a line, split on spaces (runs of spaces count as one).
fn words(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ').filter(|w| !w.is_empty())
}

/// Reads one login attempt, or what refuses it, from the front of `buf`.
pub fn parse_auth(buf: &[u8]) -> Auth<'_> {
    if buf.len() < 2 {
        return Auth::Incomplete;
    }
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > 2048 { Auth::Close } else { Auth::Incomplete };
    };
    // The `\r` stays in the last word, where the number reader ignores it.
    let tokens: Vec<&[u8]> = words(&buf[..nl]).take(6).collect();
    let line = nl + 1;
    let size = match tokens.as_slice() {
        [cmd, _, _, _, size, ..] if *cmd == b"set" => parse_u32(size),
        _ => None,
    };
    let Some(size) = size else {
        return Auth::Refused { consumed: line, reply: UNAUTHENTICATED };
    };
    let size = size as usize;
    if size > MAX_TOKEN {
        return Auth::Close;
    }
    let end = line + size + 2;
    if buf.len() < end {
        return Auth::Incomplete;
    }
    let data = &buf[line..end];
    if &data[size..] != b"\r\n" {
        return Auth::Refused { consumed: end, reply: BAD_TERMINATION };
    }
    let mut w = words(&data[..size]);
    match (w.next(), w.next()) {
        (Some(user), Some(password)) => Auth::Credentials { consumed: end, user, password },
        _ => Auth::Refused { consumed: end, reply: BAD_FORMAT },
    }
}

/// The login a client sends to a server that requires authentication.
pub fn login(user: &[u8], password: &[u8]) -> Vec<u8> {
    let mut out = format!("set auth 0 0 {}\r\n", user.len() + 1 + password.len()).into_bytes();
    out.extend_from_slice(user);
    out.push(b' ');
    out.extend_from_slice(password);
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logins_and_refusals_as_memcached_reads_them() {
        let creds = |buf: &[u8]| match parse_auth(buf) {
            Auth::Credentials { consumed, user, password } => Some((consumed, user.to_vec(), password.to_vec())),
            _ => None,
        };
        let login = b"set x 0 0 12\r\nalice secret\r\nget k\r\n";
        assert_eq!(creds(login), Some((28, b"alice".to_vec(), b"secret".to_vec())));
        assert_eq!(creds(b"set x 0 0 13\r\nalice  secret\r\n").unwrap().2, b"secret");
        assert_eq!(creds(b"set x 0 0 12 noreply\r\nalice secret\r\n").unwrap().1, b"alice");
        assert_eq!(creds(b"set x 0 0 18\r\nalice secret extra\r\n").unwrap().2, b"secret");
        let refused = |buf: &[u8]| match parse_auth(buf) {
            Auth::Refused { consumed, reply } => (consumed, reply),
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
        };
        assert_eq!(refused(b"get k\r\nget j\r\n"), (7, UNAUTHENTICATED));
        assert_eq!(refused(b"set x 0 0\r\n"), (11, UNAUTHENTICATED));
        assert_eq!(refused(b"add x 0 0 12\r\nalice secret\r\n"), (14, UNAUTHENTICATED));
        assert_eq!(refused(b"set x 0 0 -1\r\n"), (14, UNAUTHENTICATED));
        assert_eq!(refused(b"set x 0 0 5\r\nalice\r\n"), (20, BAD_FORMAT));
        assert_eq!(refused(b"set x 0 0 5\r\nalicexx").1, BAD_TERMINATION);
        assert_eq!(parse_auth(b"set x 0 0 12\r\nalice sec"), Auth::Incomplete);
        assert_eq!(parse_auth(b"get"), Auth::Incomplete);
        assert_eq!(parse_auth(&[b'a'; 3000]), Auth::Close);
        assert_eq!(parse_auth(b"set x 0 0 99999\r\n"), Auth::Close);
    }

    #[test]
    fn a_login_is_what_a_server_accepts() {
        let bytes = login(b"bob", b"pw2");
        assert_eq!(bytes, b"set auth 0 0 7\r\nbob pw2\r\n");
        assert!(matches!(parse_auth(&bytes), Auth::Credentials { consumed: 25, .. }));
    }
}
