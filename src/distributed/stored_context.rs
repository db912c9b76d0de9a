//! How a group's context is stored in the group bucket. A context that
//! fits in one value is stored as its JSON, as it always was. A bigger
//! one is stored zstd-compressed in parts, each its own key
//! (`<group>.<digest>.<i>`, named by a digest of the compressed bytes, so
//! a resumed run that stores its group again never mixes its parts with
//! the last session's), and the group's key holds only the digest, how
//! many parts there are and how long the JSON is. The parts are stored
//! before the key; a worker that finds the key and not yet a part (a
//! replica that lags) reads again, as it does for a missing key.
//!
//! The context carries the state slot, and the slot carries the planning
//! stage's result: a map over 100 000 items made a 1.18 MB context, past
//! a NATS server's default 1 MiB limit on a message, and every sibling of
//! the group failed to be queued.

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::wire::GroupContext;

/// The smallest part a context is cut into, whatever the server's limit
/// on a message (`Nats::message_budget` gives the size).
pub const MIN_PART: usize = 16 * 1024;

/// The longest context JSON a worker unpacks: a damaged or foreign
/// manifest cannot make it allocate more.
pub const MAX_CONTEXT: u64 = 1 << 30;

/// The most parts a context of [`MAX_CONTEXT`] bytes can take (zstd's
/// output is at most a little longer than its input).
pub const MAX_PARTS: usize = (MAX_CONTEXT as usize) / MIN_PART + 2;

/// What the group's key holds for a context stored in parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Parts {
    /// Names the parts: the first 16 hex digits of the compressed
    /// bytes' SHA-256.
    pub digest: String,
    /// How many parts hold the compressed JSON.
    pub zstd_parts: usize,
    /// How long the JSON is once decompressed.
    pub bytes: u64,
}

impl Parts {
    /// Part `index`'s key under the group key `group`.
    pub fn key(&self, group: &str, index: usize) -> String {
        format!("{group}.{}.{index}", self.digest)
    }

    /// A manifest that could have been written: within the limits, its
    /// digest 16 hex digits.
    fn check(self) -> Result<Parts, String> {
        let digest_ok =
            self.digest.len() == 16 && self.digest.bytes().all(|b| b.is_ascii_hexdigit());
        if !digest_ok || self.zstd_parts == 0 || self.zstd_parts > MAX_PARTS {
            return Err(format!(
                "the group's context names {} parts under `{}`, which no troupe writes",
                self.zstd_parts, self.digest
            ));
        }
        if self.bytes > MAX_CONTEXT {
            return Err(format!(
                "the group's context says it is {} bytes, more than a worker reads ({MAX_CONTEXT})",
                self.bytes
            ));
        }
        Ok(self)
    }
}

/// The values to store for `context` under the group key `group`, in
/// the order to store them (the group's key last): one value when its JSON
/// fits in `part` bytes, else its compressed bytes in parts of at most
/// `part` (or [`MIN_PART`]) and a manifest.
pub fn encode(
    group: &str,
    context: &GroupContext,
    part: usize,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let part = part.max(MIN_PART);
    let json = serde_json::to_vec(context)
        .map_err(|e| format!("the group's context cannot be encoded: {e}"))?;
    if json.len() <= part {
        return Ok(vec![(group.to_owned(), json)]);
    }
    let packed = zstd::bulk::compress(&json, 3)
        .map_err(|e| format!("the group's context cannot be compressed: {e}"))?;
    let digest: String = sha2::Sha256::digest(&packed)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let parts = Parts {
        digest,
        zstd_parts: packed.chunks(part).len(),
        bytes: json.len() as u64,
    };
    let mut values: Vec<(String, Vec<u8>)> = packed
        .chunks(part)
        .enumerate()
        .map(|(i, part)| (parts.key(group, i), part.to_vec()))
        .collect();
    let manifest = serde_json::to_vec(&parts)
        .map_err(|e| format!("the group's context cannot be encoded: {e}"))?;
    values.push((group.to_owned(), manifest));
    Ok(values)
}

/// What the group's key held.
#[derive(Debug)]
pub enum Stored {
    Whole(GroupContext),
    Parts(Parts),
}

/// Reads the value of a group's key.
pub fn decode(value: &[u8]) -> Result<Stored, String> {
    match serde_json::from_slice::<GroupContext>(value) {
        Ok(context) => Ok(Stored::Whole(context)),
        Err(e) => match serde_json::from_slice::<Parts>(value) {
            Ok(parts) => parts.check().map(Stored::Parts),
            Err(_) => Err(format!("the group's context is not valid: {e}")),
        },
    }
}

