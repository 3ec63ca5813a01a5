//! Streams obey queues' rules (issue 47), as an attacker tried them: a
//! send-only user reading entries through XINFO or emptying a stream with
//! XADD's MAXLEN / MINID; a user creating streams past `max_queues`,
//! filling a stream past MAXMESSAGES / MAXBYTES, sending an XADD of many
//! fields past `max_body`; and replies of large entries taking mwmq's memory
//! with them (3 readers of 100 MB entries: 3.7 GB RSS). Each test fails on
//! the code before the fix; both engines (`MWMQ_TEST_ENGINE=pool`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use mwmq::Service;

/// Runs `args`, the reply as a redis Value (an error reply panics).
fn v(c: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The ids of an XRANGE-shaped reply (`[[id, fields]...]`).
fn ids(r: &redis::Value) -> Vec<String> {
    let redis::Value::Array(entries) = r else { panic!("not an array: {r:?}") };
    entries
        .iter()
        .map(|e| match e {
            redis::Value::Array(pair) => redis::from_redis_value::<String>(&pair[0]).unwrap(),
            other => redis::from_redis_value::<String>(other).unwrap(),
        })
        .collect()
}

/// The entries of the one stream of an XREAD / XREADGROUP reply (RESP2).
fn read_ids(r: &redis::Value) -> Vec<String> {
    match r {
        redis::Value::Nil => Vec::new(),
        redis::Value::Array(streams) => match &streams[0] {
            redis::Value::Array(pair) => ids(&pair[1]),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// XPENDING's count.
fn pending(c: &mut redis::Connection, key: &str, group: &str) -> i64 {
    let r = v(c, &["XPENDING", key, group]);
    let redis::Value::Array(s) = r else { panic!("{r:?}") };
    redis::from_redis_value(&s[0]).unwrap()
}

/// XPENDING's summary as Redis and mwmq answer it (count, first, last, consumers).
fn summary(c: &mut redis::Connection, key: &str, group: &str) -> String {
    format!("{:?}", v(c, &["XPENDING", key, group]))
}

/// Pipelines `cmds` on a fresh connection (logged in as `login`, if given)
/// and reads one reply line each: a batch of the same kind is carried out
/// as one statement.
fn pipelined(addr: SocketAddr, login: Option<(&str, &str)>, cmds: &[Vec<String>]) -> Vec<String> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let frame = |args: &[String]| {
        let mut f = format!("*{}\r\n", args.len());
        for a in args {
            f.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        f
    };
    let mut lines = BufReader::new(s.try_clone().unwrap()).lines();
    if let Some((u, p)) = login {
        s.write_all(frame(&["AUTH".into(), u.into(), p.into()]).as_bytes()).unwrap();
        assert_eq!(lines.next().unwrap().unwrap(), "+OK");
    }
    let all: String = cmds.iter().map(|c| frame(c)).collect();
    s.write_all(all.as_bytes()).unwrap();
    // (Simple replies: a line; a bulk string: `$` and its text.)
    (0..cmds.len())
        .map(|_| {
            let l = lines.next().unwrap().unwrap();
            if l.starts_with('$') && l != "$-1" {
                format!("${}", lines.next().unwrap().unwrap())
            } else {
                l
            }
        })
        .collect()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `XINFO STREAM c.secrets FULL` by a user with only `--send 'c.*'` returned
/// every entry (XRANGE said NOPERM), plain XINFO STREAM the first and last;
/// `XADD c.log MAXLEN 0 * x y` (or MINID far ahead) by the same user emptied
/// the stream, leaving its pending entries with nothing behind them. Now
/// XINFO needs the receive right and XADD's trimming the admin right; an
/// admin's XADD trims as Redis 7.0's does (compared with redis-server).
#[test]
fn a_send_only_user_reads_nothing_through_xinfo_and_trims_nothing_through_xadd() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![
        user("producer", "p-pw", &["c.*"], &[], &[]),
        user("reader", "r-pw", &[], &["c.*"], &[]),
        user("ops", "o-pw", &["c.*"], &["c.*"], &["c.*"]),
    ];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let (mut producer, mut reader, mut ops) =
        (login(addr, "producer", "p-pw"), login(addr, "reader", "r-pw"), login(addr, "ops", "o-pw"));
    let redis = mctest::RedisServer::start_with(&[]).expect("redis-server");
    let mut r = redis::Client::open(format!("redis://{}/", redis.addr())).unwrap().get_connection().unwrap();

    // The same entries, group and deliveries in Redis and in mwmq (ids given: the clocks differ).
    let both = |who: &mut redis::Connection, r: &mut redis::Connection, args: &[&str]| {
        let (want, got) = (v(r, args), v(who, args));
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{args:?}: mwmq answers as Redis");
    };
    for i in 1..=5 {
        let (id, secret) = (format!("{i}-1"), format!("secret-{i}"));
        both(&mut producer, &mut r, &["XADD", "c.secrets", &id, "payroll", &secret]);
        both(&mut producer, &mut r, &["XADD", "c.log", &id, "line", &secret]);
    }
    both(&mut ops, &mut r, &["XGROUP", "CREATE", "c.log", "g", "0"]);
    both(&mut reader, &mut r, &["XREADGROUP", "GROUP", "g", "w", "COUNT", "10", "STREAMS", "c.log", ">"]);

    // XINFO: entries and names are the receive right's.
    for args in [
        &["XINFO", "STREAM", "c.secrets", "FULL"][..],
        &["XINFO", "STREAM", "c.secrets", "FULL", "COUNT", "0"],
        &["XINFO", "STREAM", "c.secrets"],
        &["XINFO", "GROUPS", "c.log"],
        &["XINFO", "CONSUMERS", "c.log", "g"],
        &["XPENDING", "c.log", "g"],
        &["XRANGE", "c.secrets", "-", "+"],
    ] {
        let e = err(&mut producer, args);
        let key = if args[0] == "XINFO" { args[2] } else { args[1] };
        assert_eq!(e, format!("NOPERM User producer has no permissions to receive from stream '{key}'"), "{args:?}");
        assert!(!e.contains("secret-"), "no entry in the refusal: {e}");
    }
    assert_eq!(q::<i64>(&mut producer, &["XLEN", "c.secrets"]), 5, "a count, as QLEN: any right");
    let info = format!("{:?}", v(&mut reader, &["XINFO", "STREAM", "c.secrets", "FULL"]));
    assert!(info.contains("secret-1") && info.contains("secret-5"), "a reader sees them: {info}");

    // XADD's MAXLEN / MINID is XTRIM's: the admin right; the stream and its pending entries stay.
    let refused = "NOPERM User producer has no permissions to administer stream 'c.log': XADD with MAXLEN or \
                   MINID removes entries, as XTRIM does";
    for args in [
        &["XADD", "c.log", "MAXLEN", "0", "*", "x", "y"][..],
        &["XADD", "c.log", "MAXLEN", "~", "0", "*", "x", "y"],
        &["XADD", "c.log", "MINID", "99999999999999", "*", "x", "y"],
        &["XADD", "c.log", "NOMKSTREAM", "MINID", "~", "9-0", "LIMIT", "10", "*", "x", "y"],
    ] {
        assert_eq!(err(&mut producer, args), refused, "{args:?}");
    }
    assert_eq!(q::<i64>(&mut ops, &["XLEN", "c.log"]), 5, "nothing added, nothing removed");
    assert_eq!(ids(&v(&mut reader, &["XRANGE", "c.log", "-", "+"])).len(), 5);
    assert_eq!(pending(&mut reader, "c.log", "g"), 5, "the pending entries still have their entries");
    // An XADD without trimming stays a send.
    both(&mut producer, &mut r, &["XADD", "c.log", "6-1", "plain", "xadd"]);
    both(&mut ops, &mut r, &["XDEL", "c.log", "6-1"]);

    // An admin trims as Redis does: what is trimmed stays pending, with nothing behind it.
    both(&mut ops, &mut r, &["XADD", "c.log", "MINID", "3", "7-1", "k", "v"]);
    both(&mut ops, &mut r, &["XRANGE", "c.log", "-", "+"]);
    both(&mut ops, &mut r, &["XADD", "c.log", "MAXLEN", "1", "8-1", "k", "v"]);
    both(&mut ops, &mut r, &["XRANGE", "c.log", "-", "+"]);
    both(&mut ops, &mut r, &["XADD", "c.log", "MAXLEN", "0", "9-1", "k", "v"]);
    both(&mut ops, &mut r, &["XLEN", "c.log"]);
    assert_eq!(summary(&mut ops, "c.log", "g"), summary(&mut r, "c.log", "g"));
    assert_eq!(pending(&mut ops, "c.log", "g"), 5);
    // A consumer of the group may claim another's pending entries: Redis's semantics, kept.
    let claimed = v(&mut reader, &["XCLAIM", "c.log", "g", "other", "0", "1-1", "2-1", "JUSTID"]);
    assert_eq!(
        format!("{claimed:?}"),
        format!("{:?}", v(&mut r, &["XCLAIM", "c.log", "g", "other", "0", "1-1", "2-1", "JUSTID"]))
    );
}

/// A user with `max_queues = 3` created 200 streams by XADD; QALTER on a
/// stream answered NOQUEUE; a user whose `max_body` was 100 bytes XADDed 100
/// fields of 1 MB. Now a stream counts against its creator's `max_queues`
/// as a queue does (together, and under concurrent creations), QALTER sets
/// a stream's MAXMESSAGES / MAXBYTES, and `max_body` covers a whole XADD.
#[test]
fn streams_count_against_max_queues_take_quotas_and_max_body_covers_an_xadd() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.server.max_body = 2 << 20;
    cfg.server.max_reply_bytes = 4 << 20;
    let mut small = user("small", "s-pw", &["small.*"], &["small.*"], &["small.*"]);
    small.max_queues = 3;
    small.max_body = Some(100);
    let mut burst = user("burst", "b-pw", &["burst.*"], &[], &[]);
    burst.max_queues = 4;
    cfg.users = vec![small, burst, user("ops", "o-pw", &["*"], &["*"], &["*"])];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let (mut s, mut ops) = (login(addr, "small", "s-pw"), login(addr, "ops", "o-pw"));
    let over = "OVERQUOTA user small may create at most 3 queues (max_queues)";

    // Streams, by XADD or XGROUP ... MKSTREAM, and queues: 3 in all.
    for i in 1..=3 {
        let _: String = q(&mut s, &["XADD", &format!("small.{i}"), "*", "k", "v"]);
    }
    assert_eq!(err(&mut s, &["XADD", "small.4", "*", "k", "v"]), over);
    assert_eq!(err(&mut s, &["XGROUP", "CREATE", "small.4", "g", "$", "MKSTREAM"]), over);
    assert_eq!(err(&mut s, &["QCREATE", "small.q"]), over, "a queue after 3 streams");
    assert_eq!(q::<String>(&mut s, &["TYPE", "small.4"]), "none", "nothing made");
    let _: String = q(&mut s, &["XADD", "small.1", "*", "k", "v"]);
    assert_eq!(v(&mut s, &["XADD", "small.4", "NOMKSTREAM", "*", "k", "v"]), redis::Value::Nil);
    assert_eq!(q::<i64>(&mut s, &["DEL", "small.1"]), 1);
    assert_eq!(q::<String>(&mut s, &["QCREATE", "small.q"]), "OK", "a deleted stream frees its place");
    assert_eq!(err(&mut s, &["XADD", "small.5", "*", "k", "v"]), over, "2 streams and a queue");
    assert_eq!(q::<String>(&mut s, &["QDROP", "small.q"]), "OK");
    assert_eq!(q::<String>(&mut s, &["XGROUP", "CREATE", "small.5", "g", "$", "MKSTREAM"]), "OK");
    // Streams made by someone else are not small's.
    let _: String = q(&mut ops, &["XADD", "small.6", "*", "k", "v"]);
    let _: String = q(&mut s, &["XADD", "small.6", "*", "k", "v"]);

    // Ten clients of one user creating ten streams at once: exactly max_queues of them.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(10));
    let racers: Vec<_> = (0..10)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut c = login(addr, "burst", "b-pw");
                barrier.wait();
                let mut cmd = redis::cmd("XADD");
                cmd.arg(format!("burst.{i}")).arg("*").arg("k").arg("v");
                cmd.query::<String>(&mut c).map_err(|e| e.to_string())
            })
        })
        .collect();
    let results: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
    let made = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(made, 4, "{results:?}");
    assert!(results.iter().filter_map(|r| r.as_ref().err()).all(|e| e.contains("max_queues")), "{results:?}");

    // max_body: the whole XADD (fields, values and id), refused before anything is stored.
    let hundred_fields: Vec<String> = (0..100).flat_map(|i| [format!("f{i}"), "x".repeat(1000)]).collect();
    let mut args = vec!["XADD", "small.2", "*"];
    args.extend(hundred_fields.iter().map(String::as_str));
    assert_eq!(
        err(&mut s, &args),
        "OVERQUOTA an entry of 100291 bytes (fields, values and id) is over user small's limit of 100 bytes \
         (max_body)"
    );
    let just = "x".repeat(97); // with "kk" and the id "*": 100 bytes
    let _: String = q(&mut s, &["XADD", "small.2", "*", "kk", &just]);
    assert!(err(&mut s, &["XADD", "small.2", "*", "kkk", &just]).starts_with("OVERQUOTA an entry of 101 bytes"));
    assert_eq!(q::<i64>(&mut s, &["XLEN", "small.2"]), 2, "the refused ones stored nothing");

    // QALTER on a stream: MAXMESSAGES and MAXBYTES, as a queue's.
    assert_eq!(q::<String>(&mut ops, &["QALTER", "small.2", "MAXMESSAGES", "3"]), "OK");
    let _: String = q(&mut s, &["XADD", "small.2", "*", "k", "v"]);
    let full = err(&mut s, &["XADD", "small.2", "*", "k", "v"]);
    assert_eq!(
        full,
        "OVERQUOTA stream 'small.2' is full: 3 entries, 199 bytes (MAXMESSAGES 3, MAXBYTES 0; 0 is no limit)"
    );
    assert!(err(&mut s, &["XADD", "small.2", "1-*", "k", "v"]).starts_with("OVERQUOTA stream"), "any id");
    let info = format!("{:?}", v(&mut ops, &["XINFO", "STREAM", "small.2"]));
    assert!(info.contains("max-messages"), "XINFO shows the limits set: {info}");
    // Pipelined XADDs (one statement): those that fit, in order; the rest refused.
    let e0: Vec<(String, Vec<String>)> = q(&mut ops, &["XRANGE", "small.2", "-", "+", "COUNT", "1"]);
    assert_eq!(q::<i64>(&mut ops, &["XDEL", "small.2", &e0[0].0]), 1);
    assert_eq!(q::<String>(&mut ops, &["QALTER", "small.2", "MAXMESSAGES", "5"]), "OK");
    let adds: Vec<Vec<String>> = (0..6).map(|_| strings(&["XADD", "small.2", "*", "k", "v"])).collect();
    let replies = pipelined(addr, Some(("small", "s-pw")), &adds);
    let ok = replies.iter().take_while(|r| r.starts_with('$')).count();
    assert_eq!(ok, 3, "2 held, 3 fit: {replies:?}");
    assert!(replies[ok..].iter().all(|r| r.starts_with("-OVERQUOTA stream 'small.2' is full")), "{replies:?}");
    assert_eq!(q::<i64>(&mut ops, &["XLEN", "small.2"]), 5);
    // An admin's XADD with MAXLEN on a full stream trims first: a ring of 5.
    let _: String = q(&mut ops, &["XADD", "small.2", "MAXLEN", "5", "*", "k", "v"]);
    assert_eq!(q::<i64>(&mut ops, &["XLEN", "small.2"]), 5);
    // Bytes (fields and values, and 16 for each).
    let _: String = q(&mut ops, &["XADD", "small.3", "*", "k", &"x".repeat(20)]); // 34 held, 21 + 2 x 16 bytes
    assert_eq!(q::<String>(&mut ops, &["QALTER", "small.3", "MAXBYTES", "134"]), "OK");
    assert!(err(&mut ops, &["XADD", "small.3", "*", "k", &"x".repeat(15)]).starts_with("OVERQUOTA stream 'small.3'"));
    let _: String = q(&mut ops, &["XADD", "small.3", "*", "k", &"x".repeat(14)]); // 87 + 47: 134
    assert_eq!(q::<String>(&mut ops, &["QALTER", "small.3", "MAXBYTES", "0"]), "OK");
    let _: String = q(&mut ops, &["XADD", "small.3", "*", "k", &"x".repeat(100)]);
    // QALTER's other options are a queue's; a name that is neither: NOQUEUE.
    assert!(err(&mut ops, &["QALTER", "small.3", "RATE", "5/s"]).contains("MAXMESSAGES and MAXBYTES only"));
    assert_eq!(err(&mut ops, &["QALTER", "nothing", "MAXMESSAGES", "3"]), "NOQUEUE no such queue 'nothing'");
}

