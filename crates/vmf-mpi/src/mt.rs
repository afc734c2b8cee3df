//! MPI_THREAD_MULTIPLE: one lock around the library, handed over while a thread waits.
//!
//! When a program asks for `MPI_THREAD_MULTIPLE`, every MPI call takes the library lock on entry and
//! gives it back on return ([`enter`]); the lock is recursive, so callbacks that call MPI (reduction
//! operations, error handlers, attribute callbacks) work. A thread that has to wait (for a message, a
//! collective, a lock on a window) does not keep the lock: between its polls the engine calls
//! [`hook`], which hands the lock to the threads queued for it and takes it back after them. Threads
//! are served in arrival order (a ticket lock), so a busy thread cannot starve the others.
//!
//! Without `MPI_THREAD_MULTIPLE` nothing of this runs: the entry check is one relaxed load of a flag
//! that never changes after `MPI_Init_thread`, and the single-threaded paths are unchanged.
//!
//! What a waiting thread may hold while it lets others in: the library's tables are reached through
//! indices and handles, re-read after every hand-over; the waits that loop in the library itself pass
//! the state to [`relax`] so that the compiler reloads it.
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

static ON: AtomicBool = AtomicBool::new(false);
/// Next ticket to hand out, and the ticket being served (the owner's).
static NEXT: AtomicU32 = AtomicU32::new(0);
static SERVING: AtomicU32 = AtomicU32::new(0);
/// The owner's thread token (0: nobody) and how many times it entered.
static OWNER: AtomicU64 = AtomicU64::new(0);
static DEPTH: AtomicU32 = AtomicU32::new(0);
static TOKENS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TOKEN: Cell<u64> = const { Cell::new(0) };
}

#[inline]
fn me() -> u64 {
    TOKEN.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        let v = TOKENS.fetch_add(1, Ordering::Relaxed);
        t.set(v);
        v
    })
}

/// True once `MPI_THREAD_MULTIPLE` is in force.
#[inline(always)]
pub(crate) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turn the lock on (MPI_Init_thread granting MPI_THREAD_MULTIPLE, called by the one thread that
/// initialises); the caller holds it from now on until its guard drops.
pub(crate) fn enable() -> Guard {
    ON.store(true, Ordering::SeqCst);
    acquire();
    Guard(true)
}

fn acquire() {
    let me = me();
    if OWNER.load(Ordering::Relaxed) == me {
        DEPTH.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let t = NEXT.fetch_add(1, Ordering::Relaxed);
    wait_turn(t);
    OWNER.store(me, Ordering::Relaxed);
    DEPTH.store(1, Ordering::Relaxed);
}

fn wait_turn(t: u32) {
    let mut spins = 0u32;
    while SERVING.load(Ordering::Acquire) != t {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn release() {
    if DEPTH.fetch_sub(1, Ordering::Relaxed) == 1 {
        OWNER.store(0, Ordering::Relaxed);
        SERVING.fetch_add(1, Ordering::Release);
    }
}

/// The lock held for the duration of one MPI call (nothing when `MPI_THREAD_MULTIPLE` is off).
pub(crate) struct Guard(bool);

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        if self.0 {
            release();
        }
    }
}

/// Take the library lock for an MPI call.
#[inline(always)]
pub(crate) fn enter() -> Guard {
    if on() {
        acquire();
        Guard(true)
    } else {
        Guard(false)
    }
}

/// Let the threads queued for the lock run, then take it back (at the same depth). Cheap when nobody
/// waits.
#[inline]
pub(crate) fn let_others_in() {
    if !on() {
        return;
    }
    let waiting = NEXT
        .load(Ordering::Relaxed)
        .wrapping_sub(SERVING.load(Ordering::Relaxed))
        > 1;
    if !waiting || OWNER.load(Ordering::Relaxed) != me() {
        return;
    }
    let depth = DEPTH.swap(0, Ordering::Relaxed);
    OWNER.store(0, Ordering::Relaxed);
    let t = NEXT.fetch_add(1, Ordering::Relaxed);
    SERVING.fetch_add(1, Ordering::Release);
    wait_turn(t);
    OWNER.store(me(), Ordering::Relaxed);
    DEPTH.store(depth, Ordering::Relaxed);
}

/// The engine's yield hook (installed when `MPI_THREAD_MULTIPLE` is granted).
///
/// # Safety
/// Called by the engine with a pointer to itself; the pointer is handed to an opaque point so that the
/// waiting code reloads the engine after other threads used it.
pub(crate) unsafe fn hook(e: *mut vmf_core::engine::Engine) {
    std::hint::black_box(e);
    let_others_in();
}

/// In a wait loop of the library itself: let other threads in, and return the state anew (the
/// compiler must assume they changed it).
#[inline]
pub(crate) fn relax(st: &mut crate::State) -> &mut crate::State {
    if on() {
        let p = std::hint::black_box(st as *mut crate::State);
        let_others_in();
        // SAFETY: the same global state, now under our lock again.
        unsafe { &mut *std::hint::black_box(p) }
    } else {
        st
    }
}
