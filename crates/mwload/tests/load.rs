//! mwload against real memcached servers: what it sends is what was asked,
//! what it measures obeys the operational laws, and an open loop shows a
//! stall that a closed loop hides.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use mcproto::ring::{HashKind, Ring, ServerSpec};
use mctest::{Client, Memcached};
use mwstats::reader::{read_summary, read_windows};
use mwstats::WindowRecord;

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mwload-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn mwload(server: &Memcached, dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_mwload"))
        .args(["-s", "127.0.0.1", "-p", &server.port().to_string(), "--progress", "never", "--out"])
        .arg(dir)
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

fn summary(dir: &Path) -> WindowRecord {
    read_summary(dir).expect("summary.json")
}

fn stat(server: &Memcached, name: &str) -> u64 {
    let stats = Client::connect(server.addr()).unwrap().call_str("stats\r\n").unwrap();
    let prefix = format!("STAT {name} ");
    stats.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap().parse().unwrap()
}

#[test]
fn the_mix_follows_the_ratio_and_multigets_carry_k_keys() {
    let server = Memcached::start().unwrap();
    let dir = out_dir("mix");
    mwload(&server, &dir, &["-t", "2", "-c", "4", "-n", "500", "--ratio", "1:4", "--multi-key-get", "3", "--prefill"]);
    let s = summary(&dir);
    let (sets, mgets) = (s.ops["set"].count, s.ops["multiget"].count);
    assert_eq!(sets + mgets, 2 * 4 * 500, "every request was sent and answered");
    let share = sets as f64 / (sets + mgets) as f64;
    assert!((share - 0.2).abs() < 0.02, "set share {share}");
    assert_eq!(s.ops["multiget"].keys, 3 * mgets, "exactly 3 keys per multi-get");
    assert_eq!(s.ops["get"].count, 0);
    // The server saw the same: memcached counts retrieved keys.
    assert_eq!(stat(&server, "get_hits") + stat(&server, "get_misses"), 3 * mgets);
    assert_eq!(s.ops["multiget"].misses, 0, "prefilled keys all hit");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn closed_loop_obeys_the_interactive_response_time_law() {
    let server = Memcached::start().unwrap();
    let dir = out_dir("law");
    mwload(
        &server,
        &dir,
        &[
            "-t",
            "2",
            "-c",
            "4",
            "--virtual-clients",
            "2",
            "--think-time",
            "2000",
            "--think-dist",
            "exponential",
            "--test-time",
            "3",
            "--warmup",
            "1",
            "--window-ms",
            "500",
        ],
    );
    let s = summary(&dir);
    let client = s.client.clone().unwrap();
    let n = (client.connections * client.virtual_clients) as f64;
    let x = s.ops["all"].count as f64 / (s.duration_ms as f64 / 1000.0);
    let r = s.ops["all"].response_us.mean / 1e6;
    let z = client.think_time_us / 1e6;
    assert!(z > 0.0015, "think time was spent: {z}");
    // Every request counted completed inside the measured T seconds, and
    // the think time before it (as actually spent) and its response time
    // began at most one longest R + Z before: X(R+Z) <= N (1 + (R+Z)max / T).
    // The think times are exponential with mean Z: over these few thousand,
    // none reaches 20 Z (probability e^-20 each). Below N by the generator's
    // own time between a reply and the next think, which a loaded machine
    // lengthens but which stays far under half of it.
    let law = x * (r + z);
    let t = s.duration_ms as f64 / 1000.0;
    let rmax = s.ops["all"].response_us.max as f64 / 1e6;
    let most = n * (1.0 + (rmax + 20.0 * z) / t);
    assert!(law <= most, "X(R+Z) = {law:.2} for N = {n} (at most {most:.2})");
    assert!(law > n / 2.0, "X(R+Z) = {law:.2} for N = {n}");
    let windows = read_windows(&dir).unwrap();
    assert!(windows.iter().any(|w| w.client.as_ref().unwrap().phase == "warmup"));
    let measured: u64 =
        windows.iter().filter(|w| w.client.as_ref().unwrap().phase == "measure").map(|w| w.ops["all"].count).sum();
    assert_eq!(measured, s.ops["all"].count, "the summary is the sum of the measure windows");
    for w in windows.windows(2) {
        assert_eq!(w[0].start_unix_ms + w[0].duration_ms, w[1].start_unix_ms);
        assert_eq!(w[1].start_unix_ms % 500, 0, "aligned to wall-clock multiples");
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn stalled_run(open: bool) -> WindowRecord {
    let server = Memcached::start().unwrap();
    let dir = out_dir(if open { "stall-open" } else { "stall-closed" });
    let stall = {
        let pid_server = &server;
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(1200));
                pid_server.pause().unwrap();
                std::thread::sleep(Duration::from_millis(200));
                pid_server.resume().unwrap();
            });
            let mut args = vec!["-t", "1", "-c", "4", "--test-time", "3", "--ratio", "0:1"];
            if open {
                args.extend(["--rate", "3000"]);
            }
            mwload(&server, &dir, &args);
        });
        summary(&dir)
    };
    std::fs::remove_dir_all(&dir).ok();
    stall
}

