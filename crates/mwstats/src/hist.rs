//! Latency histograms: HdrHistogram in microseconds, 1 µs to 60 s at three
//! significant digits, written in the HdrHistogram V2 compressed encoding
//! (deflate, base64) that the HdrHistogram libraries of every language read,
//! so windows from many processes merge exactly.

use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest value recorded (larger ones are recorded as this), in microseconds.
pub const MAX_US: u64 = 60_000_000;
const SIGFIG: u8 = 3;

/// A histogram of times in microseconds.
#[derive(Clone, Debug)]
pub struct Hist {
    h: Histogram<u64>,
    /// Sum of recorded values (exact, for means and Prometheus sums).
    sum: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Hist::new()
    }
}

/// The figures derived from a histogram, plus the histogram itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistSummary {
    /// Number of values.
    pub count: u64,
    /// Exact mean.
    pub mean: f64,
    /// Percentiles (HDR precision).
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest value (HDR precision).
    pub max: u64,
    /// HdrHistogram V2 compressed, base64.
    pub hdr: String,
}

/// A histogram that could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("bad histogram encoding: {0}")]
pub struct DecodeError(String);

impl Hist {
    /// An empty histogram.
    pub fn new() -> Hist {
        Hist { h: Histogram::new_with_bounds(1, MAX_US, SIGFIG).expect("valid bounds"), sum: 0 }
    }

    /// Records one value in microseconds (0 counts as 1, above [`MAX_US`] as `MAX_US`).
    #[inline]
    pub fn record(&mut self, us: u64) {
        let v = us.clamp(1, MAX_US);
        self.h.saturating_record(v);
        self.sum += v;
    }

    /// Records a duration given in nanoseconds.
    #[inline]
    pub fn record_ns(&mut self, ns: u64) {
        self.record(ns / 1000);
    }

    /// Adds another histogram's values.
    pub fn merge(&mut self, other: &Hist) {
        if other.h.is_empty() {
            return;
        }
        self.h.add(&other.h).expect("same bounds");
        self.sum += other.sum;
    }

    /// Forgets every value.
    pub fn reset(&mut self) {
        self.h.reset();
        self.sum = 0;
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.h.len()
    }

    /// Sum of the values in microseconds.
    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Exact mean (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.h.is_empty() {
            0.0
        } else {
            self.sum as f64 / self.h.len() as f64
        }
    }

    /// The value at quantile `q` (0..=1), HDR precision.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.h.is_empty() {
            0
        } else {
            self.h.value_at_quantile(q)
        }
    }

    /// Number of values at or below `us` (for cumulative histogram buckets).
    pub fn count_le(&self, us: u64) -> u64 {
        if self.h.is_empty() {
            return 0;
        }
        self.h.iter_recorded().take_while(|v| v.value_iterated_to() <= us).map(|v| v.count_at_value()).sum()
    }

    /// The V2 compressed encoding, base64.
    pub fn encode(&self) -> String {
        let mut bytes = Vec::new();
        V2DeflateSerializer::new().serialize(&self.h, &mut bytes).expect("serialize histogram");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// Decodes [`Hist::encode`]'s output (or any V2 compressed, base64 histogram).
    pub fn decode(text: &str) -> Result<Hist, DecodeError> {
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| DecodeError(e.to_string()))?;
        let decoded: Histogram<u64> =
            Deserializer::new().deserialize(&mut bytes.as_slice()).map_err(|e| DecodeError(format!("{e:?}")))?;
        let mut h = Hist::new();
        h.h.add(&decoded).map_err(|e| DecodeError(format!("{e:?}")))?;
        h.sum = decoded.iter_recorded().map(|v| v.value_iterated_to() * v.count_at_value()).sum();
        Ok(h)
    }

    /// Summary figures and the encoding.
    pub fn summary(&self) -> HistSummary {
        HistSummary {
            count: self.count(),
            mean: (self.mean() * 10.0).round() / 10.0,
            p50: self.quantile(0.50),
            p90: self.quantile(0.90),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            max: if self.h.is_empty() { 0 } else { self.h.max() },
            hdr: self.encode(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_merges_and_round_trips() {
        let mut a = Hist::new();
        let mut b = Hist::new();
        for v in 1..=1000 {
            a.record(v);
            b.record(v * 10);
        }
        a.merge(&b);
        assert_eq!(a.count(), 2000);
        assert_eq!(a.sum(), 500_500 * 11);
        let p50 = a.quantile(0.5);
        assert!((905..=915).contains(&p50), "{p50}");
        let back = Hist::decode(&a.encode()).unwrap();
        assert_eq!(back.count(), 2000);
        assert_eq!(back.quantile(0.99), a.quantile(0.99));
        assert_eq!(a.count_le(1000), 1000 + 100);
        assert!(Hist::decode("not base64!").is_err());
    }

    #[test]
    fn clamps_out_of_range_values() {
        let mut h = Hist::new();
        h.record(0);
        h.record(u64::MAX);
        assert_eq!(h.count(), 2);
        assert!(h.quantile(1.0) >= MAX_US);
        let s = Hist::new().summary();
        assert_eq!((s.count, s.p99, s.max), (0, 0, 0));
    }
}
