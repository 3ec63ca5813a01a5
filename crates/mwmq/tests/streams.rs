//! Redis Streams on mwmq against Debian's redis-server 7.0: the same random
//! command sequences sent to both, every reply compared (RESP2 and RESP3),
//! byte for byte after four documented normalisations: ids made by `*`
//! (the two clocks differ), idle times under 10 s (taken at different
//! instants), delivery and seen times (XINFO STREAM FULL: the clocks), and
//! XINFO STREAM's radix-tree figures (Redis's memory layout). Then what Redis cannot show: BLOCK woken by an XADD of another
//! connection, and pending entries that outlive a restart of mwmq.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use mctest::Rng;
use mwmq::Service;

/// A RESP2/RESP3 value, read whole.
#[derive(Debug, Clone, PartialEq)]
enum V {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    NilArray,
    Arr(Vec<V>),
    Map(Vec<(V, V)>),
    Other(String),
}

impl std::fmt::Display for V {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            V::Simple(s) => write!(f, "+{s}"),
            V::Err(s) => write!(f, "-{s}"),
            V::Int(n) => write!(f, ":{n}"),
            V::Bulk(b) => write!(f, "\"{}\"", String::from_utf8_lossy(b)),
            V::Nil => write!(f, "nil"),
            V::NilArray => write!(f, "nil-array"),
            V::Arr(items) => {
                write!(f, "[")?;
                for (i, x) in items.iter().enumerate() {
                    write!(f, "{}{x}", if i > 0 { ", " } else { "" })?;
                }
                write!(f, "]")
            }
            V::Map(pairs) => {
                write!(f, "{{")?;
                for (i, (k, v)) in pairs.iter().enumerate() {
                    write!(f, "{}{k}: {v}", if i > 0 { ", " } else { "" })?;
                }
                write!(f, "}}")
            }
            V::Other(s) => write!(f, "{s}"),
        }
    }
}

struct Raw {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Raw { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }

    fn call(&mut self, args: &[String]) -> V {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&out).expect("write");
        self.read()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("read");
        assert!(l.ends_with("\r\n"), "a reply line ends with CRLF: {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    fn read(&mut self) -> V {
        let l = self.line();
        let (t, rest) = l.split_at(1);
        let n = || rest.parse::<i64>().expect("a number");
        match t {
            "+" => V::Simple(rest.into()),
            "-" => V::Err(rest.into()),
            ":" => V::Int(n()),
            "_" => V::Nil,
            "$" if n() < 0 => V::Nil,
            "$" => {
                let mut b = vec![0; n() as usize + 2];
                self.r.read_exact(&mut b).expect("bulk");
                b.truncate(b.len() - 2);
                V::Bulk(b)
            }
            "*" if n() < 0 => V::NilArray,
            "*" | "~" => V::Arr((0..n()).map(|_| self.read()).collect()),
            "%" => V::Map((0..n()).map(|_| (self.read(), self.read())).collect()),
            _ => V::Other(l.clone()),
        }
    }
}

/// The normalisations the module's note lists.
fn normalise(v: V, pending_range: bool) -> V {
    let clock_id = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        s.split_once('-').is_some_and(|(ms, q)| ms.len() >= 12 && q.bytes().all(|c| c.is_ascii_digit()))
    };
    let small = |v: V| match v {
        V::Int(n) if (0..10_000).contains(&n) => V::Int(0),
        other => other,
    };
    let fix_pairs = |k: &V, v: V| match k {
        V::Bulk(b) if b == b"idle" => small(v),
        V::Bulk(b) if b == b"radix-tree-keys" || b == b"radix-tree-nodes" => V::Int(0),
        _ => v,
    };
    match v {
        V::Bulk(b) if clock_id(&b) => V::Bulk(b"<clock id>".to_vec()),
        // A delivery or seen time (XINFO STREAM FULL): the clock.
        V::Int(n) if n > 1_000_000_000_000 => V::Int(-1),
        V::Map(pairs) => V::Map(
            pairs
                .into_iter()
                .map(|(k, v)| {
                    let v = normalise(v, false);
                    (normalise(k.clone(), false), fix_pairs(&k, v))
                })
                .collect(),
        ),
        V::Arr(items) => {
            let mut out: Vec<V> = items.into_iter().map(|x| normalise(x, false)).collect();
            // RESP2 maps are flat arrays of keys and values.
            for i in 1..out.len() {
                let k = out[i - 1].clone();
                let v = std::mem::replace(&mut out[i], V::Nil);
                out[i] = fix_pairs(&k, v);
            }
            if pending_range {
                for e in &mut out {
                    match e {
                        V::Arr(x) if x.len() == 4 => x[2] = small(x[2].clone()),
                        _ => {}
                    }
                }
            }
            V::Arr(out)
        }
        other => other,
    }
}

