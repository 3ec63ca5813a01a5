//! Failed logins per source address: a leaky bucket per address that every
//! failure fills by one and that drains at a steady rate. While an address's
//! bucket is over its burst, logins from it are refused without checking the
//! password, so an attacker who opens connection after connection guesses no
//! faster than the drain rate, whatever it sends. A login that succeeds does
//! not empty the bucket (a valid user must not unlock guessing from its
//! address).
//!
//! The table is bounded: at most [`MAX_ADDRESSES`] addresses are tracked;
//! when it is full, drained buckets are forgotten first, then the fullest
//! bucket stays and the emptiest is dropped, so an attacker spraying from
//! many addresses cannot make the table grow nor free its own lockout.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Addresses tracked at most.
pub const MAX_ADDRESSES: usize = 16_384;

/// The limits: `burst` failures at once, then `per_sec` a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Failures an address may have in a row before it is locked out.
    pub burst: f64,
    /// Failures per second an address earns back.
    pub per_sec: f64,
}

impl Default for Limits {
    /// 10 failures in a row, then one a second.
    fn default() -> Self {
        Limits { burst: 10.0, per_sec: 1.0 }
    }
}

/// One address's bucket: its level when last touched.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

/// Failed logins by source address.
#[derive(Debug)]
pub struct Throttle {
    limits: Limits,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
    /// Attempts refused unchecked (the address was locked out).
    pub refused: std::sync::atomic::AtomicU64,
}

impl Throttle {
    /// A throttle with these limits.
    pub fn new(limits: Limits) -> Throttle {
        Throttle { limits, buckets: Mutex::new(HashMap::new()), refused: Default::default() }
    }

    fn level(&self, b: &Bucket, now: Instant) -> f64 {
        (b.level - now.saturating_duration_since(b.at).as_secs_f64() * self.limits.per_sec).max(0.0)
    }

    /// Whether a login from `addr` may be checked now; counts a refusal.
    pub fn may_try(&self, addr: IpAddr) -> bool {
        let now = Instant::now();
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let ok = buckets.get(&addr).is_none_or(|b| self.level(b, now) + 1.0 <= self.limits.burst);
        if !ok {
            self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        ok
    }

    /// A login from `addr` failed.
    pub fn failed(&self, addr: IpAddr) {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_ADDRESSES && !buckets.contains_key(&addr) {
            buckets.retain(|_, b| self.level(b, now) > 0.0);
            if buckets.len() >= MAX_ADDRESSES {
                let emptiest = buckets
                    .iter()
                    .min_by(|a, b| self.level(a.1, now).total_cmp(&self.level(b.1, now)))
                    .map(|(a, _)| *a);
                if let Some(a) = emptiest {
                    buckets.remove(&a);
                }
            }
        }
        let level = buckets.get(&addr).map_or(0.0, |b| self.level(b, now));
        buckets.insert(addr, Bucket { level: level + 1.0, at: now });
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_address_is_locked_out_after_its_burst_and_earns_attempts_back() {
        let t = Throttle::new(Limits { burst: 3.0, per_sec: 20.0 });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert!(t.may_try(a));
            t.failed(a);
        }
        assert!(!t.may_try(a), "locked out after 3 failures");
        assert!(t.may_try(b), "another address is not");
        std::thread::sleep(Duration::from_millis(80));
        assert!(t.may_try(a), "one attempt earned back after 1/20 s");
        t.failed(a);
        assert!(!t.may_try(a));
        assert_eq!(t.refused.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[test]
    fn the_table_stays_bounded_and_keeps_the_worst_offenders() {
        let t = Throttle::new(Limits { burst: 2.0, per_sec: 0.001 });
        let attacker: IpAddr = "192.0.2.1".parse().unwrap();
        t.failed(attacker);
        t.failed(attacker);
        for i in 0..(MAX_ADDRESSES as u32 + 500) {
            t.failed(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        }
        assert!(t.tracked() <= MAX_ADDRESSES);
        assert!(!t.may_try(attacker), "spraying from other addresses does not free the attacker's");
    }
}
