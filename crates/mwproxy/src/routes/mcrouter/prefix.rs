//! Routing prefixes (`/region/cluster/`): which entry of an mcrouter file's
//! `routes` a host serves. mcrouter serves every entry and picks one per key
//! by the prefix the key carries, the host's own (`-R`, `--route-prefix`)
//! when it carries none; mwproxy serves one route, so it takes the entry
//! whose `aliases` hold the host's prefix, or the only entry when there is
//! one and no prefix is given (mcrouter would want the prefix among that
//! entry's aliases; mwproxy does not read them then).

use serde_json::Value as Json;

use crate::config::ConfigError;

/// The routing prefix given, checked as mcrouter checks it: `/region/cluster/`
/// (the last slash optional).
pub fn check(p: &str) -> Result<String, ConfigError> {
    let parts: Vec<&str> = p.strip_prefix('/').unwrap_or("").trim_end_matches('/').split('/').collect();
    if !p.starts_with('/') || parts.len() != 2 || parts.iter().any(|s| s.is_empty()) || p.ends_with("//") {
        return Err(ConfigError(format!("routing prefix {p:?}: it is /region/cluster/ (mcrouter's -R)")));
    }
    Ok(p.to_string())
}

/// The route of the `routes` entry served, or where in the file to point
/// (a string to find) and why none is.
pub fn entry<'j>(routes: &'j Json, prefix: Option<&str>) -> Result<&'j Json, (String, String)> {
    let needle = || "\"routes\"".to_string();
    let Json::Array(list) = routes else { return Err((needle(), "a list of { aliases, route }".into())) };
    let (mut present, mut chosen) = (Vec::new(), None);
    for e in list {
        let Some(route) = e.get("route") else {
            return Err((needle(), "a routes entry is { aliases, route }".into()));
        };
        let aliases: Vec<&str> = match e.get("aliases") {
            None => Vec::new(),
            Some(Json::Array(a)) if a.iter().all(Json::is_string) => a.iter().filter_map(Json::as_str).collect(),
            Some(_) => return Err(("\"aliases\"".into(), "aliases is a list of \"/region/cluster/\"".into())),
        };
        if let Some(p) = prefix {
            if aliases.iter().any(|a| a.trim_end_matches('/') == p.trim_end_matches('/')) {
                if chosen.is_some() {
                    return Err((format!("\"{p}"), format!("the routing prefix {p:?} is an alias of two entries")));
                }
                chosen = Some(route);
            }
        }
        present.extend(aliases.into_iter().map(|a| format!("{a:?}")));
    }
    let present = if present.is_empty() { "none".to_string() } else { present.join(", ") };
    match (prefix, chosen) {
        (Some(_), Some(route)) => Ok(route),
        (Some(p), None) => Err((
            needle(),
            format!("no entry has the routing prefix {p:?} among its aliases (aliases present: {present})"),
        )),
        (None, _) if list.len() == 1 => Ok(&list[0]["route"]),
        (None, _) if list.is_empty() => Err((needle(), "no entry: give route, or one routes entry".into())),
        (None, _) => Err((
            needle(),
            format!(
                "several routing prefixes (aliases present: {present}): mwproxy serves one route; \
                 name this host's with -R PREFIX (mcrouter's command line) or --route-prefix PREFIX"
            ),
        )),
    }
}
