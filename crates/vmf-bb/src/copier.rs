//! Large copies shared with a helper thread: the emulated DMA engine of one-sided operations.
//!
//! An RDMA NIC moves a put's bytes while the CPU goes on (004_*); between processes of one host the bytes
//! are moved by a CPU, and one core copies at about half the rate two do (this 2-CPU machine, into a
//! shared mapping: 41-47 GB/s alone against 75-80 GB/s for two at 4 MiB). [`copy`] splits a copy of at
//! least [`configure`]'s threshold into chunks; the caller takes chunks from the front, a helper thread of
//! this process from the back, and the call returns when every chunk is copied, so it keeps `memcpy`'s
//! contract. [`copy_deferred`] returns once the caller's own chunks are done and leaves the helper's to the
//! next [`settle`]: one-sided puts and gets use it, since they complete at the next flush.
//!
//! - *No waiting on the helper to start.* A chunk is claimed by whoever takes it first (one CAS), so a
//!   helper that sleeps, is descheduled or is slow only means the caller copies more itself; the caller
//!   waits only for chunks the helper has claimed and is copying (at most one at a time).
//! - *One cache line between the two threads.* The job's addresses and the claim word, which also counts
//!   the helper's finished chunks, share a line: a copy costs two transfers of it between the cores (the
//!   helper reading the job, the caller seeing it done), which is what makes 64 KiB worth sharing.
//! - *The helper costs nothing when idle.* After its last chunk it polls for [`configure`]'s hot time
//!   (default 50 us: back-to-back puts keep it ready), then sleeps on a futex; a caller that finds it
//!   asleep rings it once (one system call per burst, never per small message: copies below the threshold
//!   never come here) and meanwhile copies on its own.
//! - *Stalls back off.* A caller that waits more than 100 us for a claimed chunk (the helper lost its CPU
//!   mid-chunk) copies alone for 10 ms, doubling on each further stall up to a second.
//! - *One job at a time.* Threads of one process share the helper: a caller that finds it taken by another
//!   thread copies alone.
//! - *Off unless there is a CPU for it*: the fabric enables it only when this host's ranks do not
//!   outnumber its CPUs and the process may run on more than one CPU (a rank pinned to one core has no
//!   second one to lend). Ranks that wait inside the library sleep after a short spin, which is when their
//!   core helps an origin's copy.
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

/// Smallest chunk, and the granularity of chunks (bytes).
const MIN_CHUNK: usize = 32 << 10;
/// Most chunks per copy (the claim word holds 8-bit counts).
const MAX_CHUNKS: usize = 16;

/// The job both threads work on, in one cache line. The claim word packs
/// `gen << 24 | lo << 16 | hi << 8 | done`: chunks `[lo, hi)` are unclaimed, the owner takes `lo`, the
/// helper `hi - 1`, and `done` counts the helper's finished chunks (the job is complete when `lo >= hi`
/// and `done == n - hi`). The other fields are written by the owner before the Release store of a new
/// generation and rewritten only once the previous job is complete, so a helper whose CAS succeeds read
/// the fields of that generation.
#[repr(C, align(128))]
struct Job {
    claim: AtomicU64,
    src: AtomicUsize,
    dst: AtomicUsize,
    len: AtomicUsize,
    chunk: AtomicUsize,
    n: AtomicU32,
    /// The CPU the owner ran on when it posted the job (`u32::MAX`: unknown).
    cpu: AtomicU32,
}

#[repr(C, align(128))]
struct Padded<T>(T);

