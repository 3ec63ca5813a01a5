//! The `/ui` page on the admin port: every queue (what QINFO shows, and its
//! rates over the last minutes as small charts), one queue's latest dead
//! letters, and buttons that pause, resume and redrive for a logged-in
//! admin. The page is three static files compiled into mwmq (`ui/`), no
//! build step; it asks the JSON paths below and draws what they answer.
//!
//! **What runs.** Every figure and every button is a command run through the
//! same code as a RESP client's (`commands::Core`: the rights check, QINFO's
//! cache, the statement): QLIST, QINFO, QDEAD, QSCHEDULES, QPAUSE, QRESUME, REDRIVE. So
//! the page shows what QINFO says and may do what the logged-in user may do
//! over RESP, no more.
//!
//! **Logging in.** With the admin token (`[stats] admin_token_file`: every
//! right) or a user's name and password (`[[users]]`: that user's rights),
//! `POST /ui/api/login` hands out a session: 32 random bytes the page keeps
//! in the tab (`sessionStorage`) and sends as `Authorization: Bearer`; it
//! ends after [`IDLE`] without use or [`LIFETIME`] in all, or at logout. A
//! user has at most [`sessions::MAX_PER_OWNER`] (its oldest goes), and when
//! [`MAX_SESSIONS`] are open a new user's login is refused — one user can
//! never end another's session ([`sessions`]).
//! Passwords are checked one at a time with argon2 (one memory block kept),
//! and failures are throttled by source address and user name as RESP
//! logins are (the same throttle; a throttled login hears `429` with
//! `Retry-After`). Nothing is kept in a cookie, so another site cannot make
//! a browser act on the page (no CSRF); the page may not be framed, and runs
//! no script but its own (its Content-Security-Policy).
//!
//! **Without a login configured** (no users, no token) the queues' figures
//! are shown as `/metrics` shows its counters, but dead letters (they hold
//! bodies) and the buttons are refused: the page is never open to changes.

pub mod sessions;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mwserve::http::{Page, Request};
use serde_json::{json, Value};

use crate::command::{Command, MAX_REDRIVE};
use crate::commands::{Core, DbFacts, Outcome, Pooled, Session};
use crate::resp::Reply;
use crate::shared::Shared;
use crate::users::{Attempts, User};
use mwserve::throttle::Attempt;

use sessions::{Login, Refused};
pub use sessions::{Ui, IDLE, LIFETIME, MAX_PER_OWNER, MAX_SESSIONS};

/// Where the page lives.
pub const PREFIX: &str = "/ui";
/// Queues the page lists at most (the others are counted, not listed).
pub const MAX_LISTED: usize = 200;
/// Dead letters the page shows at most.
pub const DEAD_SHOWN: u32 = 20;
/// Bytes of a body the page shows.
pub const BODY_SHOWN: usize = 512;

const HTML: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/ui.css");

/// The headers of the page and its files: only its own script and style,
/// never in a frame, nothing cached, no referrer.
const STRICT: &[(&str, &str)] = &[
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
         frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
];

/// The page's answer to `r`, if it is one of its paths.
pub fn route(shared: &Shared, ui: &Ui, r: &Request) -> Option<Page> {
    let path = r.path.strip_prefix(PREFIX)?;
    let file = |content_type, body: &str| Page { headers: STRICT, ..Page::ok(content_type, body.to_string()) };
    let page = match (r.method, path) {
        ("GET", "" | "/") => file("text/html; charset=utf-8", HTML),
        ("GET", "/app.js") => file("text/javascript; charset=utf-8", SCRIPT),
        ("GET", "/ui.css") => file("text/css; charset=utf-8", STYLE),
        ("GET", "/api/session") => answer(whoami(shared, ui, r)),
        ("POST", "/api/login") => login_page(shared, ui, r),
        ("POST", "/api/logout") => {
            if let Some(id) = bearer(r) {
                ui.close(id);
            }
            answer(Ok(json!({ "ok": true })))
        }
        ("GET", "/api/queues") => answer(viewer(shared, ui, r).and_then(|l| queues(shared, &l, r.query))),
        ("GET", "/api/schedules") => answer(viewer(shared, ui, r).and_then(|l| schedules(shared, &l))),
        ("GET", p) if p.starts_with("/api/dead/") => {
            answer(queue_of(&p["/api/dead/".len()..]).and_then(|q| dead_letters(shared, &acting(shared, ui, r)?, &q)))
        }
        ("POST", p) if p.starts_with("/api/") => {
            let (verb, q) = p["/api/".len()..].split_once('/')?;
            let command: fn(String) -> Command = match verb {
                "pause" => |q| Command::Pause(q, true),
                "resume" => |q| Command::Pause(q, false),
                "redrive" => |queue| Command::Redrive { queue, to: None, count: MAX_REDRIVE },
                _ => return None,
            };
            answer(queue_of(q).and_then(|q| act(shared, &acting(shared, ui, r)?, command(q))))
        }
        _ => return None,
    };
    Some(page)
}

