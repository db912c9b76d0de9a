//! Properties of the store's packs: every record reads back as it was
//! written; a pack damaged anywhere reads up to the damage and no further;
//! rows of the first schema of any types are read leniently by every
//! reader.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

#[path = "store_support/first_schema.rs"]
mod first_schema;

use proptest::prelude::*;
use troupe::runtime::result::{Usage, Verdict};
use troupe::store::pack::{self, End, Stored};

/// An exit's own parts: verdict (0 ok, 1 fail, 2 skipped), cap hit,
/// reason, parsed, output.
type Exited = (u8, bool, Option<String>, String, Option<String>);

/// The owned parts of a record, for proptest to make.
#[derive(Debug, Clone)]
struct Parts {
    exec: String,
    stage: String,
    index: Option<u64>,
    numbers: (u32, u32, u64, u64, u64),
    entered_at: Option<i64>,
    ended_at: i64,
    exited: Option<Exited>,
    cancelled: (String, String, u32, String),
}

impl Parts {
    fn stored(&self) -> Stored<'_> {
        let end = match &self.exited {
            Some((verdict, cap_hit, reason, parsed, output)) => End::Exited {
                verdict: [Verdict::Ok, Verdict::Fail, Verdict::Skipped][usize::from(*verdict)],
                cap_hit: *cap_hit,
                reason: reason.as_deref(),
                parsed,
                output: output.as_deref(),
            },
            None => End::Cancelled {
                reason: &self.cancelled.0,
                phase: &self.cancelled.1,
                turn: self.cancelled.2,
                tool_calls: &self.cancelled.3,
            },
        };
        Stored {
            exec: &self.exec,
            stage_id: &self.stage,
            index: self.index,
            visit: self.numbers.0,
            attempts: self.numbers.1,
            usage: Usage {
                prompt_tokens: self.numbers.2,
                completion_tokens: self.numbers.3,
                requests: self.numbers.4,
            },
            entered_at: self.entered_at,
            ended_at: self.ended_at,
            end,
        }
    }
}

fn parts() -> impl Strategy<Value = Parts> {
    (
        (
            "\\PC{0,12}",
            "[a-z_]{1,8}",
            proptest::option::of(0..u64::MAX),
        ),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        ),
        (
            proptest::option::of(0..i64::MAX - 1),
            0..i64::MAX,
            proptest::option::of((
                0..3u8,
                any::<bool>(),
                proptest::option::of("\\PC{0,10}"),
                "\\PC{0,40}",
                proptest::option::of("\\PC{0,20}"),
            )),
            ("\\PC{0,10}", "[A-Za-z]{0,8}", any::<u32>(), "\\PC{0,20}"),
        ),
    )
        .prop_map(
            |((exec, stage, index), numbers, (entered_at, ended_at, exited, cancelled))| Parts {
                exec,
                stage,
                index,
                numbers,
                entered_at,
                ended_at,
                exited,
                cancelled,
            },
        )
}

fn packed(records: &[Parts]) -> Vec<u8> {
    let mut body = Vec::new();
    pack::start(&mut body);
    for r in records {
        body.extend_from_slice(&pack::encode(&r.stored()));
    }
    body
}

proptest! {
    #[test]
    fn every_record_reads_back_as_it_was_written(
        records in proptest::collection::vec(parts(), 0..6),
    ) {
        let body = packed(&records);
        let back: Vec<Stored<'_>> = pack::records(&body).collect::<Result<_, _>>().unwrap();
        let written: Vec<Stored<'_>> = records.iter().map(Parts::stored).collect();
        prop_assert_eq!(back, written);
    }

    #[test]
    fn a_pack_damaged_anywhere_reads_up_to_the_damage_and_no_further(
        records in proptest::collection::vec(parts(), 1..4),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<bool>(),
    ) {
        let body = packed(&records);
        let at = at.index(body.len());
        let mut damaged = body.clone();
        if cut {
            damaged.truncate(at);
        } else {
            damaged[at] = byte;
        }
        let mut read = pack::records(&damaged);
        let mut good = 0;
        for record in read.by_ref() {
            match record {
                Ok(r) => {
                    // What reads is a whole record: written again, it
                    // reads back the same.
                    let again = pack::encode(&r);
                    let mut one = Vec::new();
                    pack::start(&mut one);
                    one.extend_from_slice(&again);
                    let back = pack::records(&one).next().unwrap().unwrap();
                    prop_assert_eq!(back, r);
                    good += 1;
                }
                Err(damage) => {
                    prop_assert!(damage.at <= damaged.len());
                    break;
                }
            }
        }
        prop_assert!(read.next().is_none(), "reading went on after a damage");
        prop_assert!(good <= records.len());
    }
}

/// Any value in any column of a first-schema row: SQLite keeps what
/// it is given, whatever a column was declared.
fn any_value() -> impl Strategy<Value = rusqlite::types::Value> {
    use rusqlite::types::Value;
    prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::Integer),
        any::<f64>().prop_map(Value::Real),
        "\\PC{0,12}".prop_map(Value::Text),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::Blob),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A first-schema store another tool wrote into: rows of any types
    /// are read leniently by every reader, never a panic or an error.
    #[test]
    fn first_schema_rows_of_any_types_are_read_leniently(
        rows in proptest::collection::vec(proptest::collection::vec(any_value(), 17), 1..5),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".troupe/troupe.db");
        first_schema::first_schema_store(&path);
        let raw = rusqlite::Connection::open(&path).unwrap();
        for (n, row) in rows.iter().enumerate() {
            // The key stays a key (as text, or as the same bytes in a
            // BLOB); every other column is anything.
            let key = format!("odd#{n}/1");
            let key = if n % 2 == 0 {
                rusqlite::types::Value::Text(key)
            } else {
                rusqlite::types::Value::Blob(key.into_bytes())
            };
            let mut values = vec![key];
            values.extend(row.iter().cloned());
            let _ = raw.execute(
                "INSERT INTO executions (exec, stage_id, sibling, visit, outcome, verdict, \
                 reason, attempts, cap_hit, phase, turn, tool_calls, prompt_tokens, \
                 completion_tokens, requests, entered_at, ended_at, parsed, run) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
                 ?16, ?17, ?18, 1)",
                rusqlite::params_from_iter(values),
            );
        }
        let stored: i64 = raw
            .query_row("SELECT count(*) FROM executions", [], |r| r.get(0))
            .unwrap();
        for store in [
            troupe::store::Store::open_read_only(&path).unwrap(),
            troupe::store::Store::open(&path).unwrap(),
        ] {
            let counts = store.counts("old").unwrap();
            prop_assert_eq!(
                (counts.ok + counts.failed + counts.skipped + counts.cancelled) as i64,
                stored
            );
            prop_assert_eq!(store.executions("old", None, None).unwrap().len() as i64, stored);
            store.kept_results("old").unwrap();
            store.exit_events("old", |_| false).unwrap();
        }
    }
}
