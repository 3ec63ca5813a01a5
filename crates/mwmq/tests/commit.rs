//! An OK only for what is committed. A statement's result arrives before
//! its transaction commits (PostgreSQL commits an implicit transaction at
//! Sync, after CommandComplete); a reply must wait for the commit. Here the
//! commit itself fails: a deferred constraint trigger that refuses some
//! bodies only at commit, and one that sleeps at commit while the backend is
//! terminated. Neither may ever produce a message id, alone or in a batch;
//! every id that was answered is in the table. Both engines
//! (`MWMQ_TEST_ENGINE`).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use mwmq::Service;

/// A constraint trigger, checked at commit, that refuses bodies starting
/// with `poison` and sleeps 2 s for bodies starting with `slow`.
fn install_commit_trigger(pg: &Postgres) {
    let mut db = sql(pg);
    db.batch_execute(
        "CREATE FUNCTION at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF position('poison'::bytea IN NEW.body) = 1 THEN
                 RAISE EXCEPTION 'refused at commit';
             END IF;
             IF position('slow'::bytea IN NEW.body) = 1 THEN
                 PERFORM pg_sleep(2);
             END IF;
             RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON mwmq_messages
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION at_commit();",
    )
    .expect("trigger");
}

fn bodies_in_table(pg: &Postgres) -> HashMap<String, i64> {
    sql(pg)
        .query("SELECT convert_from(body, 'UTF8'), id FROM mwmq_messages", &[])
        .expect("select")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[test]
fn a_commit_that_fails_never_answers_ok() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    install_commit_trigger(&pg);
    let mut c = connect(mq.local_addr());
    let _: String = q(&mut c, &["QCREATE", "q"]);
    // Alone.
    let r: redis::RedisResult<i64> = redis::cmd("SEND").arg("q").arg("poison-0").query(&mut c);
    let e = r.expect_err("a SEND refused at commit answers an error");
    assert!(e.to_string().contains("refused at commit"), "{e}");
    let ok: i64 = q(&mut c, &["SEND", "q", "fine-0"]);
    // In batches: eight clients at once, one in four poisoned.
    let addr = mq.local_addr();
    let answered: Vec<(String, Option<i64>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|t| {
                s.spawn(move || {
                    let mut c = connect(addr);
                    let mut out = Vec::new();
                    for i in 0..40 {
                        let body = if (i + t) % 4 == 0 { format!("poison-{t}-{i}") } else { format!("fine-{t}-{i}") };
                        let r: redis::RedisResult<i64> = redis::cmd("SEND").arg("q").arg(&body).query(&mut c);
                        out.push((body, r.ok()));
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let table = bodies_in_table(&pg);
    assert_eq!(table.get("fine-0"), Some(&ok));
    let mut oks = 0;
    for (body, id) in &answered {
        if body.starts_with("poison") {
            assert_eq!(*id, None, "{body} was answered with an id");
        }
        if let Some(id) = id {
            oks += 1;
            assert_eq!(table.get(body), Some(id), "{body} was answered {id} but is not in the table");
        }
    }
    assert!(oks > 0, "some clean SENDs went through");
    assert!(table.keys().all(|b| !b.starts_with("poison")), "a refused message was stored");
}

#[test]
fn a_backend_terminated_at_commit_never_answers_ok() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    install_commit_trigger(&pg);
    let mut c = connect(mq.local_addr());
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let addr = mq.local_addr();
    let sending = std::thread::spawn(move || {
        let mut c = connect(addr);
        let r: redis::RedisResult<i64> = redis::cmd("SEND").arg("q").arg("slow-1").query(&mut c);
        r
    });
    // While its commit sleeps in the trigger, its backend is terminated.
    let mut db = sql(&pg);
    let mut killed = 0;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        let rows = db
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'mwmq' AND wait_event = 'PgSleep'",
                &[],
            )
            .unwrap();
        killed += rows.len();
        if killed > 0 {
            break;
        }
    }
    assert!(killed > 0, "the SEND's commit was never seen sleeping");
    let r = sending.join().unwrap();
    let e = r.expect_err("a SEND whose backend died at commit answers an error");
    assert_eq!(e.kind(), redis::ErrorKind::TryAgain, "{e}");
    assert!(!bodies_in_table(&pg).contains_key("slow-1"), "the terminated commit was stored");
    // mwmq goes on with a new connection.
    let id: i64 = q(&mut c, &["SEND", "q", "fine-after"]);
    assert_eq!(bodies_in_table(&pg).get("fine-after"), Some(&id));
}