fn answer(v: Result<Value, Refused>) -> Page {
    match v {
        Ok(v) => Page { headers: STRICT, ..Page::json(200, &v) },
        Err(Refused(status, why)) => Page { headers: STRICT, ..Page::json(status, &json!({ "error": why })) },
    }
}

fn bearer<'a>(r: &Request<'a>) -> Option<&'a str> {
    r.authorization.and_then(|a| a.strip_prefix("Bearer ")).map(str::trim)
}

/// Whether anyone can log in: users or the admin token configured.
fn login_configured(shared: &Shared, r: &Request) -> bool {
    shared.users.enabled() || r.token_configured
}

/// Who may look: the session's login; nobody when no login is configured.
fn viewer(shared: &Shared, ui: &Ui, r: &Request) -> Result<Login, Refused> {
    if !login_configured(shared, r) {
        return Ok(Login::Nobody);
    }
    acting(shared, ui, r)
}

/// The refusal of a request without a session: how to get one (a client
/// such as curl reads it; the page shows its own login form).
const LOG_IN_FIRST: &str = "log in first: POST /ui/api/login with Authorization: Basic (a user's name and \
                            password) or Bearer (the admin token), then send the session it answers as \
                            Authorization: Bearer SESSION";

/// Who may act (and read bodies): a session's login, never nobody.
fn acting(shared: &Shared, ui: &Ui, r: &Request) -> Result<Login, Refused> {
    if !login_configured(shared, r) {
        return Err(Refused(
            403,
            "no login is configured (no [[users]], no [stats] admin_token_file): the page shows figures only".into(),
        ));
    }
    bearer(r).and_then(|id| ui.session(id)).ok_or_else(|| Refused(401, LOG_IN_FIRST.into()))
}

fn whoami(shared: &Shared, ui: &Ui, r: &Request) -> Result<Value, Refused> {
    let login = bearer(r).and_then(|id| ui.session(id));
    Ok(json!({
        "users": shared.users.enabled(),
        "token": r.token_configured,
        "login": login.as_ref().and_then(Login::name),
        "rates": rates_period(shared),
    }))
}

/// How the rates are kept: the period, in seconds, and how many.
fn rates_period(shared: &Shared) -> Value {
    json!({ "sample_s": shared.config.queues.rates_sample_ms as f64 / 1000.0, "samples": crate::rates::SAMPLES })
}

/// What a login request offers.
enum Offered {
    /// `Authorization: Basic`: a user's name and password.
    User(String, String),
    /// `Authorization: Bearer`: the admin token (checked by the endpoint).
    Token,
    /// Neither.
    Nothing,
}

impl Offered {
    fn of(r: &Request) -> Offered {
        let auth = r.authorization.unwrap_or("");
        if let Some(b64) = auth.strip_prefix("Basic ") {
            use base64::Engine;
            let decoded = base64::engine::general_purpose::STANDARD.decode(b64.trim()).unwrap_or_default();
            let text = String::from_utf8_lossy(&decoded);
            let (name, password) = text.split_once(':').unwrap_or(("", ""));
            Offered::User(name.to_string(), password.to_string())
        } else if auth.starts_with("Bearer ") {
            Offered::Token
        } else {
            Offered::Nothing
        }
    }

    /// The login as the throttle sees it (`None` without credentials).
    fn attempt<'a>(&'a self, r: &'a Request) -> Option<Attempt<'a>> {
        let source = r.peer.map(mwserve::throttle::Source::ip);
        let (user, secret): (Option<&[u8]>, &[u8]) = match self {
            Offered::User(name, password) => (Some(name.as_bytes()), password.as_bytes()),
            Offered::Token => (None, bearer(r).unwrap_or("").as_bytes()),
            Offered::Nothing => return None,
        };
        Some(Attempt { source, user, secret, via: "/ui" })
    }
}

