//! Replies held for clients that do not read them (issue 47, #3 and #5):
//! the output budget bounds them all together, RECV's and the archive's
//! replies are cut at `max_reply_bytes`, and a consumer group has at most
//! `max_consumers_per_group` consumers, whose listings are cut too. Both
//! engines (`MWMQ_TEST_ENGINE=pool`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use mwmq::Service;

/// A number (kB) from /proc/PID/status.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap()))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A client that reads next to nothing: a receive buffer of 4 KiB, set
/// before it connects (so the window it offers stays that small).
fn tiny_reader(addr: SocketAddr) -> TcpStream {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    sockopt::set_socket_recv_buffer_size(&fd, 4096).unwrap();
    rustix::net::connect(&fd, &addr).unwrap();
    TcpStream::from(fd)
}

/// A RESP request.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n{a}\r\n", a.len()).into_bytes());
    }
    out
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// One RESP reply as text (nested arrays flattened, space-separated), or
/// the error's text.
fn read_reply(r: &mut impl BufRead) -> Result<String, String> {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let line = line.trim_end();
    let (kind, rest) = line.split_at(1);
    match kind {
        "-" => Err(rest.to_string()),
        "+" | ":" => Ok(rest.to_string()),
        "$" if rest == "-1" => Ok("nil".into()),
        "$" => {
            let mut buf = vec![0; rest.parse::<usize>().unwrap() + 2];
            r.read_exact(&mut buf).unwrap();
            Ok(String::from_utf8_lossy(&buf[..buf.len() - 2]).into_owned())
        }
        "*" if rest == "-1" => Ok("nil".into()),
        "*" => {
            let parts: Result<Vec<String>, String> =
                (0..rest.parse::<usize>().unwrap()).map(|_| read_reply(r)).collect();
            Ok(format!("[{}]", parts?.join(" ")))
        }
        other => panic!("unexpected reply {other}{rest}"),
    }
}

/// Pipelines `cmds` on a fresh connection logged in as `login`: each reply, or its error.
fn pipelined(addr: SocketAddr, login: (&str, &str), cmds: &[Vec<String>]) -> Vec<Result<String, String>> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(&resp(&["AUTH", login.0, login.1])).unwrap();
    assert_eq!(read_reply(&mut r), Ok("OK".into()));
    let all: Vec<u8> = cmds.iter().flat_map(|c| resp(&c.iter().map(String::as_str).collect::<Vec<_>>())).collect();
    s.write_all(&all).unwrap();
    (0..cmds.len()).map(|_| read_reply(&mut r)).collect()
}

