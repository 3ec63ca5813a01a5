//! The `/ui` page on the admin port, in headless Chromium as a user sees it
//! (the figures are QINFO's, the buttons pause, resume and redrive, a
//! dead letter's body is shown as text), and its JSON paths as an attacker
//! meets them (no session, a forged one, a user without the right, guessed
//! passwords, no login configured).

#[path = "../common/mod.rs"]
mod common;

mod browser;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use mctest::Postgres;
use mwmq::Service;
use serde_json::Value;

use browser::Browser;

const TOKEN: &str = "ui-test-admin-token-0123456789";

/// A request to the admin endpoint: the status and the body.
fn http(addr: SocketAddr, method: &str, path: &str, auth: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
    (status, format!("{head}\r\n\r\n{body}"))
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

/// Logs in through the API: the session.
fn session(addr: SocketAddr, auth: &str) -> String {
    let (status, text) = http(addr, "POST", "/ui/api/login", Some(auth));
    assert_eq!(status, 200, "{text}");
    let body: Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
    body["session"].as_str().unwrap().to_string()
}

/// mwmq with the admin endpoint, the token and two users: `boss` (every
/// right) and `worker` (sends and receives, administers nothing).
fn configured(pg: &Postgres, burst: u32) -> mwmq::Config {
    let mut cfg = config(pg);
    cfg.stats.admin = Some("127.0.0.1:0".into());
    let file = pg.dir().join("admin-token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    cfg.stats.admin_token_file = Some(file.display().to_string());
    cfg.users =
        vec![user("boss", "boss pass", &["*"], &["*"], &["*"]), user("worker", "work pass", &["*"], &["*"], &[])];
    cfg.auth.address_burst = burst;
    // The charts' rates sampled twice a second (ten seconds by default).
    cfg.queues.rates_sample_ms = 500;
    cfg
}

/// Queues with something in every column: `jobs` (ready, delayed, leased,
/// limits, one dead letter in `dead`), `dead`, `kept` (retention, a
/// backoff, ready messages of two priorities).
fn fill(c: &mut redis::Connection) {
    for args in [
        &["QCREATE", "dead"][..],
        &["QCREATE", "jobs", "MAXDELIVERIES", "1", "DEADLETTER", "dead"],
        &["QCREATE", "kept", "RETAIN", "60000"],
    ] {
        assert_eq!(q::<String>(c, args), "OK");
    }
    // A message that fails its one delivery goes to `dead`; its body is markup.
    let _: i64 = q(c, &["SEND", "jobs", "<img src=x onerror=\"window.pwned=1\">poison"]);
    let got = recv(c, "jobs", &[]);
    let (id, lease) = (got[0].0.to_string(), got[0].1.to_string());
    let _: i64 = q(c, &["NACK", "jobs", &id, &lease]);
    assert!(recv(c, "jobs", &[]).is_empty(), "dead-lettered, not delivered again");
    assert_eq!(q::<String>(c, &["QALTER", "jobs", "CONCURRENCY", "3", "RATE", "50/s"]), "OK");
    for i in 0..5 {
        let _: i64 = q(c, &["SEND", "jobs", &format!("job {i}")]);
    }
    for i in 0..2 {
        let _: i64 = q(c, &["SEND", "jobs", &format!("later {i}"), "DELAY", "600000"]);
    }
    assert_eq!(recv(c, "jobs", &["COUNT", "2"]).len(), 2);
    let _: i64 = q(c, &["SEND", "kept", "k"]);
    let got = recv(c, "kept", &[]);
    let _: i64 = q(c, &["ACK", "kept", &got[0].0.to_string(), &got[0].1.to_string()]);
    assert_eq!(q::<String>(c, &["QALTER", "kept", "BACKOFF", "1000", "60000", "JITTER", "20"]), "OK");
    let _: i64 = q(c, &["SEND", "kept", "urgent", "PRIORITY", "4"]);
    let _: i64 = q(c, &["SEND", "kept", "normal"]);
}

/// A field of a queue's row as the page shows it (its `data-value`).
fn shown(b: &mut Browser, queue: &str, field: &str) -> String {
    let v = b.eval(&format!(
        "document.querySelector('tr[data-queue=\"{queue}\"] td[data-field=\"{field}\"]')?.dataset.value ?? null"
    ));
    v.as_str().unwrap_or_else(|| panic!("no {field} for {queue}: {v}")).to_string()
}

fn click(b: &mut Browser, action: &str, queue: &str) {
    let clicked = b.eval(&format!(
        "(() => {{ const e = document.querySelector('button[data-action=\"{action}\"][data-queue=\"{queue}\"]');
                  if (!e || e.disabled) return false; e.click(); return true; }})()"
    ));
    assert_eq!(clicked, Value::Bool(true), "a {action} button for {queue}, enabled");
}

