//! Users, logins and rights with real clients (the `redis` crate, redis-cli):
//! Redis's errors byte for byte, the logged-in user as the only identity
//! (CLIENT SETNAME cannot impersonate), rights per queue, failed attempts
//! counted and slowed, `mwmq user add`, and no unauthenticated listener
//! beyond loopback unless asked for.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use mwmq::users::UserConfig;
use mwmq::Service;

fn raw(c: &mut redis::Connection, args: &[&str]) -> Result<redis::Value, String> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query::<redis::Value>(c).map_err(|e| format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")))
}

#[test]
fn users_are_who_they_logged_in_as_and_may_only_what_they_were_given() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![
        user("alice", "alice-pw", &["inbox"], &["inbox"], &["inbox", "jobs*"]),
        user("bob", "bob-pw", &[], &["inbox"], &[]),
        user("mallory", "mallory-pw", &["inbox"], &["inbox"], &[]),
        user("sid", "sid-pw", &["inbox"], &[], &[]),
    ];
    let mq = start(cfg);
    let addr = mq.local_addr();

    // Nobody yet: only AUTH, HELLO ... AUTH, PING and QUIT.
    let mut anon = connect(addr);
    assert_eq!(q::<String>(&mut anon, &["PING"]), "PONG");
    assert_eq!(err(&mut anon, &["QLIST"]), "NOAUTH Authentication required.");
    assert_eq!(err(&mut anon, &["SEND", "inbox", "x"]), "NOAUTH Authentication required.");
    let hello = err(&mut anon, &["HELLO", "3"]);
    assert!(hello.starts_with("NOAUTH HELLO must be called with the client already authenticated"), "{hello}");
    assert_eq!(
        err(&mut anon, &["AUTH", "alice", "nope"]),
        "WRONGPASS invalid username-password pair or user is disabled."
    );
    // Right after failures even the right password is not checked (and is told so,
    // not WRONGPASS); once the connection's wait is over it is. Each failure
    // doubles the wait (100 ms after the first): five make it 1.6 s, far more
    // than a busy machine puts between two commands. (The attempts refused
    // while a wait lasts are not failures of the password, and do not count.)
    let refusal = "ERR too many failed logins on this connection; retry in ";
    let (mut failed, mut last) = (1, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(30);
    while failed < 5 {
        assert!(Instant::now() < deadline, "{failed} failures in 30 s");
        let t = Instant::now();
        match raw(&mut anon, &["AUTH", "alice", "nope"]) {
            Err(e) if e.starts_with("WRONGPASS") => (failed, last) = (failed + 1, t),
            Err(e) if e.starts_with(refusal) => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("a wrong password: {other:?}"),
        }
    }
    let answer = raw(&mut anon, &["AUTH", "alice", "alice-pw"]);
    // (Timed from before the last failure was sent: its wait began later.)
    let within = last.elapsed() < Duration::from_millis(1600);
    match answer {
        Err(refused) => {
            assert!(
                refused == format!("{refusal}2 s") || refused == format!("{refusal}1 s"),
                "the wait's whole seconds, rounded up: {refused}"
            );
            assert!(
                eventually(Duration::from_secs(30), || raw(&mut anon, &["AUTH", "alice", "alice-pw"]).is_ok()),
                "the right password still refused 30 s after the last failure"
            );
        }
        Ok(_) => assert!(!within, "the right password was checked within the connection's wait"),
    }
    assert_eq!(q::<String>(&mut anon, &["QCREATE", "inbox"]), "OK");

    // alice writes to bob; mallory calls herself bob and gets nothing; bob gets it, from alice.
    let mut alice = login(addr, "alice", "alice-pw");
    let _: i64 = q(&mut alice, &["SEND", "inbox", "secret for bob", "TO", "bob"]);
    let mut mallory = login(addr, "mallory", "mallory-pw");
    assert_eq!(q::<String>(&mut mallory, &["CLIENT", "SETNAME", "bob"]), "OK");
    assert!(recv(&mut mallory, "inbox", &[]).is_empty(), "SETNAME does not make mallory bob");
    assert_eq!(q::<Option<String>>(&mut mallory, &["CLIENT", "GETNAME"]).as_deref(), Some("bob"), "a label only");
    let mut bob = login(addr, "bob", "bob-pw");
    let got = recv(&mut bob, "inbox", &[]);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].2.as_str(), got[0].3.as_slice()), ("alice", &b"secret for bob"[..]), "the sender is the user");

    // Rights per queue, in Redis's words.
    assert_eq!(err(&mut bob, &["SEND", "inbox", "x"]), "NOPERM User bob has no permissions to send to queue 'inbox'");
    assert_eq!(err(&mut bob, &["QDROP", "inbox"]), "NOPERM User bob has no permissions to administer queue 'inbox'");
    assert_eq!(
        err(&mut mallory, &["QDROP", "inbox"]),
        "NOPERM User mallory has no permissions to administer queue 'inbox'"
    );
    assert_eq!(q::<String>(&mut alice, &["QCREATE", "jobs-eu"]), "OK");
    assert_eq!(
        err(&mut alice, &["QCREATE", "payroll"]),
        "NOPERM User alice has no permissions to administer queue 'payroll'"
    );
    assert_eq!(err(&mut bob, &["QLEN", "jobs-eu"]), "NOPERM User bob has no permissions to see queue 'jobs-eu'");
    assert_eq!(q::<Vec<String>>(&mut bob, &["QLIST"]), ["inbox"], "bob sees his queues only");
    assert_eq!(q::<Vec<String>>(&mut alice, &["QLIST"]).len(), 2);

    // HELLO 3 AUTH logs in and switches the protocol; with a wrong password it does neither.
    let mut h = connect(addr);
    assert_eq!(
        err(&mut h, &["HELLO", "3", "AUTH", "bob", "wrong"]),
        "WRONGPASS invalid username-password pair or user is disabled."
    );
    std::thread::sleep(Duration::from_millis(250));
    let map = raw(&mut h, &["HELLO", "3", "AUTH", "bob", "bob-pw"]).unwrap();
    assert!(format!("{map:?}").contains("mwmq"), "{map:?}");
    assert!(recv(&mut h, "inbox", &[]).is_empty());

    // QLIST PENDING names the queues holding a message this user may take:
    // a sender without the receive right sees the queue, nothing pending in it.
    let _: i64 = q(&mut alice, &["SEND", "inbox", "for anyone"]);
    let mut sid = login(addr, "sid", "sid-pw");
    assert_eq!(q::<Vec<String>>(&mut sid, &["QLIST"]), ["inbox"]);
    assert!(q::<Vec<String>>(&mut sid, &["QLIST", "PENDING"]).is_empty(), "sid may not receive from inbox");
    assert_eq!(q::<Vec<String>>(&mut alice, &["QLIST", "PENDING"]), ["inbox"]);

    // redis-cli --user --pass, as a user would.
    let out = Command::new("redis-cli")
        .args([
            "-p",
            &addr.port().to_string(),
            "--user",
            "alice",
            "--pass",
            "alice-pw",
            "--no-auth-warning",
            "QLEN",
            "inbox",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2", "bob's message, leased, and the one for anyone");
    let info: String = q(&mut alice, &["INFO"]);
    let failures: u64 = info.lines().find_map(|l| l.strip_prefix("auth_failures:")).unwrap().trim().parse().unwrap();
    assert!(failures >= 3, "failed attempts are counted: {failures}");
}

/// Every command mwmq knows (`command::EVERY_COMMAND`), sent by a user
/// with no rights: each one that reaches a queue or a stream is refused
/// with NOPERM before it does anything, QLIST lists nothing, and the
/// connection's own commands are answered. A new command that forgot its
/// rights check fails here (and cannot compile without a `gate` arm).
#[test]
fn a_user_without_rights_is_refused_every_command_that_reaches_a_queue_or_stream() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![user("owner", "owner-pw", &["*"], &["*"], &["*"]), user("nobody", "nobody-pw", &[], &[], &[])];
    let mq = start(cfg);
    let addr = mq.local_addr();
    // Something to refuse access to: a queue with a message, a stream with a group.
    let mut owner = login(addr, "owner", "owner-pw");
    q::<String>(&mut owner, &["QCREATE", "q"]);
    q::<i64>(&mut owner, &["SEND", "q", "secret"]);
    q::<String>(&mut owner, &["XADD", "s", "*", "f", "secret"]);
    q::<String>(&mut owner, &["XGROUP", "CREATE", "s", "g", "0"]);
    q::<String>(&mut owner, &["QSCHEDULE", "s", "q", "@hourly", "hi"]);

    let limits = mwmq::command::Limits { default_vt_ms: 30_000, max_wait_ms: 60_000 };
    let mut nobody = login(addr, "nobody", "nobody-pw");
    let mut checked = 0;
    for line in mwmq::command::EVERY_COMMAND {
        let words: Vec<&str> = line.split(' ').collect();
        if words[0] == "QUIT" || words[0] == "AUTH" {
            continue; // (would end or change the login)
        }
        let args: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let c = mwmq::command::parse(&args, &limits).unwrap();
        let answer = raw(&mut nobody, &words);
        if matches!(c, mwmq::command::Command::List { .. } | mwmq::command::Command::Schedules) {
            assert_eq!(answer, Ok(redis::Value::Array(Vec::new())), "{line}");
        } else if c.uses_database() {
            let refused = answer.as_ref().err().is_some_and(|e| e.starts_with("NOPERM") && e.contains("nobody"));
            assert!(refused, "{line}: {answer:?}");
            checked += 1;
        } else {
            assert!(answer.as_ref().err().is_none_or(|e| !e.starts_with("NOPERM")), "{line}: {answer:?}");
        }
    }
    assert!(checked >= 40, "{checked} commands checked");
    // Nothing was taken, changed or removed.
    assert_eq!(q::<i64>(&mut owner, &["QLEN", "q"]), 1);
    assert_eq!(q::<i64>(&mut owner, &["XLEN", "s"]), 1);
    assert_eq!(q::<i64>(&mut owner, &["EXISTS", "s"]), 1);
    assert_eq!(q::<Vec<redis::Value>>(&mut owner, &["QSCHEDULES"]).len(), 1, "the schedule is still there");
}