/// The value after `key` in a RESP2 map (a flat array).
fn field<'a>(map: &'a redis::Value, key: &str) -> &'a redis::Value {
    let redis::Value::Array(flat) = map else { panic!("{map:?}") };
    let at = flat.iter().position(|k| redis::from_redis_value::<String>(k).ok().as_deref() == Some(key));
    &flat[at.unwrap_or_else(|| panic!("no {key} in {map:?}")) + 1]
}

/// `i-1` for each i of `r`.
fn id_list(r: std::ops::RangeInclusive<u32>) -> Vec<String> {
    r.map(|i| format!("{i}-1")).collect()
}

/// XRANGE, XREAD, XREADGROUP (alone and batched), XCLAIM, XAUTOCLAIM and
/// XINFO STREAM FULL returned up to 10,000 entries whatever their size.
/// Now the reads stop before the entry that would take their reply past
/// `max_reply_bytes`, and the client goes on from the last id it got, as
/// with COUNT; a range (XRANGE, XREVRANGE, XINFO STREAM FULL's entries)
/// over the bound is refused, so that a paging loop never takes a short
/// page for the end (cut ranges gave 2 entries of `... COUNT 10`, and the
/// loop stopped). INFO counts both. Entries of 50,000 bytes weigh 50,097
/// (`bytes + 16 per field or value + 64`): five fit 256 KiB, six do not.
#[test]
fn reads_are_cut_by_their_bytes_and_ranges_over_them_refused() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.server.max_body = 64 << 10;
    cfg.server.max_reply_bytes = 256 << 10;
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    let big = "x".repeat(50_000);
    for i in 1..=23 {
        let _: String = q(&mut c, &["XADD", "s", &format!("{i}-1"), "f", &big]);
    }
    // Each argument fits max_body, the XADD does not: refused, nothing stored (no users: the server's).
    let half = "y".repeat(40_000);
    assert_eq!(
        err(&mut c, &["XADD", "s", "24-1", "a", &half, "b", &half]),
        "OVERQUOTA an entry of 80006 bytes (fields, values and id) is over the server's limit of 65536 bytes \
         (max_body)"
    );
    assert_eq!(q::<i64>(&mut c, &["XLEN", "s"]), 23);

    // A range over the bound is refused, and says how to page; with COUNT small enough, entries.
    let refused = "ERR the reply would exceed max_reply_bytes (262144 bytes): ask for fewer entries with COUNT";
    let counted =
        |c: &mut redis::Connection| (info_field(c, "stream_replies_refused"), info_field(c, "stream_replies_cut"));
    assert_eq!(counted(&mut c), (0, 0));
    for args in [
        &["XRANGE", "s", "-", "+"][..],
        &["XRANGE", "s", "-", "+", "COUNT", "10"],
        &["XRANGE", "s", "-", "+", "COUNT", "6"],
        &["XREVRANGE", "s", "+", "-"],
        &["XREVRANGE", "s", "+", "-", "COUNT", "10"],
        &["XINFO", "STREAM", "s", "FULL"],
        &["XINFO", "STREAM", "s", "FULL", "COUNT", "0"],
    ] {
        assert_eq!(err(&mut c, args), refused, "{args:?}");
    }
    assert_eq!(counted(&mut c), (7, 0), "each refusal counted");
    // Redis's paging loop: pages of COUNT until a shorter one, which is the end.
    let (mut got, mut from) = (Vec::new(), "-".to_string());
    loop {
        let page = ids(&v(&mut c, &["XRANGE", "s", &from, "+", "COUNT", "5"]));
        got.extend(page.iter().cloned());
        match page.last() {
            Some(last) if page.len() == 5 => from = format!("({last}"),
            _ => break,
        }
    }
    assert_eq!(got, id_list(1..=23), "every entry, and the short page was the end");
    let rev: Vec<String> = (19..=23).rev().map(|i| format!("{i}-1")).collect();
    assert_eq!(ids(&v(&mut c, &["XREVRANGE", "s", "+", "-", "COUNT", "5"])), rev);
    assert_eq!(ids(&v(&mut c, &["XRANGE", "s", "-", "+", "COUNT", "2"])), id_list(1..=2));
    assert_eq!(ids(&v(&mut c, &["XRANGE", "s", "(21-1", "+"])), id_list(22..=23), "a range that fits, whole");
    let full = v(&mut c, &["XINFO", "STREAM", "s", "FULL", "COUNT", "5"]);
    assert_eq!(ids(field(&full, "entries")), id_list(1..=5));
    assert_eq!(counted(&mut c), (7, 0));

    // XREAD: from the last id; over two streams, round by round (the small one is not crowded out).
    assert_eq!(read_ids(&v(&mut c, &["XREAD", "COUNT", "100", "STREAMS", "s", "0"])), id_list(1..=5));
    assert_eq!(counted(&mut c), (7, 1), "a read cut by its bytes is counted");
    assert_eq!(read_ids(&v(&mut c, &["XREAD", "COUNT", "5", "STREAMS", "s", "0"])), id_list(1..=5));
    assert_eq!(counted(&mut c), (7, 1), "one that COUNT stopped is not");
    assert_eq!(read_ids(&v(&mut c, &["XREAD", "STREAMS", "s", "5-1"])), id_list(6..=10));
    for i in 1..=3 {
        let _: String = q(&mut c, &["XADD", "small", &format!("{i}-1"), "k", "v"]);
    }
    let both = v(&mut c, &["XREAD", "STREAMS", "s", "small", "0", "0"]);
    let redis::Value::Array(parts) = &both else { panic!("{both:?}") };
    let part = |i: usize| match &parts[i] {
        redis::Value::Array(pair) => ids(&pair[1]),
        other => panic!("{other:?}"),
    };
    assert_eq!((part(0), part(1)), (id_list(1..=5), id_list(1..=3)));

    // XREADGROUP delivers what it returns; the rest stays new for the next read.
    assert_eq!(q::<String>(&mut c, &["XGROUP", "CREATE", "s", "g", "0"]), "OK");
    let read =
        |c: &mut redis::Connection, who: &str| read_ids(&v(c, &["XREADGROUP", "GROUP", "g", who, "STREAMS", "s", ">"]));
    assert_eq!(read(&mut c, "c1"), id_list(1..=5));
    assert_eq!(pending(&mut c, "s", "g"), 5);
    assert_eq!(read(&mut c, "c1"), id_list(6..=10));
    // Its history too.
    let hist = v(&mut c, &["XREADGROUP", "GROUP", "g", "c1", "STREAMS", "s", "0"]);
    assert_eq!(read_ids(&hist), id_list(1..=5));
    // XCLAIM claims what fits and leaves the rest with its owner.
    let mut claim = vec!["XCLAIM", "s", "g", "c2", "0"];
    let ten = id_list(1..=10);
    claim.extend(ten.iter().map(String::as_str));
    assert_eq!(ids(&v(&mut c, &claim)), id_list(1..=5));
    let owned = |c: &mut redis::Connection, who: &str| ids(&v(c, &["XPENDING", "s", "g", "-", "+", "100", who]));
    assert_eq!((owned(&mut c, "c2"), owned(&mut c, "c1")), (id_list(1..=5), id_list(6..=10)));
    // XAUTOCLAIM: the cursor is the first entry that did not fit.
    let auto = v(&mut c, &["XAUTOCLAIM", "s", "g", "c3", "0", "0", "COUNT", "100"]);
    let redis::Value::Array(parts) = &auto else { panic!("{auto:?}") };
    assert_eq!(redis::from_redis_value::<String>(&parts[0]).unwrap(), "6-1");
    assert_eq!(ids(&parts[1]), id_list(1..=5));
    let auto = v(&mut c, &["XAUTOCLAIM", "s", "g", "c3", "0", "6-1", "COUNT", "100"]);
    let redis::Value::Array(parts) = &auto else { panic!("{auto:?}") };
    assert_eq!(
        (redis::from_redis_value::<String>(&parts[0]).unwrap(), ids(&parts[1])),
        ("0-0".into(), id_list(6..=10))
    );
    let justid = v(&mut c, &["XAUTOCLAIM", "s", "g", "c4", "0", "0", "COUNT", "100", "JUSTID"]);
    let redis::Value::Array(parts) = &justid else { panic!("{justid:?}") };
    assert_eq!(ids(&parts[1]).len(), 10, "ids alone weigh little");

    // Consumers of one group reading at once (one statement when batched): each reply is cut, none skipped.
    assert_eq!(q::<String>(&mut c, &["XGROUP", "CREATE", "s", "g2", "0"]), "OK");
    let mut pipe = redis::pipe();
    for who in ["a", "b", "c"] {
        pipe.cmd("XREADGROUP").arg("GROUP").arg("g2").arg(who).arg("COUNT").arg("10").arg("STREAMS").arg("s").arg(">");
    }
    let cut_before = counted(&mut c).1;
    let replies: Vec<redis::Value> = pipe.query(&mut c).unwrap();
    let parts: Vec<Vec<String>> = replies.iter().map(read_ids).collect();
    assert!(parts.iter().all(|p| p.len() <= 5), "{parts:?}");
    assert_eq!(parts.concat(), id_list(1..=15), "in order, none skipped");
    assert_eq!(counted(&mut c).1, cut_before + 3, "each consumer's reply was cut, batched or not");
    assert_eq!(counted(&mut c).0, 7);
}