/// `POST /ui/api/login`: [`login`]'s answer; a throttled login hears `429`
/// with `Retry-After`.
fn login_page(shared: &Shared, ui: &Ui, r: &Request) -> Page {
    match login(shared, ui, r, Offered::of(r)) {
        Ok(v) => answer(Ok(v)),
        Err((refused, retry_after)) => Page { retry_after, ..answer(Err(refused)) },
    }
}

/// A login with `Authorization: Basic` (a user) or `Bearer` (the admin
/// token): a session. Within the logins' throttle, as RESP logins: charged
/// before the check, a password that failed lately refused unchecked; a
/// throttled one refused with the seconds to wait.
fn login(shared: &Shared, ui: &Ui, r: &Request, offered: Offered) -> Result<Value, (Refused, Option<u64>)> {
    if !login_configured(shared, r) {
        return Err((Refused(403, "no login is configured (no [[users]], no [stats] admin_token_file)".into()), None));
    }
    let wrong = || (Refused(401, "wrong user name, password or token".into()), None);
    match &offered {
        Offered::User(..) if !shared.users.enabled() => {
            return Err((Refused(403, "no users are configured: log in with the admin token".into()), None))
        }
        Offered::Token if !r.token_configured => {
            let why = "no admin token is configured: log in with a user's name and password";
            return Err((Refused(403, why.into()), None));
        }
        Offered::Nothing => {
            let why = "log in with Authorization: Basic (user:password) or Bearer (the admin token)";
            return Err((Refused(400, why.into()), None));
        }
        _ => {}
    }
    let attempt = offered.attempt(r).expect("credentials offered");
    let throttle = &shared.logins.throttle;
    match throttle.begin(&attempt) {
        Ok(()) => {}
        Err(mwserve::throttle::Refused::Repeated) => {
            shared.users.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(wrong());
        }
        Err(mwserve::throttle::Refused::Throttled(t)) => return Err((Refused(429, t.to_string()), Some(t.retry_secs))),
    }
    let login = match &offered {
        Offered::User(name, password) => {
            let mut verifier = ui.verifier.lock().unwrap_or_else(|p| p.into_inner());
            shared.users.check_with(name, password.as_bytes(), &mut verifier).map(Login::User)
        }
        _ => r.token.then_some(Login::Token),
    };
    throttle.checked(&attempt, login.is_some());
    let Some(login) = login else { return Err(wrong()) };
    let name = login.name();
    let peer = r.peer.map(|p| p.to_string()).unwrap_or_default();
    tracing::info!(%peer, user = name.as_deref().unwrap_or(""), "logged in to /ui");
    let session = ui.open(login).map_err(|e| (e, None))?;
    Ok(json!({ "session": session, "login": name }))
}

/// The page's connection as the commands see it: the login's user.
struct WebSession {
    user: Option<Arc<User>>,
    attempts: Attempts,
}

impl WebSession {
    fn of(login: &Login) -> WebSession {
        let user = match login {
            Login::User(u) => Some(u.clone()),
            Login::Nobody | Login::Token => None,
        };
        WebSession { user, attempts: Attempts::default() }
    }

    /// Why `login` may not run `c` (the token's holder may run anything).
    fn refusal(&self, core: &Core, login: &Login, c: &Command) -> Option<Reply> {
        if matches!(login, Login::Token) {
            return None;
        }
        core.gate(c, self)
    }
}

impl Session for WebSession {
    fn id(&self) -> u64 {
        0
    }
    fn name(&self) -> Option<String> {
        None
    }
    fn set_name(&self, _: String) {}
    fn user(&self) -> Option<Arc<User>> {
        self.user.clone()
    }
    fn set_user(&self, _: Arc<User>) {}
    fn resp3(&self) -> bool {
        false
    }
    fn set_resp3(&self, _: bool) {}
    fn attempts(&self) -> &Attempts {
        &self.attempts
    }
    fn peer(&self) -> Option<std::net::IpAddr> {
        None
    }
}

/// Runs `c` as `login` would over RESP (the token's holder past the rights
/// check); its reply.
fn run(shared: &Shared, login: &Login, c: &Command) -> Reply {
    let core = Core::new(shared);
    let s = WebSession::of(login);
    if let Some(refusal) = s.refusal(&core, login, c) {
        return refusal;
    }
    if let Some(Outcome::Reply(r, _, _)) = core.local(c, &s, None) {
        return r;
    }
    let mut facts = DbFacts::default();
    let outcome = Pooled::now(core.carry(&Pooled(&shared.pool), core.home(c), c, &s, &mut facts));
    match outcome {
        Ok(Outcome::Reply(r, leases, _)) => {
            // (None of the page's commands hands out messages.)
            debug_assert!(leases.is_empty());
            r
        }
        Ok(_) => Reply::err("unexpected outcome"),
        Err(e) => e.reply(),
    }
}

