//! The key hash functions twemproxy offers (`hash:` in nutcracker.yml), each
//! giving the value twemproxy computes for the same key, so that a key lands
//! where twemproxy puts it.
//!
//! They follow twemproxy's C code, quirks included: several read the key as
//! `char`, which is signed on the machines twemproxy runs on, so a byte of
//! 0x80 or more is sign-extended before it is mixed in (fnv1_64, fnv1a_64,
//! fnv1_32, fnv1a_32, one_at_a_time, and the last byte of a 3-byte tail in
//! hsieh); fnv1a_64 keeps its state in 32 bits; crc32 is libmemcached's
//! (bits 16..30 of the CRC), crc32a the standard CRC-32. md5 is the first
//! four bytes of the digest, little-endian.

use std::fmt;
use std::str::FromStr;

use md5::{Digest, Md5};

/// A key hash function by its name in nutcracker.yml.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KeyHash {
    /// md5, first four bytes little-endian (libmemcached's ketama; mwproxy's default).
    #[default]
    Md5,
    /// Jenkins' one-at-a-time.
    OneAtATime,
    /// CRC-16/XMODEM in a 32-bit register, as twemproxy 0.5 computes it.
    Crc16,
    /// libmemcached's CRC-32 variant: 15 bits.
    Crc32,
    /// CRC-32 (IEEE).
    Crc32a,
    /// FNV-1, 64-bit state, low 32 bits.
    Fnv1_64,
    /// FNV-1a as twemproxy computes it: the 64-bit basis and prime in 32 bits.
    Fnv1a64,
    /// FNV-1, 32-bit.
    Fnv1_32,
    /// FNV-1a, 32-bit.
    Fnv1a32,
    /// Paul Hsieh's SuperFastHash.
    Hsieh,
    /// MurmurHash2, seeded with the key's length.
    Murmur,
    /// Bob Jenkins' lookup3 (`hashlittle`, initial value 13).
    Jenkins,
}

impl KeyHash {
    /// Every function, by name.
    pub const ALL: [KeyHash; 12] = [
        KeyHash::Md5,
        KeyHash::OneAtATime,
        KeyHash::Crc16,
        KeyHash::Crc32,
        KeyHash::Crc32a,
        KeyHash::Fnv1_64,
        KeyHash::Fnv1a64,
        KeyHash::Fnv1_32,
        KeyHash::Fnv1a32,
        KeyHash::Hsieh,
        KeyHash::Murmur,
        KeyHash::Jenkins,
    ];

