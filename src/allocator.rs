//! The process's allocator: mimalloc, asked for plain blocks wherever a
//! plain block is aligned enough.
//!
//! Why mimalloc at all: an actor thread allocates every event and the
//! audit thread frees it; glibc's malloc serialized those cross-thread
//! frees on an arena lock (a 10 000-wide fan-out took 1.1 s on it, 0.43 s
//! on mimalloc).
//!
//! Why not the `mimalloc` crate's `MiMalloc`: it passes every request to
//! `mi_malloc_aligned`, alignment 8 included. mimalloc 3 takes its fast
//! path for an aligned request only while the size's page has a free
//! block at hand (and never above 1 KiB). Otherwise a size whose block is
//! not a power of two goes the generic way: `mi_good_size`, then an
//! over-allocation of `align - 1` bytes (48 bytes come from the 64-byte
//! size), without refilling the size's own page. On a fan-out's actor
//! threads one request in nine went that way (BENCHMARKS.md, "Every
//! core, twenty-first round"). A plain `mi_malloc` refills the page.
//!
//! When a plain block is aligned enough: mimalloc's blocks are whole
//! 8-byte words, above 8 bytes whole 16-byte steps where `max_align_t` is
//! 16 (x86-64, aarch64), and a page's first block is 16-aligned (mimalloc
//! asserts that a block of 16 bytes or more is). The rule here asks no
//! more than that on any target: 8-aligned always, 16-aligned when the
//! size is a multiple of 16, which every Rust type of alignment 16 has.
//! Larger alignments (tokio's 128-byte task cells) still go to the
//! aligned functions.

// The one module that may use `unsafe` (the workspace denies it
// elsewhere): a global allocator is an `unsafe` trait, and each function
// hands its arguments to mimalloc's C functions.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// mimalloc as the global allocator (`src/main.rs`, the benches, the
/// allocator's tests).
#[derive(Debug, Clone, Copy, Default)]
pub struct Mimalloc;

/// Whether a plain (unaligned) mimalloc block of `size` bytes is aligned
/// to `align` (module documentation).
#[inline(always)]
const fn plain(size: usize, align: usize) -> bool {
    align <= 8 || (align == 16 && size.is_multiple_of(16))
}

/// A new block for `layout` from `plain_fn` where a plain block is
/// aligned enough, else from `aligned_fn` (mimalloc's allocating or
/// zeroing pair). Always inlined, so each call is a direct one.
///
/// # Safety
///
/// `layout`'s size is not zero (`GlobalAlloc::alloc`'s contract).
#[inline(always)]
unsafe fn new_block(
    layout: Layout,
    plain_fn: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned_fn: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: both take any size and return a block of it or null.
    unsafe {
        if plain(layout.size(), layout.align()) {
            plain_fn(layout.size()).cast()
        } else {
            aligned_fn(layout.size(), layout.align()).cast()
        }
    }
}

// SAFETY: each function passes the caller's request to the mimalloc
// function of the same contract: `mi_malloc`/`mi_zalloc`/`mi_realloc`
// where `plain` says their blocks meet the layout's alignment, the
// `_aligned` ones otherwise. Both return null on failure, as `GlobalAlloc`
// requires, and `mi_free` and `mi_realloc*` take a block from either.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe { new_block(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe { new_block(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` is a block this allocator returned (the caller's
        // contract); mimalloc frees a block from any of its functions.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl. `mi_realloc` keeps the block where it
        // fits (its address, aligned as before) or moves it to a plain
        // block of `new_size`, which `plain` says is aligned enough.
        unsafe {
            if plain(new_size, layout.align()) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocates `count` blocks of `layout` (zeroed or not), checks each
    /// one's alignment, writes it, and returns them.
    fn blocks(layout: Layout, count: usize, zeroed: bool) -> Vec<*mut u8> {
        (0..count)
            .map(|i| {
                // SAFETY: the layout's size is not zero.
                let p = unsafe {
                    if zeroed {
                        Mimalloc.alloc_zeroed(layout)
                    } else {
                        Mimalloc.alloc(layout)
                    }
                };
                assert!(!p.is_null(), "{layout:?}");
                assert_eq!(p as usize % layout.align(), 0, "{layout:?}, block {i}");
                if zeroed {
                    // SAFETY: `p` holds `layout.size()` bytes.
                    let bytes = unsafe { std::slice::from_raw_parts(p, layout.size()) };
                    assert!(bytes.iter().all(|&b| b == 0), "{layout:?} not zeroed");
                }
                // SAFETY: as above.
                unsafe { std::ptr::write_bytes(p, i as u8, layout.size()) };
                p
            })
            .collect()
    }

    #[test]
    fn every_block_meets_its_alignment() {
        // Every size up to 1 KiB and a few beyond, at alignments 1 to
        // 128 and 4 KiB, many blocks each: the 8-byte size holds every
        // other block 8 bytes past 16, which a plain allocation of a
        // small 16-aligned layout would hand out.
        let sizes = (1..=1024).chain([1536, 4096, 6000, 65_536, 300_000, 5 << 20]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let layout = Layout::from_size_align(size, align).expect("a layout");
                let count = if size > 65_536 { 2 } else { 24 };
                let got = blocks(layout, count, size % 3 == 0);
                for p in got {
                    // SAFETY: allocated above with `layout`.
                    unsafe { Mimalloc.dealloc(p, layout) };
                }
            }
        }
    }

    #[test]
    fn a_reallocated_block_keeps_its_bytes_and_its_alignment() {
        for align in [1, 8, 16, 64, 128] {
            for (from, to) in [
                (24, 48),
                (48, 24),
                (16, 24),
                (24, 16),
                (40, 4000),
                (4000, 40),
            ] {
                let layout = Layout::from_size_align(from, align).expect("a layout");
                for p in blocks(layout, 16, false) {
                    let fill = {
                        // SAFETY: `p` holds `from` bytes.
                        unsafe { *p }
                    };
                    // SAFETY: `p` came from `alloc` with `layout`; `to` is
                    // not zero.
                    let q = unsafe { Mimalloc.realloc(p, layout, to) };
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "{from} -> {to} at {align}");
                    // SAFETY: `q` holds `to` bytes, the first
                    // `min(from, to)` of them kept.
                    let kept = unsafe { std::slice::from_raw_parts(q, from.min(to)) };
                    assert!(kept.iter().all(|&b| b == fill), "{from} -> {to} at {align}");
                    let moved = Layout::from_size_align(to, align).expect("a layout");
                    // SAFETY: `q` is the block `realloc` returned for `to`.
                    unsafe { Mimalloc.dealloc(q, moved) };
                }
            }
        }
    }

    #[test]
    fn plain_blocks_only_where_they_are_aligned() {
        assert!(plain(24, 8));
        assert!(plain(3, 1));
        assert!(plain(48, 16));
        assert!(!plain(24, 16));
        assert!(!plain(128, 32));
        assert!(!plain(256, 128));
    }
}
