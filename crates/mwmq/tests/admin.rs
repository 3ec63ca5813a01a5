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

/// 9 source addresses × 32 connections repeating `GET /readyz` (within
/// every cap) made 5 of 16 `/healthz` polls answer `503 busy: try again`
/// (median 241 ms): probes waited in one line behind readiness checks that
/// run one at a time, and could not be closed to make room. Now `/healthz`
/// is answered by the endpoint's loop, `/readyz` checks once and serves its
/// answer for a while: every `/healthz` answers 200 (its latency printed,
/// not judged).
#[test]
fn a_flood_of_readiness_probes_cannot_take_liveness_down() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    with_admin(&pg, &mut cfg);
    let mq = start(cfg);
    let admin = mq.admin_addr().unwrap();
    let flood = mctest::hostile::Askers::start(admin, "/readyz", 9, 32, Duration::from_millis(50));
    std::thread::sleep(Duration::from_millis(300));
    let (failed, took) = mctest::hostile::probe_timed(admin, "/healthz", Duration::from_secs(4));
    let answers = flood.stop();
    let mut sorted = took.clone();
    sorted.sort();
    let ok = answers.iter().filter(|&&s| s == 200).count();
    eprintln!(
        "/healthz under {} /readyz ({ok} answered 200): {} polls, median {:?}, max {:?}",
        answers.len(),
        took.len(),
        sorted[sorted.len() / 2],
        sorted.last().unwrap()
    );
    assert!(failed.is_empty(), "{} of {} /healthz failed: {failed:?}", failed.len(), took.len());
    assert!(ok > answers.len() / 2, "the flood was answered: {ok} of {}", answers.len());
}

