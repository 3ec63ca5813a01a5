//! `version` and `stats`: asked of every server, answered by the proxy.
//!
//! A proxy answers for many servers at once: `version` is the lowest version
//! the servers report (in memcached's form, so clients that parse it keep
//! working), and `stats` adds up what only the servers know (items, bytes,
//! memory limit) next to the proxy's own counters. This plan asks every
//! server and keeps what each said; the engine builds the reply from it
//! (`local.rs`), since the rest of the reply is the proxy's state.

use mcproto::Request;

use super::{own, Answer, BackendError, Outbox, Router};

/// Longest reply of one server to `version` or `stats`.
const CAP: usize = 1 << 20;

/// A request sent to every server whose replies the proxy combines itself.
#[derive(Debug)]
pub struct GatherPlan {
    req: Option<Request>,
    answers: Vec<Option<Answer>>,
    sent: bool,
}

impl GatherPlan {
    /// Plans `req` for every server.
    pub fn new(req: Request, router: &Router) -> GatherPlan {
        GatherPlan { req: Some(req), answers: vec![None; router.servers()], sent: false }
    }

    pub(super) fn round(&mut self, out: &mut Outbox) {
        if self.sent {
            return;
        }
        self.sent = true;
        if let Some(req) = &self.req {
            for s in 0..self.answers.len() {
                req.encode(out.call(s, mcproto::response_len, CAP), false);
            }
        }
    }

    pub(super) fn absorb(&mut self, i: usize, outcome: Result<&[u8], &BackendError>) {
        self.answers[i] = Some(own(outcome));
    }

    /// The request and every server's answer, once.
    pub(super) fn take(&mut self) -> Option<(Request, Vec<Answer>)> {
        let req = self.req.take()?;
        Some((req, self.answers.iter_mut().map(|a| a.take().unwrap_or(Err(BackendError::Down))).collect()))
    }
}