/// Random stream commands over a few streams, groups and consumers.
struct Gen {
    rng: Rng,
    top: [u64; 2],
    ids: [Vec<String>; 2],
}

const STREAMS: [&str; 2] = ["s1", "s2"];
const GROUPS: &[&str] = &["g1", "g2"];
const CONSUMERS: &[&str] = &["c1", "c2", "c3"];

impl Gen {
    fn stream(&mut self) -> (usize, String) {
        let i = self.rng.below(2) as usize;
        (i, STREAMS[i].to_string())
    }

    fn key(&mut self) -> String {
        match self.rng.below(20) {
            0 => "q1".into(),     // a queue in mwmq, a string in Redis: WRONGTYPE
            1 => "none".into(),   // never created
            2 => "sT".into(),     // ids from the clock
            _ => self.stream().1, // explicit ids
        }
    }

    fn known_id(&mut self, i: usize) -> String {
        if self.ids[i].is_empty() || self.rng.chance(10) {
            return format!("{}-{}", self.rng.below(40), self.rng.below(3));
        }
        let n = self.ids[i].len() as u64;
        self.ids[i][self.rng.below(n) as usize].clone()
    }

    fn bound(&mut self, i: usize, low: bool) -> String {
        match self.rng.below(6) {
            0 => (if low { "-" } else { "+" }).into(),
            1 => format!("({}", self.known_id(i)),
            2 => self.rng.below(40).to_string(),
            _ => self.known_id(i),
        }
    }

