//! mcrouter's JSON configuration, read as it is: its `pools` become
//! `[pools.<name>]`, its `route` (or its one `routes` entry) becomes the
//! `[route]` tree (`spec.rs` checks it then, limits included), its route
//! handles the tree's nodes by their mcrouter names and parameters.
//!
//! Read: `PoolRoute` (`"PoolRoute|A"`, `"Pool|A"`, an object with `pool`,
//! `shadows`, `hash`), `PrefixSelectorRoute`, `OperationSelectorRoute`,
//! `FailoverRoute` (with `failover_errors`), `AllSyncRoute`,
//! `AllAsyncRoute`, `AllInitialRoute`, `AllMajorityRoute`,
//! `AllFastestRoute`, `WarmUpRoute`, `MissFailoverRoute`, `MigrateRoute`,
//! `NullRoute`, `DevNullRoute`, `ErrorRoute`, and named handles (any route
//! object with a `name`, referred to by that name; a name that leads back
//! to itself is refused). C-style comments and trailing commas are allowed,
//! as mcrouter (folly's relaxed JSON) allows them; a key given twice in an
//! object is refused (`json.rs`); a pool's `weights` become its servers'
//! ketama weights; of several `routes` entries, the one whose `aliases` hold
//! the routing prefix (mcrouter's `-R`, `prefix.rs`) is served. The tree read
//! is checked as mwproxy's own (`spec.rs`), its refusals placed at the route
//! they name in the file. Everything else — macros, `@` functions, other
//! handles, handles over a pool's servers one by one
//! (`"AllSyncRoute|Pool|A"`), other protocols, several routing prefixes
//! without `-R` — is refused, with the handle and its line and column in the
//! file named, and what to write instead where there is something.
//! docs/mcrouter.md says what differs.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;
use toml::Value;

use crate::config::{ConfigError, RoutingConfig, ServerSpec};
use crate::routes::spec::{MAX_DEPTH, MAX_NODES};

mod json;
mod prefix;

/// The pools as `[pools.<name>]` has them.
type Pools = BTreeMap<String, RoutingConfig>;

/// The pools and the route of an mcrouter file's text.
pub fn read(text: &str) -> Result<(Pools, Value), ConfigError> {
    read_for(text, None)
}

/// The pools and the route of an mcrouter file's text, for the host whose
/// routing prefix (mcrouter's `-R`, `/region/cluster/`) is `prefix`: of
/// several `routes` entries, the one whose `aliases` hold it.
pub fn read_for(text: &str, prefix: Option<&str>) -> Result<(Pools, Value), ConfigError> {
    let prefix = prefix.map(prefix::check).transpose()?;
    // (Positions in the clean text are positions in the file: comments
    // stay out of the search for a route's place.)
    let clean = json::clean(text);
    let doc = json::parse(&clean).map_err(|e| ConfigError(format!("mcrouter config: {e}")))?;
    let Json::Object(top) = &doc else { return Err(ConfigError("mcrouter config: not a JSON object".into())) };
    let mut r = Reader {
        text: &clean,
        pools: BTreeMap::new(),
        named: BTreeMap::new(),
        stack: Vec::new(),
        depth: 0,
        nodes: 0,
        places: Vec::new(),
    };
    for key in top.keys() {
        match key.as_str() {
            "pools" | "route" | "routes" | "named_handles" => {}
            "macros" => return r.refuse("macros", "\"macros\"", "mcrouter's macros are not read: expand them first"),
            other => {
                return r.refuse(
                    other,
                    &format!("\"{other}\""),
                    "not a top-level key mwproxy reads (pools, route, routes, named_handles)",
                )
            }
        }
    }
    if let Some(pools) = top.get("pools") {
        let Json::Object(pools) = pools else {
            return r.refuse("pools", "\"pools\"", "pools is an object of name: { servers }");
        };
        for (name, p) in pools {
            r.pool(name, p)?;
        }
    }
    let mut named = BTreeMap::new();
    if let Err(name) = collect_named(&doc, &mut named) {
        let why = "this name is given to two different routes: a named handle is defined once (or twice the same)";
        return r.refuse(&format!("named handle {name:?}"), &format!("\"{name}\""), why);
    }
    r.named = named;
    let route = match (top.get("route"), top.get("routes")) {
        (Some(route), None) => route,
        (None, Some(routes)) => match prefix::entry(routes, prefix.as_deref()) {
            Ok(route) => route,
            Err((needle, why)) => return r.refuse("routes", &needle, &why),
        },
        _ => return r.refuse("route", "{", "give route, or routes with one entry"),
    };
    let tree = r.route(route, "route", "route")?;
    let names: Vec<String> = r.pools.keys().cloned().collect();
    if let Err(e) = crate::routes::spec::read(&tree, &names) {
        return Err(r.placed(e));
    }
    Ok((r.pools, tree))
}

