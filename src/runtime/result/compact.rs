//! A JSON value read straight into the compact text serde_json would
//! write for it, never built as a `Value`.
//!
//! A coordinator keeps every distributed sibling's result packed: its
//! `parsed` and `output` as compact JSON text ([`Kept`](super::Kept)).
//! Read off the wire as values and then written out again, a sibling's
//! result cost the coordinator's decoder about 12 000 instructions
//! (callgrind: an ordered map and a `String` for every key, both values,
//! then each serialized; BENCHMARKS.md, "Every core, twentieth round").
//! Read through this seed, each token the parser hands out is written as
//! it comes: the scalars exactly as serde_json writes the value the same
//! tokens would have made, so the text parses back to that value. The
//! one difference: an object that names a key twice keeps both here,
//! where a `Value` keeps the last one's value in the first one's place;
//! parsed back, the text gives that same `Value`.
//!
//! It works with any deserializer (one that buffered the value first
//! too: a report whose body comes before its tag), and reads nothing
//! serde_json's own `Value` would refuse: strings, numbers and nesting go
//! through the same parser.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::auditlog::json::{RAW_VALUE, write_json_str};

/// A value's compact JSON text, and how deep it nests (its own depth is
/// 0, its items' 1, and so on).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct CompactJson {
    pub(super) text: String,
    pub(super) deepest: usize,
}

impl<'de> serde::Deserialize<'de> for CompactJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<CompactJson, D::Error> {
        let mut out = Vec::with_capacity(64);
        let mut deepest = 0;
        Compact {
            out: &mut out,
            depth: 0,
            deepest: &mut deepest,
        }
        .deserialize(deserializer)?;
        // Written from strings and ASCII only.
        let text = String::from_utf8(out).map_err(serde::de::Error::custom)?;
        Ok(CompactJson { text, deepest })
    }
}

/// Writes the value it reads into `out`.
struct Compact<'o> {
    out: &'o mut Vec<u8>,
    depth: usize,
    deepest: &'o mut usize,
}

