//! MPI_THREAD_MULTIPLE: one lock around the library, handed over while a thread waits.
//!
//! When a program asks for `MPI_THREAD_MULTIPLE`, every MPI call takes the library lock on entry and
//! gives it back on return ([`enter`]); the lock is recursive, so callbacks that call MPI (reduction
//! operations, error handlers, attribute callbacks) work. A thread that has to wait (for a message, a
//! collective, a lock on a window) does not keep the lock: between its polls the engine calls
//! [`hook`], which, when other threads wait for the lock, releases it, yields the CPU and takes it back.
//! The lock is a futex mutex (spin briefly, yield the CPU a few times, then sleep; a holder that waits
//! hands the lock over whenever any thread tries to take it), deliberately not a first-come-first-served
//! queue: with more threads than cores a queued thread may be off the CPU, and a queue would make every
//! other thread wait for it.
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
/// The lock word: 0 free, 1 held, 2 held and somebody may sleep on it (a futex mutex).
static LOCK: AtomicU32 = AtomicU32::new(0);
/// The owner's thread token (0: nobody) and how many times it entered.
static OWNER: AtomicU64 = AtomicU64::new(0);
/// Written only by the thread that holds the lock word (plain loads and stores, no read-modify-write: an
/// MPI call under MPI_THREAD_MULTIPLE costs two atomic instructions, the lock word's, even when nested,
/// as the `_c` forms are).
static DEPTH: AtomicU32 = AtomicU32::new(0);

/// Take the owner's depth and leave 0 (the owner only).
#[inline]
fn take_depth() -> u32 {
    let d = DEPTH.load(Ordering::Relaxed);
    DEPTH.store(0, Ordering::Relaxed);
    d
}
static TOKENS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TOKEN: Cell<u64> = const { Cell::new(0) };
    /// The depth a sleeping thread held the lock at (restored when it wakes).
    static SLEEP_DEPTH: Cell<u32> = const { Cell::new(0) };
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
        DEPTH.store(DEPTH.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        return;
    }
    lock_word();
    OWNER.store(me, Ordering::Relaxed);
    DEPTH.store(1, Ordering::Relaxed);
}

/// Take the lock word: spin briefly, then sleep in the kernel. Not first-come first-served on purpose:
/// with more threads than cores a queued thread may be descheduled, and a strict queue would make every
/// other thread wait for it; here whoever runs takes the lock.
fn lock_word() {
    if LOCK
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
    {
        return;
    }
    WAITERS.fetch_add(1, Ordering::Relaxed);
    let try_take = || {
        LOCK.load(Ordering::Relaxed) == 0
            && LOCK
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    };
    // Spin, then yield the CPU (the holder may be waiting for the CPU this thread runs on: more threads
    // than cores), then sleep in the kernel.
    let mut got = false;
    for k in 0..(100 + YIELDS) {
        if k < 100 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        if try_take() {
            got = true;
            break;
        }
    }
    if !got {
        while LOCK.swap(2, Ordering::Acquire) != 0 {
            vmf_pal::futex::wait(&LOCK, 2, None);
        }
    }
    WAITERS.fetch_sub(1, Ordering::Relaxed);
}

/// Threads trying to take the lock (spinning, yielding or asleep).
static WAITERS: AtomicU32 = AtomicU32::new(0);
/// How many times a thread yields for the lock before it sleeps.
const YIELDS: u32 = 64;

fn unlock_word() {
    if LOCK.swap(0, Ordering::Release) == 2 {
        vmf_pal::futex::wake(&LOCK, 1);
    }
}

fn release() {
    let d = DEPTH.load(Ordering::Relaxed);
    DEPTH.store(d - 1, Ordering::Relaxed);
    if d == 1 {
        OWNER.store(0, Ordering::Relaxed);
        unlock_word();
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

/// Let the threads waiting for the lock run, then take it back (at the same depth). Cheap when nobody
/// waits.
#[inline]
pub(crate) fn let_others_in() {
    if !on() || WAITERS.load(Ordering::Relaxed) == 0 || OWNER.load(Ordering::Relaxed) != me() {
        return;
    }
    let depth = take_depth();
    OWNER.store(0, Ordering::Relaxed);
    unlock_word();
    // Give the woken thread the CPU before competing for the lock again.
    std::thread::yield_now();
    lock_word();
    OWNER.store(me(), Ordering::Relaxed);
    DEPTH.store(depth, Ordering::Relaxed);
}

/// Run `f` without the library lock (a wait in the kernel for something outside the engine, e.g. a
/// socket), then take the lock back at the same depth. The caller must re-read the library state after.
pub(crate) fn unlocked<T>(f: impl FnOnce() -> T) -> T {
    if !on() || OWNER.load(Ordering::Relaxed) != me() {
        return f();
    }
    let depth = take_depth();
    OWNER.store(0, Ordering::Relaxed);
    unlock_word();
    let r = f();
    lock_word();
    OWNER.store(me(), Ordering::Relaxed);
    DEPTH.store(depth, Ordering::Relaxed);
    r
}

/// The engine's yield hook (installed when `MPI_THREAD_MULTIPLE` is granted).
///
/// # Safety
/// Called by the engine with a pointer to itself; the pointer is handed to an opaque point so that the
/// waiting code reloads the engine after other threads used it.
pub(crate) unsafe fn hook(e: *mut vmf_core::engine::Engine, at: vmf_core::engine::HookPoint) {
    use vmf_core::engine::HookPoint;
    std::hint::black_box(e);
    match at {
        HookPoint::Poll => let_others_in(),
        HookPoint::Sleep => {
            SLEEP_DEPTH.with(|d| d.set(take_depth()));
            OWNER.store(0, Ordering::Relaxed);
            unlock_word();
        }
        HookPoint::Wake => {
            lock_word();
            OWNER.store(me(), Ordering::Relaxed);
            DEPTH.store(SLEEP_DEPTH.with(|d| d.get()), Ordering::Relaxed);
        }
    }
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
