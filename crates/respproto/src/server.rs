//! RESP, the Redis serialization protocol: a sans-I/O request parser and
//! the reply encoder (RESP2, and RESP3 for clients that ask with `HELLO 3`:
//! mwmq's replies differ between the two only in nil and maps).
//!
//! Requests are arrays of bulk strings (`*2\r\n$4\r\nQLEN\r\n$1\r\nq\r\n`, what
//! every Redis client sends) or inline commands (`QLEN q\r\n`, what a person
//! types into telnet). The parser is a state machine fed whatever bytes
//! arrived: it copies argument bytes straight into the request it is
//! building, so a connection never holds more than the request in progress
//! and one read's worth of input, and it asks for a whole argument's room up
//! front ([`RequestParser::need`]) so that the caller can budget memory before
//! it is used.
//!
//! Limits, with Redis' answers where Redis has one:
//! - an argument longer than `max_arg` (`--max-body`) is read and thrown away
//!   and the request is answered with an error; the connection stays usable;
//! - an argument longer than [`HARD_MAX_ARG`] (`-ERR Protocol error: invalid
//!   bulk length`), more than [`MAX_ARGS`] arguments (`invalid multibulk
//!   length`), a missing `$` (`expected '$', got 'x'`), an inline line over
//!   [`MAX_INLINE`] (`too big inline request`) or a header that is not a
//!   number are protocol errors: answered, then the connection is closed,
//!   because nothing after them can be trusted to start a request.

/// Most arguments of one request (no command takes more than a dozen).
pub const MAX_ARGS: usize = 1024;
/// Longest argument announced before it is a protocol error (Redis' `proto-max-bulk-len`).
pub const HARD_MAX_ARG: usize = 512 * 1024 * 1024;
/// Longest inline command or header line.
pub const MAX_INLINE: usize = 64 * 1024;

/// A complete request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The arguments (command name first).
    Args(Vec<Vec<u8>>),
    /// An argument was over the limit; its bytes were discarded.
    TooLarge {
        /// The command name, when it came before the long argument.
        command: Option<Vec<u8>>,
        /// Length of the longest argument.
        len: usize,
    },
    /// An empty line or an empty array: Redis ignores them.
    Empty,
}

/// Input that cannot be a request: answered with this message, then the connection closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of a request.
    Start,
    /// Reading the `*N` line (after the `*`).
    ArrayLen,
    /// Expecting `$` of the next argument.
    BulkStart,
    /// Reading the `$N` line (after the `$`).
    BulkLen,
    /// Reading `remaining` bytes of an argument (kept or discarded).
    BulkBody { remaining: usize, keep: bool },
    /// Reading the `\r\n` after an argument (`seen` of its 2 bytes so far).
    BulkEnd { seen: u8 },
    /// Reading an inline command line.
    Inline,
}

/// Turns a byte stream into requests; one per connection.
#[derive(Debug)]
pub struct RequestParser {
    state: State,
    max_arg: usize,
    /// Digits (or inline text) of the line being read.
    line: Vec<u8>,
    args: Vec<Vec<u8>>,
    /// Arguments still expected in the array.
    expected: usize,
    /// The longest argument over the limit so far in this request.
    too_large: Option<usize>,
    /// The command name, kept when a later argument is too large.
    command: Option<Vec<u8>>,
}

fn ascii_number(digits: &[u8]) -> Option<i64> {
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let (neg, d) = match digits[0] {
        b'-' => (true, &digits[1..]),
        _ => (false, digits),
    };
    if d.is_empty() || !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = d.iter().fold(0i64, |a, b| a * 10 + i64::from(b - b'0'));
    Some(if neg { -v } else { v })
}

impl RequestParser {
    /// A parser refusing (but reading) arguments longer than `max_arg`.
    pub fn new(max_arg: usize) -> RequestParser {
        RequestParser {
            state: State::Start,
            max_arg,
            line: Vec::new(),
            args: Vec::new(),
            expected: 0,
            too_large: None,
            command: None,
        }
    }

    /// Whether a request is partly read.
    pub fn in_request(&self) -> bool {
        self.state != State::Start
    }

    /// Bytes the argument being read still needs room for, if it is kept
    /// (the caller's memory budget is asked for this before reading on).
    pub fn need(&self) -> usize {
        match self.state {
            State::BulkBody { remaining, keep: true } => remaining,
            _ => 0,
        }
    }