impl Compact<'_> {
    fn nested(&mut self) -> Compact<'_> {
        Compact {
            out: self.out,
            depth: self.depth + 1,
            deepest: self.deepest,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Compact<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        *self.deepest = (*self.deepest).max(self.depth);
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Compact<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<(), E> {
        self.out
            .extend_from_slice(if b { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<(), E> {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        Ok(())
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<(), E> {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        Ok(())
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<(), E> {
        // As a `Value` holds it: a finite number as serde_json writes it,
        // anything else (which JSON text never gives) as null.
        match serde_json::Number::from_f64(n) {
            Some(n) => serde_json::to_writer(&mut *self.out, &n).map_err(E::custom),
            None => self.visit_unit(),
        }
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        write_json_str(self.out, s);
        Ok(())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut items: A) -> Result<(), A::Error> {
        self.out.push(b'[');
        let mut first = true;
        loop {
            let at = self.out.len();
            if !first {
                self.out.push(b',');
            }
            if items.next_element_seed(self.nested())?.is_none() {
                self.out.truncate(at);
                break;
            }
            first = false;
        }
        self.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut entries: A) -> Result<(), A::Error> {
        let open = self.out.len();
        self.out.push(b'{');
        let mut first = true;
        loop {
            let at = self.out.len();
            if !first {
                self.out.push(b',');
            }
            let Some(raw) = entries.next_key_seed(Key(&mut *self.out))? else {
                self.out.truncate(at);
                break;
            };
            if raw && first {
                // As a `Value` reads it: the object is the JSON its one
                // string holds (serde_json's `raw_value` protocol).
                self.out.truncate(open);
                let text: String = entries.next_value()?;
                let value: serde_json::Value =
                    serde_json::from_str(&text).map_err(serde::de::Error::custom)?;
                *self.deepest = (*self.deepest).max(self.depth + depth(&value));
                return serde_json::to_writer(&mut *self.out, &value)
                    .map_err(serde::de::Error::custom);
            }
            self.out.push(b':');
            entries.next_value_seed(self.nested())?;
            first = false;
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// How deep `value` nests below itself.
fn depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Array(items) => items.iter().map(|v| 1 + depth(v)).max().unwrap_or(0),
        serde_json::Value::Object(map) => map.values().map(|v| 1 + depth(v)).max().unwrap_or(0),
        _ => 0,
    }
}

/// Writes an object's key, which JSON makes a string; `true` for the
/// key of a raw value ([`RAW_VALUE`]).
struct Key<'o>(&'o mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<bool, E> {
        write_json_str(self.0, s);
        Ok(s == RAW_VALUE)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::{CompactJson, RAW_VALUE};

    fn compact(text: &str) -> Result<CompactJson, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// Any JSON value, as text with whitespace, escapes and number forms
    /// a writer other than serde_json may use.
    fn any_json() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |n| n.is_finite())
                .prop_map(|n| format!("{n:e}")),
            Just("-0".to_owned()),
            Just("1.50E+2".to_owned()),
            "\\PC{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just("\"\\u00e9\\n\\/\\ud83d\\ude00\"".to_owned()),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|items| format!("[ {} ]", items.join(" ,\n"))),
                prop::collection::vec(("[a-c]{0,2}", inner), 0..5).prop_map(|entries| {
                    // In any order, each key once.
                    let mut seen = std::collections::HashSet::new();
                    let entries: Vec<String> = entries
                        .into_iter()
                        .filter(|(k, _)| seen.insert(k.clone()))
                        .map(|(k, v)| format!("{} : {v}", serde_json::to_string(&k).unwrap()))
                        .collect();
                    format!("{{{}}}", entries.join(","))
                }),
            ]
        })
    }

    proptest! {
        /// The text is what serde_json writes for the value the same JSON
        /// makes (no key repeats here; see below for one that does).
        #[test]
        fn it_is_what_serde_json_writes_for_the_value(text in any_json()) {
            let value: Value = serde_json::from_str(&text).unwrap();
            let got = compact(&text).unwrap();
            prop_assert_eq!(&got.text, &serde_json::to_string(&value).unwrap());
        }
    }

    #[test]
    fn it_refuses_what_a_value_refuses() {
        for text in [
            "1e999",
            "\"\\ud800\"",
            "[1,]",
            "{\"a\" 1}",
            "nul",
            "\"\u{1}\"",
        ] {
            assert!(serde_json::from_str::<Value>(text).is_err(), "{text}");
            assert!(compact(text).is_err(), "{text}");
        }
    }

    /// serde_json's raw-value protocol: an object whose first key is its
    /// token is the JSON its string holds, to a `Value` and here alike.
    #[test]
    fn a_raw_values_token_reads_as_a_value_reads_it() {
        let ok = format!("{{\"{}\":\"[1,[2]]\"}}", RAW_VALUE);
        let value: Value = serde_json::from_str(&ok).unwrap();
        let got = compact(&ok).unwrap();
        assert_eq!((got.text.as_str(), got.deepest), ("[1,[2]]", 2));
        assert_eq!(serde_json::to_string(&value).unwrap(), got.text);
        let nested = format!("[{ok}]");
        assert_eq!(compact(&nested).unwrap().text, "[[1,[2]]]");
        for refused in [
            format!("{{\"{}\":5}}", RAW_VALUE),
            format!("{{\"{}\":\"[1\"}}", RAW_VALUE),
        ] {
            assert!(
                serde_json::from_str::<Value>(&refused).is_err(),
                "{refused}"
            );
            assert!(compact(&refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn it_counts_how_deep_the_value_nests() {
        assert_eq!(compact("1").unwrap().deepest, 0);
        assert_eq!(compact("[]").unwrap().deepest, 0);
        assert_eq!(compact("[1]").unwrap().deepest, 1);
        assert_eq!(compact("{\"a\":[{}]}").unwrap().deepest, 2);
        let deep = format!("{}{}", "[".repeat(110), "]".repeat(110));
        let got = compact(&deep).unwrap();
        assert_eq!((got.deepest, got.text), (109, deep));
    }

    #[test]
    fn a_repeated_key_is_kept_and_reads_back_as_the_value_does() {
        let text = "{\"a\":1,\"b\":2,\"a\":3}";
        let got = compact(text).unwrap();
        assert_eq!(got.text, text);
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&got.text).unwrap(), value);
    }
}