/// Reads the file at `path` (for the routing prefix `prefix`, if given).
pub fn load(path: &Path, prefix: Option<&str>) -> Result<(Pools, Value), ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
    read_for(&text, prefix).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
}

/// Where mcrouter's JSON comes from: a file, or the command line itself
/// (mcrouter's `--config-str`).
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// The file at this path.
    File(&'a Path),
    /// This text.
    Text(&'a str),
}

/// Puts the pools and route of the mcrouter JSON `from` (for the routing
/// prefix `prefix`, if given) into `c`, which must have none of its own.
pub fn install(c: &mut crate::config::Config, from: Source, prefix: Option<&str>) -> Result<(), ConfigError> {
    if !c.pools.is_empty() || c.route.is_some() || !c.routing.servers.is_empty() {
        return Err(ConfigError(
            "--mcrouter-config gives the pools and the route: leave servers, [pools] and [route] out of the rest"
                .into(),
        ));
    }
    let (pools, route) = match from {
        Source::File(path) => load(path, prefix)?,
        Source::Text(text) => read_for(text, prefix)?,
    };
    c.pools = pools;
    c.route = Some(super::RouteSpec::new(route));
    Ok(())
}

/// Whether a configuration file is mcrouter's (by its name).
pub fn is_json(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

struct Reader<'a> {
    text: &'a str,
    pools: Pools,
    named: BTreeMap<String, Json>,
    /// Named handles being read, to refuse a name that leads back to itself.
    stack: Vec<String>,
    /// Routes being read inside one another, and read in all: named handles
    /// are expanded where they are used, so twelve levels of sixteen
    /// children naming the next level would be 16^12 nodes (and a chain of
    /// hundreds a stack overflow, on a SIGHUP too). Both are bounded while
    /// expanding, before the tree's own limits are checked.
    depth: usize,
    nodes: usize,
    /// Each route read: its path in mwproxy's terms (`route.routes."a:"`),
    /// its path in the file's (`route.policies."a:"`) and what to look for
    /// to find it in the file.
    places: Vec<(String, String, String)>,
}

/// How deep routes may be read inside one another while expanding: the
/// tree's levels, with room for names standing for names.
const READ_DEPTH: usize = 4 * MAX_DEPTH;

impl Reader<'_> {
    /// A refusal naming `what` and where `needle` first appears in the file.
    fn refuse<T>(&self, what: &str, needle: &str, why: &str) -> Result<T, ConfigError> {
        Err(self.refusal(what, needle, why))
    }

    fn refusal(&self, what: &str, needle: &str, why: &str) -> ConfigError {
        let at = json::position(self.text, needle)
            .map(|(line, column)| format!(" (line {line}, column {column})"))
            .unwrap_or_default();
        ConfigError(format!("mcrouter config: {what}{at}: {why}"))
    }

    /// A refusal of the tree's check (`spec.rs`: `<path>: <why>`, the path
    /// in mwproxy's terms, which has no `: `) at the route it names in the
    /// file: a failover's seventeenth child, a shadow's range.
    fn placed(&self, e: ConfigError) -> ConfigError {
        let (at, why) = e.0.split_once(": ").unwrap_or(("route", e.0.as_str()));
        let within = |t: &str| at == t || at.strip_prefix(t).is_some_and(|rest| rest.starts_with(['.', '[']));
        // (The innermost of equal paths: a named handle's route, not its name.)
        match self.places.iter().filter(|p| within(&p.0)).max_by_key(|p| p.0.len()) {
            Some((t, path, needle)) => self.refusal(&format!("{path}{}", &at[t.len()..]), needle, why),
            None => self.refusal(at, "\"route", why),
        }
    }

    fn pool(&mut self, name: &str, p: &Json) -> Result<(), ConfigError> {
        let Json::Object(p) = p else { return self.refuse(name, &format!("\"{name}\""), "a pool is { servers }") };
        if let Some(k) = p.keys().find(|k| !["servers", "weights", "protocol", "name"].contains(&k.as_str())) {
            return self.refuse(
                &format!("pool {name}"),
                &format!("\"{k}\""),
                &format!("{k:?} is not read (servers, weights, protocol)"),
            );
        }
        if p.get("protocol").is_some_and(|v| v.as_str() != Some("ascii")) {
            return self.refuse(
                &format!("pool {name}"),
                "\"protocol\"",
                "only the ascii protocol is spoken to servers",
            );
        }
        let Some(Json::Array(list)) = p.get("servers") else {
            return self.refuse(&format!("pool {name}"), &format!("\"{name}\""), "servers is a list of \"host:port\"");
        };
        let mut servers = Vec::new();
        for s in list {
            let Some(s) = s.as_str() else {
                return self.refuse(&format!("pool {name}"), "\"servers\"", "a server is \"host:port\"");
            };
            let addr = s.strip_suffix(":ascii").unwrap_or(s);
            if addr.matches(':').count() > 1 && !addr.starts_with('[') {
                return self.refuse(
                    &format!("pool {name}"),
                    s,
                    &format!("{s:?}: only host:port[:ascii] servers are spoken to"),
                );
            }
            match addr.parse() {
                Ok(spec) => servers.push(spec),
                Err(e) => return self.refuse(&format!("pool {name}"), s, &format!("{e}")),
            }
        }
        if let Some(w) = p.get("weights") {
            self.weigh(name, w, &mut servers)?;
        }
        let pool = RoutingConfig { servers, ..RoutingConfig::default() };
        match self.pools.get(name) {
            Some(old) if *old != pool => {
                self.refuse(name, &format!("\"{name}\""), "two pools of this name with other servers")
            }
            _ => {
                self.pools.insert(name.to_string(), pool);
                Ok(())
            }
        }
    }

    /// A pool's `weights` (0.0 to 1.0 per server: mcrouter's WeightedCh3
    /// gives each server a share of keys in proportion) as ketama weights in
    /// the same proportion: thousandths, at least one (a weight of 0 next to
    /// larger ones gets no point on the ring, so no key, as in mcrouter).
    fn weigh(&self, name: &str, w: &Json, servers: &mut [ServerSpec]) -> Result<(), ConfigError> {
        let what = format!("pool {name}");
        let Json::Array(list) = w else {
            return self.refuse(&what, "\"weights\"", "weights is a list of numbers from 0.0 to 1.0, one per server");
        };
        if list.len() != servers.len() {
            let why = format!(
                "{} weights for {} servers: give one per server (mcrouter calls such a file broken and guesses 0.5)",
                list.len(),
                servers.len()
            );
            return self.refuse(&what, "\"weights\"", &why);
        }
        for (s, w) in servers.iter_mut().zip(list) {
            match w.as_f64() {
                Some(w) if (0.0..=1.0).contains(&w) => s.weight = ((w * 1000.0).round() as u32).max(1),
                _ => return self.refuse(&what, "\"weights\"", &format!("weight {w}: a number from 0.0 to 1.0")),
            }
        }
        Ok(())
    }

    /// Reads the route `v` at `path` in the file, `tpath` in mwproxy's terms.
    fn route(&mut self, v: &Json, path: &str, tpath: &str) -> Result<Value, ConfigError> {
        self.nodes += 1;
        let inside = self.stack.last().map(|n| format!("\"{n}\"")).unwrap_or_else(|| "\"route".into());
        // (Named handles are the usual way there: say which one, when it is.)
        let why = |what: String, how: &str| match self.stack.last() {
            Some(n) => format!("{what} ({how}, at named handle {n})"),
            None => what,
        };
        if self.nodes > MAX_NODES {
            let why =
                why(format!("the route expands to more than {MAX_NODES} routes"), "named handles used many times over");
            return self.refuse(path, &inside, &why);
        }
        if self.depth >= READ_DEPTH {
            let why = why(format!("nests deeper than {MAX_DEPTH} levels"), "named handles in named handles");
            return self.refuse(path, &inside, &why);
        }
        self.depth += 1;
        let needle = match v {
            Json::String(s) => format!("\"{s}\""),
            Json::Object(o) => o.get("type").and_then(Json::as_str).map_or("{".into(), |t| format!("\"{t}\"")),
            _ => "\"route".into(),
        };
        self.places.push((tpath.to_string(), path.to_string(), needle));
        let out = match v {
            Json::String(s) => self.short(s, path, tpath),
            Json::Object(o) => self.handle(o, path, tpath),
            _ => self.refuse(path, "\"route", "a route is a string (\"PoolRoute|A\") or an object with a type"),
        };
        self.depth -= 1;
        out
    }

    /// `"PoolRoute|A"`, `"Pool|A"`, `"NullRoute"`, `"ErrorRoute|why"`, a named handle.
    fn short(&mut self, s: &str, path: &str, tpath: &str) -> Result<Value, ConfigError> {
        let parts: Vec<&str> = s.split('|').collect();
        let quoted = format!("\"{s}\"");
        match parts.as_slice() {
            ["PoolRoute" | "Pool", name] => self.pool_name(name, path, &quoted),
            ["NullRoute" | "DevNullRoute"] => Ok(table([("type", "null".into())])),
            ["ErrorRoute"] => Ok(table([("type", "error".into())])),
            ["ErrorRoute", why] => Ok(table([("type", "error".into()), ("message", (*why).into())])),
            [name] if self.named.contains_key(*name) => {
                if let Some(at) = self.stack.iter().position(|n| n == name) {
                    let cycle = self.stack[at..].join(" -> ");
                    return self.refuse(path, &quoted, &format!("named handles loop: {cycle} -> {name}"));
                }
                let handle = self.named[*name].clone();
                self.stack.push(name.to_string());
                let out = self.route(&handle, path, tpath);
                self.stack.pop();
                out
            }
            [first, ..] if first.starts_with('@') => self.refuse(path, &quoted, "mcrouter's @ functions are not read"),
            ["HashRoute", "Pool" | "PoolRoute", pool] => {
                self.refuse(path, &quoted, &format!("{s:?} is not read: {}", hash_route(pool)))
            }
            [handle, "Pool" | "PoolRoute", pool] => self.refuse(
                path,
                &quoted,
                &format!("{handle} over each server of a pool is not read: {}", per_server(pool)),
            ),
            _ => self.refuse(path, &quoted, &format!("{s:?} is not a handle mwproxy reads, nor a named handle")),
        }
    }

    fn pool_name(&self, name: &str, path: &str, needle: &str) -> Result<Value, ConfigError> {
        if !self.pools.contains_key(name) {
            return self.refuse(path, needle, &format!("unknown pool {name:?}"));
        }
        Ok(Value::String(name.to_string()))
    }

    fn handle(&mut self, o: &serde_json::Map<String, Json>, path: &str, tpath: &str) -> Result<Value, ConfigError> {
        let Some(ty) = o.get("type").and_then(Json::as_str) else {
            return self.refuse(path, "{", "a route object needs a type");
        };
        let needle = format!("\"{ty}\"");
        let allowed: &[&str] = match ty {
            "PoolRoute" => &["pool", "shadows", "hash"],
            "FailoverRoute" => &["children", "failover_errors"],
            "AllSyncRoute" | "AllAsyncRoute" | "AllInitialRoute" | "AllMajorityRoute" | "AllFastestRoute"
            | "MissFailoverRoute" => &["children"],
            "WarmUpRoute" => &["cold", "warm", "exptime"],
            "PrefixSelectorRoute" => &["policies", "wildcard"],
            "OperationSelectorRoute" => &["operation_policies", "default_policy"],
            "MigrateRoute" => &["from", "to", "start_time", "interval"],
            "NullRoute" | "DevNullRoute" => &[],
            "ErrorRoute" => &["response"],
            "HashRoute" => {
                let why = match o.get("children").and_then(Json::as_str).and_then(|c| c.split_once('|')) {
                    Some(("Pool" | "PoolRoute", pool)) => hash_route(pool),
                    _ => "over a pool's servers (\"children\": \"Pool|A\") write \"PoolRoute|A\", which hashes \
                          each key to one of them as HashRoute does; mwproxy hashes keys to servers, not to routes"
                        .into(),
                };
                return self.refuse(path, &needle, &format!("HashRoute is not a handle mwproxy reads: {why}"));
            }
            other => {
                return self.refuse(path, &needle, &format!("{other} is not a handle mwproxy reads (docs/mcrouter.md)"))
            }
        };
        if let Some(k) = o.keys().find(|k| !["type", "name"].contains(&k.as_str()) && !allowed.contains(&k.as_str())) {
            return self.refuse(
                path,
                &format!("\"{k}\""),
                &format!("{ty}: {k:?} is not read (it takes {})", allowed.join(", ")),
            );
        }
        // (`tkey`: the key's name in mwproxy's terms.)
        let child = |r: &mut Self, key: &str, tkey: &str| -> Result<Value, ConfigError> {
            match o.get(key) {
                Some(v) => r.route(v, &format!("{path}.{key}"), &format!("{tpath}.{tkey}")),
                None => r.refuse(path, &needle, &format!("{ty} needs {key}")),
            }
        };
        let kind = |t: &str| ("type", Value::String(t.into()));
        Ok(match ty {
            "PoolRoute" => return self.pool_route(o, path, tpath, &needle),
            "FailoverRoute" => {
                let mut t = vec![kind("failover"), ("children", self.children(o, path, tpath, &needle)?)];
                if let Some(errors) = o.get("failover_errors") {
                    t.push(("failover_on", self.failover_errors(errors, path)?));
                }
                table(t)
            }
            "AllSyncRoute" | "AllAsyncRoute" | "AllInitialRoute" | "AllMajorityRoute" | "AllFastestRoute"
            | "MissFailoverRoute" => {
                let name = match ty {
                    "AllSyncRoute" => "all-sync",
                    "AllAsyncRoute" => "all-async",
                    "AllInitialRoute" => "all-initial",
                    "AllMajorityRoute" => "all-majority",
                    "AllFastestRoute" => "all-fastest",
                    _ => "miss-failover",
                };
                table([kind(name), ("children", self.children(o, path, tpath, &needle)?)])
            }
            "WarmUpRoute" => {
                let cold = child(self, "cold", "cold")?;
                let mut t = vec![kind("warm-up"), ("cold", cold), ("warm", child(self, "warm", "warm")?)];
                if let Some(e) = o.get("exptime") {
                    t.push(("exptime", self.int(e, path, "exptime")?));
                }
                table(t)
            }
            "PrefixSelectorRoute" => {
                let mut t = vec![kind("prefix")];
                if let Some(p) = o.get("policies") {
                    let Json::Object(p) = p else { return self.refuse(path, "\"policies\"", "policies is an object") };
                    let mut routes = toml::Table::new();
                    for (prefix, r) in p {
                        let (at, tat) = (format!("{path}.policies.{prefix:?}"), format!("{tpath}.routes.{prefix:?}"));
                        routes.insert(prefix.clone(), self.route(r, &at, &tat)?);
                    }
                    t.push(("routes", Value::Table(routes)));
                }
                if o.contains_key("wildcard") {
                    t.push(("default", child(self, "wildcard", "default")?));
                }
                table(t)
            }
            "OperationSelectorRoute" => self.operations(o, path, tpath, &needle)?,
            "MigrateRoute" => {
                let interval = match o.get("interval") {
                    Some(i) => self.int(i, path, "interval")?.as_integer().unwrap_or(0),
                    None => 3600,
                };
                let Some(start) = o.get("start_time") else {
                    return self.refuse(path, &needle, "MigrateRoute needs start_time");
                };
                table([
                    kind("migrate"),
                    ("from", child(self, "from", "from")?),
                    ("to", child(self, "to", "to")?),
                    ("start", self.int(start, path, "start_time")?),
                    ("window", Value::Integer(interval.saturating_mul(2))),
                    ("both", "deletes".into()),
                ])
            }
            "NullRoute" | "DevNullRoute" => table([kind("null")]),
            _ => match o.get("response").and_then(Json::as_str) {
                Some(why) => table([kind("error"), ("message", why.into())]),
                None => table([kind("error")]),
            },
        })
    }

    /// A pool, with its shadows.
    fn pool_route(
        &mut self,
        o: &serde_json::Map<String, Json>,
        path: &str,
        tpath: &str,
        needle: &str,
    ) -> Result<Value, ConfigError> {
        let name = match o.get("pool") {
            Some(Json::String(name)) => name.clone(),
            Some(p @ Json::Object(def)) => {
                let Some(name) = def.get("name").and_then(Json::as_str) else {
                    return self.refuse(path, "\"pool\"", "a pool defined in a PoolRoute needs a name");
                };
                self.pool(name, p)?;
                name.to_string()
            }
            _ => return self.refuse(path, needle, "PoolRoute needs pool (a name, or { name, servers })"),
        };
        let pool = self.pool_name(&name, path, needle)?;
        let Some(shadows) = o.get("shadows") else { return Ok(pool) };
        let Json::Array(shadows) = shadows else { return self.refuse(path, "\"shadows\"", "shadows is a list") };
        let mut list = Vec::new();
        for (i, s) in shadows.iter().enumerate() {
            let p = format!("{path}.shadows[{i}]");
            let Json::Object(s) = s else {
                return self.refuse(&p, "\"shadows\"", "a shadow is { target, key_fraction_range }");
            };
            if let Some(k) = s.keys().find(|k| !["target", "key_fraction_range"].contains(&k.as_str())) {
                return self.refuse(
                    &p,
                    &format!("\"{k}\""),
                    &format!("{k:?} is not read (a shadow takes target, key_fraction_range)"),
                );
            }
            let Some(target) = s.get("target") else {
                return self.refuse(&p, "\"shadows\"", "a shadow needs a target");
            };
            let range = match s.get("key_fraction_range") {
                Some(r) => toml::Value::try_from(r).map_err(|e| ConfigError(format!("{p}: {e}")))?,
                None => Value::Array(vec![Value::Float(0.0), Value::Float(1.0)]),
            };
            let route = self.route(target, &format!("{p}.target"), &format!("{tpath}.shadows[{i}].route"))?;
            list.push(table([("route", route), ("key_fraction", range)]));
        }
        Ok(table([("type", "shadow".into()), ("main", pool), ("shadows", Value::Array(list))]))
    }

    fn children(
        &mut self,
        o: &serde_json::Map<String, Json>,
        path: &str,
        tpath: &str,
        needle: &str,
    ) -> Result<Value, ConfigError> {
        let Some(Json::Array(list)) = o.get("children") else {
            if let Some(("Pool", pool)) = o.get("children").and_then(Json::as_str).and_then(|c| c.split_once('|')) {
                let why =
                    format!("\"children\": \"Pool|{pool}\" (one child per server) is not read: {}", per_server(pool));
                return self.refuse(path, "\"children\"", &why);
            }
            return self.refuse(path, needle, "children is a list of routes");
        };
        let out = list
            .iter()
            .enumerate()
            .map(|(i, c)| self.route(c, &format!("{path}.children[{i}]"), &format!("{tpath}.children[{i}]")));
        Ok(Value::Array(out.collect::<Result<_, _>>()?))
    }

    /// mcrouter's reply errors, as the failover's classes.
    fn failover_errors(&self, v: &Json, path: &str) -> Result<Value, ConfigError> {
        let Json::Array(list) = v else {
            return self.refuse(
                path,
                "\"failover_errors\"",
                "failover_errors is a list (the per-operation form is not read)",
            );
        };
        let mut on = Vec::new();
        for e in list {
            let class = match e.as_str() {
                Some("connect_error" | "connect_timeout" | "tko") => "connect",
                Some("timeout" | "data_timeout") => "timeout",
                Some("remote_error" | "local_error" | "busy" | "try_again") => "error",
                _ => return self.refuse(path, &e.to_string(), &format!("failover error {e} is not read")),
            };
            if !on.contains(&class) {
                on.push(class);
            }
        }
        Ok(Value::Array(on.into_iter().map(Value::from).collect()))
    }

    fn operations(
        &mut self,
        o: &serde_json::Map<String, Json>,
        path: &str,
        tpath: &str,
        needle: &str,
    ) -> Result<Value, ConfigError> {
        let mut t = vec![("type", Value::from("operation"))];
        if let Some(p) = o.get("operation_policies") {
            let Json::Object(p) = p else { return self.refuse(path, "\"operation_policies\"", "an object") };
            if let (Some(i), Some(d)) = (p.get("incr"), p.get("decr")) {
                if i != d {
                    return self.refuse(
                        path,
                        "\"decr\"",
                        "incr and decr go one way here (arith): give them the same route",
                    );
                }
            }
            for (op, r) in p {
                let class = match op.as_str() {
                    "get" => "get",
                    "set" => "set",
                    "delete" => "delete",
                    "incr" | "decr" => "arith",
                    "touch" => "touch",
                    other => {
                        return self.refuse(
                            path,
                            &format!("\"{other}\""),
                            &format!(
                            "operation {other:?} alone is not read: routes are by get, set, delete, incr/decr, touch"
                        ),
                        )
                    }
                };
                if op == "decr" && p.contains_key("incr") {
                    continue;
                }
                let route = self.route(r, &format!("{path}.operation_policies.{op}"), &format!("{tpath}.{class}"))?;
                t.push((class, route));
            }
        }
        if let Some(d) = o.get("default_policy") {
            t.push(("default", self.route(d, &format!("{path}.default_policy"), &format!("{tpath}.default"))?));
        }
        if t.len() == 1 {
            return self.refuse(path, needle, "OperationSelectorRoute needs operation_policies or default_policy");
        }
        Ok(table(t))
    }

    fn int(&self, v: &Json, path: &str, key: &str) -> Result<Value, ConfigError> {
        match v.as_i64() {
            Some(i) if i >= 0 => Ok(Value::Integer(i)),
            _ => self.refuse(path, &format!("\"{key}\""), &format!("{key} is a whole number of seconds")),
        }
    }
}

