//! The HTTP admin endpoint of a middleware (`--admin ADDR`): a small blocking
//! server of its own, one request per connection, answered and closed. It
//! never touches the request path; what each path shows is the middleware's
//! business (a [`Handler`]).
//!
//! It cannot be held by one client: each connection is served on a thread
//! of its own, at most [`MAX_CONCURRENT`] at once (more hear `503` at once),
//! and a request whose headers have not arrived within [`HEADER_TIMEOUT`] is
//! dropped however slowly its bytes trickle. Requests that change something
//! (any method but `GET`) must carry the token of `[stats] admin_token_file`
//! when one is configured — except under a prefix whose pages log their
//! users in themselves ([`Routes::own_login`]: mwmq's `/ui/`, which takes
//! the token or a user's password and hands out sessions); an endpoint
//! beyond loopback without a token is warned about.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::StatsConfig;
use crate::start::StartError;

/// A page: status, content type, headers of its own and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// HTTP status code (200, 503, ...).
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Headers besides the content type and length (a page's security policy).
    pub headers: &'static [(&'static str, &'static str)],
    /// Body.
    pub body: String,
}

impl Page {
    /// A `200 OK` page.
    pub fn ok(content_type: &'static str, body: String) -> Page {
        Page { status: 200, content_type, headers: &[], body }
    }

    /// A plain-text page with `status` (`503` when a health check fails).
    pub fn text(status: u16, body: String) -> Page {
        Page { status, content_type: "text/plain", headers: &[], body }
    }

    /// A JSON page with `status`.
    pub fn json(status: u16, body: &serde_json::Value) -> Page {
        Page { status, content_type: "application/json", headers: &[], body: body.to_string() + "\n" }
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
/// an unknown one, and the prefix (if any) whose pages log their users in
/// themselves, so that their requests other than `GET` are not refused for
/// want of the admin token.
#[derive(Clone)]
pub struct Routes {
    /// Listed in the answer to an unknown path.
    pub paths: &'static [&'static str],
    /// The prefix whose pages check logins themselves.
    pub own_login: Option<&'static str>,
    /// The pages.
    pub handler: Handler,
}

/// The content type of Prometheus' text exposition format.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Connections served at once.
pub const MAX_CONCURRENT: usize = 8;
/// Time a client has to send its request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request body read (a larger one is answered `413`).
pub const MAX_BODY: usize = 64 * 1024;

/// A running admin endpoint.
pub struct HttpEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl HttpEndpoint {
    /// Starts the endpoint `stats` asks for (`--admin`), if any: binds it
    /// and serves `routes` on a new thread.
    pub fn start_for(stats: &StatsConfig, routes: Routes) -> Result<Option<HttpEndpoint>, StartError> {
        let Some(addr) = stats.admin_addr() else { return Ok(None) };
        let token = match &stats.admin_token_file {
            Some(f) => Some(
                read_token(std::path::Path::new(f)).map_err(|e| StartError::Config(crate::config::ConfigError(e)))?,
            ),
            None => None,
        };
        let e =
            HttpEndpoint::start(&addr, routes, token.clone()).map_err(|source| StartError::Listen { addr, source })?;
        if token.is_none() && !e.addr.ip().is_loopback() {
            tracing::warn!(addr = %e.addr, "the admin endpoint listens beyond loopback WITHOUT A TOKEN: anyone who reaches it may reload the configuration (set [stats] admin_token_file)");
        }
        Ok(Some(e))
    }

