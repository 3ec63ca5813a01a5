use super::*;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

fn limits(burst: f64, per_sec: f64) -> Limits {
    Limits { source: Rate { burst, per_sec }, user: Rate { burst: 1000.0, per_sec: 1000.0 } }
}

fn ip(text: &str) -> Option<Source> {
    Some(Source::ip(text.parse().unwrap()))
}

fn attempt<'a>(source: Option<Source>, user: Option<&'a [u8]>, secret: &'a [u8]) -> Attempt<'a> {
    Attempt { source, user, secret, via: "AUTH" }
}

/// Whether an attempt from `source` as `user` would be checked now.
fn may(t: &Throttle, source: Option<Source>, user: Option<&[u8]>) -> Result<(), Throttled> {
    may_at(t, source, user, Instant::now())
}

/// Whether an attempt from `source` as `user` would be checked at `now`.
fn may_at(t: &Throttle, source: Option<Source>, user: Option<&[u8]>, now: Instant) -> Result<(), Throttled> {
    match t.admit(&attempt(source, user, b"a password never tried"), false, now) {
        Ok(()) => Ok(()),
        Err(Refused::Throttled(t)) => Err(t),
        Err(Refused::Repeated) => panic!("never tried"),
    }
}

static GUESS: AtomicUsize = AtomicUsize::new(0);

/// A wrong password from `source` as `user`, checked: false when refused unchecked.
fn fail(t: &Throttle, source: Option<Source>, user: Option<&[u8]>) -> bool {
    fail_at(t, source, user, Instant::now())
}

/// [`fail`] at the time `now`.
fn fail_at(t: &Throttle, source: Option<Source>, user: Option<&[u8]>, now: Instant) -> bool {
    let guess = format!("guess-{}", GUESS.fetch_add(1, Ordering::Relaxed));
    let a = attempt(source, user, guess.as_bytes());
    let begun = t.admit(&a, true, now).is_ok();
    if begun {
        t.checked(&a, false);
    }
    begun
}

/// On the throttle's clock given by the test (a loaded machine's delays
/// between two calls would refill a bucket of 20 a second).
#[test]
fn a_source_is_locked_out_after_its_burst_and_earns_attempts_back() {
    let t = Throttle::new(limits(3.0, 20.0));
    let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
    let start = Instant::now();
    for _ in 0..3 {
        assert!(fail_at(&t, a, None, start));
    }
    let refused = may_at(&t, a, None, start).unwrap_err();
    assert_eq!(refused.to_string(), "too many failed logins from 10.0.0.1; retry in 1 s");
    assert!(may_at(&t, b, None, start).is_ok(), "another address is not");
    assert!(may_at(&t, a, None, start + Duration::from_millis(40)).is_err(), "not yet earned back after 40 ms");
    let later = start + Duration::from_millis(80);
    assert!(fail_at(&t, a, None, later), "one attempt earned back after 1/20 s");
    assert!(may_at(&t, a, None, later).is_err());
    assert_eq!(t.refused.load(Ordering::Relaxed), 3);
}

#[test]
fn the_wait_is_what_the_bucket_needs_to_drain_and_a_bucket_holds_its_burst_at_most() {
    let t = Throttle::new(limits(2.0, 0.5));
    let now = Instant::now();
    for _ in 0..5 {
        fail_at(&t, ip("10.0.0.1"), None, now);
    }
    // Level 2 (the burst: the three refused attempts were not charged), half
    // an attempt a second: (2 + 1 - 2) / 0.5 = 2 s; half a second later, 1.5 s, rounded up.
    let w = may_at(&t, ip("10.0.0.1"), None, now).unwrap_err().retry_secs;
    assert_eq!(w, 2);
    let w = may_at(&t, ip("10.0.0.1"), None, now + Duration::from_millis(500)).unwrap_err().retry_secs;
    assert_eq!(w, 2);
    let w = may_at(&t, ip("10.0.0.1"), None, now + Duration::from_millis(1500)).unwrap_err().retry_secs;
    assert_eq!(w, 1);
    assert!(may_at(&t, ip("10.0.0.1"), None, now + Duration::from_secs(2)).is_ok(), "drained enough after 2 s");
}

