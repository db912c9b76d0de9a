//! A follower of a log that a resume's repair rewrites under it.

use super::*;

/// A follower reading a killed log that a resume's repair cuts back and
/// writes again under it (then appends to) goes on: no error, no line
/// twice, nothing left out, as the whole log reads afterwards.
#[test]
fn a_follower_goes_on_through_a_repair_under_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(FILE);
    let (bytes, _, ends) = frames_log(4, 40);
    // Killed while the third segment's frame was being written.
    let cut = ends[1] + (ends[2] - ends[1]) * 2 / 3;
    std::fs::write(&path, &bytes[..cut]).expect("write");
    let mut follower = Follower::new(&path);
    let mut lines = Vec::new();
    while follower.read_more(1 << 20, &mut lines).expect("read") > 0 {}
    let end = scan_end(&path, |_| Ok(())).expect("a cut is not damage");
    assert!(cut_to_whole(&path, end).expect("cut"));
    // The resumed session's next segment.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open");
    std::io::Write::write_all(&mut file, &bytes[ends[2]..ends[3]]).expect("append");
    drop(file);
    while follower.read_more(1 << 20, &mut lines).expect("read on") > 0 {}
    let seqs = |text: &str| -> Vec<u64> {
        text.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("a line")["seq"]
                    .as_u64()
                    .expect("seq")
            })
            .collect()
    };
    let whole = read_text(&path).expect("the whole log");
    let followed = String::from_utf8(lines).expect("UTF-8");
    assert_eq!(seqs(&followed), seqs(&whole));
    assert_eq!(followed, whole);
}