    fn next(&mut self) -> Vec<String> {
        let s = |x: &[&str]| x.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let (i, st) = self.stream();
        let g = self.rng.pick(GROUPS).to_string();
        let c = self.rng.pick(CONSUMERS).to_string();
        let mut v = match self.rng.below(100) {
            0..=24 => {
                let mut v = s(&["XADD"]);
                let k = if self.rng.chance(8) { self.key() } else { st.clone() };
                v.push(k.clone());
                if self.rng.chance(5) {
                    v.push("NOMKSTREAM".into());
                }
                if self.rng.chance(10) {
                    v.extend(s(&["MAXLEN", "="]));
                    v.push((3 + self.rng.below(6)).to_string());
                }
                let id = if k == "sT" {
                    "*".to_string()
                } else if self.rng.chance(10) {
                    format!("{}-*", self.top[i])
                } else if self.rng.chance(8) {
                    format!("{}-{}", self.top[i].saturating_sub(1), self.rng.below(2))
                } else {
                    self.top[i] += 1 + self.rng.below(2);
                    let id = format!("{}-{}", self.top[i], self.rng.below(2));
                    self.ids[i].push(id.clone());
                    id
                };
                v.push(id);
                for f in 0..1 + self.rng.below(2) {
                    v.push(format!("f{f}"));
                    v.push(format!("v{}", self.rng.below(100)));
                }
                v
            }
            25..=29 => {
                let rev = self.rng.chance(30);
                let mut v = vec![if rev { "XREVRANGE" } else { "XRANGE" }.to_string(), self.key()];
                let (a, b) = (self.bound(i, !rev), self.bound(i, rev));
                v.extend([a, b]);
                if self.rng.chance(40) {
                    v.extend(["COUNT".into(), self.rng.below(4).to_string()]);
                }
                v
            }
            30..=31 => vec!["XLEN".into(), self.key()],
            32..=35 => {
                let mut v = s(&["XDEL"]);
                v.push(st.clone());
                for _ in 0..1 + self.rng.below(2) {
                    v.push(self.known_id(i));
                }
                v
            }
            36..=37 => {
                if self.rng.chance(50) {
                    vec!["XTRIM".into(), st.clone(), "MAXLEN".into(), (2 + self.rng.below(8)).to_string()]
                } else {
                    vec!["XTRIM".into(), st.clone(), "MINID".into(), self.known_id(i)]
                }
            }
            38..=43 => {
                let start = match self.rng.below(4) {
                    0 => "$".to_string(),
                    1 => self.known_id(i),
                    _ => "0".to_string(),
                };
                let mut v = vec!["XGROUP".into(), "CREATE".into(), st.clone(), g, start];
                if self.rng.chance(30) {
                    v.push("MKSTREAM".into());
                }
                if self.rng.chance(15) {
                    v.extend(["ENTRIESREAD".into(), self.rng.below(5).to_string()]);
                }
                v
            }
            44 => vec!["XGROUP".into(), "DESTROY".into(), st.clone(), g],
            45 => vec!["XGROUP".into(), "CREATECONSUMER".into(), st.clone(), g, c],
            46 => vec!["XGROUP".into(), "DELCONSUMER".into(), st.clone(), g, c],
            47 => {
                let id = if self.rng.chance(30) { "$".to_string() } else { self.known_id(i) };
                vec!["XGROUP".into(), "SETID".into(), st.clone(), g, id]
            }
            48..=63 => {
                let mut v = vec!["XREADGROUP".into(), "GROUP".into(), g, c];
                if self.rng.chance(60) {
                    v.extend(["COUNT".into(), (1 + self.rng.below(3)).to_string()]);
                }
                if self.rng.chance(10) {
                    v.push("NOACK".into());
                }
                v.push("STREAMS".into());
                let two = self.rng.chance(20);
                v.push(st.clone());
                if two {
                    v.push(STREAMS[1 - i].into());
                }
                let mut id = || if self.rng.chance(75) { ">".to_string() } else { "0".to_string() };
                let a = id();
                v.push(a.clone());
                if two {
                    v.push(a);
                }
                v
            }
            64..=66 => {
                let mut v = s(&["XREAD"]);
                if self.rng.chance(50) {
                    v.extend(["COUNT".into(), (1 + self.rng.below(3)).to_string()]);
                }
                v.extend(["STREAMS".into(), "s1".into(), "s2".into()]);
                v.push(self.known_id(0));
                v.push(if self.rng.chance(20) { "$".into() } else { self.known_id(1) });
                v
            }
            67..=74 => {
                let mut v = vec!["XACK".into(), st.clone(), g];
                for _ in 0..1 + self.rng.below(3) {
                    v.push(self.known_id(i));
                }
                v
            }
            75..=78 => vec!["XPENDING".into(), st.clone(), g],
            79..=82 => {
                let mut v = vec!["XPENDING".into(), st.clone(), g, self.bound(i, true), self.bound(i, false)];
                v.push((self.rng.below(5)).to_string());
                if self.rng.chance(40) {
                    v.push(c);
                }
                v
            }
            83..=86 => {
                let mut v = vec!["XCLAIM".into(), st.clone(), g, c, "0".into()];
                for _ in 0..1 + self.rng.below(2) {
                    v.push(self.known_id(i));
                }
                if self.rng.chance(25) {
                    v.push("JUSTID".into());
                }
                if self.rng.chance(15) {
                    v.push("FORCE".into());
                }
                if self.rng.chance(15) {
                    v.extend(["RETRYCOUNT".into(), self.rng.below(5).to_string()]);
                }
                if self.rng.chance(10) {
                    v.extend(["LASTID".into(), self.known_id(i)]);
                }
                v
            }
            87..=90 => {
                let mut v = vec!["XAUTOCLAIM".into(), st.clone(), g, c, "0".into(), self.bound(i, true)];
                if self.rng.chance(50) {
                    v.extend(["COUNT".into(), (1 + self.rng.below(3)).to_string()]);
                }
                if self.rng.chance(25) {
                    v.push("JUSTID".into());
                }
                v
            }
            91..=92 => vec!["XINFO".into(), "STREAM".into(), self.key()],
            93 => {
                let mut v = vec!["XINFO".into(), "STREAM".into(), self.key(), "FULL".into()];
                if self.rng.chance(50) {
                    v.extend(["COUNT".into(), self.rng.below(3).to_string()]);
                }
                v
            }
            94..=95 => vec!["XINFO".into(), "GROUPS".into(), self.key()],
            96..=97 => vec!["XINFO".into(), "CONSUMERS".into(), st.clone(), g],
            // (TYPE of q1 differs by design: a string in Redis, a queue in mwmq.)
            98 => vec!["TYPE".into(), self.stream().1],
            _ => vec!["EXISTS".into(), self.key(), self.key()],
        };
        // Now and then an argument spoiled: the errors must match too.
        if self.rng.chance(2) && v.len() > 2 {
            let at = 2 + self.rng.below(v.len() as u64 - 2) as usize;
            v[at] = "x-y".into();
        }
        if v[0] == "XGROUP" && self.rng.chance(3) {
            v.pop();
        }
        v
    }
}

