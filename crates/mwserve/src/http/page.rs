//! What the admin endpoint reads and writes, without I/O: a request's head
//! and body as they arrive ([`Asked`]: complete yet? too large?), what a
//! handler sees of it ([`Request`]), what it answers ([`Page`]) and the
//! answer's bytes.

use std::net::IpAddr;
use std::sync::Arc;

/// The largest request body read (a larger one is answered `413`).
pub const MAX_BODY: usize = 64 * 1024;
/// The largest request head read (a longer one closes the connection).
pub const MAX_HEAD: usize = 16 * 1024;

/// A page: status, content type, headers of its own and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// HTTP status code (200, 503, ...).
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Headers besides the content type and length (a page's security policy).
    pub headers: &'static [(&'static str, &'static str)],
    /// Seconds after which the client may try again (`Retry-After`, with `429` and `503`).
    pub retry_after: Option<u64>,
    /// Body.
    pub body: String,
}

impl Page {
    /// A `200 OK` page.
    pub fn ok(content_type: &'static str, body: String) -> Page {
        Page { status: 200, content_type, headers: &[], retry_after: None, body }
    }

    /// A plain-text page with `status` (`503` when a health check fails).
    pub fn text(status: u16, body: String) -> Page {
        Page { status, content_type: "text/plain", headers: &[], retry_after: None, body }
    }

    /// A JSON page with `status`.
    pub fn json(status: u16, body: &serde_json::Value) -> Page {
        Page {
            status,
            content_type: "application/json",
            headers: &[],
            retry_after: None,
            body: body.to_string() + "\n",
        }
    }

    /// The page's bytes on the wire (the connection closes after it).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        if let Some(s) = self.retry_after {
            head.push_str(&format!("Retry-After: {s}\r\n"));
        }
        for (name, value) in self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

/// A request as a [`Handler`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path, without the query string.
    pub path: &'a str,
    /// The query string (after `?`), or "".
    pub query: &'a str,
    /// The `Authorization` header's value, if any.
    pub authorization: Option<&'a str>,
    /// The body (at most [`MAX_BODY`] bytes).
    pub body: &'a [u8],
    /// The client's address.
    pub peer: Option<IpAddr>,
    /// Whether it carries the admin token (`Authorization: Bearer ...`).
    pub token: bool,
    /// Whether an admin token is configured at all.
    pub token_configured: bool,
}

/// What the endpoint serves: the page of a request, or `None` for "not
/// found" (a `GET`) or "method not allowed".
pub type Handler = Arc<dyn Fn(&Request) -> Option<Page> + Send + Sync>;

/// What an endpoint serves: its handler, the paths listed in the answer to
/// an unknown one, the prefix (if any) whose pages log their users in
/// themselves, so that their requests other than `GET` are not refused for
/// want of the admin token, the probes, and the login throttle that a wrong
/// admin token counts in.
#[derive(Clone)]
pub struct Routes {
    /// Listed in the answer to an unknown path.
    pub paths: &'static [&'static str],
    /// The prefix whose pages check logins themselves.
    pub own_login: Option<&'static str>,
    /// `GET /healthz` and `GET /readyz`, answered ahead of pages and never
    /// by the handler.
    pub probes: Option<Probes>,
    /// Where a request with a wrong admin token counts as a failed login
    /// (the middleware's login throttle), and where a source locked out has
    /// its token refused unchecked.
    pub throttle: Option<Arc<crate::throttle::Throttle>>,
    /// The pages.
    pub handler: Handler,
}

/// A probe's page, built without a request.
pub type Probe = Arc<dyn Fn() -> Page + Send + Sync>;

/// The probes of an endpoint.
#[derive(Clone)]
pub struct Probes {
    /// `GET /healthz` (liveness): built by the endpoint's loop itself the
    /// moment the request is read — never queued, never refused for want of
    /// a slot. It must only read a flag (is the process stopping?): it must
    /// not wait for anything.
    pub live: Probe,
    /// `GET /readyz` (readiness): built on a thread of its own, one check at
    /// a time; every `/readyz` that arrives meanwhile waits for that check,
    /// and its page answers every `/readyz` for [`super::READY_FOR`] after,
    /// so a flood of probes costs one check per period.
    pub ready: Probe,
}

