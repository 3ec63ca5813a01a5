//! One configuration as the running proxy uses it: its routing, the numbers
//! of its servers, who may log in, the TLS listener's certificate and the
//! parser's limits. A reload (`reload.rs`) builds the next generation and
//! swaps it in at once; a request keeps the generation it was routed with
//! until it is answered, so requests already on their way finish on the old
//! ring while new ones take the new one.

use mwserve::stream::Addr;
use std::sync::Arc;

use crate::auth::Users;
use crate::config::Config;
use crate::exchange::Servers;
use crate::route::Router;

/// A configuration, ready to route with.
pub struct Generation {
    /// 1 at start, one more with every reload.
    pub id: u64,
    /// The configuration it was built from (the settings that cannot
    /// change while running are those of the start).
    pub config: Config,
    /// Routing rules: placement over this configuration's servers.
    pub router: Router,
    /// The number (`Servers`) of the server at each position.
    pub ids: Vec<usize>,
    /// Who may log in (`--auth-file`); everyone when `None`.
    pub users: Option<Users>,
    /// The TLS listener's configuration (`--tls-cert`), when there is one.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// What the parser accepts.
    pub limits: mcproto::Limits,
    /// The route tree over the pools, when the configuration has one
    /// (keyless requests still use `router`, over every pool's servers).
    pub tree: Option<Arc<crate::routes::Tree>>,
}

impl Generation {
    /// Generation `id` of `config`, whose servers are at `addrs` and
    /// numbered `ids`.
    pub fn new(
        id: u64,
        config: Config,
        addrs: &[Addr],
        ids: Vec<usize>,
        users: Option<Users>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Generation {
        Generation {
            id,
            router: Router::new(&config, addrs),
            limits: config.parser_limits(),
            config,
            ids,
            users,
            tls,
            tree: None,
        }
    }

    /// With ejection as `ejection` decides (when the configuration turns it on).
    pub fn ejecting(mut self, ejection: std::sync::Arc<crate::health::Ejection>) -> Generation {
        self.router = self.router.with_ejection(&self.config, ejection, &self.ids);
        self
    }

    /// With its route tree (when the configuration has one), whose copies
    /// go to `side` and whose pools eject servers as `ejection` decides; the
    /// routes it keeps of `previous`'s tree keep their counters.
    pub fn routed(
        mut self,
        side: &Arc<crate::routes::queue::Lanes<crate::routes::tree::Detached>>,
        ejection: Arc<crate::health::Ejection>,
        previous: Option<&Generation>,
    ) -> Generation {
        let mut tree = crate::routes::Tree::build(&self.config, &self.router.addrs, &self.ids, side.clone(), ejection);
        if let (Some(tree), Some(old)) = (&mut tree, previous.and_then(|p| p.tree.as_deref())) {
            tree.carry(old);
        }
        self.tree = tree.map(Arc::new);
        self
    }

    /// How many copies of a key the batches must keep in order for: the
    /// pool's replication, and with a route tree whose requests may take
    /// more than one round (failovers, warm-ups) as under replication.
    pub fn wave_width(&self) -> usize {
        match &self.tree {
            Some(tree) if tree.rounds => self.router.replication.max(2),
            _ => self.router.replication,
        }
    }

    /// Positions of this configuration's servers that are down or stalled.
    pub fn down(&self, servers: &Servers) -> Vec<usize> {
        (0..self.ids.len()).filter(|&p| servers.is_down(self.ids[p])).collect()
    }

    /// Whether server number `s` is one of this configuration's.
    pub fn uses(&self, s: usize) -> bool {
        self.ids.contains(&s)
    }
}
