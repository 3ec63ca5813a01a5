//! Window boundaries aligned to wall-clock multiples of the window length, so
//! that the windows of every process on a host (and of hosts with synchronised
//! clocks) cover the same seconds.

use std::time::Duration;

use crate::clock::{mono_of_unix_ms, now_ns};

/// The first boundary strictly after `now_ms`.
pub fn next_boundary(now_ms: u64, window_ms: u64) -> u64 {
    (now_ms / window_ms + 1) * window_ms
}

/// Sleeps until wall-clock `unix_ms` or until `stop` returns true (checked
/// every 50 ms); returns whether it was stopped.
pub fn sleep_until(target_unix_ms: u64, stop: impl Fn() -> bool) -> bool {
    let target = mono_of_unix_ms(target_unix_ms);
    loop {
        if stop() {
            return true;
        }
        let now = now_ns();
        if now >= target {
            return false;
        }
        std::thread::sleep(Duration::from_nanos((target - now).min(50_000_000)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::unix_ms;

    #[test]
    fn boundaries_are_multiples() {
        assert_eq!(next_boundary(1_000, 1_000), 2_000);
        assert_eq!(next_boundary(1_999, 1_000), 2_000);
        assert_eq!(next_boundary(1_999, 250), 2_000);
        assert!(sleep_until(unix_ms() + 10_000, || true));
        assert!(!sleep_until(unix_ms() + 20, || false));
    }
}