/// An error reply as an HTTP refusal.
fn refused(r: Reply) -> Result<Reply, Refused> {
    let Reply::Error(e) = r else { return Ok(r) };
    let status = match e.split(' ').next().unwrap_or("") {
        "NOPERM" | "NOAUTH" => 403,
        "NOQUEUE" => 404,
        "TRYAGAIN" => 503,
        _ => 400,
    };
    Err(Refused(status, e))
}

/// QINFO's fields that RESP carries as text (a rate with a fraction: RESP2
/// has no doubles) and JSON as numbers, as the page reads them.
const DECIMALS: [&str; 1] = ["rate_per_sec"];

/// QINFO's answer as JSON: [`to_json`], its [`DECIMALS`] as numbers.
fn info_json(info: &Reply) -> Value {
    let mut v = to_json(info);
    if let Value::Object(fields) = &mut v {
        for k in DECIMALS {
            if let Some(n) = fields.get(k).and_then(Value::as_str).and_then(|t| t.parse::<f64>().ok()) {
                fields.insert(k.into(), json!(n));
            }
        }
    }
    v
}

/// A reply as JSON: maps as objects, bulk strings as text.
fn to_json(r: &Reply) -> Value {
    match r {
        Reply::Simple(s) => json!(s),
        Reply::Error(e) => json!({ "error": e }),
        Reply::Int(i) => json!(i),
        Reply::Bulk(b) => json!(String::from_utf8_lossy(b)),
        Reply::Nil | Reply::NilArray => Value::Null,
        Reply::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Reply::Map(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    let k = match k {
                        Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                        other => to_json(other).to_string(),
                    };
                    (k, to_json(v))
                })
                .collect(),
        ),
    }
}

