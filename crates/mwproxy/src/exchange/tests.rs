//! The exchange on its own: scripted bytes and times, no sockets.

use std::time::Duration;

use super::*;

const MS: u64 = 1_000_000;

fn servers(n: usize, tweak: impl FnOnce(&mut BackendConfig)) -> Servers {
    let mut cfg = BackendConfig { stall_ms: 20, timeout_ms: 1000, retry_min_ms: 30, ..BackendConfig::default() };
    tweak(&mut cfg);
    let addrs =
        (0..n).map(|i| mwserve::stream::Addr::Tcp(format!("127.0.0.1:{}", 30000 + i).parse().unwrap())).collect();
    Servers::new(addrs, &cfg, 4, Box::new(|| false))
}

/// An outbox with `n` `get` calls to server `s`, named `0..n`.
fn outbox(servers: usize, s: usize, n: usize) -> (Outbox, Vec<usize>) {
    let mut out = Outbox::new(servers);
    for i in 0..n {
        out.call(s, mcproto::retrieval_reply_len, 4096).extend_from_slice(format!("get k{i}\r\n").as_bytes());
    }
    (out, (0..n).collect())
}

/// What ended: (tag, reply or error, fact).
type Log = Vec<(usize, Result<String, BackendError>, BackendFact)>;

