//! A finished execution's result as the run keeps it: whole, or packed.
//!
//! A fan-out keeps every sibling's result until the run ends: its join
//! reads them as `ctx.upstream`, the `--json` summary prints them. As
//! serde_json values a small `{"item": 7, "summary": "done 7"}` result
//! took about 860 bytes (the map's entries and index table, a `String`
//! per key, the `Arc`s, the execution id copied again), most of what a
//! million-wide run holds. A sibling's result is therefore packed by its
//! own execution, on its own thread, once it exits: its JSON as compact
//! text, its names shared with the execution, its scalars as they are.
//! It is parsed again only when something reads it (the join's
//! templates and expressions, its `inputsSchema` check, the summary), by
//! whoever reads it; reading the whole of `ctx.upstream` parses every
//! sibling's result at once.

use std::borrow::Cow;
use std::sync::Arc;

use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, SerializeStruct, Serializer};
use serde_json::Value;

use super::compact::CompactJson;
use super::{StageResult, Usage, Verdict};

/// Deeper than this, a value stays whole: serde_json refuses to parse
/// text nested past 128 levels, so packing it could not be undone.
const MAX_PACKED_DEPTH: usize = 100;

/// A result held as its JSON text and its scalars.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedResult {
    stage_id: Arc<str>,
    stage_execution_id: Arc<str>,
    verdict: Verdict,
    cap_hit: bool,
    attempt_count: u32,
    usage: Usage,
    reason: Option<Box<str>>,
    /// `parsed`, serialized compactly.
    parsed: Box<str>,
    /// `output`, serialized compactly; `None` when it is `parsed`.
    output: Option<Box<str>>,
}

/// A finished execution's result as the run keeps it.
#[derive(Debug, Clone)]
pub enum Kept {
    /// As it was made or read: sequential stages and joins (the
    /// scheduler reads them at once to walk Next), a worker's siblings
    /// (sent on at once; the coordinator packs them as it decodes them)
    /// and values nested too deep to pack. (Results restored on a resume
    /// are packed as stored, see [`Kept::stored`].)
    Whole(Arc<StageResult>),
    /// Packed by a sibling's execution (see the module documentation).
    Packed(Arc<PackedResult>),
}

impl Kept {
    /// Packs `result`; `stage_id` and `stage_execution_id` are the
    /// execution's own shared names (equal to the result's), not copies.
    /// A value too deep to parse back stays whole.
    pub fn packed(
        result: Arc<StageResult>,
        stage_id: Arc<str>,
        stage_execution_id: Arc<str>,
    ) -> Kept {
        debug_assert_eq!(
            (&*stage_id, &*stage_execution_id),
            (&*result.stage_id, &*result.stage_execution_id),
            "packed under the execution's own names"
        );
        let same = Arc::ptr_eq(&result.parsed, &result.output);
        if too_deep(&result.parsed, 0) || (!same && too_deep(&result.output, 0)) {
            return Kept::Whole(result);
        }
        let text = |v: &Value| {
            serde_json::to_string(v)
                .unwrap_or_else(|_| "null".to_owned())
                .into_boxed_str()
        };
        let parsed = text(&result.parsed);
        // An `output` that reads the same as `parsed` is kept once, even
        // as two values (a result read off the wire always is two).
        let output = (!same)
            .then(|| text(&result.output))
            .filter(|output| *output != parsed);
        Kept::Packed(Arc::new(PackedResult {
            stage_id,
            stage_execution_id,
            verdict: result.verdict,
            cap_hit: result.cap_hit,
            attempt_count: result.attempt_count,
            usage: result.usage,
            reason: result.reason.as_deref().map(Box::from),
            parsed,
            output,
        }))
    }

