//! The SQL API under attack and under mwmq's rules: objects planted in
//! `public` (by a granted role, or by any role that may create there, as
//! before PostgreSQL 15) never run inside `mwmq.send`/`mwmq.ack` nor in
//! mwmq's own statements; a database made by an older mwmq has its objects
//! moved into the schema `mwmq`, messages and all; a database role acts as
//! the mwmq user that lists it, within that user's rights and `max_body`;
//! a queue's quota holds across concurrent transactions.

use crate::common::*;
use crate::sqlsend::{app, as_role, bodies, setup};
use mctest::Postgres;
use mwmq::Service;

/// The table every planted function writes to when it runs (with the role
/// it ran as), and the function that writes there and tries to make
/// `attacker` a superuser (which works only when it runs as one).
fn markers(pg: &Postgres, attacker: &str) {
    sql(pg)
        .batch_execute(&format!(
            "CREATE TABLE public.planted_runs (what text, by_role text);
             GRANT INSERT ON public.planted_runs TO PUBLIC;
             CREATE FUNCTION public.planted(what text) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO public.planted_runs VALUES (what, current_user::text);
                 BEGIN
                     ALTER ROLE {attacker} SUPERUSER;
                 EXCEPTION WHEN insufficient_privilege THEN NULL;
                 END;
             END $$;
             GRANT EXECUTE ON FUNCTION public.planted(text) TO PUBLIC;"
        ))
        .unwrap();
}

/// What an attacker who may create in `public` plants: operators and
/// functions that are a better match than the catalogue's for what mwmq's
/// code wrote unqualified (`interval * bigint`, `numeric + integer`,
/// `numeric <= bigint`, `nextval('...')` and `convert_to(x, 'UTF8')` with
/// their unknown-typed literals) and one that is not (`text = text`).
const PLANT: &str = "
    CREATE FUNCTION public.evil_times(interval, bigint) RETURNS interval LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.planted('interval * bigint'); RETURN $1 OPERATOR(pg_catalog.*) $2::float8; END $$;
    CREATE OPERATOR public.* (LEFTARG = interval, RIGHTARG = bigint, FUNCTION = public.evil_times);
    CREATE FUNCTION public.evil_plus(numeric, integer) RETURNS numeric LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.planted('numeric + integer'); RETURN $1 OPERATOR(pg_catalog.+) $2::numeric; END $$;
    CREATE OPERATOR public.+ (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.evil_plus);
    CREATE FUNCTION public.evil_le(numeric, bigint) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.planted('numeric <= bigint'); RETURN $1 OPERATOR(pg_catalog.<=) $2::numeric; END $$;
    CREATE OPERATOR public.<= (LEFTARG = numeric, RIGHTARG = bigint, FUNCTION = public.evil_le);
    CREATE FUNCTION public.evil_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.planted('text = text'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
    CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.evil_eq);
    CREATE FUNCTION public.nextval(text) RETURNS bigint LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.planted('nextval(text)'); RETURN pg_catalog.nextval($1::regclass); END $$;
    CREATE FUNCTION public.convert_to(text, text) RETURNS bytea LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.planted('convert_to(text, text)'); RETURN pg_catalog.convert_to($1, $2::name); END $$;";

/// What ran of what was planted, and whether `attacker` became a superuser.
fn planted_runs(pg: &Postgres, attacker: &str) -> (Vec<(String, String)>, bool) {
    let mut db = sql(pg);
    let runs = db.query("SELECT what, by_role FROM public.planted_runs ORDER BY 1, 2", &[]).unwrap();
    let runs = runs.iter().map(|r| (r.get(0), r.get(1))).collect();
    let sup: bool = db.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&attacker]).unwrap().get(0);
    (runs, sup)
}

/// Every way an application sends and acknowledges in SQL: text and bytes,
/// a key, a delay, a queue with a quota, an ACK.
fn send_every_way(db: &mut postgres::Client, c: &mut redis::Connection) {
    db.batch_execute(
        "SELECT mwmq.send('orders', 'text body');
         SELECT mwmq.send('orders', '\\x00ff'::bytea, key => 'k-1', delay_ms => 5);
         SELECT mwmq.send('capped', 'counted');
         BEGIN; SELECT mwmq.send('capped', 'in a transaction', 'k-2'); COMMIT;",
    )
    .unwrap();
    let got = recv(c, "orders", &["COUNT", "1"]);
    assert_eq!(got.len(), 1);
    let acked: bool = db.query_one("SELECT mwmq.ack('orders', $1, $2)", &[&got[0].0, &got[0].1]).unwrap().get(0);
    assert!(acked);
}