/// The content type of Prometheus' text exposition format.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How far a request's bytes are.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// More bytes are needed.
    Incomplete,
    /// The request (head and body) is all there: this many bytes.
    Complete(usize),
    /// Refused before it is complete: answer this and close.
    Refuse(u16, &'static str),
}

/// Where a request's head ends (after its blank line), if it has.
fn end_of_head(r: &[u8]) -> Option<usize> {
    let crlf = r.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = r.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    crlf.into_iter().chain(lf).min()
}

/// Whether `buf` holds a whole request: its head, then as many bytes of
/// body as `Content-Length` says.
pub fn progress(buf: &[u8]) -> Progress {
    let Some(end) = end_of_head(buf) else {
        return if buf.len() > MAX_HEAD {
            Progress::Refuse(431, "the request's head is too large\n")
        } else {
            Progress::Incomplete
        };
    };
    let length = content_length(&String::from_utf8_lossy(&buf[..end]));
    if length > MAX_BODY {
        return Progress::Refuse(413, "a body is at most 64 KiB\n");
    }
    if buf.len() >= end + length {
        Progress::Complete(end + length)
    } else {
        Progress::Incomplete
    }
}

/// A whole request, owned (it goes to the thread that answers it).
#[derive(Debug, Clone, Default)]
pub struct Asked {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The query string, or "".
    pub query: String,
    /// The `Authorization` header's value.
    pub authorization: Option<String>,
    /// The body.
    pub body: Vec<u8>,
}

impl Asked {
    /// The request in `buf` (all of it, or what came before the client
    /// closed its side).
    pub fn parse(buf: &[u8]) -> Asked {
        let end = end_of_head(buf).unwrap_or(buf.len());
        let text = String::from_utf8_lossy(&buf[..end]);
        let length = content_length(&text);
        let body = buf[end..(end.saturating_add(length)).min(buf.len())].to_vec();
        let mut lines = text.lines();
        let line = lines.next().unwrap_or_default();
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let authorization = lines
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
            .map(|(_, v)| v.trim().to_string());
        Asked { method: method.into(), path: path.into(), query: query.into(), authorization, body }
    }

    /// The bearer token it carries, if any.
    pub fn bearer(&self) -> Option<&str> {
        self.authorization.as_deref().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim)
    }
}

/// The `Content-Length` of a request's headers (0 without one).
fn content_length(headers: &str) -> usize {
    headers
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, v)| v.trim().parse().unwrap_or(usize::MAX))
}

/// Whether two byte strings are equal, in time that depends only on their lengths.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The reason phrase of the status codes an admin endpoint answers with.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_complete_with_its_body_at_every_split() {
        let whole = b"POST /ui/api/login?x=1 HTTP/1.1\r\nAuthorization: Basic dTpw\r\nContent-Length: 5\r\n\r\nhello";
        for cut in 0..whole.len() {
            assert_eq!(progress(&whole[..cut]), Progress::Incomplete, "cut at {cut}");
        }
        assert_eq!(progress(whole), Progress::Complete(whole.len()));
        let a = Asked::parse(whole);
        assert_eq!((a.method.as_str(), a.path.as_str(), a.query.as_str()), ("POST", "/ui/api/login", "x=1"));
        assert_eq!((a.authorization.as_deref(), a.body.as_slice()), (Some("Basic dTpw"), &b"hello"[..]));
        assert_eq!(progress(b"GET / HTTP/1.0\n\n"), Progress::Complete(16));
    }

    #[test]
    fn oversized_heads_and_bodies_are_refused_before_they_are_read() {
        assert_eq!(progress(&vec![b'a'; MAX_HEAD + 1]), Progress::Refuse(431, "the request's head is too large\n"));
        let big = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", MAX_BODY + 1);
        assert!(matches!(progress(big.as_bytes()), Progress::Refuse(413, _)));
        let page = Page { retry_after: Some(3), ..Page::text(429, "slow down\n".into()) };
        let text = String::from_utf8(page.to_bytes()).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 429 Too Many Requests\r\n") && text.contains("\r\nRetry-After: 3\r\n"),
            "{text}"
        );
    }
}
