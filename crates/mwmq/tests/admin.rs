//! mwmq's admin port and logins as an attacker meets them: silent and
//! trickling sockets beside a liveness probe, `/metrics` asked for queue
//! names without the token, and guesses at one user from fifty source
//! addresses. Each test failed on the code before the fix it names.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use mctest::hostile::{connect_from, http_status, loopback, probe, Flood, Kind};
use mwmq::Service;

const TOKEN: &str = "admin-test-token-0123456789";

/// `cfg` with the admin endpoint and its token.
fn with_admin(pg: &Postgres, cfg: &mut mwmq::Config) {
    cfg.stats.admin = Some("127.0.0.1:0".into());
    let file = pg.dir().join("admin-token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    cfg.stats.admin_token_file = Some(file.display().to_string());
}

/// `GET path`, with the token or not: the status and the body.
fn get(addr: SocketAddr, path: &str, token: bool) -> (u16, String) {
    use std::io::Read;
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = if token { format!("Authorization: Bearer {TOKEN}\r\n") } else { String::new() };
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.split(' ').nth(1).unwrap().parse().unwrap(), body.to_string())
}

/// 8 sockets that sent nothing, reopened every 4 s, held every slot of the
/// admin endpoint: `/healthz` and `/readyz` answered 503 for as long as they
/// stayed (a liveness probe would have restarted a healthy mwmq). Now the
/// endpoint reads requests without a slot and answers probes on a lane of
/// their own: with 8 and then 64 silent sockets and 8 trickling ones held
/// and reopened, every probe every 100 ms answers 200, and so does a page.
#[test]
fn silent_admin_sockets_cannot_take_probes_down() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    with_admin(&pg, &mut cfg);
    let mq = start(cfg);
    let admin = mq.admin_addr().unwrap();
    for (n, reopen) in [(8, Duration::from_secs(4)), (64, Duration::from_secs(1))] {
        let idle = Flood::start(admin, n, Kind::Idle, None, reopen);
        let slow = Flood::start(admin, 8, Kind::Trickling, None, Duration::from_secs(4));
        std::thread::sleep(Duration::from_millis(300));
        let (failed, asked) = probe(admin, &["/healthz", "/readyz"], Duration::from_secs(4));
        assert!(failed.is_empty(), "{n} silent sockets: {} of {asked} probes failed: {failed:?}", failed.len());
        assert_eq!(http_status(admin, "/metrics", Duration::from_secs(30)), Ok(200), "pages are served too");
        assert_eq!(http_status(admin, "/ui", Duration::from_secs(30)), Ok(200));
        slow.stop();
        idle.stop();
    }
}

/// An unauthenticated `GET /metrics` named `secret.payroll` in its
/// per-queue series, a queue `/ui` hides from users without rights. Now
/// /metrics names only the `[queues] public_queues` to anyone; the others
/// need the admin token, and are otherwise added up as `_other`.
#[test]
fn metrics_name_a_queue_only_to_the_token_or_when_it_is_public() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    with_admin(&pg, &mut cfg);
    cfg.queues.public_queues = vec!["public.*".into()];
    let mq = start(cfg);
    let admin = mq.admin_addr().unwrap();
    let mut c = connect(mq.local_addr());
    for queue in ["secret.payroll", "public.jobs"] {
        assert_eq!(q::<String>(&mut c, &["QCREATE", queue]), "OK");
        let _: i64 = q(&mut c, &["SEND", queue, "x"]);
        assert_eq!(q::<String>(&mut c, &["QPAUSE", queue]), "OK");
    }
    let (status, anyone) = get(admin, "/metrics", false);
    assert_eq!(status, 200);
    assert!(!anyone.contains("secret.payroll"), "{anyone}");
    assert!(anyone.contains("mwmq_queue_sent_total{queue=\"public.jobs\"} 1"), "{anyone}");
    assert!(anyone.contains("mwmq_queue_sent_total{queue=\"_other\"} 1"), "counted, not named: {anyone}");
    assert!(anyone.contains("mwmq_queue_paused{queue=\"public.jobs\"} 1"), "{anyone}");
    let (status, admin_view) = get(admin, "/metrics", true);
    assert_eq!(status, 200);
    assert!(admin_view.contains("mwmq_queue_sent_total{queue=\"secret.payroll\"} 1"), "{admin_view}");
    assert!(admin_view.contains("mwmq_queue_paused{queue=\"secret.payroll\"} 1"), "{admin_view}");
    assert!(!admin_view.contains("queue=\"_other\""), "{admin_view}");
}

