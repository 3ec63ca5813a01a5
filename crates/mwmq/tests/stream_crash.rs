//! Streams lose nothing acknowledged: producers (XADD) and a consumer group
//! (XREADGROUP, XACK, and XAUTOCLAIM of what a dead connection left
//! pending) run while mwmq is SIGKILLed and restarted and while PostgreSQL
//! restarts. Afterwards: every XADD answered with an id is in the stream
//! and was delivered to the group at least once, no XACK answered 1 twice
//! for one entry (an acknowledged entry never comes back), nothing is left
//! pending, and nothing was delivered that nobody added.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use redis::Value;

#[derive(Default)]
struct History {
    /// Body -> id of XADDs answered with an id.
    added: HashMap<String, String>,
    /// Bodies of XADDs whose outcome is unknown.
    maybe_added: HashSet<String>,
    /// (id, body) of every delivery.
    delivered: Vec<(String, String)>,
    /// Ids whose XACK answered 1.
    acked: Vec<String>,
}

fn try_connect(addr: std::net::SocketAddr) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://{addr}/")).ok()?;
    let c = client.get_connection_with_timeout(Duration::from_millis(500)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    Some(c)
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("not a string: {other:?}"),
    }
}

/// (id, body) of `[[id, [field, value]]...]`.
fn entries(v: &Value) -> Vec<(String, String)> {
    let Value::Array(items) = v else { return Vec::new() };
    items
        .iter()
        .filter_map(|e| match e {
            Value::Array(p) => match &p[1] {
                Value::Array(f) => Some((text(&p[0]), text(&f[1]))),
                _ => None, // deleted meanwhile
            },
            _ => None,
        })
        .collect()
}

/// One consumer's turn: entries idle for a second are claimed, new ones read; all acknowledged.
fn consume(c: &mut redis::Connection, me: &str, h: &Mutex<History>) -> redis::RedisResult<()> {
    let claimed: Value = redis::cmd("XAUTOCLAIM").arg(&["s", "g", me, "1000", "0-0", "COUNT", "20"]).query(c)?;
    let mut got = match &claimed {
        Value::Array(parts) => entries(&parts[1]),
        _ => Vec::new(),
    };
    let read: Value = redis::cmd("XREADGROUP")
        .arg(&["GROUP", "g", me, "COUNT", "10", "BLOCK", "100", "STREAMS", "s", ">"])
        .query(c)?;
    if let Value::Array(streams) = &read {
        for s in streams {
            if let Value::Array(pair) = s {
                got.extend(entries(&pair[1]));
            }
        }
    }
    for (id, body) in got {
        h.lock().unwrap().delivered.push((id.clone(), body));
        let n: i64 = redis::cmd("XACK").arg(&["s", "g", &id]).query(c)?;
        if n == 1 {
            h.lock().unwrap().acked.push(id);
        }
    }
    Ok(())
}

#[test]
fn sigkill_of_mwmq_and_postgres_restarts_lose_no_stream_entry() {
    let pg = Postgres::start().unwrap();
    let port = mctest::free_port();
    let args = ["--db-pool", "6"];
    let mut mq = MqProcess::start(&pg, port, &args);
    let addr = mq.addr;
    let mut c = connect(addr);
    let _: String = q(&mut c, &["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"]);
    let history = Arc::new(Mutex::new(History::default()));
    let (adding, consuming) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(true)));
    let mut producers = Vec::new();
    for t in 0..3 {
        let (h, go) = (history.clone(), adding.clone());
        producers.push(std::thread::spawn(move || {
            let (mut conn, mut n) = (None, 0);
            while go.load(Ordering::Relaxed) {
                let Some(c) = conn.as_mut() else {
                    conn = try_connect(addr);
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let body = format!("p{t}-{n}");
                n += 1;
                match redis::cmd("XADD").arg(&["s", "*", "body", &body]).query::<String>(c) {
                    Ok(id) => {
                        h.lock().unwrap().added.insert(body, id);
                    }
                    Err(_) => {
                        h.lock().unwrap().maybe_added.insert(body);
                        conn = None;
                    }
                }
            }
        }));
    }
    let mut consumers = Vec::new();
    for t in 0..3 {
        let (h, go) = (history.clone(), consuming.clone());
        consumers.push(std::thread::spawn(move || {
            let mut conn = None;
            while go.load(Ordering::Relaxed) {
                let Some(c) = conn.as_mut() else {
                    conn = try_connect(addr);
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                if consume(c, &format!("c{t}"), &h).is_err() {
                    conn = None; // what it held is claimed by the others after a second
                }
            }
        }));
    }
    for round in 0..4 {
        std::thread::sleep(Duration::from_millis(500));
        if round % 2 == 0 {
            mq.kill();
            mq = MqProcess::start(&pg, port, &args);
        } else {
            pg.restart(if round == 1 { "immediate" } else { "fast" }).unwrap();
        }
    }
    // Enough traffic to mean something, however slow the machine (a minute at most).
    let enough = Instant::now() + Duration::from_secs(60);
    while history.lock().unwrap().added.len() <= 200 && Instant::now() < enough {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    adding.store(false, Ordering::Relaxed);
    for t in producers {
        t.join().unwrap();
    }
    // Drain: nothing pending and nothing unread.
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut check: Option<redis::Connection> = None;
    loop {
        let c = check.get_or_insert_with(|| connect(addr));
        let groups: redis::RedisResult<Value> = redis::cmd("XINFO").arg(&["GROUPS", "s"]).query(c);
        match groups {
            Ok(Value::Array(g)) => {
                let Value::Array(f) = &g[0] else { panic!("{g:?}") };
                if f[5] == Value::Int(0) && f[11] == Value::Int(0) {
                    break;
                }
            }
            Ok(other) => panic!("{other:?}"),
            Err(_) => check = None,
        }
        assert!(Instant::now() < deadline, "the group did not catch up");
        std::thread::sleep(Duration::from_millis(100));
    }
    consuming.store(false, Ordering::Relaxed);
    for t in consumers {
        t.join().unwrap();
    }
    let c = check.get_or_insert_with(|| connect(addr));
    let all: Value = redis::cmd("XRANGE").arg(&["s", "-", "+"]).query(c).unwrap();
    let stored: HashMap<String, String> = entries(&all).into_iter().collect();
    let h = history.lock().unwrap();
    let delivered: HashSet<&String> = h.delivered.iter().map(|(id, _)| id).collect();
    for (body, id) in &h.added {
        assert_eq!(stored.get(id), Some(body), "XADD {body} answered {id} but the stream does not hold it");
        assert!(delivered.contains(id), "{id} ({body}) was never delivered to the group");
    }
    for (id, body) in &h.delivered {
        assert!(
            h.added.get(body) == Some(id) || h.maybe_added.contains(body),
            "delivered {id} {body}: nobody added it"
        );
    }
    let mut once = HashSet::new();
    for id in &h.acked {
        assert!(once.insert(id), "XACK of {id} answered 1 twice: an acknowledged entry came back");
    }
    eprintln!(
        "streams under SIGKILL and PostgreSQL restarts: {} XADDs answered, {} unknown, {} deliveries ({} redelivered), {} XACKs",
        h.added.len(),
        h.maybe_added.len(),
        h.delivered.len(),
        h.delivered.len() - delivered.len(),
        h.acked.len()
    );
    assert!(h.added.len() > 200, "too little traffic to mean anything ({})", h.added.len());
}
