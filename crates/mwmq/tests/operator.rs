//! What an operator meets in mwmq's first minute: `--help` and `--version`,
//! a warning for a flag the engine in use ignores, the log's formats, a
//! database that cannot be reached at start, and `/metrics` counting a
//! request as soon as it is answered. Each test failed on the code before
//! the change it names.

mod common;

use std::process::{Command, Stdio};

use common::*;
use mwmq::Service;

/// The binary with only the flags a test gives.
fn bare() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mwmq"));
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// A connection string nothing answers (a port nothing listens on): enough
/// for `--print-config`, which connects to nothing.
fn nowhere() -> String {
    format!("host=127.0.0.1 port={} dbname=mwmq user=mwmq", mctest::free_port())
}

/// Text with every run of white space made one space.
fn words(text: &[u8]) -> String {
    String::from_utf8_lossy(text).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `mwmq -t 4` on the async engine (the default) was accepted and ignored
/// without a word. Now each flag the engine in use does not read is one
/// warning line naming what to use instead, and mwmq goes on.
#[test]
fn a_flag_the_engine_ignores_is_one_warning_naming_what_to_use() {
    let warnings = |args: &[&str]| -> Vec<String> {
        let out = bare().args(["--db", &nowhere(), "--print-config"]).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        err.lines().filter(|l| l.contains(" WARN ")).map(str::to_string).collect()
    };
    let lines = warnings(&["-t", "4", "--queue-capacity", "10"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("-t/--workers 4 is ignored by the async engine") && lines[0].contains("--threads"));
    assert!(lines[1].contains("--queue-capacity 10 is ignored by the async engine"), "{lines:?}");
    let lines = warnings(&["--engine", "pool", "--threads", "2"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("--threads 2 is ignored by the pool engine") && lines[0].contains("-t/--workers"));
    let quiet = warnings(&["--engine", "pool", "-t", "4", "--queue-capacity", "10", "--db-pool", "4"]);
    assert!(quiet.is_empty(), "the pool engine reads them all: {quiet:?}");
    assert!(warnings(&["--threads", "2", "--db-pool", "4", "--batch", "8"]).is_empty());
}

/// `mwmq --print-config` refused to print without `--db` (`no database:
/// give a PostgreSQL connection string with --db`), so the defaults could
/// not be printed to start a configuration file from. Now it prints them
/// (an empty `url`); serving without a database is still refused, exit 2.
#[test]
fn print_config_needs_no_database_and_serving_does() {
    let out = bare().arg("--print-config").output().unwrap();
    let (text, log) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{log}");
    assert!(text.contains("[database]\nurl = \"\"\n"), "{text}");
    let shown: mwmq::Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(shown, mwmq::Config::default(), "the defaults, as a file would hold them");
    let out = bare().args(["--listen", "127.0.0.1:0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(words(&out.stderr).contains("no database: give a PostgreSQL connection string with --db"));
}

/// `--help` said `Worker threads [default: 8]` whatever the engine, and
/// `--admin` listed `/metrics, /stats, /healthz` (not `/readyz`, nor `/ui`).
/// Now every engine-specific flag says which engine reads it, `--admin`
/// lists every path the endpoint serves, and the flags are grouped under
/// the headings mwproxy and mwload use too.
#[test]
fn version_and_help_say_what_each_engine_reads() {
    let out = bare().arg("-V").output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("mwmq {}\n", env!("CARGO_PKG_VERSION")));
    let help = words(&bare().arg("--help").output().unwrap().stdout);
    for needle in [
        "-t, --workers <N> Worker threads of the pool engine (the async engine's threads are --threads) [default: 8]",
        "--threads <N> Event loops of the async engine, 0 = half the cores, at least one (the pool engine's \
         threads are -t/--workers) [default: 0]",
        "--queue-capacity <N> Requests that may wait for a worker (pool engine; the async engine has no queue)",
        "--db-pool <N> Database connections in the pool: the pool engine's workers borrow them, the async engine",
        "HTTP admin endpoint (/ui, /metrics, /stats, /healthz, /readyz): host:port",
        "--log-format <FORMAT>",
        "Exit status: 0",
        // Where the queue commands are: the flags alone do not say.
        "QSCHEDULE, ...): man mwmq lists them under COMMANDS.",
    ] {
        assert!(help.contains(needle), "{needle:?} not in {help}");
    }
    let headings = ["Clients:", "Servers:", "Engine:", "Measurement:", "Process:"];
    let at: Vec<usize> = headings.iter().map(|h| help.find(h).unwrap_or_else(|| panic!("no {h}"))).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "in this order: {headings:?}");
}

/// `--log-format json`: one JSON object per line, the message and the
/// event's fields at the top level, for a log shipper; neither format has
/// colour codes when the log is not a terminal (a pipe here).
#[test]
fn logs_are_json_lines_when_asked_and_never_coloured_off_a_terminal() {
    for format in ["text", "json"] {
        let out =
            bare().args(["--db", &nowhere(), "--print-config", "-t", "4", "--log-format", format]).output().unwrap();
        assert!(out.status.success());
        assert!(!out.stderr.contains(&0x1b), "{format}: {}", String::from_utf8_lossy(&out.stderr));
        let log = String::from_utf8(out.stderr).unwrap();
        let line = log.lines().find(|l| l.contains("-t/--workers 4")).unwrap_or_else(|| panic!("{log}"));
        if format == "json" {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            assert_eq!(v["level"], "WARN", "{line}");
            assert!(v["message"].as_str().unwrap().starts_with("-t/--workers 4 is ignored"), "{line}");
            assert!(v["timestamp"].is_string(), "{line}");
        }
    }
}

/// A database that cannot be reached at start stops mwmq before it listens
/// (exit status 1), and the message says where it tried: it said only
/// `database: error connecting to server: Connection refused`.
#[test]
fn an_unreachable_database_at_start_is_named() {
    let port = mctest::free_port();
    let db = format!("host=127.0.0.1 port={port} dbname=mwmq user=mwmq password=hidden");
    let out = bare().args(["--db", &db, "--listen", "127.0.0.1:0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("mwmq: database: 127.0.0.1:{port}: ")), "{err}");
    assert!(!err.contains("hidden"), "no password in a message: {err}");
}

/// `/metrics` showed the closed windows only: a request just answered was
/// not there until its window closed. With hour-long windows none closes
/// during this test, so only the live count can pass.
#[test]
fn metrics_count_a_request_as_soon_as_it_is_answered() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.stats.window_ms = 3_600_000;
    cfg.stats.admin = Some("127.0.0.1:0".into());
    let mq = start(cfg);
    let admin = mq.admin_addr().unwrap();
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    let _: i64 = q(&mut c, &["SEND", "jobs", "hello"]);
    // Recorded just after the reply, off the request path: polled for, never a window long.
    let sends = r#"mwmq_requests_total{op="send"}"#;
    assert!(eventually(std::time::Duration::from_secs(30), || metric(admin, sends) == 1.0), "{}", metric(admin, sends));
    assert_eq!(metric(admin, "mwmq_connections_accepted_total"), 1.0);
}
