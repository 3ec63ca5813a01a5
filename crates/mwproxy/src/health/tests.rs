//! The health rules, without a server.

use super::*;

fn health(n: usize) -> Health {
    health_with(n, 8, Box::new(|| false))
}

fn health_with(n: usize, carriers: usize, work_waiting: WorkWaiting) -> Health {
    let cfg = BackendConfig { stall_ms: 50, retry_min_ms: 10_000, ..BackendConfig::default() };
    let h = Health::new(n, &cfg, carriers, work_waiting);
    for i in 0..n {
        h.name(i, format!("s{i}"));
    }
    h
}

#[test]
fn a_down_server_admits_one_probe_at_a_time() {
    let h = health(2);
    assert_eq!(h.admit(0), Ok(false));
    h.failed(0, &BackendError::Timeout);
    assert_eq!(h.admit(0), Err(BackendError::Down), "within the backoff nobody tries");
    h.servers[0].down_until_ms.store(0, Ordering::Relaxed);
    assert_eq!(h.admit(0), Ok(true), "after the backoff one request probes");
    assert_eq!(h.admit(0), Err(BackendError::Down), "the others still fail at once");
    h.end_probe(0);
    h.succeeded(0);
    assert_eq!(h.admit(0), Ok(false));
    assert!(!h.is_down(0));
}

#[test]
fn the_checker_takes_the_probe_slot_and_its_outcome_counts_for_everyone() {
    let cfg = BackendConfig { check_ms: 1000, retry_min_ms: 10_000, ..BackendConfig::default() };
    let mut h = Health::new(2, &cfg, 8, Box::new(|| false));
    // Started 10 s ago, so that a server reached at 0 ms has been idle for longer than check_ms.
    h.started = Instant::now().checked_sub(std::time::Duration::from_secs(10)).unwrap();
    assert!(h.unchecked(0));
    h.begin_wait(0);
    assert_eq!(h.check_due(0), Some(false), "every server is checked once at start, whatever the traffic");
    h.end_wait(0);
    h.checked(0, false, Err(&BackendError::Connect("refused".into())));
    assert!(!h.unchecked(0) && h.is_down(0), "a failed check marks it down");
    assert_eq!(h.check_due(0), None, "not within its backoff");
    h.servers[0].down_until_ms.store(0, Ordering::Relaxed);
    assert_eq!(h.check_due(0), Some(true), "after it, the checker is the probe");
    assert_eq!(h.admit(0), Err(BackendError::Down), "and no request probes with it");
    h.checked(0, true, Ok(()));
    assert_eq!(h.admit(0), Ok(false), "its success brings the server up for every request");
    assert_eq!(h.checks(0), (2, 1));
    assert_eq!(h.check_due(0), None, "checked just now");
    h.servers[0].checked_ms.store(0, Ordering::Relaxed);
    h.progress(0);
    assert_eq!(h.check_due(0), None, "a request reached it just now");
    h.servers[0].progress_ms.store(0, Ordering::Relaxed);
    h.begin_wait(0);
    assert_eq!(h.check_due(0), None, "requests are on their way to it");
    h.end_wait(0);
    h.servers[0].progress_ms.store(0, Ordering::Relaxed);
    assert_eq!(h.check_due(0), Some(false), "idle for check_ms");
    h.configure(&BackendConfig { check_ms: 0, ..cfg });
    assert_eq!(h.check_due(1), None, "checks off");
    assert!(!h.unchecked(1), "and nothing counts as unchecked then");
}

#[test]
fn failures_of_an_ejected_server_do_not_eject_it_again() {
    let cfg = BackendConfig { eject: true, eject_after: 2, eject_for_ms: 60_000, ..BackendConfig::default() };
    let h = Health::new(1, &cfg, 8, Box::new(|| false));
    h.name(0, "s0".into());
    let e = BackendError::Connect("refused".into());
    h.failed(0, &e);
    h.checked(0, false, Err(&e));
    assert_eq!(h.ejection.count(), 1, "a request's and a check's failures in a row eject it");
    let until = h.ejection.until_ms[0].load(Ordering::Relaxed);
    for _ in 0..5 {
        h.checked(0, false, Err(&e));
    }
    assert_eq!(h.ejection.count(), 1, "checks of an ejected server count no ejection");
    assert_eq!(h.ejection.until_ms[0].load(Ordering::Relaxed), until, "nor stretch its time off the ring");
    h.checked(0, false, Ok(()));
    assert!(h.ejection.off_ring(0, h.ejection.now_ms()), "a success does not bring it back early");
    assert!(!h.is_down(0), "though it is up");
}

#[test]
fn a_server_is_stalled_only_when_others_answer_meanwhile() {
    let h = health(2);
    h.begin_wait(0);
    let t0 = h.servers[0].progress_ms.load(Ordering::Relaxed);
    assert!(!h.stalled(0, t0 + 40));
    assert!(!h.stalled(0, t0 + 100), "nobody else answered: the whole machine may be slow");
    h.any_progress_ms.store(t0 + 90, Ordering::Relaxed);
    assert!(h.stalled(0, t0 + 100));
    h.servers[0].progress_ms.store(t0 + 95, Ordering::Relaxed);
    assert!(!h.stalled(0, t0 + 100), "an answer ends the stall");
    h.end_wait(0);
    h.servers[0].progress_ms.store(0, Ordering::Relaxed);
    assert!(!h.stalled(0, t0 + 1000), "nothing waiting, nothing stalled");
}

#[test]
fn a_server_every_carrier_waits_for_is_stalled_when_work_queues_behind_it() {
    use std::sync::Arc;
    let queued = Arc::new(AtomicBool::new(false));
    let q = queued.clone();
    let h = health_with(2, 2, Box::new(move || q.load(Ordering::Relaxed)));
    h.begin_wait(0);
    let t0 = h.servers[0].progress_ms.load(Ordering::Relaxed);
    assert!(!h.stalled(0, t0 + 100), "one carrier of two waits: the other can talk to the others");
    h.begin_wait(0);
    assert!(!h.stalled(0, t0 + 100), "every carrier waits, but nothing queues behind them");
    queued.store(true, Ordering::Relaxed);
    assert!(!h.stalled(0, t0 + 40), "not silent for stall_ms yet");
    assert!(h.stalled(0, t0 + 100), "every carrier waits and requests queue: stalled");
}
