//! What a load generator sends: which keys (pattern over a key space), which
//! values (fixed, uniform or weighted sizes, with content that can be checked
//! when read back), and which commands (set:get ratio, delete share,
//! multi-get sizes).

use mcproto::number::push_u64;
use mwstats::{MqOp, OpKind};

use crate::rng::{Rng, Zipf};

/// How keys are drawn from the key space.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyPattern {
    /// Every key equally likely.
    Uniform,
    /// Each thread walks its share of the key space in order, wrapping around.
    Sequential,
    /// Normal around `median` (a fraction of the key space, 0.5 = middle)
    /// with `stddev` (a fraction of the key space).
    Gaussian {
        /// Centre, as a fraction of the key space.
        median: f64,
        /// Spread, as a fraction of the key space.
        stddev: f64,
    },
    /// Zipf with the given exponent: the first keys are the hottest.
    Zipf {
        /// The exponent s of P(rank k) ∝ k^-s.
        exponent: f64,
    },
}

/// Value sizes.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueSizes {
    /// Always this many bytes.
    Fixed(usize),
    /// Uniform in [min, max].
    Range(usize, usize),
    /// Sizes with weights.
    Weighted(Vec<(usize, u32)>),
}

impl ValueSizes {
    /// The largest size that can be drawn.
    pub fn max(&self) -> usize {
        match self {
            ValueSizes::Fixed(n) => *n,
            ValueSizes::Range(_, hi) => *hi,
            ValueSizes::Weighted(v) => v.iter().map(|(s, _)| *s).max().unwrap_or(0),
        }
    }

    fn draw(&self, rng: &mut Rng) -> usize {
        match self {
            ValueSizes::Fixed(n) => *n,
            ValueSizes::Range(lo, hi) => lo + rng.below((hi - lo + 1) as u64) as usize,
            ValueSizes::Weighted(v) => {
                let total: u64 = v.iter().map(|(_, w)| u64::from(*w)).sum();
                let mut pick = rng.below(total);
                for (size, w) in v {
                    if pick < u64::from(*w) {
                        return *size;
                    }
                    pick -= u64::from(*w);
                }
                v[v.len() - 1].0
            }
        }
    }
}

/// Everything that decides the requests.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Prefix of every key.
    pub key_prefix: String,
    /// Keys are padded with zeros to this length (if the prefix leaves room).
    pub key_size: usize,
    /// Smallest key number.
    pub key_min: u64,
    /// Largest key number.
    pub key_max: u64,
    /// How keys are drawn.
    pub pattern: KeyPattern,
    /// Value sizes.
    pub values: ValueSizes,
    /// Sets per `gets` gets (`--ratio sets:gets`).
    pub sets: u32,
    /// Gets per `sets` sets.
    pub gets: u32,
    /// Share of all requests that are deletes.
    pub delete_share: f64,
    /// Keys per get: smallest and largest (equal for a fixed size).
    pub multiget: (u32, u32),
    /// Expiry time of sets in seconds: smallest and largest (0, 0: never).
    pub expiry: (u32, u32),
}

/// A request about to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// set of one key.
    Set,
    /// get of `n` keys.
    Get(u32),
    /// delete of one key.
    Delete,
    /// mq: SEND of one message.
    Send,
    /// mq: POP.
    Pop,
    /// mq: RECV of one message.
    Recv,
    /// mq: ACK of the message a RECV brought.
    Ack,
}

impl Command {
    /// Its class in the results format (memcached).
    pub fn op(self) -> OpKind {
        match self {
            Command::Set => OpKind::Set,
            Command::Get(1) => OpKind::Get,
            Command::Get(_) => OpKind::Multiget,
            Command::Delete => OpKind::Delete,
            Command::Send | Command::Pop | Command::Recv | Command::Ack => OpKind::Other,
        }
    }

    /// Its class in the results format (mq), if it is a queue command.
    pub fn mq_op(self) -> Option<MqOp> {
        Some(match self {
            Command::Send => MqOp::Send,
            Command::Pop => MqOp::Pop,
            Command::Recv => MqOp::Recv,
            Command::Ack => MqOp::Ack,
            _ => return None,
        })
    }
}

const ALPHABET: &[u8; 26] = b"abcdefghijklmnopqrstuvwxyz";

