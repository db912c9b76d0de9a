//! Fuzzes `pack::records`, the run store's reading of a pack (a run's
//! executions' ends, as one row per transaction of the store's writer):
//! bytes a damaged or foreign store may hold. Arbitrary bytes, as they
//! come and after the format byte, must give records or a damage with its
//! place, never a panic; reading stops at the first damage; every record
//! read, written again, reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::store::pack::{FORMAT, encode, records};

fn check(pack: &[u8]) {
    let mut again = vec![FORMAT];
    let mut read = Vec::new();
    let mut it = records(pack);
    for record in it.by_ref() {
        match record {
            Ok(r) => {
                again.extend_from_slice(&encode(&r));
                read.push(r);
            }
            Err(damage) => {
                assert!(damage.at <= pack.len(), "{damage} in {} bytes", pack.len());
                break;
            }
        }
    }
    assert!(it.next().is_none(), "reading goes on after a damage");
    let back: Vec<_> = records(&again).collect::<Result<_, _>>().expect("re-encoded");
    assert_eq!(back, read);
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut framed = vec![FORMAT];
    framed.extend_from_slice(data);
    check(&framed);
});