/// `STREAMS_SEED` and `STREAMS_STEPS` replace the fixed seed and length (to explore).
fn differential(resp3: bool, seed: u64, steps: usize) {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = env("STREAMS_SEED").unwrap_or(seed);
    let steps = env("STREAMS_STEPS").map_or(steps, |n| n as usize);
    let pg = Postgres::start().expect("postgres");
    let mq = start(config(&pg));
    let redis = mctest::RedisServer::start_with(&[]).expect("redis-server");
    let mut a = Raw::connect(redis.addr());
    let mut b = Raw::connect(mq.local_addr());
    let sv = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(a.call(&sv(&["SET", "q1", "x"])), V::Simple("OK".into()));
    assert_eq!(b.call(&sv(&["QCREATE", "q1"])), V::Simple("OK".into()));
    if resp3 {
        assert!(matches!(a.call(&sv(&["HELLO", "3"])), V::Map(_)));
        assert!(matches!(b.call(&sv(&["HELLO", "3"])), V::Map(_)));
    }
    let mut g = Gen { rng: Rng(seed), top: [0, 0], ids: [Vec::new(), Vec::new()] };
    let mut mismatches = Vec::new();
    let t0 = Instant::now();
    for step in 0..steps {
        let cmd = g.next();
        let pending_range = cmd[0] == "XPENDING" && cmd.len() > 3;
        let want = normalise(a.call(&cmd), pending_range);
        let got = normalise(b.call(&cmd), pending_range);
        if std::env::var("STREAMS_TRACE").is_ok() {
            eprintln!("{step}: {} => {want}", cmd.join(" "));
        }
        if want != got {
            mismatches.push(format!("step {step}: {}\n  redis: {want}\n  mwmq:  {got}", cmd.join(" ")));
        }
    }
    // The whole state at the end, too.
    for k in ["s1", "s2", "sT"] {
        for cmd in [sv(&["XRANGE", k, "-", "+"]), sv(&["XINFO", "GROUPS", k])] {
            let (want, got) = (normalise(a.call(&cmd), false), normalise(b.call(&cmd), false));
            if want != got {
                mismatches.push(format!("end: {}\n  redis: {want}\n  mwmq:  {got}", cmd.join(" ")));
            }
        }
    }
    eprintln!(
        "{steps} random stream commands (seed {seed}, RESP{}) in {:.1} s: {} replies differ",
        if resp3 { 3 } else { 2 },
        t0.elapsed().as_secs_f64(),
        mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} of {steps} replies differ from Redis:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn random_stream_commands_answer_as_redis_7_in_resp2() {
    differential(false, 0x5eed_0001, 600);
}

#[test]
fn random_stream_commands_answer_as_redis_7_in_resp3() {
    differential(true, 0x5eed_0002, 600);
}

/// Runs `args` on `c`, the reply as a redis Value.
fn v(c: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The ids in an XREAD / XREADGROUP reply (RESP2: `[[stream, [[id, fields]...]]...]`).
fn ids_read(r: &redis::Value) -> Vec<String> {
    let mut out = Vec::new();
    let redis::Value::Array(streams) = r else { return out };
    for s in streams {
        let redis::Value::Array(pair) = s else { continue };
        let redis::Value::Array(entries) = &pair[1] else { continue };
        for e in entries {
            if let redis::Value::Array(e) = e {
                if let redis::Value::BulkString(id) = &e[0] {
                    out.push(String::from_utf8_lossy(id).into_owned());
                }
            }
        }
    }
    out
}

#[test]
fn block_waits_are_woken_by_an_xadd_here_and_in_another_mwmq() {
    let pg = Postgres::start().expect("postgres");
    // Polling alone would take a minute: within the 30 s waits below only
    // wake-ups answer (without one, a wait ends with nothing).
    let mut cfg = config(&pg);
    cfg.queues.poll_ms = 60_000;
    let a = start(cfg.clone());
    let b = start(cfg);
    let (addr_a, addr_b) = (a.local_addr(), b.local_addr());
    let mut ca = connect(addr_a);
    let _: String = q(&mut ca, &["XADD", "jobs", "1-1", "old", "entry"]);
    assert_eq!(q::<String>(&mut ca, &["XGROUP", "CREATE", "jobs", "workers", "$"]), "OK");

    // Nothing new: the wait ends with the null array after BLOCK ms.
    let t = Instant::now();
    assert_eq!(v(&mut ca, &["XREAD", "BLOCK", "300", "STREAMS", "jobs", "$"]), redis::Value::Nil);
    assert!(t.elapsed() >= Duration::from_millis(280), "{:?}", t.elapsed());

    for (reader, writer, what) in [(addr_a, addr_a, "same process"), (addr_a, addr_b, "another mwmq")] {
        // XREADGROUP ... BLOCK and XREAD ... BLOCK $ wait; an XADD wakes both.
        let group = std::thread::spawn(move || {
            let mut c = connect(reader);
            let r = v(&mut c, &["XREADGROUP", "GROUP", "workers", "w1", "BLOCK", "30000", "STREAMS", "jobs", ">"]);
            ids_read(&r)
        });
        let plain = std::thread::spawn(move || {
            let mut c = connect(reader);
            let r = v(&mut c, &["XREAD", "BLOCK", "30000", "STREAMS", "other", "jobs", "$", "$"]);
            ids_read(&r)
        });
        // Both waits parked (INFO answers without the database): each has
        // made its first look, so `$` is resolved and the XADD comes after it.
        assert!(
            eventually(Duration::from_secs(30), || info_field(&mut ca, "blocked_clients") == 2),
            "{what}: the two BLOCK reads were not both waiting within 30 s (blocked_clients {})",
            info_field(&mut ca, "blocked_clients")
        );
        let mut w = connect(writer);
        let id: String = q(&mut w, &["XADD", "jobs", "*", "task", what]);
        assert_eq!(group.join().unwrap(), vec![id.clone()], "{what}: XREADGROUP BLOCK was woken with the new entry");
        assert_eq!(plain.join().unwrap(), vec![id], "{what}: XREAD BLOCK $ was woken with only what came after it");
    }
}

#[test]
fn pending_entries_and_delivery_counts_outlive_a_restart_of_mwmq() {
    let pg = Postgres::start().expect("postgres");
    let cfg = config(&pg);
    let mq = start(cfg.clone());
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["XGROUP", "CREATE", "orders", "billing", "0", "MKSTREAM"]), "OK");
    let ids: Vec<String> = (0..3).map(|i| q(&mut c, &["XADD", "orders", "*", "n", &i.to_string()])).collect();
    let r = v(&mut c, &["XREADGROUP", "GROUP", "billing", "dies", "COUNT", "2", "STREAMS", "orders", ">"]);
    assert_eq!(ids_read(&r), ids[..2].to_vec());
    assert_eq!(q::<i64>(&mut c, &["XACK", "orders", "billing", &ids[0]]), 1);
    drop(c);
    drop(mq);

    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    // What was delivered and not acknowledged is still pending, to the same consumer.
    let summary = v(&mut c, &["XPENDING", "orders", "billing"]);
    let redis::Value::Array(s) = summary else { panic!("{summary:?}") };
    assert_eq!(s[0], redis::Value::Int(1));
    // Another consumer claims it (delivery count 2); the third was never delivered and comes next.
    let claimed = v(&mut c, &["XAUTOCLAIM", "orders", "billing", "lives", "0", "0"]);
    let redis::Value::Array(parts) = &claimed else { panic!("{claimed:?}") };
    let redis::Value::Array(entries) = &parts[1] else { panic!("{claimed:?}") };
    assert_eq!(entries.len(), 1, "{claimed:?}");
    let r = v(&mut c, &["XPENDING", "orders", "billing", "-", "+", "10"]);
    let redis::Value::Array(rows) = r else { panic!() };
    let redis::Value::Array(row) = &rows[0] else { panic!() };
    assert_eq!(row[1], redis::Value::BulkString(b"lives".to_vec()));
    assert_eq!(row[3], redis::Value::Int(2));
    let r = v(&mut c, &["XREADGROUP", "GROUP", "billing", "lives", "STREAMS", "orders", ">"]);
    assert_eq!(ids_read(&r), vec![ids[2].clone()]);
    assert_eq!(q::<i64>(&mut c, &["XACK", "orders", "billing", &ids[1], &ids[2]]), 2);
    assert_eq!(q::<i64>(&mut c, &["XLEN", "orders"]), 3);
}