fn log_in(b: &mut Browser, user: &str, password: &str, token: &str) {
    b.wait("!document.getElementById('login').hidden", Duration::from_secs(10));
    let fill = format!(
        "document.getElementById('user').value = {user:?}; document.getElementById('password').value = {password:?};
         document.getElementById('token').value = {token:?};
         document.getElementById('login-form').requestSubmit(); true"
    );
    b.eval(&fill);
}

#[test]
fn the_page_shows_what_qinfo_says_and_its_buttons_act() {
    let pg = Postgres::start().unwrap();
    let mq = start(configured(&pg, 10));
    let admin = mq.admin_addr().unwrap();
    let mut c = login(mq.local_addr(), "boss", "boss pass");
    fill(&mut c);

    let mut b = Browser::start();
    b.open(&format!("http://{admin}/ui"));
    // Nothing shown before a login; then the queues.
    log_in(&mut b, "boss", "boss pass", "");
    b.wait("document.querySelector('tr[data-queue=\"jobs\"]')", Duration::from_secs(15));
    assert_eq!(b.eval("document.getElementById('login-name').textContent"), "logged in as boss");
    let names = b.eval("[...document.querySelectorAll('#queues tbody tr')].map(r => r.dataset.queue)");
    assert_eq!(names, serde_json::json!(["dead", "jobs", "kept"]));

    // Every figure as QINFO gives it (nothing moves meanwhile; the oldest
    // age grows, so it is checked against QINFO's before and after).
    for queue in ["jobs", "dead", "kept"] {
        let before = qinfo(&mut c, queue);
        b.eval("refresh().then(() => true)");
        let after = qinfo(&mut c, queue);
        for field in ["ready", "delayed", "leased", "dead_letters_held", "paused"] {
            assert_eq!(shown(&mut b, queue, field), after[field], "{queue} {field}");
        }
        let age: i64 = shown(&mut b, queue, "oldest_ready_ms").parse().unwrap();
        let (lo, hi): (i64, i64) =
            (before["oldest_ready_ms"].parse().unwrap(), after["oldest_ready_ms"].parse().unwrap());
        assert!(lo <= age && age <= hi, "{queue} oldest: {lo} <= {age} <= {hi}");
    }
    let jobs = qinfo(&mut c, "jobs");
    assert_eq!((jobs["ready"].as_str(), jobs["delayed"].as_str(), jobs["leased"].as_str()), ("3", "2", "2"));
    let limits = b.eval("document.querySelector('tr[data-queue=\"jobs\"] td[data-field=\"limits\"]').textContent");
    let limits = limits.as_str().unwrap();
    for part in ["concurrency 3", "rate 50/s", "max deliveries 1 → dead"] {
        assert!(limits.contains(part), "{limits}");
    }
    assert!(b
        .eval("document.querySelector('tr[data-queue=\"kept\"] td[data-field=\"limits\"]').textContent")
        .as_str()
        .unwrap()
        .contains("retain 1.0 min (1 kept)"));
    // Priorities under the ready count, highest first, and the backoff among the limits.
    let levels = b.eval(
        "document.querySelector('tr[data-queue=\"kept\"] [data-field=\"ready_by_priority\"]')?.textContent ?? null",
    );
    assert_eq!(levels, "p4 1 · p0 1");
    assert!(b
        .eval("document.querySelector('tr[data-queue=\"kept\"] td[data-field=\"limits\"]').textContent")
        .as_str()
        .unwrap()
        .contains("backoff 1.0 s–1.0 min ±20%"));
    assert_eq!(
        b.eval("document.querySelector('tr[data-queue=\"jobs\"] [data-field=\"ready_by_priority\"]') === null"),
        Value::Bool(true),
        "a queue without priorities shows none"
    );

    // The charts: once the rates thread has sampled, jobs' sends show.
    b.wait(
        "(() => { const p = document.querySelector('tr[data-queue=\"jobs\"] polyline.sent');
                  return p && p.getAttribute('points').split(' ').some(xy => Number(xy.split(',')[1]) < 20); })()",
        Duration::from_secs(30),
    );

    // Dead letters: jobs' one, held in dead, its markup shown as text.
    b.eval("document.querySelector('tr[data-queue=\"jobs\"] td.name button').click(); true");
    b.wait("document.querySelector('#dead-letters tbody tr')", Duration::from_secs(10));
    let dead: Vec<Vec<redis::Value>> = q(&mut c, &["QDEAD", "jobs"]);
    assert_eq!(dead.len(), 1);
    let id = match &dead[0][0] {
        redis::Value::Int(i) => i.to_string(),
        other => panic!("{other:?}"),
    };
    let row = b.eval("[...document.querySelectorAll('#dead-letters tbody tr td')].map(t => t.textContent)");
    assert_eq!(row[0], id.as_str());
    assert_eq!(
        (row[1].as_str(), row[2].as_str(), row[3].as_str()),
        (Some("dead"), Some("jobs"), Some("max_deliveries"))
    );
    assert_eq!(row[7], "<img src=x onerror=\"window.pwned=1\">poison", "the body as text");
    assert_eq!(b.eval("document.querySelectorAll('img').length"), 0, "no markup from a body");
    assert_eq!(b.eval("window.pwned === undefined"), true, "no script from a body");
    assert_eq!(b.eval("document.getElementById('dead-where').textContent"), "(held in dead)");

    // Schedules: listed with their next run and last run, as QSCHEDULES has
    // them; a name made of markup shown as text.
    assert_eq!(q::<String>(&mut c, &["QCREATE", "ticks"]), "OK");
    let _: String = q(&mut c, &["QSCHEDULE", "<i>beat</i>", "ticks", "* * * * * *", "tick {tick}"]);
    let _: String =
        q(&mut c, &["QSCHEDULE", "yearly", "jobs", "@yearly", "x", "TZ", "Europe/Berlin", "CATCHUP", "one"]);
    let last_run = "document.querySelector('tr[data-schedule=\"<i>beat</i>\"] td[data-field=\"last_run_ms\"]')";
    b.wait(
        &format!("(async () => {{ await refresh(); return ({last_run}?.dataset.value ?? 'null') !== 'null'; }})()"),
        Duration::from_secs(30),
    );
    let listed: Vec<std::collections::HashMap<String, redis::Value>> = q(&mut c, &["QSCHEDULES"]);
    let yearly = listed.iter().find(|m| m["name"] == redis::Value::BulkString(b"yearly".to_vec())).unwrap();
    let next = match yearly["next_run_ms"] {
        redis::Value::Int(n) => n,
        ref other => panic!("{other:?}"),
    };
    let cell = |b: &mut Browser, name: &str, field: &str, what: &str| {
        b.eval(&format!(
            "document.querySelector('tr[data-schedule=\"{name}\"] td[data-field=\"{field}\"]')?.{what} ?? null"
        ))
    };
    assert_eq!(cell(&mut b, "yearly", "next_run_ms", "dataset.value"), next.to_string().as_str());
    assert_eq!(cell(&mut b, "yearly", "last_run_ms", "textContent"), "not yet");
    assert_eq!(cell(&mut b, "yearly", "cron", "textContent"), "@yearly (Europe/Berlin)");
    assert_eq!(cell(&mut b, "yearly", "catchup", "textContent"), "one");
    assert_eq!(cell(&mut b, "yearly", "state", "textContent"), "active");
    assert!(cell(&mut b, "<i>beat</i>", "last_run_ms", "textContent").as_str().unwrap().contains(" ago"));
    let names = b.eval("[...document.querySelectorAll('#schedules tbody tr td.name')].map(t => t.textContent)");
    assert_eq!(names, serde_json::json!(["<i>beat</i>", "yearly"]));
    assert_eq!(b.eval("document.querySelectorAll('#schedules i').length"), 0, "no markup from a name");
    let (status, body) = http(admin, "GET", "/ui/api/schedules", None);
    assert_eq!(status, 401, "{body}");

    if let Ok(path) = std::env::var("MWMQ_UI_SCREENSHOT") {
        std::fs::write(path, b.screenshot()).unwrap();
    }

    // Pause and resume by the buttons.
    click(&mut b, "pause", "jobs");
    assert!(eventually(Duration::from_secs(10), || qinfo(&mut c, "jobs")["paused"] == "1"), "paused by the button");
    b.wait(
        "document.querySelector('tr[data-queue=\"jobs\"] td.state').textContent === 'paused'",
        Duration::from_secs(10),
    );
    assert!(recv(&mut c, "jobs", &[]).is_empty(), "a paused queue hands out nothing");
    click(&mut b, "resume", "jobs");
    assert!(eventually(Duration::from_secs(10), || qinfo(&mut c, "jobs")["paused"] == "0"), "resumed");

    // Redrive: the dead letter goes back to jobs.
    b.wait("document.querySelector('button[data-action=\"redrive\"][data-queue=\"dead\"]')", Duration::from_secs(10));
    click(&mut b, "redrive", "dead");
    assert!(eventually(Duration::from_secs(10), || qinfo(&mut c, "dead")["dead_letters_held"] == "0"));
    assert_eq!(qinfo(&mut c, "jobs")["ready"], "4", "back in jobs");
    b.wait(
        "document.getElementById('action-error').textContent.includes('1 dead letters moved back')",
        Duration::from_secs(10),
    );

    // A user without the admin right: sees, may not steer (NOPERM, shown).
    b.eval("logOut().then(() => true)");
    log_in(&mut b, "worker", "work pass", "");
    b.wait("document.getElementById('login-name').textContent === 'logged in as worker'", Duration::from_secs(15));
    b.wait(
        "document.querySelector('button[data-action=\"pause\"][data-queue=\"jobs\"]:enabled')",
        Duration::from_secs(10),
    );
    click(&mut b, "pause", "jobs");
    b.wait("document.getElementById('action-error').textContent.includes('NOPERM')", Duration::from_secs(10));
    assert_eq!(qinfo(&mut c, "jobs")["paused"], "0", "the worker could not pause");

    // The admin token logs in too; a wrong password says so.
    b.eval("logOut().then(() => true)");
    log_in(&mut b, "boss", "wrong", "");
    b.wait("document.getElementById('login-error').textContent.includes('wrong')", Duration::from_secs(10));
    log_in(&mut b, "", "", TOKEN);
    b.wait("document.getElementById('login-name').textContent === 'logged in as admin token'", Duration::from_secs(15));
    assert!(
        !b.eval("document.documentElement.outerHTML").as_str().unwrap().contains(TOKEN),
        "the token is not kept in the page"
    );
}