/// QLIST's bound on its reply (`max_reply_bytes` / 256 names) counted every
/// queue of the database before the caller's rights left some out: a user
/// with two queues to see was refused once others had many. Now the
/// database leaves them out first (as QSCHEDULES does), the patterns'
/// `_` and `%` taken as themselves.
#[test]
fn qlist_counts_only_the_queues_the_caller_may_see() {
    use mwmq::commands::queues::LISTED_NAME;
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.server.max_body = 512;
    cfg.server.max_reply_bytes = 3 * LISTED_NAME;
    cfg.users =
        vec![user("owner", "owner-pw", &["*"], &["*"], &["*"]), user("reader", "reader-pw", &[], &["mine_*"], &[])];
    let mq = start(cfg);
    let mut owner = login(mq.local_addr(), "owner", "owner-pw");
    let mut reader = login(mq.local_addr(), "reader", "reader-pw");
    for queue in ["mine_a", "mine_b", "mineXa", "other1", "other2", "other3", "other4"] {
        let _: String = q(&mut owner, &["QCREATE", queue]);
    }
    for queue in ["mine_a", "mineXa", "other1", "other2", "other3", "other4"] {
        let _: i64 = q(&mut owner, &["SEND", queue, "x"]);
    }
    assert_eq!(
        q::<Vec<String>>(&mut reader, &["QLIST"]),
        ["mine_a", "mine_b"],
        "the reader's two, whatever the others"
    );
    assert_eq!(q::<Vec<String>>(&mut reader, &["QLIST", "PENDING"]), ["mine_a"]);
    let refusal = format!(
        "ERR QLIST would list more than 3 queues, more than a reply may hold (max_reply_bytes / {LISTED_NAME})"
    );
    assert_eq!(err(&mut owner, &["QLIST"]), refusal, "seven to show: over the bound");
    assert_eq!(err(&mut owner, &["QLIST", "PENDING"]), refusal, "six to show");
    mq.stopper().stop();
    mq.join();
}