    /// The name nutcracker.yml gives it.
    pub fn name(self) -> &'static str {
        match self {
            KeyHash::Md5 => "md5",
            KeyHash::OneAtATime => "one_at_a_time",
            KeyHash::Crc16 => "crc16",
            KeyHash::Crc32 => "crc32",
            KeyHash::Crc32a => "crc32a",
            KeyHash::Fnv1_64 => "fnv1_64",
            KeyHash::Fnv1a64 => "fnv1a_64",
            KeyHash::Fnv1_32 => "fnv1_32",
            KeyHash::Fnv1a32 => "fnv1a_32",
            KeyHash::Hsieh => "hsieh",
            KeyHash::Murmur => "murmur",
            KeyHash::Jenkins => "jenkins",
        }
    }

    /// The hash of `key`.
    pub fn hash(self, key: &[u8]) -> u32 {
        match self {
            KeyHash::Md5 => md5(key),
            KeyHash::OneAtATime => one_at_a_time(key),
            KeyHash::Crc16 => crc16(key),
            KeyHash::Crc32 => (!crc32_raw(key) >> 16) & 0x7fff,
            KeyHash::Crc32a => !crc32_raw(key),
            KeyHash::Fnv1_64 => fnv1_64(key),
            KeyHash::Fnv1a64 => fnv1a_64(key),
            KeyHash::Fnv1_32 => fnv1_32(key),
            KeyHash::Fnv1a32 => fnv1a_32(key),
            KeyHash::Hsieh => hsieh(key),
            KeyHash::Murmur => murmur(key),
            KeyHash::Jenkins => jenkins(key),
        }
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A hash name that is none of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownHash(pub String);

impl fmt::Display for UnknownHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = KeyHash::ALL.iter().map(|h| h.name()).collect();
        write!(f, "unknown hash {:?}; known: {}", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownHash {}

impl FromStr for KeyHash {
    type Err = UnknownHash;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeyHash::ALL.into_iter().find(|h| h.name() == s).ok_or_else(|| UnknownHash(s.to_string()))
    }
}

/// A byte as C's signed `char` widened to 32 bits.
fn signed(b: u8) -> u32 {
    b as i8 as i32 as u32
}

fn md5(key: &[u8]) -> u32 {
    let d = Md5::digest(key);
    u32::from_le_bytes([d[0], d[1], d[2], d[3]])
}

fn one_at_a_time(key: &[u8]) -> u32 {
    let mut v: u32 = 0;
    for &b in key {
        v = v.wrapping_add(signed(b));
        v = v.wrapping_add(v << 10);
        v ^= v >> 6;
    }
    v = v.wrapping_add(v << 3);
    v ^= v >> 11;
    v.wrapping_add(v << 15)
}

/// CRC-16/XMODEM's table (polynomial 0x1021, not reflected).
const CRC16_TABLE: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 0x8000 != 0 { (c << 1) ^ 0x1021 } else { c << 1 };
            bit += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// twemproxy's crc16: CRC-16/XMODEM steps in a 32-bit register that is
/// never cut to 16 bits, so the bytes shifted out stay in the upper half.
fn crc16(key: &[u8]) -> u32 {
    let mut crc: u32 = 0;
    for &b in key {
        crc = (crc << 8) ^ CRC16_TABLE[(((crc >> 8) ^ b as u32) & 0xff) as usize] as u32;
    }
    crc
}

/// The CRC-32 register after `key`, started at all ones and not inverted.
fn crc32_raw(key: &[u8]) -> u32 {
    let mut crc: u32 = u32::MAX;
    for &b in key {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    crc
}

const FNV64_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV32_BASIS: u32 = 2_166_136_261;
const FNV32_PRIME: u32 = 16_777_619;

fn fnv1_64(key: &[u8]) -> u32 {
    let mut h = FNV64_BASIS;
    for &b in key {
        h = h.wrapping_mul(FNV64_PRIME);
        h ^= b as i8 as i64 as u64;
    }
    h as u32
}

fn fnv1a_64(key: &[u8]) -> u32 {
    let mut h = FNV64_BASIS as u32;
    for &b in key {
        h ^= signed(b);
        h = h.wrapping_mul(FNV64_PRIME as u32);
    }
    h
}

fn fnv1_32(key: &[u8]) -> u32 {
    let mut h = FNV32_BASIS;
    for &b in key {
        h = h.wrapping_mul(FNV32_PRIME);
        h ^= signed(b);
    }
    h
}

fn fnv1a_32(key: &[u8]) -> u32 {
    let mut h = FNV32_BASIS;
    for &b in key {
        h ^= signed(b);
        h = h.wrapping_mul(FNV32_PRIME);
    }
    h
}

fn hsieh(key: &[u8]) -> u32 {
    if key.is_empty() {
        return 0;
    }
    let get16 = |d: &[u8]| (d[1] as u32) << 8 | d[0] as u32;
    let mut h: u32 = 0;
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        h = h.wrapping_add(get16(c));
        let tmp = (get16(&c[2..]) << 11) ^ h;
        h = (h << 16) ^ tmp;
        h = h.wrapping_add(h >> 11);
    }
    let rest = chunks.remainder();
    match rest.len() {
        3 => {
            h = h.wrapping_add(get16(rest));
            h ^= h << 16;
            h ^= signed(rest[2]) << 18;
            h = h.wrapping_add(h >> 11);
        }
        2 => {
            h = h.wrapping_add(get16(rest));
            h ^= h << 11;
            h = h.wrapping_add(h >> 17);
        }
        1 => {
            h = h.wrapping_add(rest[0] as u32);
            h ^= h << 10;
            h = h.wrapping_add(h >> 1);
        }
        _ => {}
    }
    h ^= h << 3;
    h = h.wrapping_add(h >> 5);
    h ^= h << 4;
    h = h.wrapping_add(h >> 17);
    h ^= h << 25;
    h.wrapping_add(h >> 6)
}

fn murmur(key: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let len = key.len() as u32;
    let mut h = 0xdead_beef_u32.wrapping_mul(len) ^ len;
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= (rest[2] as u32) << 16;
    }
    if rest.len() >= 2 {
        h ^= (rest[1] as u32) << 8;
    }
    if !rest.is_empty() {
        h ^= rest[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

fn jenkins(key: &[u8]) -> u32 {
    let init = 0xdead_beef_u32.wrapping_add(key.len() as u32).wrapping_add(13);
    let (mut a, mut b, mut c) = (init, init, init);
    let word = |d: &[u8]| {
        let mut w = [0u8; 4];
        w[..d.len()].copy_from_slice(d);
        u32::from_le_bytes(w)
    };
    let mut k = key;
    while k.len() > 12 {
        a = a.wrapping_add(word(&k[0..4]));
        b = b.wrapping_add(word(&k[4..8]));
        c = c.wrapping_add(word(&k[8..12]));
        // lookup3's mix(a, b, c)
        mix(&mut a, &mut c, b, 4);
        mix(&mut b, &mut a, c, 6);
        mix(&mut c, &mut b, a, 8);
        mix(&mut a, &mut c, b, 16);
        mix(&mut b, &mut a, c, 19);
        mix(&mut c, &mut b, a, 4);
        k = &k[12..];
    }
    if k.is_empty() {
        return c;
    }
    a = a.wrapping_add(word(&k[..k.len().min(4)]));
    if k.len() > 4 {
        b = b.wrapping_add(word(&k[4..k.len().min(8)]));
    }
    if k.len() > 8 {
        c = c.wrapping_add(word(&k[8..]));
    }
    // lookup3's final(a, b, c)
    for (x, r) in [(2, 14), (0, 11), (1, 25), (2, 16), (0, 4), (1, 14), (2, 24)] {
        let mut v = [a, b, c];
        let y = v[(x + 2) % 3];
        v[x] ^= y;
        v[x] = v[x].wrapping_sub(y.rotate_left(r));
        [a, b, c] = v;
    }
    c
}

/// One step of lookup3's mix: `x -= z; x ^= rot(z, r); z += y`.
fn mix(x: &mut u32, z: &mut u32, y: u32, r: u32) {
    *x = x.wrapping_sub(*z);
    *x ^= z.rotate_left(r);
    *z = z.wrapping_add(y);
}

/// The part of `key` a hash tag selects: with tag `{}`, `user:{42}:name`
/// hashes as `42`. A key without the opening character, without the closing
/// one after it, or with nothing between them hashes whole (twemproxy's rule).
pub fn tagged(key: &[u8], tag: Option<[u8; 2]>) -> &[u8] {
    let Some([open, close]) = tag else { return key };
    let Some(start) = key.iter().position(|&b| b == open) else { return key };
    match key[start + 1..].iter().position(|&b| b == close) {
        Some(len) if len > 0 => &key[start + 1..start + 1 + len],
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_list_the_known() {
        for h in KeyHash::ALL {
            assert_eq!(h.name().parse::<KeyHash>().unwrap(), h);
        }
        let e = "sha1".parse::<KeyHash>().unwrap_err().to_string();
        assert!(e.contains("\"sha1\"") && e.contains("fnv1a_64") && e.contains("jenkins"), "{e}");
    }

    #[test]
    fn published_values() {
        // Reference values of the standard functions.
        assert_eq!(KeyHash::Crc32a.hash(b"123456789"), 0xCBF4_3926);
        // CRC-16/XMODEM's check value in the low half.
        assert_eq!(crc16(b"123456789") & 0xffff, 0x31C3);
        assert_eq!(KeyHash::Fnv1a32.hash(b"a"), 0xe40c_292c);
        assert_eq!(KeyHash::Fnv1_32.hash(b"a"), 0x050c_5d7e);
        assert_eq!(fnv1_64(b"a"), 0xaf63_bd4c_8601_b7be_u64 as u32);
        assert_eq!(KeyHash::Md5.hash(b""), 0xd98c_1dd4);
        // lookup3's own test vector: hashlittle("", 0) = 0xdeadbeef; here the
        // initial value is 13 more.
        assert_eq!(jenkins(b""), 0xdead_beef + 13);
        // one-at-a-time of "a" (the standard function, ASCII bytes).
        assert_eq!(one_at_a_time(b"a"), 0xca2e_9442);
    }

    #[test]
    fn bytes_above_0x7f_are_signed_where_twemproxy_reads_char() {
        // The sign-extended byte differs from the unsigned one.
        let hi = [0xffu8];
        assert_ne!(KeyHash::Fnv1a32.hash(&hi), {
            let mut h = FNV32_BASIS;
            h ^= 0xff;
            h.wrapping_mul(FNV32_PRIME)
        });
        assert_eq!(KeyHash::Fnv1a32.hash(&hi), (FNV32_BASIS ^ 0xffff_ffff).wrapping_mul(FNV32_PRIME));
        // crc32 masks the byte: the same either way.
        assert_eq!(KeyHash::Crc32.hash(&hi), (!crc32_raw(&hi) >> 16) & 0x7fff);
    }

    #[test]
    fn every_function_spreads_keys() {
        // Modulo a prime: CRCs are linear, so the low bits of the hashes of
        // keys counting up are far from uniform (as in twemproxy).
        for h in KeyHash::ALL {
            let mut buckets = [0u32; 7];
            for i in 0..7000 {
                buckets[(h.hash(format!("key:{i}").as_bytes()) % 7) as usize] += 1;
            }
            assert!(buckets.iter().all(|&n| n > 600), "{h}: {buckets:?}");
        }
    }

    #[test]
    fn hash_tags_select_what_twemproxy_selects() {
        let tag = Some(*b"{}");
        assert_eq!(tagged(b"user:{42}:name", tag), b"42");
        assert_eq!(tagged(b"user:{42", tag), b"user:{42");
        assert_eq!(tagged(b"user:{}:x", tag), b"user:{}:x");
        assert_eq!(tagged(b"plain", tag), b"plain");
        assert_eq!(tagged(b"a}{b}", tag), b"b");
        assert_eq!(tagged(b"{a}{b}", tag), b"a");
        assert_eq!(tagged(b"x{a}", None), b"x{a}");
        assert_eq!(tagged(b"k$v$w", Some(*b"$$")), b"v");
    }
}
