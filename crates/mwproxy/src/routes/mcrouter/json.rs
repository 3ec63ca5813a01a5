//! mcrouter's JSON as text: what mcrouter's parser reads — JSON with `//`
//! and `/* */` comments and trailing commas (`[1, 2,]`, `{"a": 1,}`), as its
//! wiki's "Config Files" page says — turned into plain JSON of the same
//! length line by line, so that a position in it is a position in the file;
//! then parsed with every object's keys checked, a key given twice refused
//! with its line and column (serde_json, and folly's parser by default, keep
//! the last and drop the other silently: two `"route"`s served the second).

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;

/// `text` with its comments and trailing commas (outside strings) turned
/// into spaces, line ends kept.
pub fn clean(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let (mut i, mut in_str) = (0, false);
    while i < b.len() {
        let c = b[i];
        if in_str {
            out.push(c);
            if c == b'\\' && i + 1 < b.len() {
                out.push(b[i + 1]);
                i += 1;
            } else if c == b'"' {
                in_str = false;
            }
        } else if c == b'"' {
            in_str = true;
            out.push(c);
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
            continue;
        } else if b[i..].starts_with(b"/*") {
            let end = b[i + 2..].windows(2).position(|w| w == b"*/").map_or(b.len(), |p| i + 2 + p + 2);
            out.extend(b[i..end].iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }));
            i = end;
            continue;
        } else {
            out.push(c);
        }
        i += 1;
    }
    blank_trailing_commas(&mut out);
    // (Only ASCII bytes were replaced, by ASCII bytes: still UTF-8.)
    String::from_utf8(out).unwrap_or_default()
}

/// Turns each comma outside strings that only white space separates from a
/// closing `]` or `}` into a space.
fn blank_trailing_commas(b: &mut [u8]) {
    let mut in_str = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if in_str => i += 1,
            b'"' => in_str = !in_str,
            b',' if !in_str => {
                let next = b[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
                if matches!(next, Some(b']' | b'}')) {
                    b[i] = b' ';
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// Parses clean JSON (see [`clean`]), refusing a key given twice in one
/// object; serde_json's error says the line and column.
pub fn parse(clean: &str) -> Result<Json, serde_json::Error> {
    serde_json::from_str::<Strict>(clean).map(|s| s.0)
}

/// A JSON value whose objects have no key twice.
struct Strict(Json);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "key {key:?} given twice in one object (mcrouter would keep one and drop the other)"
                )));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Json::Object(out))
    }
}

/// Where `needle` first appears in `text`: its line and column (from 1).
pub fn position(text: &str, needle: &str) -> Option<(usize, usize)> {
    let i = text.find(needle)?;
    let before = &text[..i];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Some((line, column))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_trailing_commas_are_blanked_outside_strings_and_positions_kept() {
        let text = "{ \"a\": [1, 2,], // x, ]\n \"b\": \"//, ]\", /* , } */ \"c\": {\"d\": 1,\n},\n}";
        let c = clean(text);
        assert_eq!(c.len(), text.len());
        assert_eq!(c.lines().count(), text.lines().count());
        let v = parse(&c).unwrap();
        assert_eq!(v["a"], serde_json::json!([1, 2]));
        assert_eq!(v["b"], "//, ]", "inside a string nothing changes");
        assert_eq!(v["c"]["d"], 1);
        assert!(parse(&clean("[1,,]")).is_err(), "two commas are not a trailing comma");
    }

    #[test]
    fn a_key_given_twice_is_refused_with_its_place() {
        let e = parse("{\n  \"route\": \"Pool|A\",\n  \"route\": \"Pool|B\"\n}").unwrap_err().to_string();
        assert!(e.contains("key \"route\" given twice") && e.contains("line 3"), "{e}");
        let e = parse("{ \"p\": { \"x:\": 1, \"y:\": { \"x:\": 2 }, \"x:\": 3 } }").unwrap_err().to_string();
        assert!(e.contains("\"x:\" given twice"), "{e}");
        assert!(parse("[{ \"a\": 1 }, { \"a\": 2 }]").is_ok(), "in two objects, a key once each");
    }
}
