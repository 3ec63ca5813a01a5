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

/// A page: content type and body.
pub type Page = (&'static str, String);

/// What the endpoint serves: the page of a path, or `None` for "not found".
pub type Handler = Arc<dyn Fn(&str) -> Option<Page> + Send + Sync>;

/// The content type of Prometheus' text exposition format.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A running admin endpoint.
pub struct HttpEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl HttpEndpoint {
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
    let (status, ctype, body) = if method != "GET" {
        ("405 Method Not Allowed", "text/plain", "only GET\n".to_string())
    } else {
        match handler(path) {
            Some((ctype, body)) => ("200 OK", ctype, body),
            None => ("404 Not Found", "text/plain", format!("not found: try {}\n", paths.join(", "))),
        }
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())
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
        let handler: Handler = Arc::new(|p| (p == "/healthz").then(|| ("text/plain", "ok\n".to_string())));
        let e = HttpEndpoint::start("127.0.0.1:0", &["/healthz"], handler).unwrap();
        let a = e.local_addr();
        let ok = get(a, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("\r\n\r\nok\n"), "{ok}");
        assert!(get(a, "GET /nope HTTP/1.1\r\n\r\n").contains("404 Not Found"));
        assert!(get(a, "POST /healthz HTTP/1.1\r\n\r\n").contains("405"));
        e.stop();
    }
}
