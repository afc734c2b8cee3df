//! The control block of one member of a window: its passive-target lock and its accumulate lock. It lives
//! in shared memory next to the window's data (the node segment) when co-resident peers can map it, else
//! in the owner's heap, where only the owner and its agent use it.
//!
//! Everything in it is an atomic word; nothing read from it is ever used as a pointer. A corrupt word can
//! make an operation wait for a lock that a live peer holds, never access memory out of bounds.
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of a control block (one page).
pub const CTL_SIZE: usize = 4096;

/// Bit of the lock word held by an exclusive lock; the low 32 bits count shared holders.
pub const EXCL: u64 = 1 << 63;

/// The control block.
#[repr(C, align(4096))]
pub struct Ctl {
    /// The passive-target (MPI_Win_lock) lock word: [`EXCL`] or a count of shared holders.
    pub lock: AtomicU64,
    _p0: [u64; 15],
    /// The accumulate lock: 0 free, anything else held.
    pub acc: AtomicU32,
    _p1: [u32; 31],
    _rest: [u64; 480],
}

const _: () = assert!(std::mem::size_of::<Ctl>() == CTL_SIZE);

impl Ctl {
    /// A control block at `p`.
    ///
    /// # Safety
    /// `p` must point to [`CTL_SIZE`] bytes of (shared) memory, aligned to 8, valid for the lifetime
    /// the caller uses the reference for. Zeroed memory is a free, empty block.
    pub unsafe fn at<'a>(p: *mut u8) -> &'a Ctl {
        &*(p as *const Ctl)
    }

    /// Try to take the passive-target lock once: `excl` for an exclusive lock, else a shared one.
    pub fn try_lock(&self, excl: bool) -> bool {
        if excl {
            self.lock
                .compare_exchange(0, EXCL, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        } else {
            let mut cur = self.lock.load(Ordering::Relaxed);
            loop {
                if cur & EXCL != 0 {
                    return false;
                }
                match self.lock.compare_exchange_weak(
                    cur,
                    cur + 1,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return true,
                    Err(v) => cur = v,
                }
            }
        }
    }

    /// Release the passive-target lock taken by [`Ctl::try_lock`] with the same `excl`.
    pub fn unlock(&self, excl: bool) {
        if excl {
            self.lock.fetch_and(!EXCL, Ordering::Release);
        } else {
            // Never below zero, whatever a peer wrote.
            let _ = self
                .lock
                .fetch_update(Ordering::Release, Ordering::Relaxed, |v| {
                    (v & 0xffff_ffff != 0).then(|| v - 1)
                });
        }
    }

    /// Take the accumulate lock, spinning and then yielding while another process holds it.
    pub fn acc_lock(&self) {
        let mut spins = 0u32;
        loop {
            if self.acc.load(Ordering::Relaxed) == 0
                && self
                    .acc
                    .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                vmf_pal::yield_now();
            }
        }
    }

    /// Release the accumulate lock.
    pub fn acc_unlock(&self) {
        self.acc.store(0, Ordering::Release);
    }
}

/// A zeroed control block in this process's heap (for members that share it with nobody).
pub struct HeapCtl(Box<Ctl>);

impl HeapCtl {
    /// A free, empty block.
    pub fn new() -> HeapCtl {
        // SAFETY: all-zero bytes are a valid Ctl (atomics and arrays of them).
        HeapCtl(unsafe { Box::new(std::mem::zeroed()) })
    }

    /// Its address.
    pub fn ptr(&self) -> *mut u8 {
        &*self.0 as *const Ctl as *mut u8
    }
}

impl Default for HeapCtl {
    fn default() -> Self {
        HeapCtl::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_exclude_each_other_works() {
        let h = HeapCtl::new();
        // SAFETY: a heap block of the right size.
        let c = unsafe { Ctl::at(h.ptr()) };
        assert!(c.try_lock(false) && c.try_lock(false));
        assert!(!c.try_lock(true), "exclusive waits for the shared holders");
        c.unlock(false);
        c.unlock(false);
        c.unlock(false); // an extra release never goes below zero
        assert!(c.try_lock(true));
        assert!(!c.try_lock(false) && !c.try_lock(true));
        c.unlock(true);
        assert_eq!(c.lock.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn accumulate_lock_serialises_threads_works() {
        let h = std::sync::Arc::new(HeapCtl::new());
        let counter = std::sync::Arc::new(AtomicU64::new(0));
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let (h, counter) = (h.clone(), counter.clone());
                std::thread::spawn(move || {
                    // SAFETY: the block outlives the threads (Arc).
                    let c = unsafe { Ctl::at(h.ptr()) };
                    for _ in 0..5000 {
                        c.acc_lock();
                        // A non-atomic read-modify-write made safe by the lock.
                        let v = counter.load(Ordering::Relaxed);
                        counter.store(v + 1, Ordering::Relaxed);
                        c.acc_unlock();
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::SeqCst), 20_000);
    }
}