#[test]
fn users_rights_cover_streams_and_names_keep_one_kind() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.users = vec![
        user("producer", "p-pw", &["events*"], &[], &[]),
        user("worker", "w-pw", &[], &["events*"], &[]),
        user("ops", "o-pw", &[], &[], &["events*", "jobs"]),
    ];
    let mq = start(cfg);
    let addr = mq.local_addr();
    let (mut producer, mut worker, mut ops) =
        (login(addr, "producer", "p-pw"), login(addr, "worker", "w-pw"), login(addr, "ops", "o-pw"));
    // Groups are made by an admin of the stream.
    assert!(err(&mut producer, &["XGROUP", "CREATE", "events", "g", "0", "MKSTREAM"]).starts_with("NOPERM"));
    assert_eq!(q::<String>(&mut ops, &["XGROUP", "CREATE", "events", "g", "0", "MKSTREAM"]), "OK");
    let id: String = q(&mut producer, &["XADD", "events", "*", "k", "v"]);
    assert!(err(&mut producer, &["XREADGROUP", "GROUP", "g", "p", "STREAMS", "events", ">"]).starts_with("NOPERM"));
    assert!(err(&mut producer, &["XRANGE", "events", "-", "+"]).starts_with("NOPERM"));
    assert!(err(&mut worker, &["XADD", "events", "*", "k", "v"]).starts_with("NOPERM"));
    assert!(err(&mut worker, &["XADD", "payroll", "*", "k", "v"]).starts_with("NOPERM"));
    assert!(err(&mut worker, &["XTRIM", "events", "MAXLEN", "0"]).starts_with("NOPERM"));
    assert!(err(&mut worker, &["DEL", "events"]).starts_with("NOPERM"));
    // Several streams: a right on every one.
    assert!(
        err(&mut worker, &["XREAD", "STREAMS", "events", "payroll", "0", "0"]).starts_with("NOPERM"),
        "a read of a stream beyond its rights is refused as a whole"
    );
    let r = v(&mut worker, &["XREADGROUP", "GROUP", "g", "w", "STREAMS", "events", ">"]);
    assert_eq!(ids_read(&r), vec![id.clone()]);
    assert_eq!(q::<i64>(&mut worker, &["XACK", "events", "g", &id]), 1);
    // A queue's name is not a stream's, and the other way round.
    assert_eq!(q::<String>(&mut ops, &["QCREATE", "jobs"]), "OK");
    assert_eq!(
        err(&mut ops, &["XGROUP", "CREATE", "jobs", "g", "0"]),
        "WRONGTYPE Operation against a key holding the wrong kind of value"
    );
    assert_eq!(q::<String>(&mut ops, &["TYPE", "jobs"]), "queue");
    assert_eq!(q::<String>(&mut ops, &["TYPE", "events"]), "stream");
    assert!(err(&mut ops, &["QCREATE", "events"]).starts_with("WRONGTYPE"), "QCREATE of a stream's name");
    assert_eq!(q::<i64>(&mut ops, &["DEL", "events", "jobs"]), 1, "DEL removes streams, not queues");
    assert_eq!(q::<i64>(&mut ops, &["EXISTS", "events", "jobs"]), 1);
}