/// The first attack: the role granted the functions owns its
/// tables in `public` (so it may create there), plants operators and
/// functions there, and calls the functions: nothing it planted runs, as
/// their owner or at all.
#[test]
fn a_granted_role_s_operators_in_public_never_run_inside_the_functions() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    assert_eq!(q::<String>(&mut c, &["QCREATE", "capped", "MAXMESSAGES", "100"]), "OK");
    markers(&pg, "app");
    sql(&pg).batch_execute("GRANT CREATE ON SCHEMA public TO app").unwrap();
    let mut db = app(&pg);
    db.batch_execute(PLANT).unwrap();
    send_every_way(&mut db, &mut c);
    assert_eq!(planted_runs(&pg, "app"), (vec![], false), "nothing planted ran; app is no superuser");
    // What was sent is all there, sent by app.
    let got = recv(&mut c, "capped", &["COUNT", "10"]);
    assert_eq!(bodies(&got), ["counted", "in a transaction"]);
    assert!(got.iter().all(|m| m.2 == "app"));
}

/// The second attack: a role without the grant, which may create in
/// `public` (as every role could before PostgreSQL 15), plants the same;
/// then the application sends in SQL and clients use mwmq over RESP (mwmq's
/// own connections, a superuser's here, whose connection string even puts
/// `public` before `pg_catalog`): nothing planted runs.
#[test]
fn objects_planted_in_public_run_neither_in_the_functions_nor_in_mwmq_s_statements() {
    let pg = Postgres::start().unwrap();
    let (mq, mut c) = setup(&pg, |c| c.database.url.push_str(" options='-c search_path=public,pg_catalog'"));
    assert_eq!(q::<String>(&mut c, &["QCREATE", "capped", "MAXMESSAGES", "100"]), "OK");
    markers(&pg, "mallory");
    sql(&pg).batch_execute("CREATE ROLE mallory LOGIN; GRANT CREATE ON SCHEMA public TO mallory").unwrap();
    let mut mallory = postgres::Client::connect(&as_role(&pg, "mallory"), postgres::NoTls).unwrap();
    mallory.batch_execute(PLANT).unwrap();
    let refused = mallory.execute("SELECT mwmq.send('orders', 'x')", &[]).unwrap_err();
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"), "mallory was not granted the functions");
    send_every_way(&mut app(&pg), &mut c);
    // RESP: keys (nextval), a quota (mwmq_room), delays, batches, leases, ACK, POP, QINFO, QALTER.
    let _: i64 = q(&mut c, &["SEND", "orders", "resp", "KEY", "k-3", "DELAY", "1"]);
    let _: i64 = q(&mut c, &["SEND", "capped", "resp"]);
    let mut pipe = redis::pipe();
    for i in 0..20 {
        pipe.cmd("SEND").arg(if i % 2 == 0 { "orders" } else { "capped" }).arg(format!("batch {i}"));
        pipe.cmd("SEND").arg("capped").arg("keyed").arg("KEY").arg(format!("b-{i}"));
    }
    let ids: Vec<i64> = pipe.query(&mut connect(mq.local_addr())).unwrap();
    assert_eq!(ids.len(), 40);
    for m in recv(&mut c, "capped", &["COUNT", "5"]) {
        assert_eq!(q::<i64>(&mut c, &["ACK", "capped", &m.0.to_string(), &m.1.to_string()]), 1);
    }
    let _: redis::Value = q(&mut c, &["POP", "orders"]);
    assert_eq!(q::<String>(&mut c, &["QALTER", "capped", "MAXMESSAGES", "1000", "MAXBYTES", "100000"]), "OK");
    assert!(qinfo_int(&mut c, "capped", "counted_messages") > 0);
    assert_eq!(planted_runs(&pg, "mallory"), (vec![], false), "nothing planted ran; mallory is no superuser");
}