/// A number (kB) from /proc/PID/status.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap()))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Three concurrent `XRANGE - +` over ten entries of 100 MB took mwmq to
/// 3.7 GB RSS (each reply held whole, several times over: the database's
/// rows, the reply, its encoding). Now the database stops returning entries
/// at `max_reply_bytes` (a range past it is refused, after at most that
/// much was read), so a reader costs a few times that at most; the readers
/// page with `COUNT 2`.
///
/// Here: entries of 8,000,000 bytes (an admin whose `max_body` allows
/// them), `max_reply_bytes` 16 MiB (two entries a reply), three readers
/// paging through the stream twice each. The peak RSS while they read
/// (VmHWM, reset to the current RSS when they start) may pass the RSS
/// before them by at most 3 readers × 6 × 16 MiB = 288 MiB. Per reader:
/// two replies' worth live (the database's rows and the reply's values,
/// then the values and their encoding), and what glibc's allocator keeps in
/// the threads that built them (up to twice the largest block freed, per
/// thread; a reader's pages pass through two threads). Measured here: +100
/// MiB (async engine), +174 MiB (pool: four workers each keep some).
/// Before, each reader held its whole 80 MB reply that many times.
#[test]
fn three_readers_of_large_entries_keep_rss_within_the_reply_bound() {
    const ENTRY: usize = 8_000_000;
    const REPLY: usize = 16 << 20;
    const READERS: usize = 3;
    let pg = Postgres::start().unwrap();
    let dir = std::env::temp_dir().join(format!("mwmq-stream-rss-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut big = user("big", "b-pw", &["*"], &["*"], &["*"]);
    big.max_body = Some(ENTRY + 100);
    let mut doc = toml::Table::new();
    doc.insert("users".into(), toml::Value::Array(vec![toml::Value::try_from(&big).unwrap()]));
    let file = dir.join("mwmq.toml");
    let text =
        format!("[server]\nmax_body = {}\nmax_reply_bytes = {REPLY}\n\n{}", 8 << 20, toml::to_string(&doc).unwrap());
    std::fs::write(&file, text).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mq = MqProcess::start(&pg, 0, &["--config", file.to_str().unwrap()]);
    let pid = mq.child.id();
    let mut c = login(mq.addr, "big", "b-pw");
    let body = vec![b'e'; ENTRY];
    let added: Vec<String> = (0..10)
        .map(|i| redis::cmd("XADD").arg("large").arg("*").arg(format!("n{i}")).arg(&body).query(&mut c).unwrap())
        .collect();
    drop(body);

    // The peak from here on.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
    let before = status_kb(pid, "VmRSS:");
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let addr = mq.addr;
            std::thread::spawn(move || {
                let mut c = login(addr, "big", "b-pw");
                let mut rounds = Vec::new();
                for _ in 0..2 {
                    let (mut got, mut from, mut pages) = (Vec::new(), "-".to_string(), 0);
                    loop {
                        let page: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
                            .arg("large")
                            .arg(&from)
                            .arg("+")
                            .arg("COUNT")
                            .arg(2)
                            .query(&mut c)
                            .unwrap();
                        let Some((last, _)) = page.last() else { break };
                        from = format!("({last}");
                        assert!(page.iter().all(|(_, f)| f[1].len() == ENTRY), "whole entries");
                        got.extend(page.into_iter().map(|(id, _)| id));
                        pages += 1;
                    }
                    rounds.push((got, pages));
                }
                rounds
            })
        })
        .collect();
    for r in readers {
        for (got, pages) in r.join().unwrap() {
            assert_eq!(got, added, "every reader got every entry, in order");
            assert_eq!(pages, 5, "two entries a reply");
        }
    }
    let peak = status_kb(pid, "VmHWM:");
    let bound = (READERS * 6 * REPLY / 1024) as u64;
    eprintln!(
        "RSS before the readers {} MiB, peak while {READERS} read {} MiB (+{} MiB; bound +{} MiB)",
        before / 1024,
        peak / 1024,
        peak.saturating_sub(before) / 1024,
        bound / 1024
    );
    assert!(peak <= before + bound, "peak {peak} kB > {before} kB + {bound} kB");
    std::fs::remove_dir_all(&dir).ok();
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// A user with only the send right ended a stream: `XADD c.s
/// 9223372036854775807-9223372036854775806 a b` succeeded, and then `XADD
/// c.s * ...` failed for everyone with `ERR The stream has exhausted the
/// last possible ID`; an id of 2100 dated every later `*` id 2100. Now an id
/// more than 10 s ahead of the server's clock needs the admin right: ids of
/// the past and the present stay a sender's (idempotent producers), `*`
/// works for everyone, and an admin keeps Redis's freedom.
#[test]
fn a_send_only_user_cannot_move_a_stream_s_ids_ahead() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![user("producer", "p-pw", &["c.*"], &[], &[]), user("ops", "o-pw", &["c.*"], &["c.*"], &["c.*"])];
    let mq = start(cfg);
    let (mut p, mut ops) = (login(mq.local_addr(), "producer", "p-pw"), login(mq.local_addr(), "ops", "o-pw"));
    let _: String = q(&mut p, &["XADD", "c.s", "*", "a", "b"]);
    let refused = "NOPERM User producer has no permissions to administer stream 'c.s': an XADD id more than 10 s \
                   ahead of the server's clock moves the id every later '*' follows; use '*' or an id up to now";
    let ahead = format!("{}-0", now_ms() + 600_000);
    for id in ["9223372036854775807-9223372036854775806", "4102444800000-0", "4102444800000-*", "4102444800000", &ahead]
    {
        assert_eq!(err(&mut p, &["XADD", "c.s", id, "a", "b"]), refused, "{id}");
    }
    // Nothing moved: everyone's '*' is dated now.
    for c in [&mut p, &mut ops] {
        let id: String = q(c, &["XADD", "c.s", "*", "a", "b"]);
        let ms: i64 = id.split('-').next().unwrap().parse().unwrap();
        assert!(ms <= now_ms() + 1_000, "{id} is of now");
    }
    assert_eq!(q::<i64>(&mut ops, &["XLEN", "c.s"]), 3);
    // Ids up to now (and a little ahead, for producers' clocks) are a sender's.
    let _: String = q(&mut p, &["XADD", "c.t", "1000-1", "a", "b"]);
    let _: String = q(&mut p, &["XADD", "c.t", "1000-*", "a", "b"]);
    let _: String = q(&mut p, &["XADD", "c.t", &format!("{}-*", now_ms()), "a", "b"]);
    let _: String = q(&mut p, &["XADD", "c.t", &format!("{}-0", now_ms() + 5_000), "a", "b"]);
    // An admin may, as in Redis.
    let edge = "9223372036854775807-9223372036854775807";
    assert_eq!(q::<String>(&mut ops, &["XADD", "c.edge", edge, "a", "b"]), edge);
    assert!(err(&mut p, &["XADD", "c.edge", "*", "a", "b"]).contains("exhausted the last possible ID"));
}