fn logger(log: &mut Log) -> impl FnMut(Ended<'_, usize>) + '_ {
    |e| log.push((e.tag, e.outcome.map(|r| String::from_utf8_lossy(r).into_owned()).map_err(Clone::clone), e.fact))
}

/// Begins `n` calls to server `s` on an open connection; returns the bytes written.
fn begin(ex: &mut Exchange<usize>, sv: &Servers, n: usize, now: u64, log: &mut Log) -> Option<Vec<u8>> {
    let (out, owners) = outbox(sv.endpoints().len(), ex.server, n);
    let mut bytes = Vec::new();
    ex.begin(sv, &out, &owners, &mut bytes, now, || Ok(false), &mut logger(log)).then_some(bytes)
}

#[test]
fn repairs_go_first_and_replies_end_calls_in_order() {
    let sv = servers(1, |_| {});
    sv.repairs.note(0, b"stale".to_vec());
    let mut ex = Exchange::new(0);
    let mut log = Log::new();
    let bytes = begin(&mut ex, &sv, 2, 100, &mut log).unwrap();
    assert_eq!(bytes, b"delete stale\r\nget k0\r\nget k1\r\n");
    assert!(ex.owed() && ex.in_flight());
    // Replies come in pieces: nothing ends before it is whole.
    let all = b"DELETED\r\nEND\r\nVALUE k1 0 1\r\nv\r\nEND\r\n";
    assert_eq!(ex.replies(&sv, &all[..12], 150, &mut logger(&mut log)), Ok(14 - 5));
    assert_eq!(sv.repairs.done.load(std::sync::atomic::Ordering::Relaxed), 1, "the repair is done");
    assert!(log.is_empty());
    assert_eq!(ex.replies(&sv, &all[9..], 200, &mut logger(&mut log)), Ok(all.len() - 9));
    assert_eq!(log.iter().map(|l| l.0).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(log[1].1.as_deref(), Ok("VALUE k1 0 1\r\nv\r\nEND\r\n"));
    let f = log[0].2;
    assert_eq!((f.server, f.sent, f.done, f.failed), (0, 100, 200, false));
    assert!(!ex.in_flight());
}

/// The backoff is long (1 s), so that a loaded machine's delay between
/// two steps of the test cannot outlast it; the test sleeps it out once.
#[test]
fn a_down_server_fails_calls_at_once_and_admits_one_probe_after_the_backoff() {
    const BACKOFF: Duration = Duration::from_secs(1);
    let sv = servers(1, |c| c.retry_min_ms = BACKOFF.as_millis() as u64);
    let (mut a, mut b) = (Exchange::new(0), Exchange::new(0));
    let mut log = Log::new();
    // A connect failure: the calls end with it and the server is down.
    let (out, owners) = outbox(1, 0, 2);
    let refused = || Err(BackendError::Connect("refused".into()));
    assert!(!a.begin(&sv, &out, &owners, &mut Vec::new(), 0, refused, &mut logger(&mut log)));
    assert_eq!(log.len(), 2);
    assert!(matches!(log[0].1, Err(BackendError::Connect(_))) && log[0].2.failed);
    assert!(sv.health.is_down(0));
    log.clear();
    // Within the backoff nobody tries.
    assert!(begin(&mut b, &sv, 1, 0, &mut log).is_none());
    assert_eq!(log[0].1, Err(BackendError::Down));
    log.clear();
    // (The health's clock is the monotonic one: a sleep of the backoff outlasts it.)
    std::thread::sleep(BACKOFF + Duration::from_millis(10));
    // After it, the first carrier probes, and reopening is counted once.
    let (out, owners) = outbox(1, 0, 1);
    assert!(a.begin(&sv, &out, &owners, &mut Vec::new(), 1, || Ok(true), &mut logger(&mut log)));
    assert!(begin(&mut b, &sv, 1, 1, &mut log).is_none(), "one probe at a time");
    assert_eq!(log.pop().unwrap().1, Err(BackendError::Down));
    a.replies(&sv, b"END\r\n", 2, &mut logger(&mut log)).unwrap();
    assert_eq!(log[0].2.reconnects, 1);
    assert!(!sv.health.is_down(0), "the probe's reply brings the server back");
    assert!(begin(&mut b, &sv, 1, 3, &mut log).is_some());
}

#[test]
fn a_stalled_server_keeps_one_probe_and_gives_the_other_calls_up() {
    let sv = servers(2, |_| {});
    let (mut a, mut b, mut other) = (Exchange::new(0), Exchange::new(0), Exchange::<usize>::new(1));
    let mut log = Log::new();
    let t0 = 1_000 * MS;
    begin(&mut a, &sv, 2, t0, &mut log).unwrap();
    begin(&mut b, &sv, 1, t0, &mut log).unwrap();
    begin(&mut other, &sv, 1, t0, &mut log).unwrap();
    assert_eq!(a.check(&sv, t0 + 5 * MS, &mut logger(&mut log)), Verdict::Wait, "not quiet yet");
    std::thread::sleep(Duration::from_millis(30));
    // Nobody else answered: a slow machine, not a stall.
    assert!(!a.due(&sv, t0 + 5 * MS) && a.due(&sv, t0 + 15 * MS));
    assert_eq!(a.check(&sv, t0 + 30 * MS, &mut logger(&mut log)), Verdict::Wait);
    assert!(log.is_empty());
    // Server 1 answers, server 0 stays silent: stalled.
    other.progress(&sv, t0 + 30 * MS);
    other.replies(&sv, b"END\r\n", t0 + 30 * MS, &mut logger(&mut log)).unwrap();
    log.clear();
    assert_eq!(a.check(&sv, t0 + 31 * MS, &mut logger(&mut log)), Verdict::Wait, "a becomes the probe");
    assert_eq!(log.iter().map(|l| (l.0, l.1.clone())).collect::<Vec<_>>(), vec![(1, Err(BackendError::Stalled))]);
    log.clear();
    assert_eq!(b.check(&sv, t0 + 31 * MS, &mut logger(&mut log)), Verdict::GaveUp, "b may not probe");
    assert_eq!(log[0].1, Err(BackendError::Stalled));
    assert!(b.in_flight() && !b.owed(), "b's late reply is still to be dropped");
    log.clear();
    // New calls are not sent while it is stalled.
    assert!(begin(&mut Exchange::new(0), &sv, 1, t0 + 32 * MS, &mut log).is_none());
    assert_eq!(log.pop().unwrap().1, Err(BackendError::Stalled));
    // The server answers again: the probe's reply ends its call, the given-up ones are dropped.
    a.progress(&sv, t0 + 40 * MS);
    let used = a.replies(&sv, b"END\r\nEND\r\n", t0 + 40 * MS, &mut logger(&mut log)).unwrap();
    assert_eq!((used, log.len()), (10, 1));
    assert_eq!(log[0].0, 0);
    assert!(!a.in_flight());
    b.replies(&sv, b"END\r\n", t0 + 40 * MS, &mut logger(&mut log)).unwrap();
    assert_eq!(log.len(), 1, "nothing ends twice");
    assert!(!sv.health.is_down(0));
}

#[test]
fn an_overdue_call_times_out_and_its_repairs_wait_for_the_next_exchange() {
    let sv = servers(1, |c| c.timeout_ms = 100);
    sv.repairs.note(0, b"r".to_vec());
    let mut ex = Exchange::new(0);
    let mut log = Log::new();
    begin(&mut ex, &sv, 1, 0, &mut log).unwrap();
    assert_eq!(ex.wait_limit(&sv, 90 * MS), Duration::from_millis(10), "cut to the deadline");
    assert_eq!(ex.check(&sv, 99 * MS, &mut logger(&mut log)), Verdict::Wait);
    assert_eq!(ex.check(&sv, 100 * MS, &mut logger(&mut log)), Verdict::TimedOut);
    ex.fail(&sv, &BackendError::Timeout, 100 * MS, &mut logger(&mut log));
    assert_eq!(log.len(), 1);
    assert!(log[0].2.timeout && log[0].2.failed);
    assert_eq!(log[0].2.done - log[0].2.sent, 100 * MS);
    assert!(sv.health.is_down(0));
    assert_eq!(sv.repairs.waiting(0), 1, "the repair was given back");
    assert!(!ex.in_flight());
}

#[test]
fn replies_that_are_not_memcached_s_or_too_large_fail_the_connection() {
    let sv = servers(1, |_| {});
    let mut ex = Exchange::new(0);
    let mut log = Log::new();
    begin(&mut ex, &sv, 1, 0, &mut log).unwrap();
    assert!(matches!(
        ex.replies(&sv, b"HTTP/1.1 200 OK\r\n", 1, &mut logger(&mut log)),
        Err(BackendError::Protocol(_))
    ));
    let (mut out, owners) = (Outbox::new(1), vec![7]);
    out.call(0, mcproto::retrieval_reply_len, 10).extend_from_slice(b"get k\r\n");
    let mut ex = Exchange::new(0);
    assert!(ex.begin(&sv, &out, &owners, &mut Vec::new(), 0, || Ok(false), &mut logger(&mut log)));
    assert_eq!(ex.replies(&sv, b"VALUE k 0 100\r\n", 1, &mut logger(&mut log)), Err(BackendError::TooLarge));
    assert!(log.is_empty(), "the engine fails the connection, which ends the calls");
}

#[test]
fn a_probe_whose_call_is_given_up_still_brings_the_server_back_with_its_reply() {
    let sv = servers(1, |_| {});
    let mut ex = Exchange::new(0);
    let mut log = Log::new();
    let (out, owners) = outbox(1, 0, 1);
    let refused = || Err(BackendError::Connect("refused".into()));
    assert!(!ex.begin(&sv, &out, &owners, &mut Vec::new(), 0, refused, &mut logger(&mut log)));
    assert!(sv.health.is_down(0));
    // (The backoff is 30 ms: a sleep of more outlasts it.)
    std::thread::sleep(Duration::from_millis(60));
    assert!(ex.begin(&sv, &out, &owners, &mut Vec::new(), 1, || Ok(true), &mut logger(&mut log)), "the probe");
    // An all-fastest answered from another pool: the probe's call is given up.
    assert_eq!(ex.give_up(|_| true), 1);
    assert_eq!(ex.replies(&sv, b"END\r\n", 2, &mut logger(&mut log)), Ok(5));
    assert!(!sv.health.is_down(0), "the server answered: it is up, and the probe is over");
    let mut other = Exchange::new(0);
    assert!(begin(&mut other, &sv, 1, 3, &mut log).is_some(), "requests reach it again");
}

#[test]
fn calls_given_up_end_without_an_outcome_and_their_replies_are_dropped() {
    let sv = servers(1, |_| {});
    let mut ex = Exchange::new(0);
    let mut log = Log::new();
    begin(&mut ex, &sv, 3, 100, &mut log).unwrap();
    assert_eq!(ex.give_up(|&t| t != 1), 2, "calls 0 and 2 are no longer needed");
    assert!(ex.owed(), "call 1 still is");
    let all = b"END\r\nVALUE k1 0 1\r\nv\r\nEND\r\nEND\r\n";
    assert_eq!(ex.replies(&sv, all, 200, &mut logger(&mut log)), Ok(all.len()));
    assert_eq!(log.iter().map(|l| l.0).collect::<Vec<_>>(), vec![1], "only the call still needed ends");
    assert!(!ex.in_flight() && !sv.is_down(0));
}