    /// Binds `addr` and serves `routes` on a new thread; with `token`,
    /// requests other than `GET` must carry it (outside `routes.own_login`).
    pub fn start(addr: &str, routes: Routes, token: Option<String>) -> io::Result<HttpEndpoint> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let token: Arc<Option<String>> = Arc::new(token);
        let busy = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new().name("admin".into()).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONCURRENT {
                            busy.fetch_sub(1, Ordering::SeqCst);
                            let _ = stream.set_nonblocking(false);
                            let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
                            let _ = respond(&mut stream, &Page::text(503, "busy: try again\n".into()));
                            continue;
                        }
                        let (routes, token, done) = (routes.clone(), token.clone(), busy.clone());
                        let spawned = std::thread::Builder::new().name("admin-conn".into()).spawn(move || {
                            if let Err(e) = serve(stream, &routes, token.as_deref()) {
                                tracing::debug!("admin request failed: {e}");
                            }
                            done.fetch_sub(1, Ordering::SeqCst);
                        });
                        if spawned.is_err() {
                            busy.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => {
                        tracing::warn!("admin accept failed: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
        tracing::info!(%addr, "admin endpoint listening");
        Ok(HttpEndpoint { addr, stop, thread })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// The token in the first line of `path` (which others must not be able to read).
fn read_token(path: &std::path::Path) -> Result<String, String> {
    crate::config::check_private(path, "admin token file", "chmod 600")?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("admin token file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.len() < 16 {
        return Err(format!("admin token file {}: the token must have at least 16 characters", path.display()));
    }
    Ok(token)
}

fn serve(mut stream: TcpStream, routes: &Routes, token: Option<&str>) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(HEADER_TIMEOUT))?;
    let deadline = Instant::now() + HEADER_TIMEOUT;
    let mut req = Vec::new();
    let mut chunk = [0u8; 1024];
    let end_of_headers = |r: &[u8]| {
        let crlf = r.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
        let lf = r.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
        crlf.into_iter().chain(lf).min()
    };
    // The headers, then as much of the body as Content-Length says: one
    // deadline for all of it, however slowly the bytes trickle.
    let mut want: Option<usize> = None;
    loop {
        if want.is_none() {
            if let Some(end) = end_of_headers(&req) {
                let length = content_length(&String::from_utf8_lossy(&req[..end]));
                if length > MAX_BODY {
                    return respond(&mut stream, &Page::text(413, format!("a body is at most {MAX_BODY} bytes\n")));
                }
                want = Some(end + length);
            }
        }
        if want.is_some_and(|w| req.len() >= w) {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 || (want.is_none() && req.len() > 16 * 1024) {
            break;
        }
        req.extend_from_slice(&chunk[..n]);
    }
    let end = end_of_headers(&req).unwrap_or(req.len());
    let text = String::from_utf8_lossy(&req[..end]).into_owned();
    let body = &req[end..want.unwrap_or(end).min(req.len())];
    let mut lines = text.lines();
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let authorization = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim());
    let bearer = authorization.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
    let carries_token = matches!((bearer, token), (Some(b), Some(t)) if same(b.as_bytes(), t.as_bytes()));
    let own_login = routes.own_login.is_some_and(|p| path.starts_with(p));
    let authorized = method == "GET" || token.is_none() || own_login || carries_token;
    let page = if !authorized {
        Page::text(401, format!("{method} {path} needs the admin token (Authorization: Bearer ...)\n"))
    } else {
        let request = Request {
            method,
            path,
            query,
            authorization,
            body,
            peer: stream.peer_addr().ok().map(|a| a.ip()),
            token: carries_token,
            token_configured: token.is_some(),
        };
        (routes.handler)(&request).unwrap_or_else(|| match method {
            "GET" => Page::text(404, format!("not found: try {}\n", routes.paths.join(", "))),
            _ => Page::text(405, format!("{method} {path} is not served\n")),
        })
    };
    respond(&mut stream, &page)
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
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn respond(stream: &mut TcpStream, page: &Page) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        page.status,
        reason(page.status),
        page.content_type,
        page.body.len()
    );
    for (name, value) in page.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(page.body.as_bytes())
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
        503 => "Service Unavailable",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn routes(handler: Handler) -> Routes {
        Routes { paths: &["/healthz"], own_login: Some("/own/"), handler }
    }

    #[test]
    fn serves_pages_and_refuses_the_rest() {
        let handler: Handler = Arc::new(|r| match (r.method, r.path) {
            ("GET", "/healthz") => Some(Page::text(200, "ok\n".to_string())),
            ("GET", "/down") => Some(Page::text(503, "down\n".to_string())),
            _ => None,
        });
        let e = HttpEndpoint::start("127.0.0.1:0", routes(handler), None).unwrap();
        let a = e.local_addr();
        let ok = get(a, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("\r\n\r\nok\n"), "{ok}");
        assert!(get(a, "GET /nope HTTP/1.1\r\n\r\n").contains("404 Not Found"));
        assert!(get(a, "GET /down HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503 Service Unavailable"));
        assert!(get(a, "POST /healthz HTTP/1.1\r\n\r\n").contains("405"));
        e.stop();
    }

    #[test]
    fn a_slow_client_holds_nothing_and_changes_need_the_token() {
        let handler: Handler = Arc::new(|r| match (r.method, r.path) {
            ("GET", "/healthz") => Some(Page::text(200, "ok\n".to_string())),
            ("POST", "/reload") => Some(Page::text(200, "reloaded\n".to_string())),
            _ => None,
        });
        let token = "0123456789abcdef-token".to_string();
        let e = HttpEndpoint::start("127.0.0.1:0", routes(handler), Some(token.clone())).unwrap();
        let a = e.local_addr();
        // Clients that send a byte now and then, never finishing their headers.
        let slow: Vec<TcpStream> = (0..3)
            .map(|_| {
                let mut s = TcpStream::connect(a).unwrap();
                s.write_all(b"GET /hea").unwrap();
                s
            })
            .collect();
        let t0 = Instant::now();
        let ok = get(a, "GET /healthz HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(t0.elapsed() < Duration::from_secs(1), "served beside slow clients: {:?}", t0.elapsed());
        // Changes: refused without the token or with a wrong one, done with it.
        assert!(get(a, "POST /reload HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 401 Unauthorized"));
        let wrong = get(a, "POST /reload HTTP/1.1\r\nAuthorization: Bearer nope\r\n\r\n");
        assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
        let right = get(a, &format!("POST /reload HTTP/1.1\r\nauthorization: Bearer {token}\r\n\r\n"));
        assert!(right.starts_with("HTTP/1.1 200 OK") && right.ends_with("reloaded\n"), "{right}");
        // A trickling client is cut at the header deadline.
        let mut trickle = slow.into_iter().next().unwrap();
        trickle.set_read_timeout(Some(HEADER_TIMEOUT + Duration::from_secs(2))).unwrap();
        let t0 = Instant::now();
        let mut buf = [0u8; 64];
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1500));
            if trickle.write_all(b"l").is_err() {
                break;
            }
        }
        let n = trickle.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "closed without an answer");
        assert!(t0.elapsed() < HEADER_TIMEOUT + Duration::from_secs(1), "{:?}", t0.elapsed());
        // More clients at once than the endpoint serves: the extra ones hear 503 at once.
        let many: Vec<TcpStream> = (0..MAX_CONCURRENT + 2)
            .map(|_| {
                let s = TcpStream::connect(a).unwrap();
                std::thread::sleep(Duration::from_millis(30));
                s
            })
            .collect();
        // (Answered before it sends anything: a request left unread would reset the connection.)
        let mut extra = TcpStream::connect(a).unwrap();
        let mut busy = String::new();
        extra.read_to_string(&mut busy).unwrap();
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        drop(many);
        e.stop();
    }

    #[test]
    fn pages_that_log_in_themselves_see_the_request() {
        let handler: Handler = Arc::new(|r| {
            let body = String::from_utf8_lossy(r.body);
            let seen = format!(
                "{} {} q={} auth={:?} token={} configured={} body={body} loopback={}\n",
                r.method,
                r.path,
                r.query,
                r.authorization,
                r.token,
                r.token_configured,
                r.peer.is_some_and(|p| p.is_loopback())
            );
            Some(Page { headers: &[("X-Frame-Options", "DENY")], ..Page::text(200, seen) })
        });
        let token = "0123456789abcdef-token";
        let e = HttpEndpoint::start("127.0.0.1:0", routes(handler), Some(token.into())).unwrap();
        let a = e.local_addr();
        // Outside the prefix a POST needs the token; under it the page decides.
        assert!(get(a, "POST /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 401"));
        let own = get(a, "POST /own/login?x=1 HTTP/1.1\r\nAuthorization: Basic dTpw\r\nContent-Length: 5\r\n\r\nhello");
        assert!(own.contains("\r\nX-Frame-Options: DENY\r\n"), "{own}");
        assert!(
            own.ends_with(
                "POST /own/login q=x=1 auth=Some(\"Basic dTpw\") token=false configured=true body=hello loopback=true\n"
            ),
            "{own}"
        );
        let with = get(a, &format!("GET /own/x HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\r\n"));
        assert!(with.contains("token=true"), "{with}");
        // A body over the limit is refused, not read.
        let big = get(a, &format!("POST /own/x HTTP/1.1\r\nContent-Length: {}\r\n\r\n", MAX_BODY + 1));
        assert!(big.starts_with("HTTP/1.1 413"), "{big}");
        e.stop();
    }
}
