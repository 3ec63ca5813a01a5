//! What `mwsample` reads from `/proc`: the lab's sampler on a host reached
//! over SSH, where the lab's Python (and psutil) may not be. It samples what
//! the lab's local sampler samples — each started process with its children,
//! CPU seconds per process and per thread class, resident memory, the host's
//! busy CPU and network bytes — into the same `cpu.csv` and `resources.csv`.
//!
//! The processes to sample are named by pid files in one directory (the
//! runner's remote work directory: `cl0.pid` holds the pid of the session
//! that runs `cl0`); each pid file's process tree is one process of the lab,
//! without the shell and `timeout` that wrap it.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

/// One line of `/proc/PID/stat` (or `/proc/PID/task/TID/stat`), the fields the sampler needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    /// The command name (a thread's name in a task's stat).
    pub comm: String,
    /// The parent's pid.
    pub ppid: u32,
    /// utime + stime, in clock ticks.
    pub ticks: u64,
    /// Resident set, in pages.
    pub rss_pages: u64,
}

/// Parses a stat line; `None` for a line that is not one. The command name
/// sits in parentheses and may itself hold spaces and parentheses, so the
/// fields are counted from the last `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    if close < open {
        return None;
    }
    let comm = line[open + 1..close].to_string();
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    // rest[0] is field 3 (state): field n is rest[n - 3].
    let field = |n: usize| rest.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    Some(Stat { comm, ppid: u32::try_from(field(4)?).ok()?, ticks: field(14)? + field(15)?, rss_pages: field(24)? })
}

/// A thread's role from its name, as the lab names it: `worker-3` -> `worker`,
/// `mc-worker` stays, a name of digits only -> `main`.
pub fn thread_class(name: &str) -> String {
    let name = name.trim();
    let digits = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let class = if digits.len() < name.len() { digits.strip_suffix(['-', '_']).unwrap_or(digits) } else { name };
    if class.is_empty() {
        "main".to_string()
    } else {
        class.to_string()
    }
}

/// Every process now: pid -> its stat.
pub fn processes(proc: &Path) -> HashMap<u32, Stat> {
    let mut out = HashMap::new();
    let Ok(dir) = fs::read_dir(proc) else { return out };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if let Some(stat) = fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(parse_stat) {
            out.insert(pid, stat);
        }
    }
    out
}

/// The processes of the tree under `root`, without the wrappers the runner
/// puts around a process (the session's shell, which is `root`, and a
/// `timeout` right under it).
pub fn tree(root: u32, all: &HashMap<u32, Stat>) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, s) in all {
        children.entry(s.ppid).or_default().push(pid);
    }
    let mut out = Vec::new();
    let mut todo = vec![(root, 0usize)];
    while let Some((pid, depth)) = todo.pop() {
        let wrapper = depth == 0 || (depth == 1 && all.get(&pid).is_some_and(|s| s.comm == "timeout"));
        if !wrapper && all.contains_key(&pid) {
            out.push(pid);
        }
        for &c in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            todo.push((c, depth + 1));
        }
    }
    out
}

/// CPU ticks per thread class of one process's live threads.
pub fn thread_ticks(proc: &Path, pid: u32, into: &mut BTreeMap<String, u64>) {
    let Ok(dir) = fs::read_dir(proc.join(pid.to_string()).join("task")) else { return };
    for entry in dir.flatten() {
        let Some(stat) = fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(parse_stat) else {
            continue;
        };
        *into.entry(thread_class(&stat.comm)).or_default() += stat.ticks;
    }
}

/// One sampled process of the lab: CPU ticks in all, per thread class, and resident pages.
#[derive(Debug, Default)]
pub struct Sampled {
    /// CPU ticks of every process of the tree.
    pub ticks: u64,
    /// CPU ticks of the live threads, per thread class.
    pub classes: BTreeMap<String, u64>,
    /// Resident pages of every process of the tree.
    pub rss_pages: u64,
}

/// The tree under `root`, summed.
pub fn sample_tree(proc: &Path, root: u32, all: &HashMap<u32, Stat>) -> Option<Sampled> {
    let pids = tree(root, all);
    if pids.is_empty() {
        return None;
    }
    let mut out = Sampled::default();
    for pid in pids {
        let s = &all[&pid];
        out.ticks += s.ticks;
        out.rss_pages += s.rss_pages;
        thread_ticks(proc, pid, &mut out.classes);
    }
    Some(out)
}