/// Per-thread generator of keys, values and commands.
pub struct Generator {
    w: Workload,
    zipf: Option<Zipf>,
    seq_next: u64,
    /// `ALPHABET` repeated past the largest value, so a value is a slice of it.
    pattern: Vec<u8>,
}

/// FNV-1a, to derive a value's content from its key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

/// The content a value for `key` must have (a slice of the repeated alphabet
/// starting at a key-dependent offset), so reads can be verified without state.
pub fn expected_value<'p>(pattern: &'p [u8], key: &[u8], len: usize) -> Option<&'p [u8]> {
    let start = (fnv1a(key) % 26) as usize;
    pattern.get(start..start + len)
}

impl Generator {
    /// Thread `thread` of `threads`.
    pub fn new(w: Workload, thread: u64, threads: u64) -> Generator {
        let span = w.key_max - w.key_min + 1;
        let zipf = match w.pattern {
            KeyPattern::Zipf { exponent } => Some(Zipf::new(span, exponent)),
            _ => None,
        };
        let seq_start = w.key_min + span / threads.max(1) * thread;
        let len = w.values.max() + 26;
        let pattern = (0..len).map(|i| ALPHABET[i % 26]).collect();
        Generator { w, zipf, seq_next: seq_start, pattern }
    }

    /// The workload.
    pub fn workload(&self) -> &Workload {
        &self.w
    }

    /// The next key number.
    pub fn key(&mut self, rng: &mut Rng) -> u64 {
        let (lo, hi) = (self.w.key_min, self.w.key_max);
        let span = hi - lo + 1;
        match &self.w.pattern {
            KeyPattern::Uniform => lo + rng.below(span),
            KeyPattern::Sequential => {
                let k = self.seq_next;
                self.seq_next = if k >= hi { lo } else { k + 1 };
                k
            }
            KeyPattern::Gaussian { median, stddev } => {
                let x = (median + stddev * rng.normal()) * span as f64;
                lo + (x.round().max(0.0) as u64).min(span - 1)
            }
            KeyPattern::Zipf { .. } => lo + self.zipf.as_ref().expect("zipf").sample(rng) - 1,
        }
    }

    /// Appends key number `n` in wire form.
    pub fn write_key(&self, n: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(self.w.key_prefix.as_bytes());
        let mut digits = Vec::with_capacity(20);
        push_u64(&mut digits, n);
        let pad = self.w.key_size.saturating_sub(self.w.key_prefix.len() + digits.len());
        out.extend(std::iter::repeat_n(b'0', pad));
        out.extend_from_slice(&digits);
    }

    /// The next command.
    pub fn command(&self, rng: &mut Rng) -> Command {
        if self.w.delete_share > 0.0 && rng.f64() < self.w.delete_share {
            return Command::Delete;
        }
        let total = u64::from(self.w.sets + self.w.gets);
        if rng.below(total) < u64::from(self.w.sets) {
            Command::Set
        } else {
            let (lo, hi) = self.w.multiget;
            Command::Get(lo + rng.below(u64::from(hi - lo + 1)) as u32)
        }
    }

