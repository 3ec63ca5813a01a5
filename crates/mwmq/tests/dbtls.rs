//! mwmq's connections to PostgreSQL over TLS, as libpq's connection string
//! asks: a throwaway server with `ssl = on` and a certificate the test makes,
//! listening on loopback; `sslmode=verify-full` with the right CA works (and
//! the server says the connections are encrypted), a foreign CA is refused
//! at start with the reason, `require` encrypts without checking, `disable`
//! does not encrypt.

mod common;

use common::*;
use mwmq::Service;

fn postgres_uid() -> u32 {
    let out = std::process::Command::new("id").args(["-u", "postgres"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Connections of the mwmq named `app`: (with TLS, without).
fn encrypted_connections(pg: &Postgres, app: &str) -> (i64, i64) {
    let row = sql(pg)
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
            &[&app],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn the_database_connection_honours_sslmode_and_sslrootcert() {
    let dir = std::env::temp_dir().join(format!("mwmq-dbtls-{}", std::process::id()));
    let certs = mctest::Certificates::make(&dir).unwrap();
    let stranger = mctest::Certificates::make(&dir.join("other")).unwrap();
    // PostgreSQL reads its key only when the server's user owns it, unreadable to others.
    let uid = postgres_uid();
    for p in [&dir, &certs.cert, &certs.key] {
        std::os::unix::fs::chown(p, Some(uid), None).unwrap();
    }
    std::fs::set_permissions(&certs.key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let port = mctest::free_port();
    let pg = Postgres::start_with(&[
        "listen_addresses=127.0.0.1",
        &format!("port={port}"),
        "ssl=on",
        &format!("ssl_cert_file={}", certs.cert.display()),
        &format!("ssl_key_file={}", certs.key.display()),
    ])
    .unwrap();
    let tcp = format!("host=127.0.0.1 port={port} user=postgres dbname=mwmq");
    let with = |app: &str, extra: &str| {
        let mut c = config(&pg);
        c.database.url = format!("{tcp} application_name={app} {extra}");
        c
    };

    let mq = start(with("full", &format!("sslmode=verify-full sslrootcert={}", certs.ca.display())));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "secure"]), "OK");
    let id: i64 = q(&mut c, &["SEND", "secure", "through tls"]);
    assert_eq!(recv(&mut c, "secure", &[])[0].0, id);
    let (tls, plain) = encrypted_connections(&pg, "full");
    assert!(tls >= 1 && plain == 0, "mwmq's connections are encrypted: {tls} with TLS, {plain} without");
    drop(c);
    drop(mq);

    let refused =
        mwmq::Mq::start(with("stranger", &format!("sslmode=verify-full sslrootcert={}", stranger.ca.display())));
    let why = refused.err().expect("a certificate from another CA is refused").to_string();
    assert!(why.to_lowercase().contains("certificate"), "{why}");

    let mq = start(with("require", "sslmode=require"));
    let _: String = q(&mut connect(mq.local_addr()), &["PING"]);
    let _: i64 = q(&mut connect(mq.local_addr()), &["QLEN", "secure"]);
    assert_eq!(encrypted_connections(&pg, "require").1, 0, "require encrypts (without checking)");
    assert!(encrypted_connections(&pg, "require").0 >= 1);
    drop(mq);

    let mq = start(with("plain", "sslmode=disable"));
    let _: i64 = q(&mut connect(mq.local_addr()), &["QLEN", "secure"]);
    let (tls, plain) = encrypted_connections(&pg, "plain");
    assert!(tls == 0 && plain >= 1, "disable does not encrypt: {tls} with TLS, {plain} without");
    drop(mq);
    std::fs::remove_dir_all(&dir).ok();
}
