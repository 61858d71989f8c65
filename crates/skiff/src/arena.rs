//! The process's allocator: a bump arena in front of mimalloc.
//!
//! `skiff run` is a short-lived process on the sandbox start path; musl's allocator
//! returns freed pages to the kernel eagerly, and the munmap and page-fault churn cost
//! more CPU than everything skiff itself computes (measured with `perf`). Small
//! allocations therefore come from a static arena and are never freed (the one on top
//! of the arena can be grown or popped); once the arena is used up, or for large
//! blocks, mimalloc takes over, so a long-running process wastes at most the arena's
//! size. Not musl's allocator there either: in `skiff serve` under load it took ~10% of
//! the daemon's CPU (its global lock and slot bookkeeping, in `perf`).

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc as Fallback;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

const ARENA_SIZE: usize = 1 << 20;
const LARGE: usize = 64 << 10;

#[repr(C, align(4096))]
struct Space(UnsafeCell<[u8; ARENA_SIZE]>);

// SAFETY: disjoint ranges of the arena are handed out by an atomic bump pointer.
unsafe impl Sync for Space {}

struct Arena {
    space: Space,
    next: AtomicUsize,
}

#[global_allocator]
static ARENA: Arena = Arena {
    space: Space(UnsafeCell::new([0; ARENA_SIZE])),
    next: AtomicUsize::new(0),
};

impl Arena {
    fn base(&self) -> usize {
        self.space.0.get() as usize
    }

    fn contains(&self, ptr: *mut u8) -> bool {
        (self.base()..self.base() + ARENA_SIZE).contains(&(ptr as usize))
    }
}

// SAFETY: every block is either a fresh, aligned, in-bounds arena range that no other
// block overlaps, or comes from (and returns to) the system allocator.
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() <= LARGE {
            let mut current = self.next.load(Ordering::Relaxed);
            loop {
                let start = (self.base() + current).next_multiple_of(layout.align()) - self.base();
                let end = start + layout.size();
                if end > ARENA_SIZE {
                    break;
                }
                match self.next.compare_exchange_weak(
                    current,
                    end,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return (self.base() + start) as *mut u8,
                    Err(seen) => current = seen,
                }
            }
        }
        Fallback.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !self.contains(ptr) {
            return Fallback.dealloc(ptr, layout);
        }
        // Pop the block if it is the last one handed out; otherwise it stays.
        let end = ptr as usize - self.base() + layout.size();
        let _ = self.next.compare_exchange(
            end,
            end - layout.size(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !self.contains(ptr) {
            // It stays with the fallback, which may grow it in place.
            return Fallback.realloc(ptr, layout, new_size);
        }
        // Grow or shrink in place when the block is the last one.
        let start = ptr as usize - self.base();
        let end = start + layout.size();
        if start + new_size <= ARENA_SIZE
            && new_size <= LARGE
            && self
                .next
                .compare_exchange(end, start + new_size, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return ptr;
        }
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let new = self.alloc(new_layout);
        if !new.is_null() {
            std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        new
    }
}
