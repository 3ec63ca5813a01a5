//! Integer parsing with memcached's rules.
//!
//! memcached reads every number on a command line with C's `strtoul`/`strtol`
//! wrapped in its `safe_strto*` helpers. Their corner cases decide which reply a
//! client gets (`CLIENT_ERROR bad command line format` or a stored item), so a
//! proxy that answers in memcached's place has to accept and reject exactly the
//! same tokens: leading whitespace and a sign are allowed, the number may be
//! followed by whitespace but nothing else, a negative value is refused where the
//! result is unsigned and would look negative, and 32-bit results keep the low
//! bits of the 64-bit value the way the C code's implicit conversion does.

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// What `strtoull`/`strtoll` saw in a token.
struct Scan {
    negative: bool,
    /// The magnitude, `None` when it does not fit in 64 bits.
    magnitude: Option<u64>,
    /// Whether the token ends right after the digits or continues with whitespace.
    clean_end: bool,
}

fn scan(token: &[u8]) -> Option<Scan> {
    let mut i = 0;
    while i < token.len() && is_c_space(token[i]) {
        i += 1;
    }
    let mut negative = false;
    if i < token.len() && (token[i] == b'+' || token[i] == b'-') {
        negative = token[i] == b'-';
        i += 1;
    }
    let start = i;
    let mut magnitude: Option<u64> = Some(0);
    while i < token.len() && token[i].is_ascii_digit() {
        let d = u64::from(token[i] - b'0');
        magnitude = magnitude.and_then(|m| m.checked_mul(10)).and_then(|m| m.checked_add(d));
        i += 1;
    }
    if i == start {
        return None;
    }
    let clean_end = i == token.len() || is_c_space(token[i]);
    Some(Scan { negative, magnitude, clean_end })
}

/// memcached's `safe_strtoull`: an unsigned 64-bit number.
pub fn parse_u64(token: &[u8]) -> Option<u64> {
    let s = scan(token)?;
    let m = s.magnitude?;
    if !s.clean_end {
        return None;
    }
    let value = if s.negative { m.wrapping_neg() } else { m };
    if (value as i64) < 0 && token.contains(&b'-') {
        return None;
    }
    Some(value)
}

/// memcached's `safe_strtoul`: parsed as an unsigned long, kept as its low 32 bits.
pub fn parse_u32(token: &[u8]) -> Option<u32> {
    parse_u64(token).map(|v| v as u32)
}

/// memcached's `safe_strtol`: parsed as a signed long, kept as its low 32 bits.
pub fn parse_i32(token: &[u8]) -> Option<i32> {
    let s = scan(token)?;
    let m = s.magnitude?;
    if !s.clean_end {
        return None;
    }
    let value: i64 = if s.negative {
        if m > (i64::MAX as u64) + 1 {
            return None;
        }
        (m as i64).wrapping_neg()
    } else {
        if m > i64::MAX as u64 {
            return None;
        }
        m as i64
    };
    Some(value as i32)
}

/// Writes `v` in decimal without allocating.
pub fn push_u64(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Writes a signed `v` in decimal without allocating.
pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_accepts_what_strtoul_accepts() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"+7"), Some(7));
        assert_eq!(parse_u64(b"\t7"), Some(7));
        assert_eq!(parse_u64(b"7\r"), Some(7));
        assert_eq!(parse_u64(b"-0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
    }

    #[test]
    fn unsigned_rejects_garbage_overflow_and_negatives() {
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"-"), None);
        assert_eq!(parse_u64(b"abc"), None);
        assert_eq!(parse_u64(b"12abc"), None);
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"-1"), None);
    }

    #[test]
    fn u32_keeps_low_bits_like_c() {
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), Some(0));
        assert_eq!(parse_u32(b"-1"), None);
    }

    #[test]
    fn i32_truncates_and_refuses_out_of_range_longs() {
        assert_eq!(parse_i32(b"-5"), Some(-5));
        assert_eq!(parse_i32(b"2147483647"), Some(i32::MAX));
        assert_eq!(parse_i32(b"2147483648"), Some(i32::MIN));
        assert_eq!(parse_i32(b"9223372036854775808"), None);
        assert_eq!(parse_i32(b"-9223372036854775808"), Some(0));
        assert_eq!(parse_i32(b"1x"), None);
    }

    #[test]
    fn decimal_writers() {
        let mut v = Vec::new();
        push_u64(&mut v, 0);
        v.push(b' ');
        push_u64(&mut v, u64::MAX);
        v.push(b' ');
        push_i64(&mut v, -42);
        assert_eq!(v, b"0 18446744073709551615 -42");
    }
}
