use super::*;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mctest::hostile::{connect_from, http_status, loopback, probe, Flood, Kind};

fn get(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn routes(handler: Handler) -> Routes {
    let probes = Probes {
        live: Arc::new(|| Page::text(200, "ok\n".into())),
        ready: Arc::new(|| Page::text(200, "ready\n".into())),
    };
    Routes { paths: &["/healthz"], own_login: Some("/own/"), probes: Some(probes), throttle: None, handler }
}

#[test]
fn serves_pages_and_refuses_the_rest() {
    let handler: Handler = Arc::new(|r| match (r.method, r.path) {
        ("GET", "/down") => Some(Page::text(503, "down\n".to_string())),
        ("GET", "/panics") => panic!("a page that fails"),
        _ => None,
    });
    let e = HttpEndpoint::start("127.0.0.1:0", routes(handler), None).unwrap();
    let a = e.local_addr();
    let ok = get(a, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("\r\n\r\nok\n"), "{ok}");
    assert!(get(a, "GET /nope HTTP/1.1\r\n\r\n").contains("404 Not Found"));
    assert!(get(a, "GET /down HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503 Service Unavailable"));
    assert!(get(a, "POST /healthz HTTP/1.1\r\n\r\n").contains("405"));
    // A page that panics answers 500 and gives its slot back.
    for _ in 0..MAX_CONCURRENT + 1 {
        assert!(get(a, "GET /panics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 500"));
    }
    assert!(get(a, "GET /nope HTTP/1.1\r\n\r\n").contains("404 Not Found"), "no slot was lost");
    e.stop();
}

#[test]
fn a_slow_client_holds_nothing_and_changes_need_the_token() {
    let handler: Handler = Arc::new(|r| match (r.method, r.path) {
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
    let ok = get(a, "GET /healthz HTTP/1.1\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
    // Changes: refused without the token or with a wrong one, done with it.
    assert!(get(a, "POST /reload HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 401 Unauthorized"));
    let wrong = get(a, "POST /reload HTTP/1.1\r\nAuthorization: Bearer nope\r\n\r\n");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let right = get(a, &format!("POST /reload HTTP/1.1\r\nauthorization: Bearer {token}\r\n\r\n"));
    assert!(right.starts_with("HTTP/1.1 200 OK") && right.ends_with("reloaded\n"), "{right}");
    // A trickling client is cut at the header deadline, without an answer.
    let mut trickle = slow.into_iter().next().unwrap();
    trickle.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let closed = loop {
        let _ = trickle.write_all(b"l");
        match trickle.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => panic!("answered {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) if t0.elapsed() < HEADER_TIMEOUT * 6 => {}
            Err(_) => break false,
        }
    };
    assert!(closed, "closed at the deadline");
    assert!(t0.elapsed() >= HEADER_TIMEOUT - Duration::from_millis(500), "not before it: {:?}", t0.elapsed());
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

/// 8 silent sockets reopened every 4 s held every slot of the endpoint, and
/// `/healthz` answered 503 throughout. Now sockets are read without a slot:
/// 64 silent ones from the probe's own address, 300 from many addresses
/// (past the endpoint's connection cap) and 16 trickling ones, all reopened
/// as they go, while a probe asks `/healthz` and `/readyz` every 100 ms —
/// every answer is 200.
#[test]
fn silent_and_trickling_sockets_cannot_take_probes_down() {
    let handler: Handler = Arc::new(|r| match r.path {
        "/metrics" => Some(Page::text(200, "ok\n".into())),
        _ => None,
    });
    let e = HttpEndpoint::start("127.0.0.1:0", routes(handler), None).unwrap();
    let a = e.local_addr();
    let floods = [
        Flood::start(a, 64, Kind::Idle, None, Duration::from_secs(4)),
        Flood::start(a, 300, Kind::Idle, Some(50), Duration::from_secs(2)),
        Flood::start(a, 16, Kind::Trickling, None, Duration::from_secs(4)),
    ];
    std::thread::sleep(Duration::from_millis(500));
    let (failed, asked) = probe(a, &["/healthz", "/readyz"], Duration::from_secs(5));
    assert!(failed.is_empty(), "{} of {asked} probes failed: {:?}", failed.len(), &failed[..failed.len().min(10)]);
    assert_eq!(http_status(a, "/metrics", Duration::from_secs(10)), Ok(200), "pages too");
    let opened: usize = floods.into_iter().map(Flood::stop).sum();
    assert!(opened > 64 + 300 + 16, "the sockets were reopened: {opened}");
    e.stop();
}

/// Pages hold slots while they are built — at most MAX_CONCURRENT, and
/// MAX_PAGES_PER_SOURCE for one address — and probes have a lane of their
/// own: with every page slot taken by pages that do not finish, a probe is
/// still answered 200 at once.
#[test]
fn pages_are_bounded_per_source_and_probes_pass_them() {
    let release = Arc::new(Mutex::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let (r2, s2) = (release.clone(), started.clone());
    let handler: Handler = Arc::new(move |r| match r.path {
        "/slow" => {
            s2.fetch_add(1, Ordering::SeqCst);
            while !*r2.lock().unwrap() {
                std::thread::sleep(Duration::from_millis(10));
            }
            Some(Page::text(200, "slow\n".into()))
        }
        _ => None,
    });
    let e = HttpEndpoint::start("127.0.0.1:0", routes(handler), None).unwrap();
    let a = e.local_addr();
    let ask = |from: std::net::Ipv4Addr| {
        let mut s = connect_from(from, a).unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\n\r\n").unwrap();
        s
    };
    let read = |mut s: TcpStream| {
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    // One address: MAX_PAGES_PER_SOURCE pages at once, the next hears 429.
    let mut held: Vec<TcpStream> = (0..MAX_PAGES_PER_SOURCE).map(|_| ask(loopback(0))).collect();
    let waited = Instant::now();
    while started.load(Ordering::SeqCst) < MAX_PAGES_PER_SOURCE && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let more = read(ask(loopback(0)));
    assert!(more.starts_with("HTTP/1.1 429") && more.contains("Retry-After: 1"), "{more}");
    // Other addresses fill the rest; past MAX_CONCURRENT, 503.
    held.extend((1..=MAX_CONCURRENT - MAX_PAGES_PER_SOURCE).map(|i| ask(loopback(i))));
    while started.load(Ordering::SeqCst) < MAX_CONCURRENT && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let busy = read(ask(loopback(100)));
    assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
    // Probes pass them all.
    for from in [loopback(0), loopback(100)] {
        let mut s = connect_from(from, a).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
        let ok = read(s);
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    }
    *release.lock().unwrap() = true;
    for s in held {
        assert!(read(s).starts_with("HTTP/1.1 200"));
    }
    e.stop();
}

/// Probes whose readiness check takes `check` (one at a time, as a
/// database's is) and counts itself in `checks`.
fn slow_readiness(check: Duration, checks: Arc<AtomicUsize>) -> Routes {
    let one_at_a_time = Arc::new(Mutex::new(()));
    let ready = Arc::new(move || {
        let _one = one_at_a_time.lock().unwrap();
        checks.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(check);
        Page::text(200, "ready\n".into())
    });
    let mut r = routes(Arc::new(|_| None));
    r.probes = Some(Probes { live: Arc::new(|| Page::text(200, "ok\n".into())), ready });
    r
}

/// 9 source addresses × 32 connections repeating `GET /readyz` (within
/// every cap) made `/healthz` answer `503 busy` (5 of 16 polls on mwmq) and
/// take up to 1.2 s: probes waited in one line behind readiness checks that
/// run one at a time, and waiting probes could not be closed to make room.
/// Now `/healthz` is answered by the loop itself and a readiness check's
/// answer is served again for READY_FOR: every `/healthz` answers 200 and
/// the flood costs about one check per period.
#[test]
fn a_flood_of_readiness_probes_cannot_take_liveness_down() {
    let checks = Arc::new(AtomicUsize::new(0));
    let e =
        HttpEndpoint::start("127.0.0.1:0", slow_readiness(Duration::from_millis(20), checks.clone()), None).unwrap();
    let a = e.local_addr();
    let t0 = Instant::now();
    let flood = mctest::hostile::Askers::start(a, "/readyz", 9, 32, Duration::from_millis(50));
    std::thread::sleep(Duration::from_millis(300));
    let (failed, took) = mctest::hostile::probe_timed(a, "/healthz", Duration::from_secs(4));
    let answers = flood.stop();
    let secs = t0.elapsed().as_secs_f64();
    let mut sorted = took.clone();
    sorted.sort();
    eprintln!(
        "/healthz under a flood of {} /readyz in {secs:.1} s: {} polls, median {:?}, max {:?}; {} readiness checks",
        answers.len(),
        took.len(),
        sorted[sorted.len() / 2],
        sorted.last().unwrap(),
        checks.load(Ordering::SeqCst)
    );
    assert!(failed.is_empty(), "{} of {} /healthz failed: {failed:?}", failed.len(), took.len());
    let mut by_status = std::collections::BTreeMap::new();
    for s in &answers {
        *by_status.entry(*s).or_insert(0) += 1;
    }
    eprintln!("{by_status:?}");
    let ok = answers.iter().filter(|&&s| s == 200).count();
    assert!(ok > answers.len() / 2, "the flood was answered: {ok} of {}", answers.len());
    // One check a period at most (and one more under way at the end).
    let most = (secs / READY_FOR.as_secs_f64()).ceil() as usize + 1;
    assert!(checks.load(Ordering::SeqCst) <= most, "{} checks in {secs:.1} s", checks.load(Ordering::SeqCst));
    e.stop();
}

/// Readiness probes wait for the check under way — at most
/// MAX_READY_WAITING_PER_SOURCE from one source, the next hears 429 — while
/// `/healthz` answers at once; the check's answer goes to every one waiting
/// and answers the next without a check.
#[test]
fn readiness_probes_wait_for_one_check_and_its_answer_is_served_again() {
    let release = Arc::new(Mutex::new(false));
    let checks = Arc::new(AtomicUsize::new(0));
    let (r2, c2) = (release.clone(), checks.clone());
    let ready = Arc::new(move || {
        c2.fetch_add(1, Ordering::SeqCst);
        while !*r2.lock().unwrap() {
            std::thread::sleep(Duration::from_millis(10));
        }
        Page::text(200, "ready\n".into())
    });
    let mut r = routes(Arc::new(|_| None));
    r.probes = Some(Probes { live: Arc::new(|| Page::text(200, "alive\n".into())), ready });
    let e = HttpEndpoint::start("127.0.0.1:0", r, None).unwrap();
    let a = e.local_addr();
    let ask = |from| {
        let mut s = connect_from(from, a).unwrap();
        s.write_all(b"GET /readyz HTTP/1.1\r\n\r\n").unwrap();
        s
    };
    let read = |mut s: TcpStream| {
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let waiting: Vec<TcpStream> = (0..MAX_READY_WAITING_PER_SOURCE).map(|_| ask(loopback(0))).collect();
    let t0 = Instant::now();
    while checks.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let more = read(ask(loopback(0)));
    assert!(more.starts_with("HTTP/1.1 429") && more.contains("Retry-After: 1"), "{more}");
    let other = ask(loopback(1));
    for from in [loopback(0), loopback(1)] {
        let mut s = connect_from(from, a).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
        assert!(read(s).ends_with("\r\n\r\nalive\n"), "liveness answers while readiness waits");
    }
    *release.lock().unwrap() = true;
    for s in waiting.into_iter().chain([other]) {
        assert!(read(s).ends_with("\r\n\r\nready\n"));
    }
    assert!(read(ask(loopback(2))).ends_with("ready\n"));
    assert_eq!(checks.load(Ordering::SeqCst), 1, "one check answered them all (and the next, within READY_FOR)");
    e.stop();
}

/// A scrape with a wrong admin token got 200 and the public view, silently.
/// Now a token that is presented must be right: a wrong one hears 401 and
/// counts as a failed login of its source (repeating the same wrong token
/// counts once); past the source's burst even the right token hears 429
/// unchecked. No token: the public view. Probes never look at tokens.
#[test]
fn a_wrong_admin_token_is_refused_and_counted_as_a_failed_login() {
    use crate::throttle::{Limits, Rate, Throttle};
    let handler: Handler = Arc::new(|r| match r.path {
        "/metrics" => Some(Page::text(200, format!("token={}\n", r.token))),
        _ => None,
    });
    let token = "0123456789abcdef-token";
    let throttle = Arc::new(Throttle::new(Limits {
        source: Rate { burst: 3.0, per_sec: 0.001 },
        user: Rate { burst: 3.0, per_sec: 0.001 },
    }));
    let mut r = routes(handler.clone());
    r.throttle = Some(throttle.clone());
    let e = HttpEndpoint::start("127.0.0.1:0", r, Some(token.into())).unwrap();
    let a = e.local_addr();
    let with = |t: &str| get(a, &format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {t}\r\n\r\n"));
    assert!(get(a, "GET /metrics HTTP/1.1\r\n\r\n").ends_with("token=false\n"), "no token: the public view");
    assert!(with(token).ends_with("token=true\n"));
    let wrong = with("not-the-token");
    assert!(wrong.starts_with("HTTP/1.1 401") && wrong.contains("wrong admin token"), "{wrong}");
    for _ in 0..5 {
        assert!(with("not-the-token").starts_with("HTTP/1.1 401"), "the same wrong token, counted once");
    }
    assert!(with(token).ends_with("token=true\n"), "one failure in the source's bucket");
    assert!(with("another-wrong").starts_with("HTTP/1.1 401"));
    assert!(with("a-third-wrong").starts_with("HTTP/1.1 401"));
    let locked = with(token);
    assert!(locked.starts_with("HTTP/1.1 429") && locked.contains("too many failed logins from 127.0.0.1"), "{locked}");
    assert!(get(a, "GET /healthz HTTP/1.1\r\nAuthorization: Bearer nope\r\n\r\n").starts_with("HTTP/1.1 200"));
    assert_eq!(throttle.repeated.load(Ordering::Relaxed), 5);
    e.stop();
    // Without a token configured, a token presented is refused, never ignored.
    let e = HttpEndpoint::start("127.0.0.1:0", routes(handler), None).unwrap();
    let said = get(e.local_addr(), "GET /metrics HTTP/1.1\r\nAuthorization: Bearer x\r\n\r\n");
    assert!(said.starts_with("HTTP/1.1 401") && said.contains("has no admin token"), "{said}");
    e.stop();
}