    /// Appends a set of key `key` (already written in wire form) with a fresh value.
    pub fn write_set(&self, key: &[u8], rng: &mut Rng, out: &mut Vec<u8>) {
        let len = self.w.values.draw(rng);
        out.extend_from_slice(b"set ");
        out.extend_from_slice(key);
        out.extend_from_slice(b" 0 ");
        push_u64(out, u64::from(self.expiry(rng)));
        out.push(b' ');
        push_u64(out, len as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(expected_value(&self.pattern, key, len).expect("pattern covers every size"));
        out.extend_from_slice(b"\r\n");
    }

    /// The expiry time of the next set (a random draw only for a real range).
    fn expiry(&self, rng: &mut Rng) -> u32 {
        let (lo, hi) = self.w.expiry;
        if lo == hi {
            lo
        } else {
            lo + rng.below(u64::from(hi - lo) + 1) as u32
        }
    }

    /// A message body of the next size (mq): a slice of the repeated alphabet.
    pub fn body(&self, rng: &mut Rng) -> &[u8] {
        let len = self.w.values.draw(rng);
        &self.pattern[..len]
    }

    /// Whether `data`, read back for `key`, is what this workload writes.
    pub fn verify(&self, key: &[u8], data: &[u8]) -> bool {
        expected_value(&self.pattern, key, data.len()) == Some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(pattern: KeyPattern) -> Workload {
        Workload {
            key_prefix: "key:".into(),
            key_size: 16,
            key_min: 0,
            key_max: 999,
            pattern,
            values: ValueSizes::Fixed(128),
            sets: 1,
            gets: 10,
            delete_share: 0.0,
            multiget: (1, 1),
            expiry: (0, 0),
        }
    }

    #[test]
    fn keys_are_sixteen_bytes_and_values_verify() {
        let g = Generator::new(workload(KeyPattern::Uniform), 0, 1);
        let mut k = Vec::new();
        g.write_key(42, &mut k);
        assert_eq!(k, b"key:000000000042");
        let mut out = Vec::new();
        let mut r = Rng::new(1, 1);
        g.write_set(&k, &mut r, &mut out);
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with("set key:000000000042 0 0 128\r\n"));
        let data = &out[out.len() - 130..out.len() - 2];
        assert!(g.verify(&k, data));
        assert!(!g.verify(b"key:000000000043", data));
    }

    #[test]
    fn ratio_and_multiget_sizes() {
        let mut w = workload(KeyPattern::Uniform);
        w.multiget = (3, 5);
        w.delete_share = 0.1;
        let g = Generator::new(w, 0, 1);
        let mut r = Rng::new(5, 0);
        let (mut sets, mut gets, mut deletes) = (0, 0, 0);
        for _ in 0..110_000 {
            match g.command(&mut r) {
                Command::Set => sets += 1,
                Command::Get(n) => {
                    assert!((3..=5).contains(&n));
                    gets += 1
                }
                Command::Delete => deletes += 1,
                other => panic!("{other:?} is not a memcached command"),
            }
        }
        assert!((deletes as f64 / 110_000.0 - 0.1).abs() < 0.01);
        assert!((gets as f64 / sets as f64 - 10.0).abs() < 0.5, "{gets} {sets}");
    }

    fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
        counts.iter().zip(expected).map(|(&c, &e)| (c as f64 - e).powi(2) / e).sum()
    }

    /// Key frequencies as drawn by the generator match their distributions
    /// (chi-square at the 99.9% level).
    #[test]
    fn uniform_and_zipf_key_frequencies() {
        let mut w = workload(KeyPattern::Uniform);
        w.key_max = 49;
        let mut g = Generator::new(w.clone(), 0, 1);
        let mut r = Rng::new(11, 0);
        let draws = 5000u64;
        let mut counts = vec![0u64; 50];
        for _ in 0..draws {
            counts[g.key(&mut r) as usize] += 1;
        }
        let uniform = vec![draws as f64 / 50.0; 50];
        // 49 degrees of freedom: 99.9% quantile 85.4.
        assert!(chi_square(&counts, &uniform) < 85.4, "uniform: {counts:?}");

        w.pattern = KeyPattern::Zipf { exponent: 1.2 };
        let mut g = Generator::new(w, 0, 1);
        let mut counts = vec![0u64; 50];
        for _ in 0..draws {
            counts[g.key(&mut r) as usize] += 1;
        }
        let norm: f64 = (1..=50).map(|k| (k as f64).powf(-1.2)).sum();
        let zipf: Vec<f64> = (1..=50).map(|k| draws as f64 * (k as f64).powf(-1.2) / norm).collect();
        assert!(chi_square(&counts, &zipf) < 85.4, "zipf: {counts:?}");
        assert!(counts[0] > counts[9] * 5, "the first keys are the hottest");
    }

    #[test]
    fn sequential_and_gaussian_stay_in_range() {
        let mut g = Generator::new(workload(KeyPattern::Sequential), 1, 2);
        let mut r = Rng::new(0, 0);
        let first = g.key(&mut r);
        assert_eq!(first, 500);
        assert_eq!(g.key(&mut r), 501);
        let mut g = Generator::new(workload(KeyPattern::Gaussian { median: 0.5, stddev: 0.1 }), 0, 1);
        let keys: Vec<u64> = (0..10_000).map(|_| g.key(&mut r)).collect();
        assert!(keys.iter().all(|&k| k <= 999));
        let mean = keys.iter().sum::<u64>() as f64 / keys.len() as f64;
        assert!((mean - 500.0).abs() < 10.0, "{mean}");
    }
}
