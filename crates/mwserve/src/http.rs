//! The HTTP admin endpoint of a middleware (`--admin ADDR`): a small blocking
//! server on its own thread, one GET per connection, answered and closed. It
//! never touches the request path; what each path shows is the middleware's
//! business (a [`Handler`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

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
        HttpEndpoint::start(&addr, paths, handler).map(Some).map_err(|source| StartError::Listen { addr, source })
    }

    /// Binds `addr` and serves `handler` on a new thread; `paths` are listed
    /// in the answer to an unknown path.
    pub fn start(addr: &str, paths: &'static [&'static str], handler: Handler) -> io::Result<HttpEndpoint> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("admin".into()).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if let Err(e) = serve(stream, paths, &handler) {
                            tracing::debug!("admin request failed: {e}");
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

fn serve(mut stream: TcpStream, paths: &[&str], handler: &Handler) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut req = Vec::new();
    let mut chunk = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && !req.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 || req.len() > 16 * 1024 {
            break;
        }
        req.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(req.split(|&b| b == b'\n').next().unwrap_or_default()).into_owned();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let page = handler(method, path).unwrap_or_else(|| match method {
        "GET" => Page::text(404, format!("not found: try {}\n", paths.join(", "))),
        _ => Page::text(405, format!("{method} {path} is not served\n")),
    });
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
        let e = HttpEndpoint::start("127.0.0.1:0", &["/healthz"], handler).unwrap();
        let a = e.local_addr();
        let ok = get(a, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("\r\n\r\nok\n"), "{ok}");
        assert!(get(a, "GET /nope HTTP/1.1\r\n\r\n").contains("404 Not Found"));
        assert!(get(a, "GET /down HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503 Service Unavailable"));
        assert!(get(a, "POST /healthz HTTP/1.1\r\n\r\n").contains("405"));
        e.stop();
    }
}
