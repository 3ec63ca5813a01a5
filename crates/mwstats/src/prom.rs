//! Prometheus text exposition (version 0.0.4): counters, gauges and
//! histograms in seconds, grouped by metric family as the format requires.

use std::fmt::Write;

use crate::hist::Hist;

/// Bucket bounds, in seconds, of exported latency histograms.
pub const LATENCY_BUCKETS_S: [f64; 17] =
    [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

struct Family {
    name: String,
    help: String,
    kind: &'static str,
    samples: String,
}

/// A page of metrics being built.
#[derive(Default)]
pub struct PromText {
    families: Vec<Family>,
}

fn labels_text(labels: &[(&str, &str)], extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .chain(extra.as_ref())
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")))
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    parts.dedup();
    format!("{{{}}}", parts.join(","))
}

impl PromText {
    fn family(&mut self, name: &str, help: &str, kind: &'static str) -> &mut String {
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family { name: name.into(), help: help.into(), kind, samples: String::new() });
                self.families.len() - 1
            }
        };
        &mut self.families[i].samples
    }

    /// A counter sample (`name` should end in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        let l = labels_text(labels, None);
        let _ = writeln!(self.family(name, help, "counter"), "{name}{l} {value}");
    }

    /// A counter sample of a quantity that is not a count, such as seconds.
    pub fn counter_f64(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        let l = labels_text(labels, None);
        let _ = writeln!(self.family(name, help, "counter"), "{name}{l} {value}");
    }

    /// A gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        let l = labels_text(labels, None);
        let _ = writeln!(self.family(name, help, "gauge"), "{name}{l} {value}");
    }

    /// A histogram in seconds from a microsecond [`Hist`] (`name` should end in `_seconds`).
    pub fn histogram_seconds(&mut self, name: &str, help: &str, labels: &[(&str, &str)], h: &Hist) {
        let mut text = String::new();
        for b in LATENCY_BUCKETS_S {
            let le = format!("{b}");
            let count = h.count_le((b * 1e6).round() as u64);
            let _ = writeln!(text, "{name}_bucket{} {count}", labels_text(labels, Some(("le", &le))));
        }
        let _ = writeln!(text, "{name}_bucket{} {}", labels_text(labels, Some(("le", "+Inf"))), h.count());
        let l = labels_text(labels, None);
        let _ = writeln!(text, "{name}_sum{l} {}", h.sum() as f64 / 1e6);
        let _ = writeln!(text, "{name}_count{l} {}", h.count());
        self.family(name, help, "histogram").push_str(&text);
    }

    /// The page.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            out.push_str(&f.samples);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_samples_by_family() {
        let mut p = PromText::default();
        p.counter("x_total", "X.", &[("op", "get")], 3);
        p.gauge("g", "G.", &[], 0.5);
        p.counter("x_total", "X.", &[("op", "set")], 4);
        let mut h = Hist::new();
        h.record(80);
        h.record(2000);
        p.histogram_seconds("lat_seconds", "L.", &[("op", "get")], &h);
        let text = p.render();
        let x = text.find("x_total{op=\"get\"} 3\nx_total{op=\"set\"} 4\n");
        assert!(x.is_some(), "{text}");
        assert_eq!(text.matches("# TYPE x_total counter").count(), 1);
        assert!(text.contains("lat_seconds_bucket{op=\"get\",le=\"0.0001\"} 1\n"), "{text}");
        assert!(text.contains("lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 2\n"));
        assert!(text.contains("lat_seconds_count{op=\"get\"} 2\n"));
    }
}