/// (busy ticks, all ticks) of the host's CPUs, from the first line of `/proc/stat`
/// (busy: everything but idle and iowait, as the local sampler counts it).
pub fn host_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields.take(8).filter_map(|f| f.parse().ok()).collect();
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    Some((total - v[3] - v[4], total))
}

/// (received, sent) bytes over every interface, from `/proc/net/dev`.
pub fn net_bytes(dev: &str) -> (u64, u64) {
    let (mut rx, mut tx) = (0, 0);
    for line in dev.lines().skip(2) {
        let Some((_, counters)) = line.split_once(':') else { continue };
        let v: Vec<u64> = counters.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        if v.len() >= 9 {
            rx += v[0];
            tx += v[8];
        }
    }
    (rx, tx)
}

/// The pid files of `dir`: (process name, pid), without the sampler's own.
pub fn pid_files(dir: &Path, own: &str) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let path = entry.path();
        let (Some(stem), Some("pid")) =
            (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|s| s.to_str()))
        else {
            continue;
        };
        if stem == own {
            continue;
        }
        if let Some(pid) = fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u32>().ok()) {
            out.push((stem.to_string(), pid));
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_and_parentheses_in_its_name() {
        let line = "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 555 \
                    12345678 321 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(line).unwrap();
        assert_eq!(s, Stat { comm: "my (odd) name".into(), ppid: 17, ticks: 325, rss_pages: 321 });
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 0"), None);
    }

    #[test]
    fn thread_classes_as_the_lab_names_them() {
        for (name, class) in [
            ("worker-3", "worker"),
            ("worker_12", "worker"),
            ("mc-worker", "mc-worker"),
            ("load7", "load"),
            ("mwload\n", "mwload"),
            ("123", "main"),
            ("", "main"),
        ] {
            assert_eq!(thread_class(name), class, "{name:?}");
        }
    }

    #[test]
    fn a_tree_leaves_out_the_shell_and_timeout_around_a_process() {
        let p = |comm: &str, ppid| Stat { comm: comm.into(), ppid, ticks: 0, rss_pages: 0 };
        let all: HashMap<u32, Stat> = [
            (10, p("sh", 1)),
            (11, p("timeout", 10)),
            (12, p("postgres", 11)),
            (13, p("postgres", 12)),
            (14, p("timeout", 12)),
            (20, p("other", 1)),
        ]
        .into_iter()
        .collect();
        let mut t = tree(10, &all);
        t.sort();
        assert_eq!(t, vec![12, 13, 14]);
        assert!(tree(99, &all).is_empty());
    }

    #[test]
    fn host_and_network_counters() {
        let stat = "cpu  100 5 50 800 20 1 2 0 0 0\ncpu0 50 2 25 400 10 0 1 0 0 0\n";
        assert_eq!(host_ticks(stat), Some((158, 978)));
        assert_eq!(host_ticks("intr 1 2 3"), None);
        let dev = "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n    lo: 1000 10 0 0 0 0 0 0 1000 10 0 0 0 0 0 0\n  eth0: 5 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n";
        assert_eq!(net_bytes(dev), (1005, 1007));
    }

    #[test]
    fn the_sampler_finds_its_own_process_tree() {
        let dir = std::env::temp_dir().join(format!("mwsample-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("me.pid"), format!("{}\n", std::process::id())).unwrap();
        fs::write(dir.join("mwsample.pid"), "1\n").unwrap();
        fs::write(dir.join("broken.pid"), "not a pid").unwrap();
        let files = pid_files(&dir, "mwsample");
        assert_eq!(files, vec![("me".to_string(), std::process::id())]);
        let all = processes(Path::new("/proc"));
        // This test process is the root, which `tree` treats as a wrapper: its
        // parent stands in as the root here.
        let me = &all[&std::process::id()];
        let sampled = sample_tree(Path::new("/proc"), me.ppid, &all).unwrap();
        assert!(sampled.rss_pages > 0);
        assert!(!sampled.classes.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
