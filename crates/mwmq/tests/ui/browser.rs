//! Headless Chromium, driven over the Chrome DevTools Protocol: a page is
//! opened, scripts are evaluated in it as a user's clicks and typing would
//! be, and what it shows is read back.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

type Socket = tungstenite::WebSocket<TcpStream>;

/// A headless Chromium with one page.
pub struct Browser {
    child: Child,
    profile: PathBuf,
    ws: Socket,
    next: u64,
}

fn chromium() -> &'static str {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new("sh").args(["-c", &format!("command -v {name}")]).output().is_ok_and(|o| o.status.success()) {
            return name;
        }
    }
    panic!("Chromium is not installed (make test installs Debian's chromium package)")
}

/// `GET path` from the DevTools HTTP endpoint: the JSON body (`None`
/// while it does not answer yet).
fn devtools_get(port: u16, path: &str) -> Option<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    // (It keeps the connection open: read as much as Content-Length says.)
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<usize>().ok())?;
            if body.len() >= length {
                return serde_json::from_str(body).ok();
            }
        }
    }
}

impl Browser {
    /// Starts Chromium and connects to its first page.
    pub fn start() -> Browser {
        let profile =
            std::env::temp_dir().join(format!("mwmq-ui-chromium-{}-{}", std::process::id(), mctest::free_port()));
        std::fs::create_dir_all(&profile).unwrap();
        let child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                "--window-size=1500,1000",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        // Stopped and removed however the start ends.
        struct Started(Option<Child>, PathBuf);
        impl Drop for Started {
            fn drop(&mut self) {
                if let Some(mut c) = self.0.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                    let _ = std::fs::remove_dir_all(&self.1);
                }
            }
        }
        let mut started = Started(Some(child), profile.clone());
        // Chromium writes the port it chose into its profile.
        let file = profile.join("DevToolsActivePort");
        let end = Instant::now() + Duration::from_secs(30);
        let port: u16 = loop {
            if let Some(p) = std::fs::read_to_string(&file).ok().and_then(|t| t.lines().next()?.parse().ok()) {
                break p;
            }
            assert!(Instant::now() < end, "chromium did not open its DevTools port");
            std::thread::sleep(Duration::from_millis(50));
        };
        let page = loop {
            let list = devtools_get(port, "/json/list").unwrap_or_default();
            if let Some(p) = list.as_array().and_then(|l| l.iter().find(|t| t["type"] == "page")) {
                break p["webSocketDebuggerUrl"].as_str().unwrap().to_string();
            }
            assert!(Instant::now() < end, "chromium has no page");
            std::thread::sleep(Duration::from_millis(50));
        };
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let (ws, _) = tungstenite::client(page.as_str(), stream).expect("devtools websocket");
        let child = started.0.take().expect("started");
        let mut b = Browser { child, profile, ws, next: 0 };
        b.call("Page.enable", json!({}));
        b.call("Runtime.enable", json!({}));
        b
    }

    /// Calls a DevTools method: its result (events in between are skipped).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let msg = json!({ "id": id, "method": method, "params": params }).to_string();
        self.ws.send(tungstenite::Message::text(msg)).expect("send to devtools");
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < end, "{method}: no answer within 30 s");
            let m = self.ws.read().expect("read from devtools");
            let Ok(text) = m.to_text() else { continue };
            let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Opens `url`.
    pub fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
    }

    /// Evaluates `expr` in the page (awaiting a promise): its value.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r =
            self.call("Runtime.evaluate", json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }));
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Waits until `expr` is truthy in the page: its value.
    pub fn wait(&mut self, expr: &str, limit: Duration) -> Value {
        let end = Instant::now() + limit;
        loop {
            let v = self.eval(&format!("(() => {{ try {{ return {expr}; }} catch (e) {{ return null; }} }})()"));
            let truthy = !matches!(&v, Value::Null | Value::Bool(false))
                && v != json!(0)
                && v != json!("")
                && v != Value::Array(vec![]);
            if truthy {
                return v;
            }
            assert!(Instant::now() < end, "waited {limit:?} for {expr}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the page as shown.
    pub fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine;
        let r = self.call("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": true }));
        base64::engine::general_purpose::STANDARD.decode(r["data"].as_str().unwrap_or("")).unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
