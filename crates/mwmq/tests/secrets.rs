//! Secrets kept: the database password and users' hashes never reach
//! `--print-config` or the results (`summary.json`, its command line); the
//! password is found where libpq finds it (PGPASSWORD, a password file), so
//! it need not be on the command line; a configuration file with secrets
//! that every user may read is refused. Against a PostgreSQL role that logs
//! in with a password (scram-sha-256).

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const SECRET: &str = "app-db-secret-4711";

/// A role `app` whose password is [`SECRET`], asked for over the socket.
fn password_role(pg: &Postgres) -> String {
    let mut db = sql(pg);
    db.batch_execute(&format!(
        "CREATE ROLE app LOGIN PASSWORD '{SECRET}'; ALTER DATABASE mwmq OWNER TO app; GRANT ALL ON SCHEMA public TO app"
    ))
    .unwrap();
    let hba = pg.dir().join("data").join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("local all app scram-sha-256\n{rules}")).unwrap();
    db.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    pg.conninfo().replace("user=postgres", "user=app")
}

fn mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mwmq(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mwmq"));
    c.args(args).args(["--log", "warn"]).env_remove("PGPASSWORD").env_remove("PGPASSFILE");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Starts mwmq and waits until it listens; `Err` with its stderr when it exits instead.
fn serve(args: &[&str], env: &[(&str, &str)]) -> Result<(Child, SocketAddr), String> {
    let addr: SocketAddr = format!("127.0.0.1:{}", mctest::free_port()).parse().unwrap();
    let listen = addr.to_string();
    let mut all = vec!["--listen", listen.as_str()];
    all.extend_from_slice(args);
    let mut child = mwmq(&all, env).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Ok(Some(_)) = child.try_wait() {
            let out = child.wait_with_output().unwrap();
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        assert!(Instant::now() < deadline, "mwmq did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((child, addr))
}

fn terminate(mut child: Child) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_database_password_is_masked_and_found_where_libpq_finds_it() {
    let pg = Postgres::start().unwrap();
    let conn = password_role(&pg);
    let dir = std::env::temp_dir().join(format!("mwmq-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let with_password = format!("{conn} password={SECRET}");

    // --print-config masks it.
    let out = mwmq(&["--db", &with_password, "--print-config"], &[]).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && printed.contains("password=***"), "{printed}");
    assert!(!printed.contains(SECRET));

    // Given on the command line, it is in no results file.
    let results = dir.join("results");
    let (child, addr) = serve(&["--db", &with_password, "--out", results.to_str().unwrap()], &[]).unwrap();
    assert_eq!(q::<String>(&mut connect(addr), &["QCREATE", "q"]), "OK");
    terminate(child);
    for file in ["summary.json", "windows.jsonl"] {
        let text = std::fs::read_to_string(results.join(file)).unwrap();
        assert!(!text.contains(SECRET), "{file} holds the password");
    }
    let summary = std::fs::read_to_string(results.join("summary.json")).unwrap();
    assert!(summary.contains("password=***"), "the command line, masked");

    // Without it on the command line: not in, until PGPASSWORD or a password file says it.
    let refused = serve(&["--db", &conn], &[]).unwrap_err();
    assert!(refused.contains("password"), "{refused}");
    let (child, addr) = serve(&["--db", &conn], &[("PGPASSWORD", SECRET)]).unwrap();
    assert_eq!(q::<i64>(&mut connect(addr), &["QLEN", "q"]), 0);
    terminate(child);
    let passfile = dir.join("pgpass");
    std::fs::write(&passfile, format!("# mwmq's database\n*:*:mwmq:app:{SECRET}\n")).unwrap();
    mode(&passfile, 0o600);
    let file = passfile.to_str().unwrap();
    let (child, addr) = serve(&["--db", &conn], &[("PGPASSFILE", file)]).unwrap();
    assert_eq!(q::<i64>(&mut connect(addr), &["QLEN", "q"]), 0);
    terminate(child);
    let in_string = format!("{conn} passfile={file}");
    let (child, addr) = serve(&["--db", &in_string], &[]).unwrap();
    assert_eq!(q::<i64>(&mut connect(addr), &["QLEN", "q"]), 0);
    terminate(child);
    // A password file others may read is ignored, as libpq ignores it.
    mode(&passfile, 0o644);
    let refused = serve(&["--db", &conn], &[("PGPASSFILE", file)]).unwrap_err();
    assert!(refused.contains("group or world access"), "{refused}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_configuration_file_with_secrets_that_others_may_read_is_refused() {
    let dir = std::env::temp_dir().join(format!("mwmq-secret-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = mwmq::users::user_table("app", b"app-pw", &["*".into()], &[], &[]).unwrap();
    let file = dir.join("mwmq.toml");
    std::fs::write(&file, format!("[database]\nurl = \"host=/nowhere dbname=x password={SECRET}\"\n\n{table}"))
        .unwrap();
    mode(&file, 0o644);
    let f = file.to_str().unwrap();
    let out = mwmq(&["-c", f, "--print-config"], &[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("every user of this machine may read it") && err.contains("chmod 600"), "{err}");
    // Accepted when asked for, or once private; printed without its secrets.
    for (m, extra) in [(0o644, Some("--allow-readable-secrets")), (0o600, None)] {
        mode(&file, m);
        let mut args = vec!["-c", f, "--print-config"];
        args.extend(extra);
        let out = mwmq(&args, &[]).output().unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(!printed.contains(SECRET) && !printed.contains("$argon2"), "{printed}");
        assert!(printed.contains("password_hash = \"***\""), "{printed}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