    /// A result read back from the run store, packed as it was stored:
    /// its JSON columns are checked, not parsed. A column that is absent
    /// or is no JSON reads as `null`, and an `output` that is absent or
    /// no JSON as `parsed`, as a stored result always has.
    #[allow(clippy::too_many_arguments)]
    pub fn stored(
        stage_id: Arc<str>,
        stage_execution_id: Arc<str>,
        verdict: Verdict,
        reason: Option<String>,
        cap_hit: bool,
        attempt_count: u32,
        usage: Usage,
        (parsed, output): (Option<String>, Option<String>),
    ) -> Kept {
        let json = |text: Option<String>| {
            text.filter(|t| serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok())
                .map(String::into_boxed_str)
        };
        Kept::Packed(Arc::new(PackedResult {
            stage_id,
            stage_execution_id,
            verdict,
            cap_hit,
            attempt_count,
            usage,
            reason: reason.map(String::into_boxed_str),
            parsed: json(parsed).unwrap_or_else(|| "null".into()),
            output: json(output),
        }))
    }

    /// The result itself: shared when whole, parsed again when packed.
    pub fn result(&self) -> Arc<StageResult> {
        match self {
            Kept::Whole(r) => Arc::clone(r),
            Kept::Packed(p) => Arc::new(p.unpack()),
        }
    }

    /// `parsed`, parsed again when packed (and nothing else).
    pub fn parsed(&self) -> Arc<Value> {
        match self {
            Kept::Whole(r) => Arc::clone(&r.parsed),
            Kept::Packed(p) => Arc::new(parse(&p.parsed)),
        }
    }

    /// `output`, parsed again when packed (and nothing else).
    pub fn output(&self) -> Arc<Value> {
        match self {
            Kept::Whole(r) => Arc::clone(&r.output),
            Kept::Packed(p) => Arc::new(parse(p.output.as_deref().unwrap_or(&p.parsed))),
        }
    }

    /// The result as a JSON value, as templates and expressions see it
    /// (through the one serialization both ways of holding it share).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    pub fn verdict(&self) -> Verdict {
        match self {
            Kept::Whole(r) => r.verdict,
            Kept::Packed(p) => p.verdict,
        }
    }

    pub fn stage_id(&self) -> &str {
        match self {
            Kept::Whole(r) => &r.stage_id,
            Kept::Packed(p) => &p.stage_id,
        }
    }

    pub fn stage_execution_id(&self) -> &str {
        match self {
            Kept::Whole(r) => &r.stage_execution_id,
            Kept::Packed(p) => &p.stage_execution_id,
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            Kept::Whole(r) => r.reason.as_deref(),
            Kept::Packed(p) => p.reason.as_deref(),
        }
    }

    pub fn cap_hit(&self) -> bool {
        match self {
            Kept::Whole(r) => r.cap_hit,
            Kept::Packed(p) => p.cap_hit,
        }
    }

    pub fn attempt_count(&self) -> u32 {
        match self {
            Kept::Whole(r) => r.attempt_count,
            Kept::Packed(p) => p.attempt_count,
        }
    }

    pub fn usage(&self) -> Usage {
        match self {
            Kept::Whole(r) => r.usage,
            Kept::Packed(p) => p.usage,
        }
    }

    /// `parsed` and `output` as the run store keeps them: JSON text, and
    /// `None` for `output` when it is `parsed` (stored once). Borrowed
    /// when the result is held packed.
    pub fn json_text(&self) -> (Cow<'_, str>, Option<Cow<'_, str>>) {
        match self {
            Kept::Whole(r) => (
                serde_json::to_string(&*r.parsed).unwrap_or_default().into(),
                (!Arc::ptr_eq(&r.parsed, &r.output))
                    .then(|| serde_json::to_string(&*r.output).unwrap_or_default().into()),
            ),
            Kept::Packed(p) => (
                Cow::Borrowed(&*p.parsed),
                p.output.as_deref().map(Cow::Borrowed),
            ),
        }
    }
}

impl From<Arc<StageResult>> for Kept {
    fn from(result: Arc<StageResult>) -> Kept {
        Kept::Whole(result)
    }
}

