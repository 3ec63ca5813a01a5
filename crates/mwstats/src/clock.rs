//! One monotonic clock for every thread of a process, and its link to wall time.
//!
//! Timestamps are nanoseconds since the process first asked for the time
//! (`now_ns`), read from the monotonic clock, so they never go backwards and
//! differences between threads are meaningful. [`unix_ms_of`] converts them
//! to wall-clock milliseconds with the offset measured at that first call, so
//! client and middleware windows can be lined up.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

struct Anchor {
    mono: Instant,
    unix_ns: u128,
}

fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| Anchor {
        mono: Instant::now(),
        unix_ns: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
    })
}

/// Nanoseconds on the process's monotonic clock.
#[inline]
pub fn now_ns() -> u64 {
    anchor().mono.elapsed().as_nanos() as u64
}

/// Wall-clock milliseconds since the Unix epoch of a monotonic timestamp.
pub fn unix_ms_of(mono_ns: u64) -> u64 {
    ((anchor().unix_ns + u128::from(mono_ns)) / 1_000_000) as u64
}

/// The monotonic timestamp of a wall-clock time in Unix milliseconds
/// (saturating at 0 for times before the anchor).
pub fn mono_of_unix_ms(unix_ms: u64) -> u64 {
    (u128::from(unix_ms) * 1_000_000).saturating_sub(anchor().unix_ns) as u64
}

/// Wall-clock milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    unix_ms_of(now_ns())
}

/// Wall-clock microseconds since the Unix epoch, now (on the same clock as [`unix_ms`]).
pub fn unix_us() -> u64 {
    ((anchor().unix_ns + u128::from(now_ns())) / 1_000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_linked_to_wall_time() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        assert!(unix_ms().abs_diff(wall) < 50);
        let t = mono_of_unix_ms(unix_ms() + 1000);
        assert!(t > now_ns());
    }
}
