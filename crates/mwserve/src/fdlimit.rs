//! File descriptors: how many clients fit.
//!
//! At start the soft limit on open files is raised to the hard limit. The
//! middleware keeps descriptors for its own connections (to servers or the
//! database), its event loops and files, plus [`OWN`]; what is left is for
//! clients. When the configured number of clients does not fit, the
//! middleware says so at start and serves as many as fit, so that a client
//! over the limit gets the protocol's refusal and the middleware's own
//! connections can always be opened again.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Descriptors kept for the process itself (listener, results files, admin
/// endpoint, spare descriptor, logs) besides the ones a middleware names.
pub const OWN: u64 = 64;
/// Used when the hard limit is unlimited.
const UNLIMITED: u64 = 1 << 20;

/// The client limit that fits, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdPlan {
    /// The soft limit on open files after raising it.
    pub limit: u64,
    /// Descriptors kept for the middleware's own connections and itself.
    pub reserve: u64,
    /// Clients served at once.
    pub max_connections: usize,
}

/// Raises the soft limit on open files to the hard one; returns the soft limit.
pub fn raise_soft_limit() -> u64 {
    let lim = getrlimit(Resource::Nofile);
    let hard = lim.maximum.unwrap_or(UNLIMITED);
    let soft = lim.current.unwrap_or(hard);
    if soft < hard {
        let target = hard.min(UNLIMITED);
        match setrlimit(Resource::Nofile, Rlimit { current: Some(target), maximum: lim.maximum }) {
            Ok(()) => return target,
            Err(e) => tracing::warn!("cannot raise the open file limit from {soft} to {target}: {e}"),
        }
    }
    soft
}

/// How many of `wanted` clients fit under `limit` open files when `own`
/// descriptors are needed for the middleware's connections (`own_what`
/// says what they are, for the message when nothing fits).
pub fn plan(limit: u64, own: u64, own_what: &str, wanted: usize) -> Result<FdPlan, String> {
    let reserve = own + OWN;
    let usable = limit.saturating_sub(reserve);
    if usable == 0 {
        return Err(format!(
            "the open file limit ({limit}) leaves no room for clients: {own_what} need {own} descriptors, plus {OWN} \
             for the process itself; raise it with `ulimit -n`"
        ));
    }
    let max_connections = wanted.min(usize::try_from(usable).unwrap_or(usize::MAX));
    Ok(FdPlan { limit, reserve, max_connections })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_get_what_is_left_after_the_reserve() {
        let p = plan(1024, 18, "connections", 4096).unwrap();
        assert_eq!(p.reserve, 18 + OWN);
        assert_eq!(p.max_connections, 1024 - 18 - OWN as usize);
        assert_eq!(plan(100_000, 18, "connections", 4096).unwrap().max_connections, 4096);
        let e = plan(50, 18, "8 workers x 2 servers", 4096).unwrap_err();
        assert!(e.contains("ulimit") && e.contains("8 workers x 2 servers"), "{e}");
    }
}