/// Equal when the results are, however each is held (a packed one is
/// compared as its values, not its text: `-0.0` is `0.0`, and an `output`
/// stored apart from `parsed` equals the same value shared).
impl PartialEq for Kept {
    fn eq(&self, other: &Kept) -> bool {
        match (self, other) {
            (Kept::Whole(a), Kept::Whole(b)) => a == b,
            _ => self.result() == other.result(),
        }
    }
}

impl PackedResult {
    fn unpack(&self) -> StageResult {
        let parsed = Arc::new(parse(&self.parsed));
        let output = self
            .output
            .as_deref()
            .map_or_else(|| Arc::clone(&parsed), |text| Arc::new(parse(text)));
        StageResult {
            stage_id: self.stage_id.to_string(),
            stage_execution_id: self.stage_execution_id.to_string(),
            verdict: self.verdict,
            reason: self.reason.as_deref().map(str::to_owned),
            parsed,
            output,
            cap_hit: self.cap_hit,
            attempt_count: self.attempt_count,
            usage: self.usage,
        }
    }
}

impl Kept {
    /// The JSON [`Serialize`] writes, byte for byte: a whole result's by
    /// hand (its field names as the bytes they are, where serde_json
    /// sends each through its string escaper; the values through
    /// serde_json), a packed one's through [`Serialize`]. A worker writes
    /// every sibling's this way (`wire::write`).
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        use crate::auditlog::json::{write_json_str, write_key, write_u64, write_usage};
        let r = match self {
            Kept::Whole(r) => r,
            Kept::Packed(_) => return serde_json::to_writer(&mut *out, self),
        };
        out.extend_from_slice(b"{\"stageId\":");
        write_json_str(out, &r.stage_id);
        write_key(out, "stageExecutionId");
        write_json_str(out, &r.stage_execution_id);
        write_key(out, "verdict");
        write_json_str(out, r.verdict.as_str());
        if let Some(reason) = &r.reason {
            write_key(out, "reason");
            write_json_str(out, reason);
        }
        write_key(out, "parsed");
        serde_json::to_writer(&mut *out, &*r.parsed)?;
        write_key(out, "output");
        serde_json::to_writer(&mut *out, &*r.output)?;
        write_key(out, "capHit");
        out.extend_from_slice(if r.cap_hit { b"true" } else { b"false" });
        write_key(out, "attemptCount");
        write_u64(out, u64::from(r.attempt_count));
        write_key(out, "usage");
        let usage = r.usage;
        write_usage(
            out,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.requests,
        );
        out.push(b'}');
        Ok(())
    }
}

/// The same JSON as [`StageResult`]'s, whichever way it is held: a
/// packed result's values are parsed back one at a time as they are
/// written, so a printer formats them as it formats any value.
impl Serialize for Kept {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let p = match self {
            Kept::Whole(r) => return r.serialize(serializer),
            Kept::Packed(p) => p,
        };
        // As every reader reads it: a column that does not parse is null.
        let parsed = parse(&p.parsed);
        let output = p.output.as_deref().map(parse);
        let fields = 8 + usize::from(p.reason.is_some());
        let mut s = serializer.serialize_struct("StageResult", fields)?;
        s.serialize_field("stageId", &*p.stage_id)?;
        s.serialize_field("stageExecutionId", &*p.stage_execution_id)?;
        s.serialize_field("verdict", &p.verdict)?;
        if let Some(reason) = &p.reason {
            s.serialize_field("reason", &**reason)?;
        } else {
            s.skip_field("reason")?;
        }
        s.serialize_field("parsed", &parsed)?;
        s.serialize_field("output", output.as_ref().unwrap_or(&parsed))?;
        s.serialize_field("capHit", &p.cap_hit)?;
        s.serialize_field("attemptCount", &p.attempt_count)?;
        s.serialize_field("usage", &p.usage)?;
        s.end()
    }
}