#[test]
fn a_group_with_a_delivery_limit_moves_poison_entries_to_its_dead_letter_stream() {
    let pg = Postgres::start().expect("postgres");
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["XGROUP", "CREATE", "jobs", "g", "0", "MKSTREAM"]), "OK");
    assert!(err(&mut c, &["XGROUP", "DEADLETTER", "jobs", "g", "2"]).contains("needs a target stream"));
    assert!(err(&mut c, &["XGROUP", "DEADLETTER", "jobs", "nog", "2", "jobs.dead"]).starts_with("NOGROUP"));
    assert_eq!(q::<String>(&mut c, &["XGROUP", "DEADLETTER", "jobs", "g", "2", "jobs.dead"]), "OK");
    let poison: String = q(&mut c, &["XADD", "jobs", "*", "task", "poison"]);
    let fine: String = q(&mut c, &["XADD", "jobs", "*", "task", "fine"]);
    // Delivered once by reading, a second time by a claim; the third delivery does not happen.
    let r = v(&mut c, &["XREADGROUP", "GROUP", "g", "w1", "STREAMS", "jobs", ">"]);
    assert_eq!(ids_read(&r), vec![poison.clone(), fine.clone()]);
    assert_eq!(q::<i64>(&mut c, &["XACK", "jobs", "g", &fine]), 1);
    let claimed = v(&mut c, &["XAUTOCLAIM", "jobs", "g", "w2", "0", "0"]);
    let redis::Value::Array(parts) = &claimed else { panic!("{claimed:?}") };
    assert!(matches!(&parts[1], redis::Value::Array(e) if e.len() == 1), "{claimed:?}");
    let again = v(&mut c, &["XAUTOCLAIM", "jobs", "g", "w3", "0", "0"]);
    let redis::Value::Array(parts) = &again else { panic!("{again:?}") };
    assert_eq!(parts[1], redis::Value::Array(vec![]), "not delivered a third time");
    assert_eq!(parts[2], redis::Value::Array(vec![redis::Value::BulkString(poison.clone().into_bytes())]));
    let summary = v(&mut c, &["XPENDING", "jobs", "g"]);
    assert!(matches!(&summary, redis::Value::Array(s) if s[0] == redis::Value::Int(0)), "{summary:?}");
    // The dead-letter stream has it, with where it came from.
    let dead: Vec<(String, Vec<String>)> = q(&mut c, &["XRANGE", "jobs.dead", "-", "+"]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    let want: Vec<String> =
        ["task", "poison", "dead-from", "jobs", "dead-group", "g", "dead-id", &poison, "deliveries", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    assert_eq!(dead[0].1, want);
    let info = v(&mut c, &["XINFO", "GROUPS", "jobs"]);
    let text = format!("{info:?}");
    assert!(text.contains("max-deliveries") && text.contains("jobs.dead"), "{text}");
    assert_eq!(q::<String>(&mut c, &["XGROUP", "DEADLETTER", "jobs", "g", "0"]), "OK");
    let info = format!("{:?}", v(&mut c, &["XINFO", "GROUPS", "jobs"]));
    assert!(!info.contains("max-deliveries"), "off again: {info}");
}

#[test]
fn concurrent_producers_and_consumers_batched_lose_and_repeat_nothing() {
    // Many XADDs, XREADGROUPs and XACKs at once: they share statements
    // (batches); not one may fail, repeat or go missing.
    let pg = Postgres::start().expect("postgres");
    let mq = start(config(&pg));
    let addr = mq.local_addr();
    let mut c = connect(addr);
    assert_eq!(q::<String>(&mut c, &["XGROUP", "CREATE", "work", "g", "$", "MKSTREAM"]), "OK");
    let producers: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = connect(addr);
                (0..100)
                    .map(|i| q::<String>(&mut c, &["XADD", "work", "*", "n", &format!("{t}-{i}")]))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let added: Vec<String> = producers.into_iter().flat_map(|p| p.join().unwrap()).collect();
    let distinct: std::collections::HashSet<&String> = added.iter().collect();
    assert_eq!(distinct.len(), 400, "every XADD got an id of its own");
    let consumers: Vec<_> = (0..6)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = connect(addr);
                let me = format!("c{t}");
                let mut got = Vec::new();
                loop {
                    let count = if t % 2 == 0 { "1" } else { "3" };
                    let r = v(&mut c, &["XREADGROUP", "GROUP", "g", &me, "COUNT", count, "STREAMS", "work", ">"]);
                    let ids = ids_read(&r);
                    if ids.is_empty() {
                        return got;
                    }
                    let mut ack = vec!["XACK", "work", "g"];
                    ack.extend(ids.iter().map(String::as_str));
                    assert_eq!(q::<i64>(&mut c, &ack), ids.len() as i64, "{me}: each XACK acknowledged its own");
                    got.extend(ids);
                }
            })
        })
        .collect();
    let mut delivered: Vec<String> = consumers.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let n = delivered.len();
    delivered.sort();
    delivered.dedup();
    assert_eq!(n, 400, "each entry delivered once");
    assert_eq!(delivered.len(), 400);
    let info = v(&mut c, &["XINFO", "GROUPS", "work"]);
    let redis::Value::Array(groups) = &info else { panic!("{info:?}") };
    let redis::Value::Array(f) = &groups[0] else { panic!("{info:?}") };
    assert_eq!(
        (&f[5], &f[9], &f[11]),
        (&redis::Value::Int(0), &redis::Value::Int(400), &redis::Value::Int(0)),
        "{info:?}"
    );
}