/// What to write instead of a HashRoute over the servers of `pool`.
fn hash_route(pool: &str) -> String {
    format!(
        "write \"PoolRoute|{pool}\" instead: a PoolRoute hashes each key to one server of the pool, as this \
         HashRoute does (mwproxy with ketama, docs/mcrouter.md)"
    )
}

/// What to write instead of a handle over each server of `pool`.
fn per_server(pool: &str) -> String {
    format!(
        "mwproxy does not expand a pool into one child per server: list one-server pools as the children \
         (\"PoolRoute|{pool}1\", \"PoolRoute|{pool}2\", ...), or route to the pool (\"PoolRoute|{pool}\") \
         with replication set to its number of servers in mwproxy's TOML (--print-config writes it): \
         writes then go to every server, reads to one and on to the next if it fails"
    )
}

fn table<'a>(entries: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    Value::Table(entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Every route object with a `name` (and a `type`), by name. A name given
/// twice to the same route is that route; given to two different routes,
/// its name (mcrouter would use whichever it met first, silently).
fn collect_named(v: &Json, out: &mut BTreeMap<String, Json>) -> Result<(), String> {
    match v {
        Json::Object(o) => {
            if let (Some(Json::String(name)), Some(_)) = (o.get("name"), o.get("type")) {
                match out.get(name) {
                    Some(first) if first != v => return Err(name.clone()),
                    Some(_) => {}
                    None => {
                        out.insert(name.clone(), v.clone());
                    }
                }
            }
            o.values().try_for_each(|c| collect_named(c, out))
        }
        Json::Array(a) => a.iter().try_for_each(|c| collect_named(c, out)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