/// One RESP command on a fresh connection from `from`: the reply line.
fn call_from(from: std::net::Ipv4Addr, addr: SocketAddr, args: &[&str]) -> String {
    let mut s = connect_from(from, addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(out.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

/// 50 source addresses in 127.0.0.0/8 made 200 checked guesses at one user
/// in 10 s: failures were counted per address only (10 each). Now they are
/// also counted per user name: past `[auth] user_burst` guesses at `app`
/// from anywhere, its logins are refused unchecked — and told so, with
/// `-ERR too many failed logins for user app; retry in N s`, which the
/// redis crate reports as it is, where it used to hear `WRONGPASS` even
/// for the right password.
#[test]
fn guesses_at_one_user_from_fifty_addresses_are_throttled_and_told_so() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![user("app", "app-pw", &["*"], &["*"], &["*"])];
    cfg.auth.user_burst = 10;
    cfg.auth.user_per_sec = 1.0;
    let mq = start(cfg);
    let addr = mq.local_addr();
    let t0 = Instant::now();
    let (mut checked, mut throttled) = (0, 0);
    for i in 0..200 {
        let reply = call_from(loopback(i % 50), addr, &["AUTH", "app", &format!("guess-{i}")]);
        if reply.starts_with("-WRONGPASS") {
            checked += 1;
        } else {
            assert!(reply.starts_with("-ERR too many failed logins for user app; retry in "), "{reply:?}");
            throttled += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    assert!(checked as f64 <= 10.0 + secs + 1.0, "{checked} guesses checked in {secs:.1} s");
    assert!(throttled > 0);
    // The right password while the user is throttled: told so, by the redis crate too.
    let reply = call_from(loopback(77), addr, &["AUTH", "app", "app-pw"]);
    assert!(reply.starts_with("-ERR too many failed logins for user app; retry in "), "{reply:?}");
    // (The redis crate reports the server's words for HELLO 3 AUTH and for
    // an AUTH command; for its RESP2 connection-time AUTH it reports any
    // refusal, WRONGPASS included, as "Password authentication failed".)
    let client = redis::Client::open(format!("redis://app:app-pw@{addr}/?protocol=resp3")).unwrap();
    let e = client.get_connection_with_timeout(Duration::from_secs(10)).map(drop).unwrap_err();
    assert!(e.to_string().contains("too many failed logins for user app; retry in"), "{e}");
    let mut c = connect(addr);
    let e = redis::cmd("AUTH").arg("app").arg("app-pw").query::<String>(&mut c).unwrap_err();
    assert!(e.to_string().contains("too many failed logins for user app; retry in"), "{e}");
    let cli = std::process::Command::new("redis-cli")
        .args(["-p", &addr.port().to_string(), "--no-auth-warning", "--user", "app", "--pass", "app-pw", "PING"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&cli.stdout).into_owned() + &String::from_utf8_lossy(&cli.stderr);
    assert!(said.contains("too many failed logins for user app"), "redis-cli: {said}");
    // Another user is not throttled; the user is again once it has earned an attempt back.
    assert!(call_from(loopback(78), addr, &["AUTH", "bob", "x"]).starts_with("-WRONGPASS"));
    assert!(
        eventually(Duration::from_secs(60), || call_from(loopback(79), addr, &["AUTH", "app", "app-pw"]) == "+OK\r\n"),
        "logs in once the bucket drains"
    );
}