/// A reply is built whole: its size is bounded (clients page with COUNT).
/// A range that would carry more than 10,000 entries is refused (it used
/// to stop at 10,000, and a client paging until a short page took it for
/// the end); a read stops there.
#[test]
fn a_reply_carries_at_most_ten_thousand_entries() {
    let pg = Postgres::start().expect("postgres");
    let mq = start(config(&pg));
    let mut c = connect(mq.local_addr());
    let mut pipe = redis::pipe();
    for i in 1..=10_050 {
        pipe.cmd("XADD").arg("big").arg(format!("{i}-0")).arg("f").arg("v").ignore();
    }
    let () = pipe.query(&mut c).expect("10,050 XADDs");
    assert_eq!(q::<i64>(&mut c, &["XLEN", "big"]), 10_050);
    let refused = "ERR the reply would carry more than 10000 entries (mwmq's most per reply): ask for fewer entries \
                   with COUNT";
    assert_eq!(err(&mut c, &["XRANGE", "big", "-", "+"]), refused);
    assert_eq!(err(&mut c, &["XREVRANGE", "big", "+", "-", "COUNT", "10001"]), refused);
    let all: Vec<(String, Vec<String>)> = q(&mut c, &["XRANGE", "big", "-", "+", "COUNT", "10000"]);
    assert_eq!(all.len(), 10_000);
    assert_eq!(all.last().unwrap().0, "10000-0");
    let rest: Vec<(String, Vec<String>)> = q(&mut c, &["XRANGE", "big", "(10000-0", "+", "COUNT", "20000"]);
    assert_eq!(rest.len(), 50, "the next page has the rest");
    assert_eq!(q::<String>(&mut c, &["XGROUP", "CREATE", "big", "g", "0"]), "OK");
    let r = v(&mut c, &["XREADGROUP", "GROUP", "g", "c", "STREAMS", "big", ">"]);
    assert_eq!(ids_read(&r).len(), 10_000);
}