#[test]
fn the_api_refuses_without_a_session_and_with_forged_or_weak_ones() {
    let pg = Postgres::start().unwrap();
    let mq = start(configured(&pg, 4));
    let admin = mq.admin_addr().unwrap();
    let mut c = login(mq.local_addr(), "boss", "boss pass");
    fill(&mut c);

    // The page's files come with a strict policy: their own script only, never framed.
    let (status, page) = http(admin, "GET", "/ui", None);
    assert_eq!(status, 200);
    for h in [
        "Content-Security-Policy: default-src 'none'; script-src 'self'",
        "X-Frame-Options: DENY",
        "Cache-Control: no-store",
    ] {
        assert!(page.contains(h), "{h}");
    }
    assert!(!page.contains("<script>"), "no inline script");

    // No session, a forged one, the admin token itself (sessions only), a user's password as a bearer.
    for auth in [None, Some("Bearer 0000"), Some(&*format!("Bearer {TOKEN}")), Some(&*basic("boss", "boss pass"))] {
        let (status, text) = http(admin, "GET", "/ui/api/queues", auth);
        assert_eq!(status, 401, "{auth:?}");
        // Says how to log in, for a client that is not the page (curl).
        assert!(text.contains("POST /ui/api/login with Authorization: Basic"), "{text}");
        assert_eq!(http(admin, "GET", "/ui/api/dead/jobs", auth).0, 401, "{auth:?}");
        assert_eq!(http(admin, "POST", "/ui/api/pause/jobs", auth).0, 401, "{auth:?}");
    }
    assert_eq!(qinfo(&mut c, "jobs")["paused"], "0");

    // A user without the admin right: figures yes; bodies and buttons NOPERM.
    let worker = format!("Bearer {}", session(admin, &basic("worker", "work pass")));
    assert_eq!(http(admin, "GET", "/ui/api/queues", Some(&worker)).0, 200);
    let (status, text) = http(admin, "POST", "/ui/api/pause/jobs", Some(&worker));
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("NOPERM"), "{text}");
    assert_eq!(http(admin, "GET", "/ui/api/dead/jobs", Some(&worker)).0, 403);
    assert_eq!(http(admin, "POST", "/ui/api/redrive/dead", Some(&worker)).0, 403);
    assert_eq!(qinfo(&mut c, "jobs")["paused"], "0");

    // The boss's session acts; a queue name is decoded, an unknown one is 404, an unknown verb 405.
    let boss = format!("Bearer {}", session(admin, &basic("boss", "boss pass")));
    assert_eq!(http(admin, "POST", "/ui/api/pause/jobs", Some(&boss)).0, 200);
    assert_eq!(qinfo(&mut c, "jobs")["paused"], "1");
    assert_eq!(http(admin, "POST", "/ui/api/resume/%6Aobs", Some(&boss)).0, 200);
    assert_eq!(qinfo(&mut c, "jobs")["paused"], "0");
    assert_eq!(http(admin, "POST", "/ui/api/pause/nope", Some(&boss)).0, 404);
    assert_eq!(http(admin, "POST", "/ui/api/drop/jobs", Some(&boss)).0, 405);
    assert_eq!(http(admin, "POST", "/ui/api/pause/bad%zz", Some(&boss)).0, 400);
    let (status, text) = http(admin, "GET", "/ui/api/queues?match=ob", Some(&boss));
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["total"], 1, "filtered by name");
    assert_eq!(body["queues"][0]["info"]["ready"], 3);
    // A session ends at logout.
    assert_eq!(http(admin, "POST", "/ui/api/logout", Some(&boss)).0, 200);
    assert_eq!(http(admin, "POST", "/ui/api/pause/jobs", Some(&boss)).0, 401);

    // Guessing: each failure counts against the address; past the burst, refused unchecked.
    let mut statuses = Vec::new();
    for i in 0..8 {
        statuses.push(http(admin, "POST", "/ui/api/login", Some(&basic("boss", &format!("guess {i}")))).0);
    }
    assert!(statuses.iter().all(|s| *s == 401 || *s == 429), "{statuses:?}");
    assert!(statuses.iter().filter(|s| **s == 401).count() <= 5, "throttled after the burst: {statuses:?}");
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    // ... even the right password, told so with when to come back; token guesses count too.
    let (status, text) = http(admin, "POST", "/ui/api/login", Some(&basic("boss", "boss pass")));
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("\r\nRetry-After: "), "{text}");
    assert!(text.contains("too many failed logins from 127.0.0.1; retry in "), "{text}");
    assert_eq!(http(admin, "POST", "/ui/api/login", Some("Bearer guess")).0, 429);
}

