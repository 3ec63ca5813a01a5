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
//! when one is configured; an endpoint beyond loopback without one is warned
//! about.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::StatsConfig;
use crate::start::StartError;

/// A page: status, content type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// HTTP status code (200, 503, ...).
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: String,
}

impl Page {
    /// A `200 OK` page.
    pub fn ok(content_type: &'static str, body: String) -> Page {
        Page { status: 200, content_type, body }
    }

    /// A plain-text page with `status` (`503` when a health check fails).
    pub fn text(status: u16, body: String) -> Page {
        Page { status, content_type: "text/plain", body }
    }
}

/// What the endpoint serves: the page of a method (`GET`, `POST`) and a
/// path, or `None` for "not found" (a `GET`) or "method not allowed".
pub type Handler = Arc<dyn Fn(&str, &str) -> Option<Page> + Send + Sync>;

/// The content type of Prometheus' text exposition format.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Connections served at once.
pub const MAX_CONCURRENT: usize = 8;
/// Time a client has to send its request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// A running admin endpoint.
pub struct HttpEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl HttpEndpoint {
    /// Starts the endpoint `stats` asks for (`--admin`), if any: binds it
    /// and serves `handler` on a new thread; `paths` are listed in the answer
    /// to an unknown path.
    pub fn start_for(
        stats: &StatsConfig,
        paths: &'static [&'static str],
        handler: Handler,
    ) -> Result<Option<HttpEndpoint>, StartError> {
        let Some(addr) = stats.admin_addr() else { return Ok(None) };
        let token = match &stats.admin_token_file {
            Some(f) => Some(
                read_token(std::path::Path::new(f)).map_err(|e| StartError::Config(crate::config::ConfigError(e)))?,
            ),
            None => None,
        };
        let e = HttpEndpoint::start(&addr, paths, handler, token.clone())
            .map_err(|source| StartError::Listen { addr, source })?;
        if token.is_none() && !e.addr.ip().is_loopback() {
            tracing::warn!(addr = %e.addr, "the admin endpoint listens beyond loopback WITHOUT A TOKEN: anyone who reaches it may reload the configuration (set [stats] admin_token_file)");
        }
        Ok(Some(e))
    }

    /// Binds `addr` and serves `handler` on a new thread; `paths` are listed
    /// in the answer to an unknown path; with `token`, requests other than
    /// `GET` must carry it.
    pub fn start(
        addr: &str,
        paths: &'static [&'static str],
        handler: Handler,
        token: Option<String>,
    ) -> io::Result<HttpEndpoint> {
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
                        let (handler, token, done) = (handler.clone(), token.clone(), busy.clone());
                        let spawned = std::thread::Builder::new().name("admin-conn".into()).spawn(move || {
                            if let Err(e) = serve(stream, paths, &handler, token.as_deref()) {
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

fn serve(mut stream: TcpStream, paths: &[&str], handler: &Handler, token: Option<&str>) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(HEADER_TIMEOUT))?;
    let deadline = Instant::now() + HEADER_TIMEOUT;
    let mut req = Vec::new();
    let mut chunk = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && !req.windows(2).any(|w| w == b"\n\n") {
        // One deadline for all the headers, however slowly they trickle.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 || req.len() > 16 * 1024 {
            break;
        }
        req.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&req).into_owned();
    let mut lines = text.lines();
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let bearer = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .and_then(|(_, v)| v.trim().strip_prefix("Bearer ").map(str::trim));
    let authorized = match (method, token) {
        ("GET", _) | (_, None) => true,
        (_, Some(t)) => bearer.is_some_and(|b| same(b.as_bytes(), t.as_bytes())),
    };
    let page = if !authorized {
        Page::text(401, format!("{method} {path} needs the admin token (Authorization: Bearer ...)\n"))
    } else {
        handler(method, path).unwrap_or_else(|| match method {
            "GET" => Page::text(404, format!("not found: try {}\n", paths.join(", "))),
            _ => Page::text(405, format!("{method} {path} is not served\n")),
        })
    };
    respond(&mut stream, &page)
}

/// Whether two byte strings are equal, in time that depends only on their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn respond(stream: &mut TcpStream, page: &Page) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        page.status,
        reason(page.status),
        page.content_type,
        page.body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(page.body.as_bytes())
}

/// The reason phrase of the status codes an admin endpoint answers with.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        409 => "Conflict",
        404 => "Not Found",
        405 => "Method Not Allowed",
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

    #[test]
    fn serves_pages_and_refuses_the_rest() {
        let handler: Handler = Arc::new(|m, p| match (m, p) {
            ("GET", "/healthz") => Some(Page::text(200, "ok\n".to_string())),
            ("GET", "/down") => Some(Page::text(503, "down\n".to_string())),
            _ => None,
        });
        let e = HttpEndpoint::start("127.0.0.1:0", &["/healthz"], handler, None).unwrap();
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
        let handler: Handler = Arc::new(|m, p| match (m, p) {
            ("GET", "/healthz") => Some(Page::text(200, "ok\n".to_string())),
            ("POST", "/reload") => Some(Page::text(200, "reloaded\n".to_string())),
            _ => None,
        });
        let token = "0123456789abcdef-token".to_string();
        let e = HttpEndpoint::start("127.0.0.1:0", &["/healthz"], handler, Some(token.clone())).unwrap();
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
}