/// Attempts checked at the same time (a queue of logins, several login
/// threads) each passed a look at the bucket before any had failed: 50
/// sources made 69 checked guesses at one user in 10 s where the user's
/// bucket allowed about 30. Now the charge is taken before the check: with
/// 100 attempts begun and none yet answered, only the burst is let through —
/// and a right password gets its charge back, so logins that succeed never
/// fill a bucket.
#[test]
fn the_charge_is_taken_before_the_check_and_given_back_to_a_right_password() {
    let t = Throttle::new(Limits {
        source: Rate { burst: 10.0, per_sec: 0.001 },
        user: Rate { burst: 5.0, per_sec: 0.001 },
    });
    let guesses: Vec<String> = (0..100).map(|i| format!("guess-{i}")).collect();
    let begun: Vec<Attempt> = guesses
        .iter()
        .enumerate()
        .map(|(i, g)| {
            attempt(Some(Source::ip(IpAddr::from([127, 0, 0, 2 + i as u8 % 50]))), Some(b"alice"), g.as_bytes())
        })
        .filter(|a| t.begin(a).is_ok())
        .collect();
    assert_eq!(begun.len(), 5, "the user's burst, however many are in flight");
    for a in &begun {
        t.checked(a, false);
    }
    assert!(may(&t, ip("127.0.0.99"), Some(b"alice")).is_err());
    // A user whose logins succeed, a thousand times from one address.
    for _ in 0..1000 {
        let a = attempt(ip("10.1.1.1"), Some(b"bob"), b"right");
        t.begin(&a).unwrap();
        t.checked(&a, true);
    }
    assert!(may(&t, ip("10.1.1.1"), Some(b"bob")).is_ok());
}

/// One redis-py client with a wrong password retries its login: 11 failed
/// logins in 4 s filled its address's burst of 10, and the admin's right
/// password from the same address was refused. Now the same password from
/// the same source for the same user, failed within the window, is refused
/// unchecked and not counted again; another password is checked; and once
/// failures are forgotten (a reload), the same one is checked again.
#[test]
fn a_repeated_failure_is_refused_unchecked_and_not_counted_again() {
    let t = Throttle::new(limits(3.0, 0.001));
    let me = ip("10.0.0.5");
    let wrong = attempt(me, Some(b"app"), b"old-password");
    t.begin(&wrong).unwrap();
    t.checked(&wrong, false);
    for _ in 0..20 {
        assert_eq!(t.begin(&wrong), Err(Refused::Repeated));
    }
    assert_eq!(t.repeated.load(Ordering::Relaxed), 20);
    let right = attempt(me, Some(b"app"), b"new-password");
    assert_eq!(t.begin(&right), Ok(()), "the source's bucket holds one failure, not 21");
    t.checked(&right, true);
    // The same password from another source, or for another user, is checked.
    assert_eq!(t.check(&attempt(ip("10.0.0.6"), Some(b"app"), b"old-password")), Ok(()));
    assert_eq!(t.check(&attempt(me, Some(b"admin"), b"old-password")), Ok(()));
    t.forget_failures();
    assert_eq!(t.begin(&wrong), Ok(()), "checked again after a reload");
    t.checked(&wrong, false);
    assert_eq!(t.remembered.len(), 1);
}

#[test]
fn the_failures_remembered_are_bounded() {
    let t =
        Throttle::new(Limits { source: Rate { burst: 1e9, per_sec: 1.0 }, user: Rate { burst: 1e9, per_sec: 1.0 } });
    for i in 0..(MAX_REMEMBERED + 100) {
        let guess = format!("g{i}");
        let a = attempt(ip("10.0.0.1"), Some(b"u"), guess.as_bytes());
        t.begin(&a).unwrap();
        t.checked(&a, false);
    }
    assert_eq!(t.remembered.len(), MAX_REMEMBERED);
    let last = format!("g{}", MAX_REMEMBERED + 99);
    assert_eq!(t.check(&attempt(ip("10.0.0.1"), Some(b"u"), last.as_bytes())), Err(Refused::Repeated));
    assert_eq!(t.check(&attempt(ip("10.0.0.1"), Some(b"u"), b"g0")), Ok(()), "the oldest forgotten");
}

