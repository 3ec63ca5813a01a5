//! mwmq with TLS, with redis-cli (`--tls --cacert`, and `--cert --key` for
//! client certificates): logins over TLS, plaintext to the TLS port refused
//! and counted, a plaintext listener beside it, and with a client CA no
//! certificate, no entry.

mod common;

use std::process::Command;

use common::*;
use mwmq::Service;

fn cli(port: u16, args: &[&str], cmd: &[&str]) -> (bool, String) {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--no-auth-warning"])
        .args(args)
        .args(cmd)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && !text.contains("ERR") && !text.contains("Could not"), text.trim().to_string())
}

#[test]
fn clients_speak_tls_log_in_and_plaintext_is_refused() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    let (certs, plain) = with_tls(&mut cfg, "tls");
    let dir = certs.ca.parent().unwrap().to_path_buf();
    let table = mwmq::users::user_table("app", b"app-pw", &["*".into()], &["*".into()], &["*".into()]).unwrap();
    let doc: toml::Table = toml::from_str(&table).unwrap();
    cfg.users = doc["users"].clone().try_into().unwrap();
    let mq = start(cfg);
    let port = mq.local_addr().port();
    let ca = certs.ca.display().to_string();
    let tls = ["--tls", "--cacert", ca.as_str(), "--user", "app", "--pass", "app-pw"];
    assert_eq!(cli(port, &tls, &["QCREATE", "secure"]), (true, "OK".into()));
    let (ok, id) = cli(port, &tls, &["SEND", "secure", "over tls"]);
    assert!(ok && id.parse::<i64>().is_ok(), "{id}");
    let (ok, popped) = cli(port, &tls, &["POP", "secure"]);
    assert!(ok && popped.contains("over tls") && popped.contains("app"), "{popped}");
    // Without logging in, over TLS: Redis's NOAUTH.
    let (_, noauth) = cli(port, &["--tls", "--cacert", &ca], &["QLIST"]);
    assert!(noauth.contains("NOAUTH"), "{noauth}");
    // Plaintext to the TLS port: no answer, counted; the plaintext listener beside it works.
    let (ok, _) = cli(port, &["--user", "app", "--pass", "app-pw"], &["PING"]);
    assert!(!ok, "plaintext to the TLS port is refused");
    assert_eq!(cli(plain, &["--user", "app", "--pass", "app-pw"], &["QLEN", "secure"]), (true, "0".into()));
    let (_, info) = cli(plain, &["--user", "app", "--pass", "app-pw"], &["INFO"]);
    let failures: u64 =
        info.lines().find_map(|l| l.strip_prefix("tls_handshake_failures:")).unwrap().trim().parse().unwrap();
    assert!(failures >= 1, "{info}");
    drop(mq);

    // With a client CA: a client without a certificate does not get in, one with a certificate does.
    let client_dir = dir.join("client");
    let client = mctest::Certificates::make(&client_dir).unwrap();
    let mut cfg = config(&pg);
    cfg.tls.cert = Some(certs.cert.display().to_string());
    cfg.tls.key = Some(certs.key.display().to_string());
    cfg.tls.ca = Some(client.ca.display().to_string());
    let mq = start(cfg);
    let port = mq.local_addr().port();
    let (ok, _) = cli(port, &["--tls", "--cacert", &ca], &["PING"]);
    assert!(!ok, "no client certificate");
    let (cert, key) = (client.cert.display().to_string(), client.key.display().to_string());
    assert_eq!(
        cli(port, &["--tls", "--cacert", &ca, "--cert", &cert, "--key", &key], &["PING"]),
        (true, "PONG".into())
    );
    std::fs::remove_dir_all(&dir).ok();
}