static JOB: Job = Job {
    claim: AtomicU64::new(0),
    src: AtomicUsize::new(0),
    dst: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    chunk: AtomicUsize::new(0),
    n: AtomicU32::new(0),
    cpu: AtomicU32::new(u32::MAX),
};
/// Who has [`JOB`]: [`IDLE`], [`OWNED`] or [`IN_FLIGHT`].
static BUSY: Padded<AtomicU32> = Padded(AtomicU32::new(IDLE));
/// [`BUSY`] states: no job; a caller (or a thread completing a deferred job) owns it; a deferred job's
/// caller has returned and the helper may still be copying.
const IDLE: u32 = 0;
const OWNED: u32 = 1;
const IN_FLIGHT: u32 = 2;
/// 1 while the helper polls for work; 0 while it sleeps (or before it exists).
static HOT: Padded<AtomicU32> = Padded(AtomicU32::new(0));
/// The futex the helper sleeps on.
static BELL: Padded<AtomicU32> = Padded(AtomicU32::new(0));
/// Copies of at least this many bytes are shared (`usize::MAX`: never).
static MIN_LEN: AtomicUsize = AtomicUsize::new(usize::MAX);
/// How long the helper polls after its last chunk (nanoseconds).
static HOT_NS: AtomicU64 = AtomicU64::new(50_000);
static START: Once = Once::new();
/// Set once the helper thread runs.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Statistics: shared copies; chunks the helper copied; waits for the helper that paused sharing.
static JOBS: Padded<AtomicU64> = Padded(AtomicU64::new(0));
static HELPER_CHUNKS: Padded<AtomicU64> = Padded(AtomicU64::new(0));
static STALLS: Padded<AtomicU64> = Padded(AtomicU64::new(0));
static MOVES: Padded<AtomicU64> = Padded(AtomicU64::new(0));
/// Copies stay unshared until `PAUSE[0]` (nanoseconds on [`clock`]) after a caller waited long for the
/// helper; `PAUSE[1]` is the next such pause.
static PAUSE: Padded<[AtomicU64; 2]> = Padded([AtomicU64::new(0), AtomicU64::new(MIN_BACKOFF_NS)]);
/// A caller that waited this long (plus the time a slow copy of one chunk takes) for the helper's chunk
/// stops sharing for a while.
const STALL_NS: u64 = 100_000;
const MIN_BACKOFF_NS: u64 = 10_000_000;
const MAX_BACKOFF_NS: u64 = 1_000_000_000;

/// CLOCK_MONOTONIC, nanoseconds.
#[inline(always)]
fn clock() -> u64 {
    vmf_pal::monotonic_ns()
}

/// The beacon: two words (`until`, `kernel`) in shared memory where a posted job announces that the helper
/// wants a CPU until `until` (CLOCK_MONOTONIC ns), so that ranks waiting on this kernel stop spinning (a
/// spinning rank on the helper's CPU would leave it a time slice at a time, and the caller would wait for
/// a chunk it had claimed). Null: nowhere to announce.
static BEACON: Padded<AtomicPtr<AtomicU64>> = Padded(AtomicPtr::new(std::ptr::null_mut()));
/// This process's kernel id, written beside `until`.
static BEACON_KERNEL: AtomicU64 = AtomicU64::new(0);
/// Threads writing through [`BEACON`] right now ([`set_beacon`] waits for them before it returns).
static BEACON_USERS: Padded<AtomicU32> = Padded(AtomicU32::new(0));
/// The `until` this process wrote last (it writes again only when half of it has passed).
static BEACON_LAST: Padded<AtomicU64> = Padded(AtomicU64::new(0));
/// How long an announcement lasts (readers treat one further ahead as another kernel's clock).
pub const BEACON_NS: u64 = 200_000;

/// Announce jobs at `words` (`until`, then `kernel`, two consecutive words) from now on, as kernel
/// `kernel`; null: nowhere. Returns once no thread writes through the previous pointer any more.
///
/// # Safety
/// A non-null `words` must point to two `AtomicU64` that stay valid until the next `set_beacon` returns.
pub unsafe fn set_beacon(words: *const AtomicU64, kernel: u64) {
    BEACON_KERNEL.store(kernel, Ordering::Relaxed);
    BEACON_LAST.0.store(0, Ordering::Relaxed);
    BEACON.0.store(words as *mut AtomicU64, Ordering::SeqCst);
    while BEACON_USERS.0.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
}