/// A user without rights who logged in 64 times in 2.5 s ended the admin's
/// session (the least recently used of 64 went). Now a user has at most 8
/// sessions and its own oldest goes: the admin's outlives another user's
/// 100 logins.
#[test]
fn another_users_logins_do_not_end_the_admins_session() {
    let pg = Postgres::start().unwrap();
    let mq = start(configured(&pg, 10));
    let admin = mq.admin_addr().unwrap();
    let boss = format!("Bearer {}", session(admin, &basic("boss", "boss pass")));
    let token = format!("Bearer {}", session(admin, &format!("Bearer {TOKEN}")));
    let mut sessions = Vec::new();
    for _ in 0..100 {
        sessions.push(session(admin, &basic("worker", "work pass")));
    }
    for s in [&boss, &token] {
        let (status, text) = http(admin, "GET", "/ui/api/session", Some(s));
        assert_eq!(status, 200);
        assert!(text.contains("\"login\":\"boss\"") || text.contains("\"login\":\"admin token\""), "{text}");
        assert_eq!(http(admin, "GET", "/ui/api/queues", Some(s)).0, 200, "still logged in");
    }
    assert_eq!(
        http(admin, "GET", "/ui/api/queues", Some(&format!("Bearer {}", sessions[0]))).0,
        401,
        "its own oldest went"
    );
    assert_eq!(http(admin, "GET", "/ui/api/queues", Some(&format!("Bearer {}", sessions[99]))).0, 200);
}