/// A user with no `max_body` of its own was told an XADD past the
/// server's `max_body` was "over user adm's limit"; the server's limit
/// past one argument read `ERR an argument of N bytes is over the limit
/// ...`, a user's `OVERQUOTA a body of N bytes is over user u's limit ...`.
/// Now each names whose limit it is, in one form; the classes stay (ERR
/// for an argument the server will not read, OVERQUOTA for a body or entry
/// over a limit). Also QINFO on a stream: its counts and limits.
#[test]
fn refusals_over_a_size_limit_say_whose_limit_it_is() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.server.max_body = 2048;
    let mut shop = user("shop", "s-pw", &["*"], &["*"], &[]);
    shop.max_body = Some(100);
    cfg.users = vec![user("adm", "a-pw", &["*"], &["*"], &["*"]), shop];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let (mut adm, mut shop) = (login(addr, "adm", "a-pw"), login(addr, "shop", "s-pw"));
    let _: String = q(&mut adm, &["QCREATE", "q"]);
    let (x2000, x100) = ("x".repeat(2000), "y".repeat(100));
    assert_eq!(
        err(&mut adm, &["XADD", "s", "*", "f", &x2000, "g", &x100]),
        "OVERQUOTA an entry of 2103 bytes (fields, values and id) is over the server's limit of 2048 bytes (max_body)"
    );
    assert_eq!(
        err(&mut adm, &["SEND", "q", &"z".repeat(2049)]),
        "ERR an argument of 2049 bytes is over the server's limit of 2048 bytes (max_body)"
    );
    assert_eq!(
        err(&mut shop, &["SEND", "q", &"z".repeat(101)]),
        "OVERQUOTA a body of 101 bytes is over user shop's limit of 100 bytes (max_body)"
    );
    assert_eq!(
        err(&mut shop, &["XADD", "s", "*", "f", &x100]),
        "OVERQUOTA an entry of 102 bytes (fields, values and id) is over user shop's limit of 100 bytes (max_body)"
    );
    // QINFO of a stream: what it holds, no entry.
    let _: String = q(&mut shop, &["XADD", "s", "*", "f", "v"]);
    let info = qinfo(&mut shop, "s");
    assert_eq!((info["type"].as_str(), info["length"].as_str(), info["bytes"].as_str()), ("stream", "1", "34"));
    assert_eq!((info["max_messages"].as_str(), info["groups"].as_str()), ("0", "0"));
}