/// Polls INFO until `field` satisfies `ok` (60 s at most).
fn until_info(c: &mut redis::Connection, field: &str, what: &str, ok: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = info_field(c, field);
        if ok(v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: INFO {field} is still {v} after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 100 clients with a receive buffer of 4 KiB each sent one `XRANGE big - +`
/// over 8 entries of 4 MiB and never read: each held a reply of 12 MiB (the
/// three entries `max_reply_bytes` allowed; now the whole range is refused
/// over it, so `COUNT 3` asks for them), 1.58 GB in all, kept after they
/// closed. Now every reply held counts in `output_budget` (64 MiB here):
/// the readers past it wait, unread, and those whose replies do not move
/// for `reply_stall_ms` while others wait are closed. Meanwhile a client
/// that reads is served: its SEND and its RECV (which waits at most until a
/// stalled reader is closed).
///
/// Memory: the peak RSS (VmHWM, reset when the attack starts) stays within
/// the RSS before it plus `output_budget` plus a slack of three times it
/// and 64 MiB: a byte reserved may exist three times over while its reply
/// is built (the database's rows, the reply's values, their encoding), and
/// glibc's allocator keeps what its arenas freed (the pool engine's four
/// workers each have one). Then the same attack again: the peak over both
/// stays within the same bound (what the first freed serves the second).
/// Measured: +92 to +108 MiB (async engine), +232 to +237 MiB (pool);
/// before, the first attack alone took +1.2 to +1.3 GB.
#[test]
fn unread_replies_stay_within_the_output_budget_and_a_reader_is_served() {
    const ATTACKERS: usize = 100;
    const BUDGET: u64 = 64 << 20;
    const SLACK: u64 = 3 * BUDGET + (64 << 20);
    let pg = Postgres::start().unwrap();
    let dir = std::env::temp_dir().join(format!("mwmq-reply-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mwmq.toml");
    let text = format!(
        "[server]\nmax_body = {}\nmax_reply_bytes = {}\noutput_budget = {BUDGET}\nreply_stall_ms = 1000\n",
        5 << 20,
        16 << 20
    );
    std::fs::write(&file, text).unwrap();
    let mq = MqProcess::start(&pg, 0, &["--config", file.to_str().unwrap()]);
    let pid = mq.child.id();
    let mut c = connect(mq.addr);
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let value = vec![b'e'; 4 << 20];
    for _ in 0..8 {
        let _: String = redis::cmd("XADD").arg("big").arg("*").arg("f").arg(&value).query(&mut c).unwrap();
    }
    drop(value);
    let _: String = q(&mut c, &["QCREATE", "q"]);
    let mut info = connect(mq.addr);

    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
    let before = status_kb(pid, "VmRSS:") * 1024;
    let xrange = resp(&["XRANGE", "big", "-", "+", "COUNT", "3"]);
    for round in 1..=2 {
        let delayed = info_field(&mut info, "output_delayed");
        let closed = info_field(&mut info, "stalled_readers_closed");
        let attackers: Vec<TcpStream> = (0..ATTACKERS)
            .map(|_| {
                let mut s = tiny_reader(mq.addr);
                s.write_all(&xrange).unwrap();
                s
            })
            .collect();
        // The budget is used up: readers wait.
        until_info(&mut info, "output_delayed", "readers waiting for room", |v| v > delayed);
        // A client that reads is served meanwhile.
        let t0 = Instant::now();
        let id: i64 = q(&mut c, &["SEND", "q", "hello"]);
        let got = recv(&mut c, "q", &[]);
        assert_eq!((got.len(), got[0].0, got[0].3.as_slice()), (1, id, &b"hello"[..]), "round {round}");
        let _: i64 = q(&mut c, &["ACK", "q", &id.to_string(), &got[0].1.to_string()]);
        let served = t0.elapsed();
        until_info(&mut info, "stalled_readers_closed", "stalled readers closed", |v| v > closed);
        let peak = info_field(&mut info, "output_peak_bytes");
        eprintln!(
            "round {round}: SEND + RECV served in {served:?} under attack; output budget peak {} MiB",
            peak >> 20
        );
        drop(attackers);
        // Everything they held goes back.
        until_info(&mut info, "output_held_bytes", "replies of closed clients given back", |v| v == 0);
        until_info(&mut info, "output_waiting", "no request waits", |v| v == 0);
    }
    let peak = status_kb(pid, "VmHWM:") * 1024;
    let after = status_kb(pid, "VmRSS:") * 1024;
    eprintln!(
        "RSS before {} MiB, peak over two attacks of {ATTACKERS} readers {} MiB (+{} MiB; bound +{} MiB), after {} MiB",
        before >> 20,
        peak >> 20,
        peak.saturating_sub(before) >> 20,
        (BUDGET + SLACK) >> 20,
        after >> 20
    );
    assert!(peak <= before + BUDGET + SLACK, "peak {peak} > {before} + {BUDGET} + {SLACK}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `RECV q COUNT n` was bounded by `max_body` × n only (4 GiB with the
/// defaults), QARCHIVE and QDEAD likewise. Now their replies stop before
/// the message that would pass `max_reply_bytes` (a message counts its
/// body, its sender and 64 bytes: the archive's and dead letters' a little
/// more), the first always; what is not returned is not leased, and the
/// next RECV goes on. Here: messages of 1 MiB, `max_reply_bytes` 4 MiB:
/// three a reply, on a plain queue and on one with a delivery limit (the
/// database function's path).
#[test]
fn recv_and_listings_are_cut_at_max_reply_bytes() {
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.server.max_body = 1 << 20;
    cfg.server.max_reply_bytes = 4 << 20;
    let mq = start(cfg);
    let mut c = connect_as(mq.local_addr(), "me");
    let body = vec![b'm'; 1 << 20];
    for queue in ["plain", "limited"] {
        let _: String = q(&mut c, &["QCREATE", queue]);
        for _ in 0..10 {
            let _: i64 = redis::cmd("SEND").arg(queue).arg(&body).query(&mut c).unwrap();
        }
    }
    let _: String = q(&mut c, &["QALTER", "limited", "MAXDELIVERIES", "5", "RETAIN", "60000"]);
    let _: String = q(&mut c, &["QALTER", "plain", "RETAIN", "60000"]);
    for queue in ["plain", "limited"] {
        let mut pages = Vec::new();
        loop {
            let got = recv(&mut c, queue, &["COUNT", "1000", "VT", "60000"]);
            if got.is_empty() {
                break;
            }
            assert!(got.iter().all(|m| m.3.len() == 1 << 20), "whole messages");
            for m in &got {
                let _: i64 = q(&mut c, &["ACK", queue, &m.0.to_string(), &m.1.to_string()]);
            }
            pages.push(got.len());
        }
        assert_eq!(pages, [3, 3, 3, 1], "{queue}: three a reply, every message once");
        // The archive (acknowledged messages kept by RETAIN) is cut the same way.
        let kept: Vec<redis::Value> = redis::cmd("QARCHIVE").arg(queue).arg("COUNT").arg(1000).query(&mut c).unwrap();
        assert_eq!(kept.len(), 3, "{queue}: QARCHIVE");
    }
    // A message larger than the bound alone still goes (the first always).
    let _: String = q(&mut c, &["QCREATE", "one"]);
    let _: i64 = redis::cmd("SEND").arg("one").arg(&body).query(&mut c).unwrap();
    assert_eq!(recv(&mut c, "one", &["COUNT", "5"]).len(), 1);
}

/// A receive-only user made ~90,000 consumers in 22 s by pipelining
/// `XREADGROUP GROUP g <new name> STREAMS s 0`; `XINFO CONSUMERS` then
/// answered 23 MB and `XINFO STREAM FULL` 26 MB, past `max_reply_bytes`.
/// Now a group has at most `max_consumers_per_group` (1,000 here): the
/// 1,001st name is refused with `-OVERQUOTA` (a name that exists never
/// is), in a batch of XREADGROUPs too, and the listings stop at
/// `max_reply_bytes` (64 KiB here: about 220 consumers of 200-byte names);
/// XPENDING's extended form, a range, is refused past it instead.
#[test]
fn consumers_per_group_are_capped_and_their_listings_bounded() {
    const CAP: usize = 1000;
    const REPLY: usize = 64 << 10;
    let pg = Postgres::start().unwrap();
    let mut cfg = config(&pg);
    cfg.server.max_body = REPLY;
    cfg.server.max_reply_bytes = REPLY;
    cfg.server.max_consumers_per_group = CAP as u64;
    cfg.users = vec![user("reader", "r-pw", &[], &["s"], &[]), user("boss", "b-pw", &["s"], &["s"], &["s"])];
    let mq = start(cfg);
    let mut boss = login(mq.local_addr(), "boss", "b-pw");
    for i in 0..20 {
        let _: String = q(&mut boss, &["XADD", "s", "*", "n", &i.to_string()]);
    }
    let _: String = q(&mut boss, &["XGROUP", "CREATE", "s", "g", "0"]);
    let _: i64 = q(&mut boss, &["XGROUP", "CREATECONSUMER", "s", "g", "first"]);

    // 2,000 new names, pipelined, as the attacker sent them.
    let name = |i: usize| format!("{i:05}{}", "c".repeat(195));
    let reads: Vec<Vec<String>> =
        (0..2000).map(|i| strings(&["XREADGROUP", "GROUP", "g", &name(i), "STREAMS", "s", "0"])).collect();
    let replies = pipelined(mq.local_addr(), ("reader", "r-pw"), &reads);
    let refused: Vec<&String> = replies.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(refused.len(), 2000 - (CAP - 1), "the group had one consumer: 999 more made");
    assert_eq!(
        refused[0],
        "OVERQUOTA consumer group 'g' of stream 's' has 1000 consumers, the most a group may have \
         (max_consumers_per_group); XGROUP DELCONSUMER removes idle ones"
    );
    let mut reader = login(mq.local_addr(), "reader", "r-pw");
    let groups: redis::Value = redis::cmd("XINFO").arg("GROUPS").arg("s").query(&mut boss).unwrap();
    assert!(format!("{groups:?}").contains("int(1000)"), "{groups:?}");
    // A consumer that exists reads on; a new one is refused, by CREATECONSUMER too.
    let _: redis::Value = q(&mut reader, &["XREADGROUP", "GROUP", "g", &name(5), "STREAMS", "s", "0"]);
    assert!(err(&mut boss, &["XGROUP", "CREATECONSUMER", "s", "g", "late"]).starts_with("OVERQUOTA"));
    // In a batch of new-entry reads (one statement): the known ones get their entries, the new one is refused.
    let batch: Vec<Vec<String>> = [name(1), "newcomer".into(), name(2)]
        .iter()
        .map(|who| strings(&["XREADGROUP", "GROUP", "g", who, "COUNT", "2", "STREAMS", "s", ">"]))
        .collect();
    let got = pipelined(mq.local_addr(), ("reader", "r-pw"), &batch);
    assert!(got[1].as_ref().is_err_and(|e| e.starts_with("OVERQUOTA")), "{:?}", got[1]);
    assert!(got[0].as_ref().is_ok_and(|r| r.contains("n")) && got[2].is_ok(), "{got:?}");

    // The listings stop at max_reply_bytes.
    let size = |v: &redis::Value| format!("{v:?}").len();
    let consumers: Vec<redis::Value> =
        redis::cmd("XINFO").arg("CONSUMERS").arg("s").arg("g").query(&mut reader).unwrap();
    let bytes: usize = consumers.iter().map(size).sum();
    assert!(consumers.len() > 100 && consumers.len() < CAP, "{} consumers listed", consumers.len());
    assert!(bytes <= 2 * REPLY, "XINFO CONSUMERS: about {bytes} bytes");
    let full: redis::Value =
        redis::cmd("XINFO").arg("STREAM").arg("s").arg("FULL").arg("COUNT").arg(0).query(&mut reader).unwrap();
    assert!(size(&full) <= 2 * REPLY, "XINFO STREAM FULL: about {} bytes", size(&full));

    // XPENDING's extended form is a range a client pages through: whole or
    // refused, as XRANGE. 250 more pending entries of a 200-byte consumer
    // name weigh about 75 KiB.
    let mut adds = redis::pipe();
    for i in 0..250 {
        adds.cmd("XADD").arg("s").arg("*").arg("n").arg(i).ignore();
    }
    let () = adds.query(&mut boss).unwrap();
    let _: redis::Value = q(&mut reader, &["XREADGROUP", "GROUP", "g", &name(1), "COUNT", "300", "STREAMS", "s", ">"]);
    let e = err(&mut reader, &["XPENDING", "s", "g", "-", "+", "10000"]);
    assert!(e.starts_with("ERR the reply would exceed max_reply_bytes"), "{e}");
    let page: Vec<redis::Value> =
        redis::cmd("XPENDING").arg("s").arg("g").arg("-").arg("+").arg(100).query(&mut reader).unwrap();
    assert_eq!(page.len(), 100, "a page that fits is whole");
}

/// A server with a small output budget (4 MiB; replies of at most 1 MiB,
/// readers stalled 1 s while others wait are closed), its config's directory.
fn small_budget(pg: &Postgres, name: &str) -> (MqProcess, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("mwmq-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mwmq.toml");
    let text = format!(
        "[server]\nmax_body = {}\nmax_reply_bytes = {}\noutput_budget = {}\nreply_stall_ms = 1000\n",
        256 << 10,
        1 << 20,
        4 << 20
    );
    std::fs::write(&file, text).unwrap();
    (MqProcess::start(pg, 0, &["--config", file.to_str().unwrap()]), dir)
}

/// QLIST and XPENDING's summary reserved nothing of the output budget:
/// 800 clients that never read, each with one QLIST of 990 queues of
/// 200-byte names (206 KB) unread, held 2.5 times the budget, and as no
/// request waited for room none was closed (each connection could hold
/// one such reply: max_connections × 206 KB). Now every reply that may be
/// larger than a small one (`SMALL_REPLY`, 8 KiB) reserves its room first,
/// so what is held stays within the budget plus one reply being swapped
/// for its reservation plus a small reply per connection, and the
/// non-readers are closed as stalled while a client that reads is served.
/// Here: 300 queues and 300 consumers with 200-byte names (replies of
/// ~63 and ~70 KB), 200 non-readers pipelining five of each; before, the
/// peak was ~13 MB on a 4 MiB budget.
#[test]
fn listings_reserve_room_in_the_output_budget() {
    const CLIENTS: u64 = 200;
    let pg = Postgres::start().unwrap();
    let (mq, dir) = small_budget(&pg, "listings-budget");
    let mut c = connect(mq.addr);
    let long = |i: usize| format!("{i:0>200}");
    let mut p = redis::pipe();
    for i in 0..300 {
        p.cmd("QCREATE").arg(long(i)).ignore();
    }
    p.cmd("XGROUP").arg("CREATE").arg("s").arg("g").arg("$").arg("MKSTREAM").ignore();
    for _ in 0..300 {
        p.cmd("XADD").arg("s").arg("*").arg("f").arg("v").ignore();
    }
    for i in 0..300 {
        p.cmd("XREADGROUP").arg("GROUP").arg("g").arg(long(i)).arg("COUNT").arg(1).arg("STREAMS").arg("s").arg(">");
        p.ignore();
    }
    let () = p.query(&mut c).unwrap();
    let mut info = connect(mq.addr);
    let closed = info_field(&mut info, "stalled_readers_closed");
    let mut requests = Vec::new();
    for _ in 0..5 {
        requests.extend(resp(&["QLIST"]));
        requests.extend(resp(&["XPENDING", "s", "g"]));
    }
    let attackers: Vec<TcpStream> = (0..CLIENTS)
        .map(|_| {
            let mut s = tiny_reader(mq.addr);
            s.write_all(&requests).unwrap();
            s
        })
        .collect();
    // The budget is used up: the non-readers are closed as stalled ...
    until_info(&mut info, "stalled_readers_closed", "non-readers closed", |v| v >= closed + CLIENTS / 2);
    // ... and a client that reads is served meanwhile.
    let names: Vec<String> = q(&mut c, &["QLIST"]);
    assert_eq!(names.len(), 300);
    let pending: redis::Value = q(&mut c, &["XPENDING", "s", "g"]);
    assert!(matches!(pending, redis::Value::Array(ref a) if a.len() == 4), "{pending:?}");
    let peak = info_field(&mut info, "output_peak_bytes");
    let bound = (4 << 20) + (1 << 20) + (CLIENTS + 2) * 8192;
    eprintln!("output budget peak {peak} bytes, bound {bound}");
    assert!(peak <= bound, "output_peak_bytes {peak} > {bound}");
    drop(attackers);
    until_info(&mut info, "output_held_bytes", "replies of closed clients given back", |v| v == 0);
    std::fs::remove_dir_all(&dir).ok();
}

/// A client that reads slowly but steadily was closed as stalled: mwmq saw
/// progress only when its own writes went through, and the kernel's send
/// buffer (grown to megabytes) took seconds at the reader's pace to have
/// room again. Now at most 64 KiB wait unsent in the kernel, so a write
/// goes through each time the reader took 32 KiB. Here: a reader of 16 KiB
/// every 100 ms pipelines 24 replies of 512 KiB while non-readers keep the
/// budget used up for 4 s (`reply_stall_ms` 1 s): the non-readers are
/// closed, the slow reader gets every reply whole.
#[test]
fn a_slow_reader_is_not_closed_while_non_readers_are() {
    let pg = Postgres::start().unwrap();
    let (mq, dir) = small_budget(&pg, "slow-reader");
    let mut c = connect(mq.addr);
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let value = vec![b'e'; 128 << 10];
    for _ in 0..4 {
        let _: String = redis::cmd("XADD").arg("big").arg("*").arg("f").arg(&value).query(&mut c).unwrap();
    }
    let mut info = connect(mq.addr);
    let closed = info_field(&mut info, "stalled_readers_closed");
    let xrange = resp(&["XRANGE", "big", "-", "+"]);
    let mut slow = TcpStream::connect(mq.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    slow.write_all(&xrange.repeat(24)).unwrap();
    let addr = mq.addr;
    let attack = std::thread::spawn(move || {
        // A non-reader every 100 ms for 4 s: the budget stays used up.
        let t0 = Instant::now();
        let mut held = Vec::new();
        while t0.elapsed() < Duration::from_secs(4) {
            let mut s = tiny_reader(addr);
            s.write_all(&xrange.repeat(24)).unwrap();
            held.push(s);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    while !attack.is_finished() {
        let n = std::io::Read::read(&mut slow, &mut buf).unwrap();
        assert!(n > 0, "the slow reader was closed after {} bytes", seen.len());
        seen.extend_from_slice(&buf[..n]);
        std::thread::sleep(Duration::from_millis(100));
    }
    let got = seen.len();
    attack.join().unwrap();
    let stalled = info_field(&mut info, "stalled_readers_closed") - closed;
    assert!(stalled > 0, "no non-reader was closed: the budget was not used up");
    // The rest at full speed: every reply whole.
    let mut r = BufReader::new(std::io::Read::chain(std::io::Cursor::new(seen), slow));
    for i in 0..24 {
        let reply = read_reply(&mut r).unwrap_or_else(|e| panic!("reply {i}: {e}"));
        assert!(reply.len() > 4 * (128 << 10), "reply {i}: {} bytes", reply.len());
    }
    eprintln!("slow reader read {got} bytes slowly, {stalled} non-readers closed");
    std::fs::remove_dir_all(&dir).ok();
}