/// Tell waiting ranks that the helper wants a CPU for the next [`BEACON_NS`].
#[inline]
fn announce(now: u64) {
    if now + BEACON_NS / 2 < BEACON_LAST.0.load(Ordering::Relaxed) {
        return;
    }
    BEACON_USERS.0.fetch_add(1, Ordering::SeqCst);
    let p = BEACON.0.load(Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: valid until `set_beacon` replaces it, which waits for us (BEACON_USERS).
        unsafe {
            (*p.add(1)).store(BEACON_KERNEL.load(Ordering::Relaxed), Ordering::Relaxed);
            (*p).store(now + BEACON_NS, Ordering::Relaxed);
        }
    }
    BEACON_USERS.0.fetch_sub(1, Ordering::Release);
    BEACON_LAST.0.store(now + BEACON_NS, Ordering::Relaxed);
}

/// (lo, hi, done) of a claim word.
#[inline(always)]
fn unpack(w: u64) -> (u64, u64, u64) {
    ((w >> 16) & 0xff, (w >> 8) & 0xff, w & 0xff)
}

/// Share copies of at least `min_len` bytes with the helper (`None`: never), which polls `hot` after its
/// last chunk before it sleeps. Takes effect for the next copy; the helper thread starts on the first copy
/// that uses it. Returns whether sharing is on: it stays off, whatever is asked, in a process that may run
/// on only one CPU.
pub fn configure(min_len: Option<usize>, hot: Duration) -> bool {
    let on = min_len.is_some() && vmf_pal::available_cpus() > 1;
    HOT_NS.store(hot.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    MIN_LEN.store(
        if on { min_len.unwrap_or(usize::MAX).max(2 * MIN_CHUNK) } else { usize::MAX },
        Ordering::Relaxed,
    );
    on
}

/// The threshold in force (`None`: copies are never shared).
pub fn threshold() -> Option<usize> {
    Some(MIN_LEN.load(Ordering::Relaxed)).filter(|&m| m != usize::MAX)
}

/// True once the helper thread exists (it stays for the life of the process). Between jobs it touches
/// nothing but this module's statics and its own stack; [`settle`] ends the last job.
pub fn helper_exists() -> bool {
    STARTED.load(Ordering::Acquire)
}

/// What sharing did in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Copies shared with the helper.
    pub jobs: u64,
    /// Chunks the helper copied.
    pub helper_chunks: u64,
    /// Waits for the helper long enough to pause sharing.
    pub stalls: u64,
    /// Times the helper moved itself off its caller's CPU.
    pub moves: u64,
}

/// What sharing did in this process so far.
pub fn stats() -> Stats {
    Stats {
        jobs: JOBS.0.load(Ordering::Relaxed),
        helper_chunks: HELPER_CHUNKS.0.load(Ordering::Relaxed),
        stalls: STALLS.0.load(Ordering::Relaxed),
        moves: MOVES.0.load(Ordering::Relaxed),
    }
}

/// Chunk size for a copy of `len` bytes: at least [`MIN_CHUNK`], at most [`MAX_CHUNKS`] chunks, whole
/// multiples of 4 KiB (page-aligned pieces of page-aligned buffers).
fn chunk_for(len: usize) -> usize {
    len.div_ceil(MAX_CHUNKS).div_ceil(4096).max(MIN_CHUNK / 4096) * 4096
}

/// Where chunk `i` of a job starts: every chunk but the first starts on a page of the destination, so
/// that no cache line of it is written by both threads (a line written from both cores bounces between
/// them; a destination 16 bytes off a line made a shared 64 KiB copy up to 1.5x slower than one
/// thread's).
#[inline(always)]
fn chunk_start(dst: usize, len: usize, chunk: usize, i: u64) -> usize {
    if i == 0 {
        return 0;
    }
    ((dst + i as usize * chunk).next_multiple_of(4096) - dst).min(len)
}

/// Copy chunk `i` of a job.
///
/// # Safety
/// The job's buffers are valid for its length (the caller of [`copy`] guarantees it until every chunk is
/// done).
#[inline]
unsafe fn copy_chunk(src: usize, dst: usize, len: usize, chunk: usize, i: u64) {
    let off = chunk_start(dst, len, chunk, i);
    let end = chunk_start(dst, len, chunk, i + 1);
    std::ptr::copy_nonoverlapping((src + off) as *const u8, (dst + off) as *mut u8, end - off);
}