/// Read back whole: a group's state slot, which a worker's siblings read
/// at once and often (see [`Kept::read_packed`] for a result the reader
/// only keeps).
impl<'de> Deserialize<'de> for Kept {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Kept, D::Error> {
        StageResult::deserialize(deserializer).map(|r| Kept::Whole(Arc::new(r)))
    }
}

impl Kept {
    /// A result read packed: its values go straight into their compact
    /// text as they are read ([`CompactJson`]), parsed only when something
    /// reads them, as a local sibling's result is. How a coordinator reads
    /// a distributed sibling's result off the wire (`Report::Exited`),
    /// which it keeps until the run ends. A value nested too deep to pack
    /// is parsed from that text and kept whole.
    pub fn read_packed<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Kept, D::Error> {
        WireResult::deserialize(deserializer)?
            .kept()
            .map_err(serde::de::Error::custom)
    }
}

/// A [`StageResult`] as its JSON reads, its values as compact text.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResult {
    stage_id: String,
    stage_execution_id: String,
    verdict: Verdict,
    reason: Option<String>,
    parsed: CompactJson,
    output: CompactJson,
    cap_hit: bool,
    attempt_count: u32,
    usage: Usage,
}

impl WireResult {
    /// The result packed, or whole when a value nests too deep to pack.
    /// A value's text nests no deeper than serde_json's parser allows, but
    /// for a raw value's (serde_json's `raw_value` key), which may nest
    /// deeper inside its object: such a value is refused rather than kept
    /// as the `null` its text would parse to.
    fn kept(self) -> Result<Kept, String> {
        let same = self.output.text == self.parsed.text;
        if self.parsed.deepest > MAX_PACKED_DEPTH || self.output.deepest > MAX_PACKED_DEPTH {
            let whole = |text: &str| {
                serde_json::from_str::<Value>(text)
                    .map(Arc::new)
                    .map_err(|e| format!("a result's value nests too deep to read back: {e}"))
            };
            let parsed = whole(&self.parsed.text)?;
            let output = if same {
                Arc::clone(&parsed)
            } else {
                whole(&self.output.text)?
            };
            return Ok(Kept::Whole(Arc::new(StageResult {
                stage_id: self.stage_id,
                stage_execution_id: self.stage_execution_id,
                verdict: self.verdict,
                reason: self.reason,
                parsed,
                output,
                cap_hit: self.cap_hit,
                attempt_count: self.attempt_count,
                usage: self.usage,
            })));
        }
        Ok(Kept::Packed(Arc::new(PackedResult {
            stage_id: self.stage_id.into(),
            stage_execution_id: self.stage_execution_id.into(),
            verdict: self.verdict,
            cap_hit: self.cap_hit,
            attempt_count: self.attempt_count,
            usage: self.usage,
            reason: self.reason.map(String::into_boxed_str),
            output: (!same).then(|| self.output.text.into_boxed_str()),
            parsed: self.parsed.text.into_boxed_str(),
        })))
    }
}