    /// Bytes held for the request in progress.
    pub fn held(&self) -> usize {
        self.args.iter().map(Vec::capacity).sum::<usize>() + self.line.capacity()
    }

    fn finish(&mut self) -> Request {
        self.state = State::Start;
        self.expected = 0;
        let args = std::mem::take(&mut self.args);
        match self.too_large.take() {
            Some(len) => {
                let command = self.command.take().or_else(|| args.first().cloned());
                Request::TooLarge { command, len }
            }
            None if args.is_empty() => Request::Empty,
            None => Request::Args(args),
        }
    }

    fn after_arg(&mut self) -> Option<Request> {
        self.expected -= 1;
        if self.expected == 0 {
            Some(self.finish())
        } else {
            self.state = State::BulkStart;
            None
        }
    }

    /// Consumes bytes of `input` up to the end of at most one request.
    /// Returns how many bytes were consumed and the request if one ended.
    pub fn feed(&mut self, input: &[u8]) -> (usize, Result<Option<Request>, ProtocolError>) {
        let mut i = 0;
        while i < input.len() {
            match self.state {
                State::Start => {
                    if input[i] == b'*' {
                        self.state = State::ArrayLen;
                        i += 1;
                    } else {
                        self.state = State::Inline;
                    }
                }
                State::ArrayLen | State::BulkLen | State::Inline => {
                    let rest = &input[i..];
                    let (taken, complete) = match memchr::memchr(b'\n', rest) {
                        Some(at) => (at + 1, true),
                        None => (rest.len(), false),
                    };
                    if self.line.len() + taken > MAX_INLINE {
                        let what =
                            if self.state == State::Inline { "too big inline request" } else { "too big header" };
                        return (i + taken, Err(ProtocolError(format!("Protocol error: {what}"))));
                    }
                    self.line.extend_from_slice(&rest[..taken]);
                    i += taken;
                    if !complete {
                        continue;
                    }
                    let mut line = std::mem::take(&mut self.line);
                    line.pop(); // '\n'
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    match self.state {
                        State::Inline => {
                            self.args = line
                                .split(|b| *b == b' ' || *b == b'\t')
                                .filter(|w| !w.is_empty())
                                .map(<[u8]>::to_vec)
                                .collect();
                            if self.args.len() > MAX_ARGS {
                                return (i, Err(ProtocolError("Protocol error: invalid multibulk length".into())));
                            }
                            self.line = line;
                            self.line.clear();
                            return (i, Ok(Some(self.finish())));
                        }
                        State::ArrayLen => {
                            self.line = line;
                            let n = ascii_number(&self.line);
                            self.line.clear();
                            match n {
                                Some(n) if n <= 0 => return (i, Ok(Some(self.finish()))),
                                Some(n) if n as usize <= MAX_ARGS => {
                                    self.expected = n as usize;
                                    self.args = Vec::with_capacity(n as usize);
                                    self.state = State::BulkStart;
                                }
                                _ => return (i, Err(ProtocolError("Protocol error: invalid multibulk length".into()))),
                            }
                        }
                        State::BulkLen => {
                            self.line = line;
                            let n = ascii_number(&self.line);
                            self.line.clear();
                            match n {
                                Some(n) if n >= 0 && (n as usize) <= HARD_MAX_ARG => {
                                    let n = n as usize;
                                    let keep = n <= self.max_arg && self.too_large.is_none();
                                    if !keep {
                                        self.too_large = Some(self.too_large.unwrap_or(0).max(n));
                                        if self.command.is_none() {
                                            self.command = self.args.first().cloned();
                                        }
                                        self.args.clear();
                                    } else {
                                        self.args.push(Vec::new());
                                    }
                                    self.state = State::BulkBody { remaining: n, keep };
                                    if n == 0 {
                                        self.state = State::BulkEnd { seen: 0 };
                                    }
                                }
                                _ => return (i, Err(ProtocolError("Protocol error: invalid bulk length".into()))),
                            }
                        }
                        _ => unreachable!("only line states read lines"),
                    }
                }
                State::BulkStart => {
                    if input[i] != b'$' {
                        let got = char::from(input[i]);
                        let shown =
                            if got.is_ascii_graphic() { got.to_string() } else { format!("\\x{:02x}", input[i]) };
                        return (i + 1, Err(ProtocolError(format!("Protocol error: expected '$', got '{shown}'"))));
                    }
                    self.state = State::BulkLen;
                    i += 1;
                }
                State::BulkBody { remaining, keep } => {
                    let take = remaining.min(input.len() - i);
                    if keep {
                        let arg = self.args.last_mut().expect("a kept argument has its vector");
                        if arg.capacity() == 0 {
                            arg.reserve_exact(remaining);
                        }
                        arg.extend_from_slice(&input[i..i + take]);
                    }
                    i += take;
                    let left = remaining - take;
                    self.state =
                        if left == 0 { State::BulkEnd { seen: 0 } } else { State::BulkBody { remaining: left, keep } };
                }
                State::BulkEnd { seen } => {
                    let want = if seen == 0 { b'\r' } else { b'\n' };
                    if input[i] != want {
                        return (
                            i + 1,
                            Err(ProtocolError("Protocol error: bulk string not terminated by CRLF".into())),
                        );
                    }
                    i += 1;
                    if seen == 0 {
                        self.state = State::BulkEnd { seen: 1 };
                    } else if let Some(req) = self.after_arg() {
                        return (i, Ok(Some(req)));
                    }
                }
            }
        }
        (i, Ok(None))
    }
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(&'static str),
    /// `-CODE message`
    Error(String),
    /// `:n`
    Int(i64),
    /// `$n\r\n...`
    Bulk(Vec<u8>),
    /// `$-1`
    Nil,
    /// `*n` and the elements.
    Array(Vec<Reply>),
    /// The null array: `*-1` in RESP2, `_` in RESP3 (XREAD that found nothing).
    NilArray,
    /// A map: `%n` in RESP3, a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    /// `-ERR message`
    pub fn err(msg: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {msg}"))
    }

    /// A bulk string of text.
    pub fn text(s: impl Into<String>) -> Reply {
        Reply::Bulk(s.into().into_bytes())
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Appends the RESP2 encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_as(out, false);
    }

    /// Appends the encoding to `out`, in RESP3 when `resp3` (nil and maps differ).
    pub fn encode_as(&self, out: &mut Vec<u8>, resp3: bool) {
        match self {
            Reply::Simple(s) => {
                out.push(b'+');
                out.extend_from_slice(s.as_bytes());
            }
            Reply::Error(s) => {
                out.push(b'-');
                // An error is one line: a newline in a message would end it early.
                out.extend(s.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
            }
            Reply::Int(n) => {
                out.push(b':');
                out.extend_from_slice(n.to_string().as_bytes());
            }
            Reply::Bulk(b) => {
                out.push(b'$');
                out.extend_from_slice(b.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(b);
            }
            Reply::Nil if resp3 => out.push(b'_'),
            Reply::Nil => out.extend_from_slice(b"$-1"),
            Reply::NilArray if resp3 => out.push(b'_'),
            Reply::NilArray => out.extend_from_slice(b"*-1"),
            Reply::Array(items) => {
                out.push(b'*');
                out.extend_from_slice(items.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                for item in items {
                    item.encode_as(out, resp3);
                }
                return;
            }
            Reply::Map(pairs) => {
                let (mark, n) = if resp3 { (b'%', pairs.len()) } else { (b'*', 2 * pairs.len()) };
                out.push(mark);
                out.extend_from_slice(n.to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                for (k, v) in pairs {
                    k.encode_as(out, resp3);
                    v.encode_as(out, resp3);
                }
                return;
            }
        }
        out.extend_from_slice(b"\r\n");
    }

    /// The RESP2 encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }

    /// The encoding in RESP3 when `resp3`, else RESP2.
    pub fn to_bytes_as(&self, resp3: bool) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_as(&mut v, resp3);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Request {
        Request::Args(v.iter().map(|s| s.as_bytes().to_vec()).collect())
    }

    fn parse_all(p: &mut RequestParser, mut input: &[u8]) -> Vec<Result<Request, ProtocolError>> {
        let mut out = Vec::new();
        while !input.is_empty() {
            let (n, r) = p.feed(input);
            input = &input[n..];
            match r {
                Ok(Some(req)) => out.push(Ok(req)),
                Ok(None) => assert!(input.is_empty()),
                Err(e) => {
                    out.push(Err(e));
                    break;
                }
            }
        }
        out
    }

    #[test]
    fn arrays_inline_and_pipelines() {
        let mut p = RequestParser::new(100);
        let got = parse_all(&mut p, b"*2\r\n$4\r\nQLEN\r\n$1\r\nq\r\nPING\r\n  SEND  q  hi \n*0\r\n\r\n");
        assert_eq!(
            got,
            vec![
                Ok(args(&["QLEN", "q"])),
                Ok(args(&["PING"])),
                Ok(args(&["SEND", "q", "hi"])),
                Ok(Request::Empty),
                Ok(Request::Empty)
            ]
        );
        assert!(!p.in_request());
    }

    #[test]
    fn byte_by_byte_gives_the_same_requests() {
        let input = b"*3\r\n$4\r\nSEND\r\n$1\r\nq\r\n$5\r\nhe\r\no\r\n";
        let mut p = RequestParser::new(100);
        let mut got = Vec::new();
        for b in input.iter() {
            let (n, r) = p.feed(std::slice::from_ref(b));
            assert_eq!(n, 1);
            if let Some(req) = r.unwrap() {
                got.push(req);
            }
        }
        assert_eq!(got, vec![Request::Args(vec![b"SEND".to_vec(), b"q".to_vec(), b"he\r\no".to_vec()])]);
    }

    #[test]
    fn long_arguments_are_read_and_refused() {
        let mut p = RequestParser::new(4);
        let got = parse_all(&mut p, b"*3\r\n$4\r\nSEND\r\n$1\r\nq\r\n$6\r\nabcdef\r\n*1\r\n$4\r\nPING\r\n");
        assert_eq!(got, vec![Ok(Request::TooLarge { command: Some(b"SEND".to_vec()), len: 6 }), Ok(args(&["PING"]))]);
    }

    #[test]
    fn the_parser_asks_for_room_before_a_long_argument() {
        let mut p = RequestParser::new(1 << 20);
        let (n, r) = p.feed(b"*2\r\n$4\r\nSEND\r\n$1000\r\nab");
        assert_eq!((n, r), (23, Ok(None)));
        assert_eq!(p.need(), 998);
        assert!(p.held() >= 1000);
    }

    #[test]
    fn protocol_errors() {
        for (input, msg) in [
            (&b"*x\r\n"[..], "invalid multibulk length"),
            (b"*99999\r\n", "invalid multibulk length"),
            (b"*1\r\n+PING\r\n", "expected '$', got '+'"),
            (b"*1\r\n$-5\r\n", "invalid bulk length"),
            (b"*1\r\n$999999999999\r\n", "invalid bulk length"),
            (b"*1\r\n$2\r\nabcd", "not terminated by CRLF"),
        ] {
            let mut p = RequestParser::new(100);
            let got = parse_all(&mut p, input);
            match got.last() {
                Some(Err(ProtocolError(m))) => assert!(m.contains(msg), "{m} for {input:?}"),
                other => panic!("{other:?} for {input:?}"),
            }
        }
        let mut p = RequestParser::new(100);
        let long = vec![b'a'; MAX_INLINE + 10];
        assert!(matches!(parse_all(&mut p, &long).last(), Some(Err(ProtocolError(m))) if m.contains("too big inline")));
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2_000 {
            let len = (seed % 64) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    b"*$\r\n0123456789-abcQ "[(seed % 20) as usize]
                })
                .collect();
            let mut p = RequestParser::new(16);
            let _ = parse_all(&mut p, &bytes);
        }
    }

    #[test]
    fn replies() {
        let r = Reply::Array(vec![Reply::Int(3), Reply::Bulk(b"a\r\nb".to_vec()), Reply::Nil, Reply::Array(vec![])]);
        assert_eq!(r.to_bytes(), b"*4\r\n:3\r\n$4\r\na\r\nb\r\n$-1\r\n*0\r\n");
        assert_eq!(Reply::Simple("OK").to_bytes(), b"+OK\r\n");
        assert_eq!(Reply::err("bad\r\nthing").to_bytes(), b"-ERR bad  thing\r\n");
        let m = Reply::Map(vec![(Reply::text("proto"), Reply::Int(3)), (Reply::text("x"), Reply::Nil)]);
        assert_eq!(m.to_bytes_as(true), b"%2\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n_\r\n");
        assert_eq!(m.to_bytes(), b"*4\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n$-1\r\n");
    }
}
