//! The binary's allocator (mimalloc, as `src/main.rs` installs it) asks
//! the kernel for no transparent huge pages.
//!
//! mimalloc madvises its arenas `MADV_HUGEPAGE` unless built with
//! `no_thp`; on a kernel whose THP mode is `madvise` (Debian's and
//! Ubuntu's default) every first touch of such an arena then zeroes 2 MiB.
//! That cost a fresh worker its first 100 ms and every run 15-27 MiB of
//! RSS (BENCHMARKS.md, "Every core, nineteenth round"). This test binary
//! installs the same allocator, built with the same features, touches 64
//! MiB of small blocks and reads how much of its memory is huge pages.

#[global_allocator]
static GLOBAL: troupe::allocator::Mimalloc = troupe::allocator::Mimalloc;

/// `AnonHugePages` of this process, in KiB.
fn anon_huge_pages_kib() -> u64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    rollup
        .lines()
        .find_map(|line| line.strip_prefix("AnonHugePages:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("an AnonHugePages line")
}

#[test]
fn the_allocator_asks_for_no_transparent_huge_pages() {
    // Only `madvise` tells: with `always` the kernel decides whatever the
    // allocator asks, and with `never` there are none to ask for.
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    if !mode.is_ok_and(|m| m.contains("[madvise]")) {
        eprintln!("skipped: the kernel's THP mode is not `madvise`");
        return;
    }
    let before = anon_huge_pages_kib();
    // 64 MiB in 64-byte blocks: pages of mimalloc's arenas, each written.
    let blocks: Vec<Box<[u8; 64]>> = (0..1 << 20).map(|i| Box::new([i as u8; 64])).collect();
    let after = anon_huge_pages_kib();
    let kept: u64 = blocks.iter().map(|b| u64::from(b[0])).sum();
    assert!(kept > 0);
    assert_eq!(
        after.saturating_sub(before),
        0,
        "the allocator's 64 MiB came in transparent huge pages: is mimalloc built without `no_thp`?"
    );
}