/// Copy `len` bytes from `src` to `dst`, which must not overlap; shared with the helper thread when
/// sharing is on and `len` reaches the threshold. Complete on return, as `memcpy`.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `len` bytes, not
/// overlapping.
#[inline]
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    copy_maybe_shared(dst, src, len, false);
}

/// A plain copy below the threshold; else shared (`defer`: as [`copy_deferred`]).
#[inline(always)]
unsafe fn copy_maybe_shared(dst: *mut u8, src: *const u8, len: usize, defer: bool) {
    if len < MIN_LEN.load(Ordering::Relaxed) {
        std::ptr::copy_nonoverlapping(src, dst, len);
    } else {
        shared(dst, src, len, defer);
    }
}

/// [`copy`], except that it may return while the helper still copies its last chunks: the copy is
/// complete after the next [`settle`] (or the next shared copy of any thread of this process). The caller
/// takes its share and goes on, so the helper's share of one copy overlaps the caller's share of the next,
/// and no copy waits for the other CPU.
///
/// # Safety
/// As [`copy`], for as long as the copy is not settled: `src` must stay unchanged and readable, `dst`
/// writable and unread until [`settle`] returns.
#[inline]
pub unsafe fn copy_deferred(dst: *mut u8, src: *const u8, len: usize) {
    copy_maybe_shared(dst, src, len, true);
}

/// Complete every copy of this process that [`copy_deferred`] left to the helper (an unclaimed chunk is
/// copied here; one the helper is copying is waited for). One load when nothing is outstanding.
#[inline]
pub fn settle() {
    if BUSY.0.load(Ordering::Acquire) != IDLE {
        settle_slow();
    }
}