/// A writer the log lines go to, for one test.
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Failed logins raised counters only. Now they are logged at warn with the
/// source and the user name, never the password: one line per source per
/// interval, the next line counting those not logged.
#[test]
fn failures_are_logged_once_per_source_without_the_password() {
    let lines = Lines::default();
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let t = Throttle::new(limits(3.0, 0.001));
    tracing::subscriber::with_default(subscriber, || {
        for i in 0..5 {
            let secret = format!("hunter{i}");
            let a = attempt(ip("10.0.0.9"), Some(b"alice"), secret.as_bytes());
            if t.begin(&a).is_ok() {
                t.checked(&a, false);
            }
        }
        let a = attempt(ip("10.0.0.10"), Some(b"bob\r\nFAKE"), b"hunter9");
        t.begin(&a).unwrap();
        t.checked(&a, false);
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged: Vec<&str> = text.lines().collect();
    assert_eq!(logged.len(), 2, "{text}");
    assert!(
        logged[0].contains("WARN")
            && logged[0].contains("failed login over AUTH from 10.0.0.9 as user \"alice\": wrong password"),
        "{text}"
    );
    assert!(logged[1].contains("from 10.0.0.10 as user \"bob??FAKE\""), "{text}");
    assert!(!text.contains("hunter"), "no password: {text}");
}

/// A failed-login flood from many addresses (an attacker with a /20, or
/// loopback's /8) wrote one line per source: 4,096 sources per 10 s, about
/// 90 KB/s of log. Now the sources past MAX_LOGGED share one line.
#[test]
fn failures_sprayed_from_many_sources_log_a_bounded_number_of_lines() {
    let lines = Lines::default();
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let t = Throttle::new(limits(1000.0, 1000.0));
    tracing::subscriber::with_default(subscriber, || {
        for i in 0..1_000u32 {
            let a = attempt(ip(&format!("10.1.{}.{}", i / 250, i % 250 + 1)), Some(b"alice"), b"guess");
            if t.begin(&a).is_ok() {
                t.checked(&a, false);
            }
        }
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged = text.lines().count();
    assert!(logged > 1, "failures are logged: {text}");
    assert!(logged <= super::report::MAX_LOGGED + 1, "{logged} lines for 1,000 sources in one interval");
}

#[test]
fn ipv6_is_grouped_by_its_64_and_mapped_ipv4_is_ipv4() {
    assert_eq!(ip("2001:db8:1:2:aaaa::1"), ip("2001:db8:1:2:ffff:1:2:3"));
    assert_ne!(ip("2001:db8:1:2::1"), ip("2001:db8:1:3::1"));
    assert_eq!(ip("2001:db8:1:2:aaaa::1").unwrap().to_string(), "2001:db8:1:2::/64");
    assert_eq!(ip("::ffff:192.0.2.7"), ip("192.0.2.7"));
    assert_ne!(ip("192.0.2.7"), ip("192.0.2.8"), "IPv4 by address");
    let t = Throttle::new(limits(2.0, 0.001));
    fail(&t, ip("2001:db8::1"), None);
    fail(&t, ip("2001:db8::2"), None);
    let refused = may(&t, ip("2001:db8::ffff:3"), None).unwrap_err();
    assert_eq!(refused.by, By::Source(ip("2001:db8::").unwrap()));
    assert!(refused.to_string().starts_with("too many failed logins from 2001:db8::/64; retry in "));
    assert!(may(&t, ip("2001:db8:0:1::1"), None).is_ok(), "the next /64 is another source");
}

#[test]
fn unix_clients_are_bucketed_by_uid() {
    let t = Throttle::new(limits(2.0, 0.001));
    fail(&t, Some(Source::Uid(1000)), None);
    fail(&t, Some(Source::Uid(1000)), None);
    let refused = may(&t, Some(Source::Uid(1000)), None).unwrap_err();
    assert_eq!(refused.by, By::Source(Source::Uid(1000)));
    assert!(refused.to_string().contains("from local uid 1000"), "{refused}");
    assert!(may(&t, Some(Source::Uid(1001)), None).is_ok(), "another local user is not locked out");
    assert!(may(&t, ip("127.0.0.1"), None).is_ok(), "nor loopback TCP clients");
}

#[test]
fn a_user_name_is_locked_out_whatever_the_sources() {
    let t = Throttle::new(Limits {
        source: Rate { burst: 10.0, per_sec: 0.001 },
        user: Rate { burst: 5.0, per_sec: 0.001 },
    });
    let mut checked = 0;
    for i in 0..200u32 {
        let source = Some(Source::ip(IpAddr::from(std::net::Ipv4Addr::from(0x7f00_0001 + i % 50))));
        if fail(&t, source, Some(b"alice")) {
            checked += 1;
        }
    }
    assert_eq!(checked, 5, "the user's burst, across 50 addresses");
    let refused = may(&t, ip("127.0.0.99"), Some(b"alice")).unwrap_err();
    assert_eq!(refused.by, By::User("alice".into()));
    assert!(may(&t, ip("127.0.0.99"), Some(b"bob")).is_ok(), "another user is not");
    assert_eq!(shown_name(b"a\r\n-ERR x \"y\""), "a??-ERR?x??y?", "nothing that breaks a protocol line");
    assert!(shown_name(&[b'x'; 300]).ends_with("..."));
}

#[test]
fn the_tables_stay_bounded_and_keep_the_worst_offenders() {
    let t = Throttle::new(Limits {
        source: Rate { burst: 2.0, per_sec: 0.001 },
        user: Rate { burst: 2.0, per_sec: 0.001 },
    });
    let attacker = ip("192.0.2.1");
    fail(&t, attacker, Some(b"victim"));
    fail(&t, attacker, Some(b"victim"));
    for i in 0..(MAX_SOURCES as u32 + 500) {
        let name = format!("sprayed-{i}");
        fail(&t, Some(Source::ip(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)))), Some(name.as_bytes()));
    }
    let (sources, users) = t.tracked();
    assert!(sources <= MAX_SOURCES && users <= MAX_USERS, "{sources} {users}");
    assert!(may(&t, attacker, None).is_err(), "spraying from other addresses does not free the attacker's");
    assert!(may(&t, None, Some(b"victim")).is_err(), "spraying names does not free the victim's lockout");
}