#[test]
fn an_open_loop_shows_a_stall_that_a_closed_loop_hides() {
    let open = stalled_run(true);
    let closed = stalled_run(false);
    let (op99, cp99) = (open.ops["all"].response_us.p99, closed.ops["all"].response_us.p99);
    let cmax = closed.ops["all"].response_us.max;
    // The open loop kept sending through the 200 ms stall: at 3000/s some
    // 600 requests met it, more than 1% of the run's. The closed loop's four
    // connections had four requests outstanding when it began, and sent no
    // more until they were answered: far fewer than 1% met it.
    assert!(op99 >= 100_000, "open loop p99 shows the 200 ms stall: {op99} us");
    assert!(cmax >= 150_000, "the closed loop met the stall too: max {cmax} us");
    assert!(closed.ops["all"].count > 400, "the closed loop ran: {} requests", closed.ops["all"].count);
    assert!(cp99 < 100_000, "but its p99 hides it: {cp99} us against {op99} us");
}

#[test]
fn several_targets_are_placed_with_ketama() {
    let a = Memcached::start().unwrap();
    let b = Memcached::start().unwrap();
    let dir = out_dir("ketama");
    let list = format!("{},{}", a.endpoint(), b.endpoint());
    let out = Command::new(env!("CARGO_BIN_EXE_mwload"))
        .args(["--servers", &list, "--key-maximum", "199", "--prefill", "-n", "20", "--ratio", "0:1"])
        .args(["--multi-key-get", "4", "--progress", "never", "--verify", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ring =
        Ring::new(HashKind::Ketama, &[a.endpoint().parse::<ServerSpec>().unwrap(), b.endpoint().parse().unwrap()]);
    let mut on = [0, 0];
    for n in 0..200 {
        let key = format!("key:{n:012}");
        let owner = ring.server_for(key.as_bytes());
        on[owner] += 1;
        for (i, server) in [&a, &b].iter().enumerate() {
            let reply = Client::connect(server.addr()).unwrap().call_str(&format!("get {key}\r\n")).unwrap();
            assert_eq!(reply != "END\r\n", i == owner, "{key} on server {i}");
        }
    }
    assert!(on[0] > 50 && on[1] > 50, "{on:?}");
    let s = summary(&dir);
    assert_eq!(s.ops["multiget"].misses, 0, "multi-gets split over both servers find every key");
    assert_eq!(s.client.unwrap().verify_failures, 0);
    std::fs::remove_dir_all(&dir).ok();
}

/// `--version`, and `--help` in mwproxy's and mwmq's style: the flags under
/// headings (servers, then measurement and process as the middlewares name
/// theirs), value names that say what they take, the defaults in brackets
/// (the port's was memcached's 11211, unlike mwproxy's 11311), and the exit
/// statuses.
#[test]
fn version_and_help_in_the_middlewares_style() {
    let run = |arg: &str| Command::new(env!("CARGO_BIN_EXE_mwload")).arg(arg).output().unwrap();
    let out = run("-V");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("mwload {}\n", env!("CARGO_PKG_VERSION")));
    let help = String::from_utf8(run("--help").stdout).unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    for needle in [
        "-p, --port <PORT> Server port (memcached itself listens on 11211) [default: 11311, mwproxy's; 6380 with -P mq, mwmq's]",
        "-t, --threads <N> Load threads [default: 2]",
        "--test-time <SECS> Seconds of measurement, unless -n is given [default: 10]",
        "Exit status: 0",
    ] {
        assert!(help.contains(needle), "{needle:?} not in {help}");
    }
    let headings = ["Servers:", "Load:", "Workload:", "Message queues (-P mq):", "Measurement:", "Process:"];
    let at: Vec<usize> = headings.iter().map(|h| help.find(h).unwrap_or_else(|| panic!("no {h}"))).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "in this order: {headings:?}");
}