/// `GET /ui/api/queues[?match=text]`: the queues the login may see (at
/// most [`MAX_LISTED`], by name; those whose name contains `text`), each
/// with QINFO's fields and its rates.
fn queues(shared: &Shared, login: &Login, query: &str) -> Result<Value, Refused> {
    let filter = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("match="))
        .map(decode)
        .transpose()
        .map_err(|e| Refused(400, e))?
        .unwrap_or_default();
    let Reply::Array(names) = refused(run(shared, login, &Command::List { pending: false }))? else {
        return Err(Refused(500, "QLIST answered something else than a list".into()));
    };
    let names: Vec<String> = names
        .iter()
        .filter_map(|n| match n {
            Reply::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
        .filter(|n| n.contains(filter.as_str()))
        .collect();
    let shown: Vec<&str> = names.iter().take(MAX_LISTED).map(String::as_str).collect();
    let period = Duration::from_millis(shared.config.queues.rates_sample_ms);
    let infos = infos(shared, login, &shown);
    let listed: Vec<Value> = shown
        .iter()
        .map(|name| {
            let (series, _) = shared.rates.series(name, period);
            let info =
                infos.get(*name).cloned().unwrap_or_else(|| run(shared, login, &Command::QueueInfo(name.to_string())));
            json!({ "name": name, "info": info_json(&info), "rates": series })
        })
        .collect();
    Ok(json!({
        "queues": listed,
        "total": names.len(),
        "login": login.name(),
        "now_ms": mwstats::clock::unix_ms(),
        "rates": rates_period(shared),
    }))
}

/// `GET /ui/api/schedules`: the schedules of the queues the login may see
/// (QSCHEDULES), each with its next run and its last.
fn schedules(shared: &Shared, login: &Login) -> Result<Value, Refused> {
    let listed = refused(run(shared, login, &Command::Schedules))?;
    Ok(json!({ "schedules": to_json(&listed), "now_ms": mwstats::clock::unix_ms() }))
}

/// QINFO of each of `names` the login may see, as QINFO answers it: one
/// statement per database for them all (rather than one a queue), its
/// figures kept in QINFO's cache as a QINFO's are. A queue it does not
/// answer for (refused, gone, its database down) is left out: the caller
/// asks QINFO itself, which says why.
fn infos(shared: &Shared, login: &Login, names: &[&str]) -> HashMap<String, Reply> {
    let core = Core::new(shared);
    let s = WebSession::of(login);
    let mut by_db: HashMap<usize, Vec<&str>> = HashMap::new();
    for name in names {
        if s.refusal(&core, login, &Command::QueueInfo(name.to_string())).is_none() {
            by_db.entry(shared.pool.home(name)).or_default().push(name);
        }
    }
    let mut out = HashMap::new();
    for (db, names) in by_db {
        let found = shared.pool[db].with(async |pg| pg.infos(&names).await).and_then(|r| r);
        for (name, state) in found.unwrap_or_default() {
            shared.info_cache.put(&name, state.clone(), core.info_ttl());
            out.insert(name.clone(), crate::commands::queues::queue_info(&state, &shared.queues.get(&name)));
        }
    }
    out
}

/// `GET /ui/api/dead/QUEUE`: its latest dead letters (QDEAD), bodies cut to [`BODY_SHOWN`] bytes.
fn dead_letters(shared: &Shared, login: &Login, q: &str) -> Result<Value, Refused> {
    let reply = refused(run(shared, login, &Command::DeadLetters { queue: q.to_string(), count: DEAD_SHOWN }))?;
    let Reply::Array(rows) = reply else { return Err(Refused(500, "QDEAD answered something else".into())) };
    let letters: Vec<Value> = rows
        .iter()
        .filter_map(|row| match row {
            Reply::Array(f) if f.len() == 8 => {
                let body = match &f[7] {
                    Reply::Bulk(b) => b.as_slice(),
                    _ => &[],
                };
                let shown = &body[..body.len().min(BODY_SHOWN)];
                Some(json!({
                    "id": to_json(&f[0]), "queue": to_json(&f[1]), "from": to_json(&f[2]),
                    "reason": to_json(&f[3]), "deliveries": to_json(&f[4]), "sender": to_json(&f[5]),
                    "sent_at_ms": to_json(&f[6]), "size": body.len(),
                    "body": String::from_utf8_lossy(shown), "cut": shown.len() < body.len(),
                }))
            }
            _ => None,
        })
        .collect();
    Ok(json!({ "queue": q, "dead_letters": letters }))
}

/// A button: pause, resume or redrive.
fn act(shared: &Shared, login: &Login, c: Command) -> Result<Value, Refused> {
    let reply = refused(run(shared, login, &c))?;
    tracing::info!(user = login.name().as_deref().unwrap_or(""), queue = c.queue().unwrap_or(""), "/ui: {}", verb(&c));
    Ok(json!({ "ok": true, "reply": to_json(&reply) }))
}

fn verb(c: &Command) -> &'static str {
    match c {
        Command::Pause(_, true) => "QPAUSE",
        Command::Pause(_, false) => "QRESUME",
        Command::Redrive { .. } => "REDRIVE",
        _ => "command",
    }
}

/// The queue a path names (its last segment, percent-encoded).
fn queue_of(segment: &str) -> Result<String, Refused> {
    decode(segment).map_err(|e| Refused(400, e))
}

/// A percent-encoded path segment or query value, decoded (a queue name).
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(hex.ok_or_else(|| format!("bad percent-encoding in {s:?}"))?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_percent_decoded_and_bad_ones_refused() {
        assert_eq!(decode("jobs").unwrap(), "jobs");
        assert_eq!(decode("%7Bt%7D.jobs%20x").unwrap(), "{t}.jobs x");
        assert_eq!(decode("a+b").unwrap(), "a b");
        assert!(decode("bad%2").is_err());
        assert!(decode("bad%zz").is_err());
        assert!(decode("%ff").is_err(), "not UTF-8");
    }

    #[test]
    fn replies_become_json() {
        let m = Reply::Map(vec![(Reply::text("ready"), Reply::Int(3)), (Reply::text("dead_letter"), Reply::Nil)]);
        assert_eq!(to_json(&m), json!({ "ready": 3, "dead_letter": null }));
        let info =
            Reply::Map(vec![(Reply::text("rate_per_sec"), Reply::text("2.5")), (Reply::text("ready"), Reply::Int(1))]);
        assert_eq!(info_json(&info), json!({ "rate_per_sec": 2.5, "ready": 1 }));
        assert!(matches!(refused(Reply::Error("NOPERM no".into())), Err(Refused(403, _))));
        assert!(matches!(refused(Reply::Error("NOQUEUE no".into())), Err(Refused(404, _))));
        assert!(refused(Reply::Simple("OK")).is_ok());
    }
}