#[test]
fn without_a_login_configured_the_page_shows_figures_only() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.stats.admin = Some("127.0.0.1:0".into());
    let mq = start(cfg);
    let admin = mq.admin_addr().unwrap();
    let mut c = connect(mq.local_addr());
    fill(&mut c);
    let (status, text) = http(admin, "GET", "/ui/api/queues", None);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"name\":\"jobs\""), "{text}");
    for (method, path) in
        [("GET", "/ui/api/dead/jobs"), ("POST", "/ui/api/pause/jobs"), ("POST", "/ui/api/redrive/dead")]
    {
        let (status, text) = http(admin, method, path, None);
        assert_eq!(status, 403, "{path}: {text}");
        assert!(text.contains("no login is configured"), "{text}");
    }
    assert_eq!(http(admin, "POST", "/ui/api/login", Some("Bearer anything")).0, 403);
    assert_eq!(qinfo(&mut c, "jobs")["paused"], "0");
    assert_eq!(qinfo(&mut c, "dead")["dead_letters_held"], "1");
}

/// The page's JSON gave a queue's `rate_per_sec` as a string (`"2.5"`:
/// QINFO's text, as RESP2 carries a fraction) where every other figure is
/// a number. Now every figure of the queues and the schedules is a JSON
/// number, text only where it is text (names, a dead-letter queue, a
/// schedule's expression, zone, state).
#[test]
fn the_api_gives_figures_as_numbers() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.stats.admin = Some("127.0.0.1:0".into());
    let mq = start(cfg);
    let admin = mq.admin_addr().unwrap();
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "limited", "RATE", "2.5/s", "CONCURRENCY", "3"]), "OK");
    let _: i64 = q(&mut c, &["SEND", "limited", "x", "PRIORITY", "2"]);
    let json = |path: &str| -> Value {
        let (status, text) = http(admin, "GET", path, None);
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap()
    };
    let info = &json("/ui/api/queues")["queues"][0]["info"];
    assert_eq!(info["rate_per_sec"], serde_json::json!(2.5), "{info}");
    let texts = ["dead_letter"];
    for (k, v) in info.as_object().unwrap() {
        match k.as_str() {
            "ready_by_priority" => assert_eq!(v, &serde_json::json!({ "2": 1 })),
            k if texts.contains(&k) => assert!(v.is_string() || v.is_null(), "{k}: {v}"),
            k => assert!(v.is_number(), "{k} is {v}, not a number"),
        }
    }
    let _: String = q(&mut c, &["QSCHEDULE", "yearly", "limited", "@yearly", "x", "PRIORITY", "5", "GROUP", "g"]);
    let schedules = json("/ui/api/schedules");
    let s = &schedules["schedules"][0];
    let texts = ["name", "queue", "cron", "tz", "catchup", "key_prefix", "created_by", "group", "state", "reason"];
    for (k, v) in s.as_object().unwrap() {
        if texts.contains(&k.as_str()) {
            assert!(v.is_string() || v.is_null(), "{k}: {v}");
        } else {
            assert!(
                v.is_number() || (v.is_null() && (k.ends_with("_ms") || k == "last_id")),
                "{k} is {v}, not a number"
            );
        }
    }
    assert_eq!(
        (&s["priority"], &s["group"], &s["state"]),
        (&serde_json::json!(5), &serde_json::json!("g"), &serde_json::json!("active"))
    );
    mq.stopper().stop();
    mq.join();
}
