//! What mwload needs of RESP (the Redis protocol) to drive mwmq: requests
//! written as arrays of bulk strings, and replies read far enough to count
//! messages and find the lease to acknowledge — bodies are skipped, not copied.

/// Appends a request: an array of bulk strings.
pub fn push_request(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_num(out, args.len() as u64);
    for a in args {
        out.push(b'$');
        push_num(out, a.len() as u64);
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends `n` in decimal and a line end, without allocating.
fn push_num(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// A reply, as far as the load cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MqReply {
    /// An error reply (`-...`).
    pub error: bool,
    /// Messages it carries: RECV's array length, 1 for a POP that took one, 0 for nil.
    pub messages: u32,
    /// The first message's id and lease (RECV), to acknowledge.
    pub lease: Option<(i64, i64)>,
    /// An integer reply (SEND's id, ACK's 1 or 0).
    pub integer: Option<i64>,
}

/// A RESP value with bulk strings reduced to their length.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Val {
    Simple,
    Error,
    Int(i64),
    Bulk,
    /// A bulk string that is a stream entry's id (`ms-seq`).
    Id(i64, i64),
    Nil,
    Array(Vec<Val>),
}

/// The deepest nesting accepted (mwmq's replies nest two levels).
const MAX_DEPTH: usize = 8;

/// Parses one whole reply at the start of `buf`: `Ok(None)` until it is all
/// there, then the reply and the bytes it took. Malformed input is an error.
pub fn parse(buf: &[u8]) -> Result<Option<(MqReply, usize)>, String> {
    let Some((v, used)) = value(buf, 0, 0)? else { return Ok(None) };
    let mut r = MqReply::default();
    match v {
        Val::Error => r.error = true,
        Val::Int(n) => r.integer = Some(n),
        Val::Array(items) => {
            if let Some(entries) = stream_entries(&items) {
                // XREADGROUP / XREAD: [[stream, [[id, fields], ...]], ...]
                r.messages = entries.len() as u32;
                if let Some(Val::Array(first)) = entries.first() {
                    if let Some(Val::Id(ms, seq)) = first.first() {
                        r.lease = Some((*ms, *seq));
                    }
                }
            } else if items.iter().all(|i| matches!(i, Val::Array(_))) && !items.is_empty() {
                // RECV: [[id, lease, sender, body], ...]
                r.messages = items.len() as u32;
                if let Val::Array(first) = &items[0] {
                    if let (Some(Val::Int(id)), Some(Val::Int(lease))) = (first.first(), first.get(1)) {
                        r.lease = Some((*id, *lease));
                    }
                }
            } else if !items.is_empty() {
                // POP: [id, sender, body]
                r.messages = 1;
            }
        }
        Val::Simple | Val::Bulk | Val::Id(..) | Val::Nil => {}
    }
    Ok(Some((r, used)))
}

/// The first stream's entries of an XREAD / XREADGROUP reply, if it is one.
fn stream_entries(items: &[Val]) -> Option<&Vec<Val>> {
    match items.first()? {
        Val::Array(pair) => match pair.as_slice() {
            [Val::Bulk, Val::Array(entries)] => Some(entries),
            _ => None,
        },
        _ => None,
    }
}

/// A stream entry's id (`ms-seq`, digits only), if the bulk string is one.
fn stream_id(b: &[u8]) -> Option<Val> {
    if b.len() > 41 {
        return None;
    }
    let s = std::str::from_utf8(b).ok()?;
    let (ms, seq) = s.split_once('-')?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit());
    (digits(ms) && digits(seq)).then(|| Some(Val::Id(ms.parse().ok()?, seq.parse().ok()?)))?
}

fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, String> {
    match memchr::memchr(b'\n', &buf[at..]) {
        None if buf.len() - at > 64 * 1024 => Err("a reply line without an end".into()),
        None => Ok(None),
        Some(i) => {
            let end = at + i;
            if end == at || buf[end - 1] != b'\r' {
                return Err("a reply line not ended by CRLF".into());
            }
            Ok(Some((&buf[at..end - 1], end + 1)))
        }
    }
}

fn number(s: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(s).ok().and_then(|t| t.parse().ok()).ok_or_else(|| format!("not a number: {s:?}"))
}