#[test]
fn failures_give_clear_messages_and_exit_codes() {
    let port = mctest::free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_mwload")).args(["-p", &port.to_string(), "-n", "1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect to 127.0.0.1"));
    let out = Command::new(env!("CARGO_BIN_EXE_mwload")).args(["--ratio", "one:two"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ratio"));
    // Values over the server's item size: every set fails.
    let small = Memcached::start_with(&["-I", "1k", "-o", "slab_chunk_max=512"]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mwload"))
        .args(["-p", &small.port().to_string(), "-n", "50", "-d", "2000", "--ratio", "1:1", "--progress", "never"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("above --max-error-rate"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Totals"));
}

/// mwload against a server that is killed 0.8 s into a 3 s run and started
/// again (empty, same port) 0.3 s later.
fn run_through_a_restart(reconnect: bool, extra: &[&str]) -> (Output, WindowRecord, Vec<WindowRecord>) {
    let mut server = Memcached::start().unwrap();
    let port = server.port().to_string();
    let dir = out_dir(&format!("reconnect-{reconnect}-{}", extra.len()));
    let out = std::thread::scope(|s| {
        let server = &mut server;
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(800));
            server.stop();
            std::thread::sleep(Duration::from_millis(300));
            server.restart().unwrap();
        });
        let mut args = vec!["-p", &port, "-t", "1", "-c", "4", "--test-time", "3", "--ratio", "1:1", "--progress"];
        args.extend(["never", "--window-ms", "500"]);
        if reconnect {
            args.push("--reconnect");
        }
        args.extend(extra);
        Command::new(env!("CARGO_BIN_EXE_mwload")).args(&args).arg("--out").arg(&dir).output().unwrap()
    });
    let (s, w) = (summary(&dir), read_windows(&dir).unwrap());
    std::fs::remove_dir_all(&dir).ok();
    (out, s, w)
}

#[test]
fn a_lost_server_is_reconnected_with_reconnect_and_stops_the_load_without() {
    let last_full_window =
        |w: &[WindowRecord]| w.iter().rev().find(|w| w.duration_ms == 500).expect("a whole window").ops["all"].count;

    let (out, s, windows) = run_through_a_restart(true, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let client = s.client.unwrap();
    assert_eq!(client.connections_lost, 4, "{stderr}");
    assert_eq!(client.reconnects, 4, "{stderr}");
    assert!(stderr.contains("re-established"), "{stderr}");
    assert!(s.ops["all"].errors <= 4, "only the requests in flight at the kill fail: {}", s.ops["all"].errors);
    assert!(last_full_window(&windows) > 100, "the load goes on after the restart");

    let (out, s, windows) = run_through_a_restart(false, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("4 connection(s) lost during the run"), "{stderr}");
    assert_eq!(s.client.unwrap().reconnects, 0);
    let covered: u64 = windows.iter().map(|w| w.duration_ms).sum();
    assert!(covered < 3000, "without --reconnect the run ends with its last connection: {covered} ms of 3000");
    let after_restart = windows.iter().filter(|w| w.start_unix_ms >= windows[0].start_unix_ms + 1500);
    assert_eq!(after_restart.map(|w| w.ops["all"].count).sum::<u64>(), 0, "nothing sent once the server was back");
}

#[test]
fn open_loop_arrivals_during_an_outage_are_counted_as_not_sent() {
    let (out, s, _) = run_through_a_restart(true, &["--rate", "2000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let client = s.client.unwrap();
    assert_eq!(client.reconnects, 4, "{stderr}");
    // The server is away for 0.3 s or more: some 600 arrivals find no connection.
    assert!(client.unsent > 100, "arrivals during the outage: {} not sent", client.unsent);
    // Every arrival of the 3 s at 2000/s is answered or counted as not sent,
    // none twice; a loaded machine may leave the last ones, those of the
    // generator's largest lateness, unsent when the run ends.
    let due = (s.ops["all"].count + client.unsent) as f64;
    let behind = client.send_late_us.as_ref().map_or(0.0, |h| h.max as f64 / 1e6) * 2000.0;
    assert!(
        due <= 6300.0 && due >= 5400.0 - behind,
        "every arrival accounted for: {due} (generator {behind:.0} behind)"
    );
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("not sent for want of a connection"), "{stderr}");
}

#[test]
fn memtier_spellings_work_and_sets_carry_the_expiry_range() {
    let server = Memcached::start().unwrap();
    let dir = out_dir("memtier-flags");
    let args = ["-P", "memcache_text", "--hide-histogram", "--pipeline", "4", "-t", "1", "-c", "2", "-n", "50"];
    let mut all = args.to_vec();
    all.extend(["--ratio", "1:0", "--key-maximum", "9", "--expiry-range", "100-200"]);
    mwload(&server, &dir, &all);
    let s = summary(&dir);
    assert_eq!(s.ops["set"].count, 2 * 4 * 50, "--pipeline 4 is 4 requests outstanding per connection");
    assert_eq!(s.client.unwrap().virtual_clients, 4);
    std::fs::remove_dir_all(&dir).ok();
    // memcached's meta get tells each item's remaining time to live.
    let mut c = Client::connect(server.addr()).unwrap();
    let ttls: Vec<u64> = (0..10)
        .map(|k| {
            let reply = c.call_str(&format!("mg key:{k:012} t\r\n")).unwrap();
            reply.trim_end().strip_prefix("HD t").unwrap_or_else(|| panic!("{reply}")).parse().unwrap()
        })
        .collect();
    assert!(ttls.iter().all(|t| (95..=200).contains(t)), "expiry times within 100-200 s: {ttls:?}");
    assert!(ttls.iter().any(|t| *t != ttls[0]), "drawn, not fixed: {ttls:?}");
    // What mwload cannot do is refused with a reason.
    let refused = |args: &[&str], what: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_mwload")).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(what), "{}", String::from_utf8_lossy(&out.stderr));
    };
    refused(&["-P", "redis"], "use memcache_text (memcached) or mq (mwmq)");
    refused(&["--expiry-range", "0-9999999"], "reads a larger number as a date");
}

/// mwload against a memcached that speaks only TLS and wants a login (`-Z`,
/// `-Y`): the load runs without an error, prefill and verify included; a
/// wrong password or a missing CA is refused with the reason.
#[test]
fn tls_and_login_as_memcached_asks_for_them() {
    let dir = out_dir("tls");
    let certs = mctest::Certificates::make(&dir.join("certs")).unwrap();
    let users = dir.join("certs").join("users");
    std::fs::write(&users, "loader:s3cret\n").unwrap();
    let mut flags = certs.memcached_flags();
    flags.extend(["-Y".to_string(), users.display().to_string()]);
    let server = Memcached::start_with(&flags.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    let ca = certs.ca.display().to_string();
    mwload(
        &server,
        &dir,
        &["--tls", "--tls-ca", &ca, "--auth", "loader:s3cret", "-t", "1", "-c", "4", "-n", "300"]
            .into_iter()
            .chain(["--prefill", "--verify", "--key-maximum", "99", "--multi-key-get", "1-3"])
            .collect::<Vec<_>>(),
    );
    let s = summary(&dir);
    assert_eq!(s.ops["all"].errors, 0);
    assert_eq!(s.ops["all"].count, 4 * 300);
    assert_eq!(s.client.as_ref().unwrap().verify_failures, 0);
    assert!(s.ops["get"].hits + s.ops["multiget"].hits > 0, "prefilled keys were found over TLS");
    let refused = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mwload"))
            .args(["-s", "127.0.0.1", "-p", &server.port().to_string(), "-n", "1", "--progress", "never"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} must fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let wrong = refused(&["--tls", "--tls-ca", &ca, "--auth", "loader:nope"]);
    assert!(wrong.contains("refused the login") && wrong.contains("authentication failure"), "{wrong}");
    assert!(!wrong.contains("nope"), "the password is never shown: {wrong}");
    assert!(refused(&["--tls"]).contains("--tls needs --tls-ca"));
    let plain = refused(&["--auth", "loader:s3cret"]);
    assert!(!plain.is_empty(), "plaintext to a TLS-only server fails: {plain}");
}