/// An entry's fields and values counted their bytes alone toward MAXBYTES:
/// 1,020 empty fields cost nothing. Now each counts 16 more, as a reply
/// weighs it.
#[test]
fn empty_fields_count_toward_maxbytes() {
    let pg = Postgres::start().unwrap();
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let _: String = q(&mut c, &["XADD", "e", "*", "k", "v"]); // 2 + 2 x 16
    assert_eq!(q::<String>(&mut c, &["QALTER", "e", "MAXBYTES", "1000"]), "OK");
    let xadd_empty = |c: &mut redis::Connection, n: usize| {
        let mut cmd = redis::cmd("XADD");
        cmd.arg("e").arg("*");
        for _ in 0..n {
            cmd.arg("");
        }
        cmd.query::<String>(c).map_err(|e| format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")))
    };
    assert_eq!(
        xadd_empty(&mut c, 1020),
        Err("OVERQUOTA stream 'e' is full: 1 entries, 34 bytes (MAXMESSAGES 0, MAXBYTES 1000; 0 is no limit)".into())
    );
    assert!(xadd_empty(&mut c, 60).is_ok(), "960 bytes more: 994");
    assert!(xadd_empty(&mut c, 2).is_err(), "32 more would be 1026");
    assert_eq!(qinfo_int(&mut c, "e", "bytes"), 994);
    assert_eq!(field(&v(&mut c, &["XINFO", "STREAM", "e"]), "bytes"), &redis::Value::Int(994));
    // Trimming and deleting give back what the entries counted.
    let first: Vec<(String, Vec<String>)> = q(&mut c, &["XRANGE", "e", "-", "+", "COUNT", "1"]);
    assert_eq!(q::<i64>(&mut c, &["XDEL", "e", &first[0].0]), 1);
    assert_eq!(qinfo_int(&mut c, "e", "bytes"), 960);
    assert_eq!(q::<i64>(&mut c, &["XTRIM", "e", "MAXLEN", "0"]), 1);
    assert_eq!(qinfo_int(&mut c, "e", "bytes"), 0);
}

/// With three `[[databases]]`, a user with `max_queues = 3` created 9
/// queues (and as many streams): the count was each database's. Now a
/// creation counts the user's queues and streams on every database, by
/// any command that creates (QCREATE, XADD alone or batched, XGROUP CREATE
/// ... MKSTREAM); creations at once on different databases pass it by at
/// most the user's connections creating less one (docs/mwmq.md).
#[test]
fn max_queues_holds_across_databases() {
    let pg = Postgres::start().unwrap();
    let mut db = sql(&pg);
    db.batch_execute("CREATE DATABASE mwmq_1").unwrap();
    db.batch_execute("CREATE DATABASE mwmq_2").unwrap();
    let urls: Vec<String> = ["mwmq", "mwmq_1", "mwmq_2"]
        .iter()
        .map(|d| pg.conninfo().replace("dbname=mwmq", &format!("dbname={d}")))
        .collect();
    let mut cfg = config_for("");
    cfg.databases = urls
        .iter()
        .enumerate()
        .map(|(i, url)| mwmq::config::DatabaseEntry { name: format!("db{i}"), url: url.clone(), drain: false })
        .collect();
    let mut small = user("small", "s-pw", &["*"], &["*"], &["*"]);
    small.max_queues = 3;
    let mut burst = user("burst", "b-pw", &["*"], &["*"], &["*"]);
    burst.max_queues = 3;
    cfg.users = vec![small, burst];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let placement = mwmq::placement::Placement::new(vec!["db0".into(), "db1".into(), "db2".into()]);
    // Names of `who` on database `d`: the k-th.
    let on = |who: &str, d: usize, k: usize| {
        (0..).map(|i| format!("{who}.{i}")).filter(|n| placement.home(n) == d).nth(k).unwrap()
    };
    let mut s = login(addr, "small", "s-pw");

    // One on each database: a queue, a stream by XADD, one by XGROUP CREATE ... MKSTREAM.
    assert_eq!(q::<String>(&mut s, &["QCREATE", &on("small", 0, 0)]), "OK");
    let _: String = q(&mut s, &["XADD", &on("small", 1, 0), "*", "k", "v"]);
    assert_eq!(q::<String>(&mut s, &["XGROUP", "CREATE", &on("small", 2, 0), "g", "$", "MKSTREAM"]), "OK");
    // A fourth, on any database, by any command, is refused; what exists is served.
    let over = "OVERQUOTA user small may create at most 3 queues (max_queues); 2 of its queues and streams are on \
                other databases";
    for d in 0..3 {
        let name = on("small", d, 1);
        assert_eq!(err(&mut s, &["QCREATE", &name]), over, "{name}");
        assert_eq!(err(&mut s, &["XADD", &name, "*", "k", "v"]), over, "{name}");
        assert_eq!(err(&mut s, &["XGROUP", "CREATE", &name, "g", "$", "MKSTREAM"]), over, "{name}");
    }
    let adds: Vec<Vec<String>> = (0..3).map(|_| strings(&["XADD", &on("small", 0, 2), "*", "k", "v"])).collect();
    let replies = pipelined(addr, Some(("small", "s-pw")), &adds);
    assert!(replies.iter().all(|r| *r == format!("-{over}")), "batched XADDs alike: {replies:?}");
    let _: String = q(&mut s, &["XADD", &on("small", 1, 0), "*", "k", "v"]);
    let owned = |who: &str| -> i64 {
        urls.iter()
            .map(|u| {
                let mut c = sql_at(u);
                let r = c
                    .query_one(
                        "SELECT (SELECT count(*) FROM mwmq_queues WHERE created_by = $1 AND dropped_at IS NULL)
                              + (SELECT count(*) FROM mwmq_streams WHERE created_by = $1)",
                        &[&who],
                    )
                    .unwrap();
                r.get::<_, i64>(0)
            })
            .sum()
    };
    assert_eq!(owned("small"), 3);
    // DEL frees a place, on any database: batched XADDs then make the stream once.
    assert_eq!(q::<i64>(&mut s, &["DEL", &on("small", 1, 0)]), 1);
    let adds: Vec<Vec<String>> = (0..3).map(|_| strings(&["XADD", &on("small", 2, 1), "*", "k", "v"])).collect();
    let replies = pipelined(addr, Some(("small", "s-pw")), &adds);
    assert!(replies.iter().all(|r| r.starts_with('$')), "{replies:?}");
    assert_eq!(q::<i64>(&mut s, &["XLEN", &on("small", 2, 1)]), 3);
    assert_eq!(owned("small"), 3);

    // Six connections creating two each at once, over the three databases: the
    // quota is met, and passed by at most the connections less one.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
    let names: Vec<String> = (0..12).map(|k| on("burst", k % 3, k / 3)).collect();
    let racers: Vec<_> = (0..6)
        .map(|i| {
            let (barrier, mine) = (barrier.clone(), [names[2 * i].clone(), names[2 * i + 1].clone()]);
            std::thread::spawn(move || {
                let mut c = login(addr, "burst", "b-pw");
                barrier.wait();
                mine.iter()
                    .map(|n| redis::cmd("XADD").arg(n).arg("*").arg("k").arg("v").query::<String>(&mut c).is_ok())
                    .filter(|made| *made)
                    .count()
            })
        })
        .collect();
    let made: usize = racers.into_iter().map(|t| t.join().unwrap()).sum();
    eprintln!("six connections racing over three databases made {made} streams (max_queues 3)");
    assert_eq!(made as i64, owned("burst"));
    assert!((3..=3 + 6 - 1).contains(&made), "{made} streams made by six connections with max_queues 3");
}