#[cold]
fn settle_slow() {
    let mut spins = 0u32;
    loop {
        match BUSY.0.load(Ordering::Acquire) {
            IDLE => return,
            IN_FLIGHT => {
                if BUSY
                    .0
                    .compare_exchange(IN_FLIGHT, OWNED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    // SAFETY: we own the job; its caller's buffers are valid until it is settled.
                    unsafe { complete_job() };
                    BUSY.0.store(IDLE, Ordering::Release);
                    return;
                }
            }
            // Another thread is copying (perhaps completing ours): it ends soon, unless it shares our CPU.
            _ => {
                spins += 1;
                if spins % 1024 == 0 {
                    vmf_pal::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// Claim chunks of the owned job from the front and copy them; returns the claim word last seen, in which
/// nothing is left unclaimed.
///
/// # Safety
/// The caller owns the job (its buffers valid).
unsafe fn claim_front() -> u64 {
    let (src, dst, len, chunk) = (
        JOB.src.load(Ordering::Relaxed),
        JOB.dst.load(Ordering::Relaxed),
        JOB.len.load(Ordering::Relaxed),
        JOB.chunk.load(Ordering::Relaxed),
    );
    let mut w = JOB.claim.load(Ordering::Acquire);
    loop {
        let (lo, hi, _) = unpack(w);
        if lo >= hi {
            return w;
        }
        match JOB
            .claim
            .compare_exchange_weak(w, w + (1 << 16), Ordering::Acquire, Ordering::Acquire)
        {
            Ok(_) => {
                copy_chunk(src, dst, len, chunk, lo);
                w = JOB.claim.load(Ordering::Acquire);
            }
            Err(cur) => w = cur,
        }
    }
}

/// Whether the claim word `w` of a job of `n` chunks says it is complete.
#[inline(always)]
fn complete(w: u64, n: u64) -> bool {
    let (lo, hi, done) = unpack(w);
    lo >= hi && done == n - hi
}

/// Finish the owned job: take what is unclaimed, wait for the helper's chunks. A chunk takes a few
/// microseconds; a helper that takes longer lost its CPU mid-chunk (perhaps to us: we then yield), and
/// sharing pauses for a while, longer after each such stall.
///
/// # Safety
/// The caller owns the job (its buffers valid).
unsafe fn complete_job() {
    let n = JOB.n.load(Ordering::Relaxed) as u64;
    let chunk = JOB.chunk.load(Ordering::Relaxed) as u64;
    let mut w = claim_front();
    let mut spins = 0u32;
    let mut since = None;
    while !complete(w, n) {
        std::hint::spin_loop();
        spins += 1;
        if spins % 1024 == 0 {
            let t0 = *since.get_or_insert_with(clock);
            if clock() - t0 > 2 * chunk / 1024 + 2_000 {
                vmf_pal::yield_now();
            }
        }
        w = JOB.claim.load(Ordering::Acquire);
    }
    // Normal for the helper's last chunk: its copy at a slow 2 bytes a nanosecond.
    if since.is_some_and(|t0| clock() - t0 > STALL_NS + chunk / 2) {
        let b = PAUSE.0[1].load(Ordering::Relaxed);
        PAUSE.0[0].store(clock() + b, Ordering::Relaxed);
        PAUSE.0[1].store((b * 2).min(MAX_BACKOFF_NS), Ordering::Relaxed);
        STALLS.0.fetch_add(1, Ordering::Relaxed);
    } else if unpack(w).2 > 0 && PAUSE.0[1].load(Ordering::Relaxed) != MIN_BACKOFF_NS {
        PAUSE.0[1].store(MIN_BACKOFF_NS, Ordering::Relaxed);
    }
}

#[cold]
unsafe fn shared(dst: *mut u8, src: *const u8, len: usize, defer: bool) {
    // Own the job slot, completing a deferred job first; another thread's copy in progress means this one
    // is copied alone.
    loop {
        match BUSY.0.compare_exchange(IDLE, OWNED, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => break,
            Err(IN_FLIGHT) => {
                if BUSY
                    .0
                    .compare_exchange(IN_FLIGHT, OWNED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    complete_job();
                    break;
                }
            }
            Err(_) => {
                std::ptr::copy_nonoverlapping(src, dst, len);
                return;
            }
        }
    }
    let now = clock();
    if now < PAUSE.0[0].load(Ordering::Relaxed) {
        // Paused after a stall.
        BUSY.0.store(IDLE, Ordering::Release);
        std::ptr::copy_nonoverlapping(src, dst, len);
        return;
    }
    START.call_once(|| {
        // The helper inherits this thread's CPUs: it needs one more than us (a rank pinned to one core
        // since the fabric was configured has none to lend).
        if vmf_pal::process::allowed_cpus().len() > 1
            && std::thread::Builder::new()
                .name("vmf-copier".into())
                .spawn(helper)
                .is_ok()
        {
            STARTED.store(true, Ordering::Release);
            // SAFETY: registering a handler that only stores to atomics (async-signal-safe).
            unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        } else {
            MIN_LEN.store(usize::MAX, Ordering::Relaxed);
        }
    });
    if !STARTED.load(Ordering::Acquire) {
        BUSY.0.store(IDLE, Ordering::Release);
        std::ptr::copy_nonoverlapping(src, dst, len);
        return;
    }
    let chunk = chunk_for(len);
    let n = len.div_ceil(chunk) as u64;
    JOB.src.store(src as usize, Ordering::Relaxed);
    JOB.dst.store(dst as usize, Ordering::Relaxed);
    JOB.len.store(len, Ordering::Relaxed);
    JOB.chunk.store(chunk, Ordering::Relaxed);
    JOB.n.store(n as u32, Ordering::Relaxed);
    JOB.cpu.store(vmf_pal::process::current_cpu().map_or(u32::MAX, |c| c as u32), Ordering::Relaxed);
    // The owner holds chunk 0 from the start (lo = 1).
    let gen = (JOB.claim.load(Ordering::Relaxed) >> 24).wrapping_add(1) & ((1 << 40) - 1);
    JOB.claim.store(gen << 24 | 1 << 16 | n << 8, Ordering::Release);
    JOBS.0.fetch_add(1, Ordering::Relaxed);
    announce(now);
    // Dekker with a helper going to sleep (it stores HOT = 0, fences, then looks at the claim): one of us
    // sees the other's store.
    fence(Ordering::SeqCst);
    if HOT.0.load(Ordering::Relaxed) == 0 {
        BELL.0.fetch_add(1, Ordering::Release);
        vmf_pal::futex::wake(&BELL.0, 1);
    }
    copy_chunk(src as usize, dst as usize, len, chunk, 0);
    let w = claim_front();
    if defer && !complete(w, n) {
        // The helper has the rest in hand: whoever settles next waits for it.
        BUSY.0.store(IN_FLIGHT, Ordering::Release);
        return;
    }
    complete_job();
    BUSY.0.store(IDLE, Ordering::Release);
}

/// A child of `fork()` has no helper thread: it copies alone from then on, and a job the helper had in
/// hand counts as done (MPI programs do not fork with an epoch open).
extern "C" fn after_fork_in_child() {
    MIN_LEN.store(usize::MAX, Ordering::Relaxed);
    STARTED.store(false, Ordering::Relaxed);
    HOT.0.store(0, Ordering::Relaxed);
    BEACON.0.store(std::ptr::null_mut(), Ordering::Relaxed);
    BEACON_USERS.0.store(0, Ordering::Relaxed);
    BUSY.0.store(IDLE, Ordering::Release);
}

/// The helper thread: take chunks from the back of the current job while any are unclaimed; poll for the
/// hot time after the last one, then sleep until a caller rings.
///
/// A helper on its caller's CPU only takes turns with it (and its polling halves the caller's rate): the
/// kernel places a new or woken thread beside its waker when every other CPU is busy, and may leave it
/// there for milliseconds after another CPU goes idle (it is cache-hot). On a job from the CPU it runs
/// on, the helper moves itself off that CPU first (`leave_cpu`, at most once a millisecond).
fn helper() {
    // Signals for the process go to the application's threads, never to this one.
    // SAFETY: a full set, blocked for this thread only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    HOT.0.store(1, Ordering::SeqCst);
    let mut idle_since = clock();
    let mut polls = 0u32;
    let mut seen_gen = 0u64;
    let mut moved_at = 0u64;
    loop {
        let mut w = JOB.claim.load(Ordering::Acquire);
        let (lo, hi, _) = unpack(w);
        if lo < hi && w >> 24 != seen_gen {
            seen_gen = w >> 24;
            let cpu = JOB.cpu.load(Ordering::Relaxed);
            let now = clock();
            if now - moved_at > 1_000_000
                && vmf_pal::process::current_cpu().is_some_and(|c| c as u32 == cpu)
                && vmf_pal::process::leave_cpu(cpu as usize, &vmf_pal::process::allowed_cpus()).is_ok()
            {
                moved_at = now;
                MOVES.0.fetch_add(1, Ordering::Relaxed);
            }
            w = JOB.claim.load(Ordering::Acquire);
        }
        let (lo, hi, _) = unpack(w);
        if lo < hi {
            let (src, dst, len, chunk) = (
                JOB.src.load(Ordering::Relaxed),
                JOB.dst.load(Ordering::Relaxed),
                JOB.len.load(Ordering::Relaxed),
                JOB.chunk.load(Ordering::Relaxed),
            );
            if JOB
                .claim
                .compare_exchange(w, w - (1 << 8), Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                #[cfg(test)]
                tests::helper_delay();
                // SAFETY: the claim succeeded in this generation with chunks left, so the job is not
                // complete: its owner keeps the buffers valid until our chunk is counted, and the fields
                // read above are its job's.
                unsafe { copy_chunk(src, dst, len, chunk, hi - 1) };
                // Count it in the claim word (the generation cannot change before it is counted).
                JOB.claim.fetch_add(1, Ordering::Release);
                HELPER_CHUNKS.0.fetch_add(1, Ordering::Relaxed);
            }
            polls = 0;
            idle_since = clock();
            continue;
        }
        std::hint::spin_loop();
        polls += 1;
        if polls % 64 != 0 || clock() - idle_since < HOT_NS.load(Ordering::Relaxed) {
            continue;
        }
        let bell = BELL.0.load(Ordering::Acquire);
        HOT.0.store(0, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let (lo, hi, _) = unpack(JOB.claim.load(Ordering::Acquire));
        if lo >= hi {
            vmf_pal::futex::wait(&BELL.0, bell, None);
        }
        HOT.0.store(1, Ordering::SeqCst);
        polls = 0;
        idle_since = clock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Mutex, MutexGuard};

    /// The copier is one per process: its tests take turns.
    fn serial() -> MutexGuard<'static, ()> {
        static M: Mutex<()> = Mutex::new(());
        M.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nanoseconds the helper waits between claiming a chunk and copying it (tests only): a caller that
    /// did not wait for the helper's chunks would then read them unwritten every time.
    static DELAY_NS: AtomicU64 = AtomicU64::new(0);

    pub(super) fn helper_delay() {
        let d = DELAY_NS.load(Ordering::Relaxed);
        if d > 0 {
            let t0 = clock();
            while clock() - t0 < d {
                std::hint::spin_loop();
            }
        }
    }

    fn pattern(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// The first byte where `a` and `b` differ, looking from the end (where the helper's chunks are).
    fn differs_from_the_end(a: &[u8], b: &[u8]) -> Option<usize> {
        (0..a.len()).rev().find(|&i| a[i] != b[i])
    }

    fn two_cpus() -> bool {
        vmf_pal::process::allowed_cpus().len() > 1
    }

    #[test]
    fn chunks_tile_the_copy_and_start_on_destination_pages() {
        for dst in [0x1000usize, 0x1010, 0x1fff, 0x7f00_0000_0e90] {
            for len in [64 << 10, (64 << 10) + 1, 100_000, (4 << 20) - 3] {
                let c = chunk_for(len);
                let n = len.div_ceil(c) as u64;
                assert_eq!(chunk_start(dst, len, c, 0), 0);
                assert_eq!(chunk_start(dst, len, c, n), len);
                for i in 1..n {
                    let (a, b) = (chunk_start(dst, len, c, i), chunk_start(dst, len, c, i + 1));
                    assert!(a <= b && b - a <= c + 4096, "dst {dst:#x} len {len}: chunk {i} is {a}..{b}");
                    assert!(a == len || (dst + a) % 4096 == 0);
                }
            }
        }
    }

    #[test]
    fn chunks_cover_the_copy_in_page_multiples() {
        for len in [32 << 10, 64 << 10, (64 << 10) + 1, 1 << 20, (4 << 20) - 3, 64 << 20] {
            let c = chunk_for(len);
            assert_eq!(c % 4096, 0);
            assert!(c >= MIN_CHUNK);
            let n = len.div_ceil(c);
            assert!((1..=MAX_CHUNKS).contains(&n), "{len}: {n} chunks of {c}");
        }
    }

    /// Every size around the threshold and the chunk boundaries, plain and deferred, with several threads
    /// copying at once (one gets the helper, the others copy alone, deferred jobs are completed by
    /// whichever thread comes next) and the helper asleep, hot and racing: every byte lands, nothing outside
    /// the destination is touched, and the helper took part.
    #[test]
    fn shared_copies_are_exact_from_several_threads_and_after_sleeps() {
        let _s = serial();
        configure(Some(64 << 10), Duration::from_micros(20));
        let sizes = [1usize, 4095, 64 << 10, (64 << 10) + 1, 100_000, (1 << 20) + 12_345, (4 << 20) + 7];
        let before = stats();
        let threads: Vec<_> = (0..3)
            .map(|t| {
                std::thread::spawn(move || {
                    for round in 0..40u64 {
                        for &n in &sizes {
                            let src = pattern(n, round * 31 + t + n as u64);
                            // Guard bytes on both sides of the destination.
                            let mut dst = vec![0xa5u8; n + 128];
                            // SAFETY: distinct vectors of the right lengths, settled before they are read.
                            unsafe {
                                if (round + t) % 2 == 0 {
                                    copy_deferred(dst.as_mut_ptr().add(64), src.as_ptr(), n);
                                    settle();
                                } else {
                                    copy(dst.as_mut_ptr().add(64), src.as_ptr(), n);
                                }
                            }
                            assert!(dst[..64].iter().all(|&b| b == 0xa5), "{n}: written before");
                            assert!(dst[64 + n..].iter().all(|&b| b == 0xa5), "{n}: written after");
                            let bad = differs_from_the_end(&dst[64..64 + n], &src);
                            assert!(bad.is_none(), "{n} bytes, round {round}: byte {bad:?} differs");
                        }
                        if round % 10 == 9 {
                            // Let the helper fall asleep: the next copies must ring it.
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // On a loaded machine the helper may not have run yet: give it up to 20 s of large copies.
        let (src, mut dst) = (pattern(4 << 20, 5), vec![0u8; 4 << 20]);
        let t0 = std::time::Instant::now();
        while two_cpus() && stats().helper_chunks == before.helper_chunks && t0.elapsed() < Duration::from_secs(20) {
            PAUSE.0[0].store(0, Ordering::Relaxed);
            // SAFETY: distinct vectors of the right lengths.
            unsafe { copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
            assert!(differs_from_the_end(&dst, &src).is_none());
        }
        let after = stats();
        assert!(after.jobs > before.jobs, "no copy was shared: {after:?}");
        if two_cpus() {
            assert!(after.helper_chunks > before.helper_chunks, "the helper never copied a chunk: {after:?}");
        }
    }

    /// Deferred copies back to back into one buffer, settled only at the end (as puts between flushes),
    /// with the helper slowed down between its claim and its copy: each copy completes before the next
    /// starts and settle waits for the helper's last chunk, so the last copy's bytes are what remains
    /// (without the wait the helper's chunk would be found unwritten every time).
    #[test]
    fn deferred_copies_complete_at_settle() {
        let _s = serial();
        configure(Some(64 << 10), Duration::from_micros(50));
        // Well under a stall (which would pause sharing), far longer than the caller's own chunks.
        DELAY_NS.store(50_000, Ordering::Relaxed);
        PAUSE.0[0].store(0, Ordering::Relaxed);
        let n = 256 << 10;
        let srcs: Vec<Vec<u8>> = (0..4).map(|k| pattern(n, 1000 + k)).collect();
        let mut dst = vec![0u8; n];
        let before = stats();
        // On a loaded machine the helper may not run for a while: go on until it took part often enough.
        let t0 = std::time::Instant::now();
        let mut round = 0;
        while round < 20
            || (two_cpus()
                && stats().helper_chunks < before.helper_chunks + 20
                && t0.elapsed() < Duration::from_secs(20))
        {
            // A stall (the helper descheduled on a busy machine) would pause sharing: not what is tested.
            PAUSE.0[0].store(0, Ordering::Relaxed);
            for s in &srcs {
                // SAFETY: every source outlives the settle below; dst is read only after it.
                unsafe { copy_deferred(dst.as_mut_ptr(), s.as_ptr(), n) };
            }
            settle();
            let bad = differs_from_the_end(&dst, &srcs[3]);
            assert!(bad.is_none(), "round {round}: byte {bad:?} differs");
            round += 1;
        }
        DELAY_NS.store(0, Ordering::Relaxed);
        let after = stats();
        assert!(after.jobs >= before.jobs + 4, "copies were not shared: {after:?}");
        if two_cpus() {
            assert!(after.helper_chunks > before.helper_chunks, "the helper never copied a chunk in 20 s: {after:?}");
        }
    }

    #[test]
    fn off_means_plain_copies() {
        let _s = serial();
        configure(None, Duration::from_micros(50));
        assert_eq!(threshold(), None);
        let before = stats();
        let src = pattern(1 << 20, 9);
        let mut dst = vec![0u8; 1 << 20];
        // SAFETY: distinct vectors of the right lengths.
        unsafe { copy_deferred(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
        assert!(dst == src);
        assert_eq!(stats().jobs, before.jobs);
    }
}