impl Parts {
    /// The context from its parts' values, in order.
    pub fn assemble(&self, parts: &[impl AsRef<[u8]>]) -> Result<GroupContext, String> {
        if parts.len() != self.zstd_parts {
            return Err(format!(
                "the group's context has {} of its {} parts",
                parts.len(),
                self.zstd_parts
            ));
        }
        let packed = parts
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<&[u8]>>()
            .concat();
        let json = zstd::bulk::decompress(&packed, self.bytes as usize)
            .map_err(|e| format!("the group's context cannot be decompressed: {e}"))?;
        if json.len() as u64 != self.bytes {
            return Err(format!(
                "the group's context is {} bytes, not the {} its key says",
                json.len(),
                self.bytes
            ));
        }
        serde_json::from_slice(&json).map_err(|e| format!("the group's context is not valid: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use serde_json::{Map, Value, json};

    use super::*;

    fn context(items: usize) -> GroupContext {
        let mut fields = Map::new();
        fields.insert("width".into(), json!(items));
        fields.insert(
            "items".into(),
            Value::from(
                (0..items)
                    .map(|i| json!(format!("item {i}")))
                    .collect::<Vec<_>>(),
            ),
        );
        GroupContext {
            fields: Arc::new(fields),
            slot: Arc::new(BTreeMap::new()),
        }
    }

    /// What a server on NATS's default limit allows a message.
    const PART: usize = 512 * 1024;

    /// Stores as the coordinator does with parts of `part` bytes, reads as
    /// a worker does; the values stored, and the context read.
    fn round_trip(context: &GroupContext, part: usize) -> (usize, Result<GroupContext, String>) {
        let values = encode("run.2", context, part).unwrap();
        assert_eq!(values.last().unwrap().0, "run.2", "the group's key last");
        let stored: HashMap<String, Vec<u8>> = values.iter().cloned().collect();
        let read = match decode(&stored["run.2"]).unwrap() {
            Stored::Whole(c) => Ok(c),
            Stored::Parts(parts) => {
                let read: Vec<&Vec<u8>> = (0..parts.zstd_parts)
                    .map(|i| &stored[&parts.key("run.2", i)])
                    .collect();
                parts.assemble(&read)
            }
        };
        (values.len(), read)
    }

    /// The slot's results come back whole: each sibling reads them at once
    /// (`ctx.results`), and a packed one would be parsed again each time.
    #[test]
    fn the_slots_results_are_read_back_whole() {
        use crate::runtime::result::{Kept, StageResult};
        let parsed = json!({"goal": "g", "items": [1, 2]});
        let plan = Arc::new(StageResult::ok("plan", "run/plan/1", parsed));
        let mut with_slot = context(3);
        with_slot.slot = Arc::new(BTreeMap::from([("plan".to_owned(), Kept::Whole(plan))]));
        let (_, read) = round_trip(&with_slot, PART);
        let read = read.unwrap();
        assert!(matches!(read.slot["plan"], Kept::Whole(_)));
        assert_eq!(read, with_slot);
    }

    #[test]
    fn a_small_context_is_one_value_as_before() {
        let small = context(10);
        let (values, read) = round_trip(&small, PART);
        assert_eq!((values, read.unwrap()), (1, small.clone()));
        let values = encode("g", &small, PART).unwrap();
        assert_eq!(values[0].1, serde_json::to_vec(&small).unwrap());
    }

    #[test]
    fn a_context_past_the_message_limit_is_stored_in_parts_and_read_back_whole() {
        for items in [100_000, 400_000] {
            let big = context(items);
            let json = serde_json::to_vec(&big).unwrap().len();
            assert!(json > 1 << 20, "{items} items make {json} bytes");
            let (values, read) = round_trip(&big, PART);
            assert!(values >= 2, "parts and the key");
            assert_eq!(read.unwrap(), big);
            // A server with a lower limit: the parts are smaller, and
            // there are several, each read back in its place.
            let (values, read) = round_trip(&big, MIN_PART);
            assert!(values > 3, "{values} values: several parts and the key");
            assert_eq!(read.unwrap(), big);
        }
    }

    #[test]
    fn damaged_parts_or_manifests_are_typed_errors_not_panics() {
        let big = context(100_000);
        let values = encode("g", &big, MIN_PART).unwrap();
        assert!(
            values[..values.len() - 1]
                .iter()
                .all(|(k, _)| k.starts_with("g.") && k.len() > "g.0123456789abcdef.".len()),
            "parts are named by the digest"
        );
        let Stored::Parts(parts) = decode(&values.last().unwrap().1).unwrap() else {
            panic!("stored in parts");
        };
        let chunks: Vec<Vec<u8>> = values[..values.len() - 1]
            .iter()
            .map(|(_, v)| v.clone())
            .collect();
        assert!(
            parts.assemble(&chunks[..chunks.len() - 1]).is_err(),
            "a part missing"
        );
        let mut bad = chunks.clone();
        bad[0][10] ^= 0xff;
        assert!(parts.assemble(&bad).is_err(), "a part damaged");
        let lying = Parts {
            bytes: parts.bytes + 1,
            ..parts.clone()
        };
        assert!(lying.assemble(&chunks).is_err(), "a wrong length");
        let manifests = [
            &br#"{}"#[..],
            br#"[1]"#,
            br#"{"zstdParts":1}"#,
            b"\xff",
            br#"{"digest":"0123456789abcdef","zstdParts":18446744073709551615,"bytes":1}"#,
            br#"{"digest":"0123456789abcdef","zstdParts":0,"bytes":1}"#,
            br#"{"digest":"0123456789abcdef","zstdParts":2,"bytes":1073741825}"#,
            br#"{"digest":"../x","zstdParts":2,"bytes":10}"#,
            br#"{"digest":"0123456789abcdef","zstdParts":2,"bytes":10,"more":1}"#,
        ];
        for value in manifests {
            assert!(decode(value).is_err(), "{}", String::from_utf8_lossy(value));
        }
        let good = serde_json::to_vec(&parts).unwrap();
        assert!(matches!(decode(&good), Ok(Stored::Parts(p)) if p == parts));
    }
}