fn value(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Val, usize)>, String> {
    if at >= buf.len() {
        return Ok(None);
    }
    if depth > MAX_DEPTH {
        return Err("a reply nested too deep".into());
    }
    let Some((l, next)) = line(buf, at + 1)? else { return Ok(None) };
    match buf[at] {
        // (RESP3's booleans, doubles and big numbers read as simple strings, its null as nil.)
        b'+' | b'#' | b',' | b'(' => Ok(Some((Val::Simple, next))),
        b'-' => Ok(Some((Val::Error, next))),
        b':' => Ok(Some((Val::Int(number(l)?), next))),
        b'_' => Ok(Some((Val::Nil, next))),
        b'$' => {
            let n = number(l)?;
            if n < 0 {
                return Ok(Some((Val::Nil, next)));
            }
            let end = usize::try_from(n)
                .ok()
                .and_then(|n| next.checked_add(n)?.checked_add(2))
                .ok_or_else(|| format!("a bulk string of {n} bytes"))?;
            if buf.len() < end {
                return Ok(None);
            }
            if &buf[end - 2..end] != b"\r\n" {
                return Err("a bulk string not ended by CRLF".into());
            }
            Ok(Some((stream_id(&buf[next..end - 2]).unwrap_or(Val::Bulk), end)))
        }
        // (A RESP3 map's keys and values, and a set's members, read as an array's items.)
        kind @ (b'*' | b'%' | b'~') => {
            let n = number(l)?;
            if n < 0 {
                return Ok(Some((Val::Nil, next)));
            }
            let n = if kind == b'%' { n.saturating_mul(2) } else { n };
            let mut items = Vec::with_capacity((n as usize).min(1024));
            let mut pos = next;
            for _ in 0..n {
                match value(buf, pos, depth + 1)? {
                    None => return Ok(None),
                    Some((v, p)) => {
                        // Only the first message's fields are looked at.
                        items.push(if items.len() < 4 || depth == 0 { v } else { Val::Bulk });
                        pos = p;
                    }
                }
            }
            Ok(Some((Val::Array(items), pos)))
        }
        b => Err(format!("not a RESP reply: starts with {:?}", b as char)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        push_request(&mut out, &[b"SEND", b"q0", b"hello", b"TO", b"c1"]);
        assert_eq!(out, b"*5\r\n$4\r\nSEND\r\n$2\r\nq0\r\n$5\r\nhello\r\n$2\r\nTO\r\n$2\r\nc1\r\n");
    }

    #[test]
    fn replies_of_each_command() {
        let recv = b"*1\r\n*4\r\n:17\r\n:99\r\n$2\r\nc1\r\n$5\r\nhello\r\n";
        let (r, used) = parse(recv).unwrap().unwrap();
        assert_eq!((r.messages, r.lease, used), (1, Some((17, 99)), recv.len()));
        let pop = b"*3\r\n:5\r\n$0\r\n\r\n$3\r\nabc\r\n";
        assert_eq!(parse(pop).unwrap().unwrap().0.messages, 1);
        assert_eq!(parse(b"*-1\r\n").unwrap().unwrap().0.messages, 0);
        assert_eq!(parse(b"*0\r\n").unwrap().unwrap().0.messages, 0);
        assert_eq!(parse(b":42\r\n").unwrap().unwrap().0.integer, Some(42));
        assert!(parse(b"-NOQUEUE no such queue 'q'\r\n").unwrap().unwrap().0.error);
        assert_eq!(parse(b"+OK\r\n:1\r\n").unwrap().unwrap().1, 5);
        let xread = b"*1\r\n*2\r\n$2\r\nq0\r\n*1\r\n*2\r\n$15\r\n1700000000000-3\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n";
        let (r, used) = parse(xread).unwrap().unwrap();
        assert_eq!((r.messages, r.lease, used), (1, Some((1_700_000_000_000, 3)), xread.len()));
    }

    #[test]
    fn partial_replies_wait_and_garbage_is_refused() {
        let recv = b"*1\r\n*4\r\n:17\r\n:99\r\n$2\r\nc1\r\n$5\r\nhello\r\n";
        for cut in 0..recv.len() {
            assert_eq!(parse(&recv[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert!(parse(b"?what\r\n").is_err());
        assert!(parse(b":12x\r\n").is_err());
        assert!(parse(b"$3\r\nabcde\r\n").is_err());
    }
}