#[test]
fn without_users_auth_is_refused_and_only_loopback_is_served_unless_asked() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let no_password = "ERR AUTH <password> called without any password configured for the default user. Are you sure \
                       your configuration is correct?";
    assert_eq!(err(&mut c, &["AUTH", "x"]), no_password);
    assert_eq!(err(&mut c, &["HELLO", "3", "AUTH", "x", "y"]), no_password, "HELLO AUTH does not pretend");
    assert_eq!(err(&mut c, &["AUTH"]), "ERR wrong number of arguments for 'AUTH' command");
    drop(mq);
    let mut open = config(&pg);
    open.server.listen = "0.0.0.0:0".into();
    let why = mwmq::Mq::start(open.clone()).err().expect("refused").to_string();
    assert!(why.contains("without users") && why.contains("--insecure-no-auth"), "{why}");
    open.server.insecure_no_auth = true;
    let mq = start(open);
    assert_eq!(
        q::<String>(&mut connect(SocketAddr::from(([127, 0, 0, 1], mq.local_addr().port()))), &["PING"]),
        "PONG"
    );
}

#[test]
fn mwmq_user_add_prints_a_table_that_logs_in() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mwmq"))
        .args(["user", "add", "carol", "--password-stdin", "--send", "orders.*", "--receive", "orders.*"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"carol pass phrase\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("[[users]]") && table.contains("$argon2id$") && !table.contains("carol pass phrase"),
        "{table}"
    );
    let doc: toml::Table = toml::from_str(&table).unwrap();
    let users: Vec<UserConfig> = doc["users"].clone().try_into().unwrap();
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = users;
    let mq = start(cfg);
    let mut carol = login(mq.local_addr(), "carol", "carol pass phrase");
    assert_eq!(
        err(&mut carol, &["QCREATE", "orders.eu"]),
        "NOPERM User carol has no permissions to administer queue 'orders.eu'"
    );
    let empty = Command::new(env!("CARGO_BIN_EXE_mwmq"))
        .args(["user", "add", "dave", "--password-stdin"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(empty.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no password"));
}
