//! mwload --protocol mq against mwmq over a real PostgreSQL: the cycle of
//! SENDs and receives, pairs addressing each other, RECV followed by ACK, and
//! the counts agree with what mwmq itself measured.

use mwmq::Service;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mctest::Postgres;
use mwstats::reader::read_summary;

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mwload-mq-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn start_mq(pg: &Postgres, out: &Path) -> mwmq::Mq {
    let mut c = mwmq::Config::default();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 4;
    c.database.url = pg.conninfo().to_string();
    c.stats.window_ms = 200;
    c.stats.out = Some(out.display().to_string());
    mwmq::Mq::start(c).expect("mwmq starts")
}

fn mwload(addr: SocketAddr, dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_mwload"))
        .args(["-P", "mq", "-s", "127.0.0.1", "-p", &addr.port().to_string(), "--progress", "never", "--out"])
        .arg(dir)
        .args(["--window-ms", "200"])
        .args(args)
        .output()
        .expect("run mwload");
    assert!(
        out.status.success(),
        "mwload {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// One request over a fresh connection; the first reply line.
fn call(addr: SocketAddr, line: &str) -> String {
    let s = TcpStream::connect(addr).unwrap();
    (&s).write_all(format!("{line}\r\n").as_bytes()).unwrap();
    let mut r = BufReader::new(&s);
    let mut got = String::new();
    r.read_line(&mut got).unwrap();
    got.trim_end().to_string()
}

fn qlen(addr: SocketAddr, q: &str) -> i64 {
    call(addr, &format!("QLEN {q}")).trim_start_matches(':').parse().unwrap()
}

#[test]
fn pairs_send_and_receive_with_recv_and_ack() {
    let pg = Postgres::start().unwrap();
    let mq_out = out_dir("mq-recv");
    let mq = start_mq(&pg, &mq_out);
    let addr = mq.local_addr();
    let dir = out_dir("recv");
    let per_client = 300;
    let out = mwload(
        addr,
        &dir,
        &[
            "-t",
            "2",
            "-c",
            "3",
            "-n",
            &per_client.to_string(),
            "--ratio",
            "1:1",
            "--pairs",
            "--receive",
            "recv",
            "--queues",
            "2",
            "--name-prefix",
            "t-",
            "-d",
            "200",
        ],
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("Sends") && table.contains("Recvs") && table.contains("Acks"), "{table}");
    let s = read_summary(&dir).unwrap();
    let (send, recv, ack) = (&s.ops["send"], &s.ops["recv"], &s.ops["ack"]);
    // -n counts SENDs and RECVs (ACKs follow what came): a 1:1 cycle.
    assert_eq!(send.count + recv.count, 6 * per_client);
    assert_eq!(send.count, recv.count);
    assert_eq!(send.errors + recv.errors + ack.errors, 0);
    // Every message that came was acknowledged.
    assert_eq!(ack.count, recv.hits);
    assert!(recv.hits > 0 && recv.hits <= send.count);
    assert!(s.ops["pop"].count == 0 && !s.ops.contains_key("get"));
    // Both queues exist and hold what was sent and not received: every ACK
    // found its lease and deleted its message.
    let left = qlen(addr, "q0") + qlen(addr, "q1");
    assert_eq!(left as u64, send.count - recv.hits);
    // Pairs address each other: nothing is left for a stranger.
    assert_eq!(call(addr, "POP q0"), "$-1");
    mq.stopper().stop();
    mq.join();
    // mwmq counted the same requests.
    let m = read_summary(&mq_out).unwrap();
    let total = |op: &str| m.ops[op].count;
    let mq_windows = mwstats::reader::read_windows(&mq_out).unwrap();
    let seen = |op: &str| mq_windows.iter().map(|w| w.ops[op].count).sum::<u64>();
    assert_eq!(seen("send"), send.count, "summary {}", total("send"));
    assert_eq!(seen("recv"), recv.count);
    assert_eq!(seen("ack"), ack.count);
}

#[test]
fn pop_in_an_open_loop_and_refusals() {
    let pg = Postgres::start().unwrap();
    let mq_out = out_dir("mq-pop");
    let mq = start_mq(&pg, &mq_out);
    let addr = mq.local_addr();
    let dir = out_dir("pop");
    mwload(addr, &dir, &["-t", "1", "-c", "4", "--rate", "400", "--test-time", "1.5", "--ratio", "2:1", "-d", "2000"]);
    let s = read_summary(&dir).unwrap();
    let (send, pop) = (&s.ops["send"], &s.ops["pop"]);
    let share = send.count as f64 / (send.count + pop.count) as f64;
    assert!((share - 2.0 / 3.0).abs() < 0.05, "send share {share}");
    assert!(pop.hits > 0 && pop.hits <= send.count);
    assert_eq!(send.errors + pop.errors, 0);
    let client = s.client.as_ref().unwrap();
    assert!(client.bytes >= send.count * 2000, "bodies of 2000 bytes were sent");
    // A client name mwmq refuses stops the run with a message.
    let out = Command::new(env!("CARGO_BIN_EXE_mwload"))
        .args(["-P", "mq", "-p", &addr.port().to_string(), "-n", "1", "--name-prefix", "a\u{7}"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--name-prefix"));
    mq.stopper().stop();
    mq.join();
    // Without pairs, messages are for anyone: what is left is exactly what
    // mwmq counted sent and not popped (read once it stopped, so that the
    // requests of mwload's closed connections are all done, however slowly),
    // and what mwload saw sent and not popped, give or take the requests in
    // flight when its run ended.
    let after = start_mq(&pg, &out_dir("mq-pop-after"));
    let left = qlen(after.local_addr(), "q0");
    after.stopper().stop();
    after.join();
    let expected = (send.count - pop.hits) as i64;
    assert!(left >= 0 && pop.hits <= send.count, "{left} left, {expected} expected by mwload");
    let m = read_summary(&mq_out).unwrap();
    let (sent, popped) = (m.ops["send"].count - m.ops["send"].errors, m.ops["pop"].hits);
    assert_eq!(left, (sent - popped) as i64, "left: what mwmq counted sent ({sent}) and not popped ({popped})");
    assert!(sent >= send.count && popped >= pop.hits, "mwmq answered at least what mwload counted");
}