/// A packed value read back, `null` when its text does not parse. Text
/// packed here is serde_json's own and nests at most [`MAX_PACKED_DEPTH`]
/// deep, so it parses; text read from a store (written by another troupe,
/// or damaged) may not, and reads as `null` as the store's reader always
/// read such a column.
fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Whether `value` nests deeper than [`MAX_PACKED_DEPTH`] below `depth`.
fn too_deep(value: &Value, depth: usize) -> bool {
    if depth > MAX_PACKED_DEPTH {
        return true;
    }
    match value {
        Value::Array(items) => items.iter().any(|v| too_deep(v, depth + 1)),
        Value::Object(map) => map.values().any(|v| too_deep(v, depth + 1)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(parsed: Value, output: Option<Value>, reason: Option<&str>) -> Arc<StageResult> {
        let parsed = Arc::new(parsed);
        Arc::new(StageResult {
            stage_id: "worker".into(),
            stage_execution_id: "run/worker#3/1".into(),
            verdict: if reason.is_some() {
                Verdict::Fail
            } else {
                Verdict::Ok
            },
            reason: reason.map(str::to_owned),
            output: output.map_or_else(|| Arc::clone(&parsed), Arc::new),
            parsed,
            cap_hit: true,
            attempt_count: 2,
            usage: Usage {
                prompt_tokens: 11,
                completion_tokens: 5,
                requests: 2,
            },
        })
    }

    fn pack(r: &Arc<StageResult>) -> Kept {
        Kept::packed(
            Arc::clone(r),
            r.stage_id.as_str().into(),
            r.stage_execution_id.as_str().into(),
        )
    }

    #[test]
    fn packed_reads_back_and_prints_as_whole() {
        let values = [
            json!({"item": 7, "summary": "done 7"}),
            json!({"z": 1, "a": [1.5, -0.0, 1e300, null, true], "é": {"\u{2028}": "\"\\"}}),
            json!(u64::MAX),
            json!(i64::MIN),
            // Floats whose shortest text parses back to the same bits only
            // with serde_json's `float_roundtrip` (the workspace asks for it).
            json!([
                0.9146155235219107,
                117.63331139400017,
                f64::MAX,
                5e-324,
                9007199254740991.0
            ]),
            json!({"p": 2.2250738585072014e-308, "q": -1.7976931348623157e308, "r": 0.1}),
            Value::Null,
            json!("text"),
        ];
        for v in values {
            for (output, reason) in [
                (None, None),
                (Some(json!({"text": "report"})), None),
                (None, Some("Validation/AssertFailed: no")),
            ] {
                let whole = result(v.clone(), output, reason);
                let packed = pack(&whole);
                assert!(matches!(packed, Kept::Packed(_)));
                assert_eq!(*packed.result(), *whole);
                assert_eq!(packed.to_json(), whole.to_json());
                assert_eq!(
                    (&*packed.parsed(), &*packed.output()),
                    (&*whole.parsed, &*whole.output)
                );
                let as_whole = Kept::Whole(Arc::clone(&whole));
                for (a, b) in [
                    (
                        serde_json::to_string(&packed),
                        serde_json::to_string(&*whole),
                    ),
                    (
                        serde_json::to_string_pretty(&packed),
                        serde_json::to_string_pretty(&*whole),
                    ),
                ] {
                    assert_eq!(a.unwrap(), b.unwrap());
                }
                assert_eq!(serde_json::to_value(&packed).unwrap(), whole.to_json());
                assert_eq!(packed.json_text(), as_whole.json_text());
                assert_eq!(packed, as_whole);
                assert_eq!(
                    (packed.verdict(), packed.reason(), packed.stage_id()),
                    (whole.verdict, whole.reason.as_deref(), "worker")
                );
                assert_eq!(
                    (packed.cap_hit(), packed.attempt_count(), packed.usage()),
                    (true, 2, whole.usage)
                );
            }
        }
    }

    #[test]
    fn output_that_is_parsed_stays_shared_when_read_back() {
        let packed = pack(&result(json!({"a": 1}), None, None));
        let back = packed.result();
        assert!(Arc::ptr_eq(&back.parsed, &back.output));
        assert_eq!(packed.json_text().1, None);
        // Two values that read the same (as off the wire): kept once.
        let twice = pack(&result(
            json!({"a": [1.5, "é"]}),
            Some(json!({"a": [1.5, "é"]})),
            None,
        ));
        assert_eq!(twice.json_text().1, None);
        assert_eq!(*twice.output(), json!({"a": [1.5, "é"]}));
        // Equal as values but not as text: both kept, each as it was.
        let zeros = pack(&result(json!(-0.0), Some(json!(0.0)), None));
        assert_eq!(
            zeros.json_text(),
            (Cow::from("-0.0"), Some(Cow::from("0.0")))
        );
    }

    #[test]
    fn a_value_too_deep_to_parse_back_stays_whole() {
        let mut deep = json!(1);
        for _ in 0..=MAX_PACKED_DEPTH + 1 {
            deep = json!([deep]);
        }
        let whole = result(deep, None, None);
        assert!(matches!(pack(&whole), Kept::Whole(_)));
        let shallow = result(json!([[[1]]]), Some(json!({"deep": 1})), None);
        assert!(matches!(pack(&shallow), Kept::Packed(_)));
    }

    #[test]
    fn packed_results_are_equal_when_their_values_are() {
        let shared = result(json!({"x": 0.0}), None, None);
        let apart = result(json!({"x": -0.0}), Some(json!({"x": 0.0})), None);
        assert_eq!(pack(&shared), pack(&apart));
        assert_ne!(pack(&shared), pack(&result(json!({"x": 1}), None, None)));
    }

    #[test]
    fn stored_text_that_does_not_parse_reads_and_prints_as_null() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        for text in [deep.as_str(), "\"\\ud800\"", "1e400", "{no json"] {
            let kept = Kept::stored(
                "worker".into(),
                "run/worker#1/1".into(),
                Verdict::Ok,
                None,
                false,
                1,
                Usage::default(),
                (Some(text.to_owned()), None),
            );
            assert_eq!(*kept.parsed(), Value::Null, "{text}");
            let printed: Value = serde_json::to_value(&kept).expect("it prints");
            assert_eq!(printed["parsed"], Value::Null, "{text}");
            assert_eq!(printed["output"], Value::Null, "{text}");
        }
    }

    #[test]
    fn read_off_the_wire_it_is_packed_as_its_execution_packs_it() {
        let results = [
            result(json!({"item": 1, "s": "\u{e9}\n"}), None, Some("why")),
            result(json!([1.5, -0.0, null]), Some(json!({"other": true})), None),
        ];
        for whole in results {
            let local = pack(&whole);
            let text = serde_json::to_string(&local).unwrap();
            let back = Kept::read_packed(&mut serde_json::Deserializer::from_str(&text)).unwrap();
            assert!(matches!(back, Kept::Packed(_)));
            assert_eq!(*back.result(), *whole);
            assert_eq!(back.json_text(), local.json_text());
            // Through a deserializer that holds the value first.
            let value: Value = serde_json::from_str(&text).unwrap();
            let held = Kept::read_packed(value.clone()).unwrap();
            assert_eq!(held.json_text(), local.json_text());
            // Read as a state slot's entry: whole.
            let slot: Kept = serde_json::from_value(value).unwrap();
            assert!(matches!(slot, Kept::Whole(_)));
            assert_eq!(*slot.result(), *whole);
        }
        // A raw value (serde_json's raw_value key) nested past what a
        // parser reads back: refused, not read as null.
        let inner = format!("{}1{}", "[".repeat(120), "]".repeat(120));
        let raw = json!({ crate::auditlog::json::RAW_VALUE: inner });
        let mut text = serde_json::to_string(&raw).unwrap();
        for _ in 0..20 {
            text = format!("[{text}]");
        }
        let reply = format!(
            "{{\"stageId\":\"s\",\"stageExecutionId\":\"e\",\"verdict\":\"ok\",\"parsed\":{text},\"output\":1,\"capHit\":false,\"attemptCount\":1,\"usage\":{{\"promptTokens\":0,\"completionTokens\":0,\"requests\":0}}}}"
        );
        let why = Kept::read_packed(&mut serde_json::Deserializer::from_str(&reply))
            .expect_err("refused");
        assert!(why.to_string().contains("too deep"), "{why}");
        // Too deep to pack: read whole, and equal.
        let deep = (0..MAX_PACKED_DEPTH + 5).fold(json!(1), |v, _| json!([v]));
        let whole = result(deep, None, None);
        let text = serde_json::to_string(&*whole).unwrap();
        let back = Kept::read_packed(&mut serde_json::Deserializer::from_str(&text)).unwrap();
        assert!(matches!(back, Kept::Whole(_)));
        assert_eq!(*back.result(), *whole);
    }
}