/// mwmq up to schema version 10 made its objects in the connection's
/// current schema (`public`): such a database, with messages, a quota's
/// counts and a key in it, is migrated by two mwmq processes at once; its
/// objects are then all in `mwmq`, none in `public`, and what it held is
/// served as before.
#[test]
fn a_database_made_by_an_older_mwmq_moves_into_the_schema_mwmq_and_keeps_its_messages() {
    let pg = Postgres::start().unwrap();
    let mut old = postgres::Client::connect(pg.conninfo(), postgres::NoTls).unwrap();
    old.batch_execute("CREATE TABLE mwmq_schema (version integer NOT NULL)").unwrap();
    for (i, m) in mwmq::db::MIGRATIONS[..10].iter().enumerate() {
        old.batch_execute(m).unwrap();
        old.execute("INSERT INTO mwmq_schema (version) VALUES ($1)", &[&(i as i32 + 1)]).unwrap();
    }
    let before: i64 = old
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relname LIKE 'mwmq%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(before > 10, "the old layout is in public ({before} relations)");
    old.batch_execute(
        "INSERT INTO mwmq_queues (name) VALUES ('orders');
         INSERT INTO mwmq_queues (name, max_messages) VALUES ('small', 4);
         SELECT mwmq.send('orders', 'sent before', 'k-1');
         SELECT mwmq.send('small', 'one'); SELECT mwmq.send('small', 'two');",
    )
    .unwrap();
    let first: i64 = old.query_one("SELECT id FROM mwmq_messages WHERE body = 'sent before'", &[]).unwrap().get(0);
    drop(old);
    // Two processes migrating at once: one waits for the other, then finds nothing to do.
    let cfg = config(&pg);
    let both: Vec<_> = (0..2)
        .map(|_| {
            let cfg = cfg.clone();
            std::thread::spawn(move || mwmq::db::migrate(&cfg))
        })
        .collect();
    for t in both {
        assert_eq!(t.join().unwrap(), Ok(mwmq::db::MIGRATIONS.len() as u32));
    }
    let mut db = sql(&pg);
    let left: i64 = db
        .query_one(
            "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relname LIKE 'mwmq%')
                  + (SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'mwmq%')
                  + (SELECT count(*) FROM pg_type WHERE typnamespace = 'public'::regnamespace AND typname LIKE '%mwmq%')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "nothing of mwmq's is left in public");
    let versions: Vec<i32> =
        db.query("SELECT version FROM mwmq.mwmq_schema ORDER BY 1", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, (1..=mwmq::db::MIGRATIONS.len() as i32).collect::<Vec<_>>());
    let paths: Vec<String> = db
        .query("SELECT array_to_string(proconfig, ' ') FROM pg_proc WHERE proconfig IS NOT NULL AND pronamespace = 'mwmq'::regnamespace", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Each sets the path, and nothing else (a custom setting there would
    // need a superuser to install: `sql/0014_sql_quota.sql`).
    let path = "search_path=pg_catalog, mwmq, pg_temp";
    assert!(!paths.is_empty() && paths.iter().all(|p| p == path), "{paths:?}");
    let creators: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_roles WHERE has_schema_privilege(oid, 'mwmq', 'CREATE') AND NOT rolsuper",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(creators, 0, "only mwmq's user (a superuser here) may create in mwmq");
    // Served as before: the message, its key, the quota's counts.
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let again: i64 = q(&mut c, &["SEND", "orders", "sent again", "KEY", "k-1"]);
    assert_eq!(again, first, "the key sent before the move");
    let got = recv(&mut c, "orders", &["COUNT", "5"]);
    assert_eq!(bodies(&got), ["sent before"]);
    assert_eq!(qinfo_int(&mut c, "small", "counted_messages"), 2);
    let _: i64 = q(&mut c, &["SEND", "small", "three"]);
    let _: i64 = q(&mut c, &["SEND", "small", "four"]);
    assert!(err(&mut c, &["SEND", "small", "five"]).starts_with("OVERQUOTA"), "the counts moved with the queue");
}

/// The SQLSTATE and message of a failed statement.
fn failure(e: postgres::Error) -> (String, String) {
    let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
    (code, e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string()))
}

/// With users, a database role is the user whose `database_roles` list it:
/// it sends where that user may send (patterns matched as mwmq matches
/// them, `_` and `%` being plain characters), as that user, bodies up to
/// that user's `max_body` (else the server's); it acknowledges where the
/// user may receive, deliveries leased to that user (any, for an admin of
/// the queue); a role no user lists is refused, granted or not.
#[test]
fn a_database_role_acts_as_the_mwmq_user_that_lists_it() {
    let pg = Postgres::start().unwrap();
    let with_roles = |mut u: mwmq::users::UserConfig, roles: &[&str]| {
        u.database_roles = roles.iter().map(|r| r.to_string()).collect();
        u
    };
    let mut alice = with_roles(user("alice", "pa", &["orders.*"], &["orders.*"], &[]), &["app"]);
    alice.max_body = Some(100);
    let bob = with_roles(user("bob", "pb", &["a_b.*", "x%"], &[], &[]), &["bobrole"]);
    let carol = with_roles(user("carol", "pc", &[], &["orders.*"], &["orders.*"]), &["ops"]);
    let dave = user("dave", "pd", &["*"], &["*"], &["*"]);
    let mut cfg = config(&pg);
    cfg.users = vec![alice, bob, carol, dave];
    cfg.server.max_body = 1000;
    let mq = start(cfg);
    let mut admin = login(mq.local_addr(), "dave", "pd");
    for queue in ["orders.x", "payroll", "a_b.1", "axb.1", "x%", "xy"] {
        assert_eq!(q::<String>(&mut admin, &["QCREATE", queue]), "OK");
    }
    sql(&pg)
        .batch_execute(
            "CREATE ROLE app LOGIN; CREATE ROLE bobrole LOGIN; CREATE ROLE ops LOGIN; CREATE ROLE stranger LOGIN;
             GRANT USAGE ON SCHEMA mwmq TO app, bobrole, ops, stranger;
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA mwmq TO app, bobrole, ops, stranger;",
        )
        .unwrap();
    let role = |name: &str| postgres::Client::connect(&as_role(&pg, name), postgres::NoTls).unwrap();
    let (mut app, mut bob, mut ops, mut stranger) = (role("app"), role("bobrole"), role("ops"), role("stranger"));
    let send = |db: &mut postgres::Client, queue: &str, body: &[u8]| {
        db.query_one("SELECT mwmq.send($1, $2::bytea)", &[&queue, &body]).map(|r| r.get::<_, i64>(0)).map_err(failure)
    };
    // Send rights, and the sender recorded.
    send(&mut app, "orders.x", b"from app").unwrap();
    let mut alice_c = login(mq.local_addr(), "alice", "pa");
    let got = recv(&mut alice_c, "orders.x", &[]);
    assert_eq!((bodies(&got), got[0].2.as_str()), (vec!["from app".to_string()], "alice"));
    let (code, why) = send(&mut app, "payroll", b"x").unwrap_err();
    assert_eq!(code, "42501");
    assert_eq!(why, "mwmq.send: the role app (mwmq user alice) has no permissions to send to queue 'payroll'");
    let (code, why) = send(&mut stranger, "orders.x", b"x").unwrap_err();
    assert_eq!(
        (code.as_str(), why.as_str()),
        ("42501", "mwmq.send: the role stranger is not one of any mwmq user's database_roles")
    );
    for (queue, ok) in [("a_b.1", true), ("axb.1", false), ("x%", true), ("xy", false)] {
        assert_eq!(send(&mut bob, queue, b"x").is_ok(), ok, "bob to {queue}");
    }
    // Bodies: the user's max_body, else the server's.
    send(&mut app, "orders.x", &[b'x'; 100]).unwrap();
    let (code, why) = send(&mut app, "orders.x", &[b'x'; 101]).unwrap_err();
    assert_eq!(code, "54000");
    assert_eq!(why, "mwmq.send: a body of 101 bytes is over the limit of 100 bytes (max_body of mwmq user alice)");
    send(&mut bob, "a_b.1", &[b'x'; 1000]).unwrap();
    let (code, why) = send(&mut bob, "a_b.1", &[b'x'; 1001]).unwrap_err();
    assert_eq!(
        (code.as_str(), why.as_str()),
        ("54000", "mwmq.send: a body of 1001 bytes is over the limit of 1000 bytes (the server's max_body)")
    );
    // ACK: the receive right; the delivery leased to the user, or an admin's.
    let ack = |db: &mut postgres::Client, m: &Leased| {
        db.query_one("SELECT mwmq.ack('orders.x', $1, $2)", &[&m.0, &m.1]).map(|r| r.get::<_, bool>(0)).map_err(failure)
    };
    let mine = recv(&mut alice_c, "orders.x", &[]).remove(0);
    let (code, why) = ack(&mut bob, &mine).unwrap_err();
    assert_eq!(
        (code.as_str(), why.as_str()),
        ("42501", "mwmq.ack: the role bobrole (mwmq user bob) has no permissions to receive from queue 'orders.x'")
    );
    let (code, why) = ack(&mut stranger, &mine).unwrap_err();
    assert_eq!(
        (code.as_str(), why.as_str()),
        ("42501", "mwmq.ack: the role stranger is not one of any mwmq user's database_roles")
    );
    assert_eq!(ack(&mut app, &mine), Ok(true));
    send(&mut app, "orders.x", b"for dave").unwrap();
    let daves = recv(&mut admin, "orders.x", &[]).remove(0);
    assert_eq!(ack(&mut app, &daves), Ok(false), "not alice's delivery");
    assert_eq!(ack(&mut ops, &daves), Ok(true), "carol administers orders.*");
}

/// `MAXMESSAGES 10` and 20 transactions that each send 10 messages, then
/// wait a second before committing: 10 are stored (overshoot 0), one
/// transaction commits, every other fails (at its COMMIT, or at a send once
/// the winner committed) with 54000. Under REPEATABLE READ a sender whose
/// snapshot predates another's commit fails with 40001 rather than pass.
#[test]
fn a_queue_s_quota_holds_across_concurrent_transactions() {
    let pg = Postgres::start().unwrap();
    let (_mq, mut c) = setup(&pg, |_| {});
    assert_eq!(q::<String>(&mut c, &["QCREATE", "capped", "MAXMESSAGES", "10"]), "OK");
    let start = std::sync::Arc::new(std::sync::Barrier::new(20));
    let sessions: Vec<_> = (0..20)
        .map(|i| {
            let (info, start) = (as_role(&pg, "app"), start.clone());
            std::thread::spawn(move || -> Result<(), (String, String, &'static str)> {
                let mut db = postgres::Client::connect(&info, postgres::NoTls).unwrap();
                let mut tx = db.transaction().unwrap();
                start.wait();
                for n in 0..10 {
                    let body = format!("{i}.{n}");
                    tx.execute("SELECT mwmq.send('capped', $1::text)", &[&body]).map_err(|e| {
                        let (code, why) = failure(e);
                        (code, why, "send")
                    })?;
                }
                tx.execute("SELECT pg_sleep(1)", &[]).unwrap();
                tx.commit().map_err(|e| {
                    let (code, why) = failure(e);
                    (code, why, "commit")
                })
            })
        })
        .collect();
    let results: Vec<_> = sessions.into_iter().map(|s| s.join().unwrap()).collect();
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(results.len() - failed.len(), 1, "one transaction committed: {failed:?}");
    assert!(failed.iter().all(|(code, why, _)| code == "54000" && why.contains("capped is full")), "{failed:?}");
    assert!(failed.iter().any(|(_, _, at)| *at == "commit"), "the check at COMMIT refused some: {failed:?}");
    let stored: i64 = sql(&pg)
        .query_one(
            "SELECT count(*) FROM mwmq_messages m JOIN mwmq_queues q ON q.id = m.queue_id WHERE q.name = 'capped'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(stored, 10, "no overshoot");
    assert_eq!(qinfo_int(&mut c, "capped", "counted_messages"), 10);
    // REPEATABLE READ: the snapshot is taken before another sender commits.
    assert_eq!(q::<String>(&mut c, &["QCREATE", "one", "MAXMESSAGES", "1"]), "OK");
    let mut late = app(&pg);
    let mut tx = late.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    tx.execute("SELECT 1", &[]).unwrap();
    app(&pg).execute("SELECT mwmq.send('one', 'first')", &[]).unwrap();
    let outcome = tx.execute("SELECT mwmq.send('one', 'second')", &[]).map(|_| ()).and_then(|_| tx.commit());
    let (code, _) = failure(outcome.unwrap_err());
    assert!(code == "40001" || code == "54000", "{code}");
    assert_eq!(qinfo_int(&mut c, "one", "counted_messages"), 1);
    assert!(recv(&mut c, "one", &["WAIT", "100"]).iter().all(|m| m.3 == b"first"));
}