/// RESP lines of `AUTH app <guess>` from 50 addresses at once, each on a
/// fresh connection, until `until`: (checked, throttled).
fn guess_from_fifty(addr: SocketAddr, until: Instant) -> (usize, usize) {
    let threads: Vec<_> = (0..50)
        .map(|i| {
            std::thread::spawn(move || {
                let (mut checked, mut throttled, mut n) = (0, 0, 0);
                while Instant::now() < until {
                    let reply = call_from(loopback(i), addr, &["AUTH", "app", &format!("guess-{i}-{n}")]);
                    n += 1;
                    if reply.starts_with("-WRONGPASS") {
                        checked += 1;
                    } else if reply.starts_with("-ERR too many failed logins") {
                        throttled += 1;
                        // (Refusals come at once: a pause keeps 50 threads from taking every core.)
                        std::thread::sleep(Duration::from_millis(20));
                    } else {
                        assert!(reply.starts_with("-TRYAGAIN"), "{reply:?}");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                (checked, throttled)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// 50 sources guessing at one user at once got 69 checked guesses in 10 s
/// where the docs promise about `user_burst` + 1 a second (≈ 30): attempts
/// passed the throttle while up to 64 waited in the login queue, and the
/// bucket overflowed (the real user then waited up to 48 s). Now the charge
/// is taken when the check starts: the checked guesses stay within
/// `user_burst + user_per_sec × t + 1`, and right after the attack the user
/// is told to wait at most `1 / user_per_sec` s.
#[test]
fn guesses_at_one_user_from_fifty_addresses_at_once_stay_within_its_bucket() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![user("app", "app-pw", &["*"], &["*"], &["*"])];
    cfg.auth.user_burst = 20;
    cfg.auth.user_per_sec = 1.0;
    let mq = start(cfg);
    let addr = mq.local_addr();
    let t0 = Instant::now();
    let (checked, throttled) = guess_from_fifty(addr, t0 + Duration::from_secs(5));
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("{checked} guesses checked, {throttled} throttled in {secs:.1} s");
    assert!(checked as f64 <= 20.0 + secs + 1.0, "{checked} guesses checked in {secs:.1} s");
    assert!(throttled > 0);
    let told = call_from(loopback(77), addr, &["AUTH", "app", "app-pw"]);
    assert!(
        told == "+OK\r\n" || told == "-ERR too many failed logins for user app; retry in 1 s\r\n",
        "right after the attack, a wait of one drain at most: {told:?}"
    );
}

/// One `redis.Redis(username=..., password='wrong').ping()` (redis-py
/// retries a failed login) made 11 failed logins in 4 s, filled its
/// address's burst of 10, and the admin's right login from the same address
/// was refused. Now the same wrong password from the same address for the
/// same user is refused at once, unchecked and not counted again: after 20
/// of them (and 20 at /ui), the right password logs in at once.
#[test]
fn a_client_repeating_a_wrong_password_does_not_lock_out_its_host() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![user("app", "app-pw", &["*"], &["*"], &["*"])];
    with_admin(&pg, &mut cfg);
    let mq = start(cfg);
    let addr = mq.local_addr();
    let client = redis::Client::open(format!("redis://app:stale-pw@{addr}/")).unwrap();
    for _ in 0..20 {
        assert!(client.get_connection_with_timeout(Duration::from_secs(10)).is_err());
    }
    for _ in 0..20 {
        let e = redis::cmd("AUTH").arg("app").arg("stale-pw").query::<String>(&mut connect(addr)).unwrap_err();
        assert_eq!(e.code(), Some("WRONGPASS"), "answered as a wrong password: {e}");
    }
    let admin = mq.admin_addr().unwrap();
    for _ in 0..20 {
        assert_eq!(ui_login(admin, "app:stale-pw"), 401);
    }
    let mut app = login(addr, "app", "app-pw");
    assert_eq!(ui_login(admin, "app:app-pw"), 200);
    assert!(info_field(&mut app, "auth_repeated") >= 59, "the repeats were not checked");
    assert!(info_field(&mut app, "auth_failures") >= 60, "but counted as failures");
}

/// `POST /ui/api/login` with `Authorization: Basic <user:password>`: the status.
fn ui_login(admin: SocketAddr, credentials: &str) -> u16 {
    use base64::Engine;
    use std::io::Read;
    let basic = base64::engine::general_purpose::STANDARD.encode(credentials);
    let mut s = TcpStream::connect(admin).unwrap();
    write!(s, "POST /ui/api/login HTTP/1.1\r\nAuthorization: Basic {basic}\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Failed and throttled RESP logins only raised counters. Now each is
/// logged at warn with the address and the user name — one line per
/// address per 10 s, with a count — and never the password.
#[test]
fn a_failed_login_is_logged_with_the_user_and_address_and_never_the_password() {
    let pg = Postgres::start().unwrap();
    let dir = pg.dir().join("logged");
    std::fs::create_dir_all(&dir).unwrap();
    let table = mwmq::users::user_table("app", b"app-pw", &["*".into()], &[], &[]).unwrap();
    let file = dir.join("mwmq.toml");
    std::fs::write(&file, &table).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let log = dir.join("mwmq.log");
    let sink = std::fs::File::create(&log).unwrap();
    let mq = MqProcess::start_with(&pg, 0, &["--config", file.to_str().unwrap()], sink.into());
    let t0 = Instant::now();
    for i in 0..3 {
        assert!(
            call_from(loopback(5), mq.addr, &["AUTH", "app", &format!("secret-guess-{i}")]).starts_with("-WRONGPASS")
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    let lines = || -> Vec<String> {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().filter(|l| l.contains("failed login")).map(String::from).collect()
    };
    assert!(eventually(Duration::from_secs(30), || !lines().is_empty()), "logged");
    let found = lines();
    assert!(found.len() <= 1 + (secs / 10.0) as usize, "one line per address per 10 s: {found:?}");
    assert!(found[0].contains("WARN"), "{found:?}");
    assert!(found[0].contains("failed login over AUTH from 127.0.0.7 as user \"app\": wrong password"), "{found:?}");
    let all = std::fs::read_to_string(&log).unwrap();
    assert!(!all.contains("secret-guess"), "never the password: {all}");
}

/// A scrape with a wrong admin token got 200 and the public view, silently.
/// Now a wrong token hears 401 and counts as a failed login of its address
/// (in the same throttle as RESP logins); no token is the public view.
#[test]
fn a_wrong_admin_token_on_metrics_is_refused_and_counted() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    with_admin(&pg, &mut cfg);
    cfg.users = vec![user("app", "app-pw", &["*"], &["*"], &["*"])];
    cfg.auth.address_burst = 3;
    cfg.auth.address_per_sec = 0.01;
    let mq = start(cfg);
    let admin = mq.admin_addr().unwrap();
    let scrape = |token: &str| {
        use std::io::Read;
        let mut s = TcpStream::connect(admin).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    };
    assert_eq!(get(admin, "/metrics", false).0, 200, "no token: the public view");
    assert_eq!(get(admin, "/metrics", true).0, 200);
    for i in 0..3 {
        let wrong = scrape(&format!("wrong-token-{i}"));
        assert!(wrong.starts_with("HTTP/1.1 401") && wrong.contains("wrong admin token"), "{wrong}");
    }
    let locked = call_from("127.0.0.1".parse().unwrap(), mq.local_addr(), &["AUTH", "app", "app-pw"]);
    assert!(locked.starts_with("-ERR too many failed logins from 127.0.0.1"), "{locked:?}");
    assert!(scrape(TOKEN).starts_with("HTTP/1.1 429"), "the right token too, unchecked");
    assert_eq!(get(admin, "/metrics", false).0, 200, "the public view stays");
}
