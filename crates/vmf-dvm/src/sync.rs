//! Mutexes, barriers and signals of DASS (`lock`/`unlock`, `barr`, `wait`/`signal`: the instructions
//! 004_* left unimplemented), shared by every node of an application, on one-sided atomics.
//!
//! Objects live in a table on the first page node: 4096 slots of one cache line, found by hashing the
//! object's number (linear probing; a slot is claimed by compare-and-swap of its claim word, then its
//! number is written). A slot holds a
//! mutex word (the holder's owner id, 0 when free), a signal count and a barrier word
//! (`generation:32 | arrived:32`). Mutex 5, barrier 5 and signal 5 are three objects.
//!
//! The table's header counts the application's running threads, the blocked ones and every event that
//! can unblock one (progress). A thread that has been blocked for a while checks them: when every
//! running thread is blocked and nothing happened across two checks 50 ms apart, the application is
//! deadlocked, and the thread traps.
use crate::backend::{BResult, Backend};
use crate::space::backoff;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const SLOTS: usize = 4096;
pub const SLOT_BYTES: usize = 64;
const HEADER: usize = 64;
/// Bytes of the table (header and slots).
pub const TABLE_BYTES: usize = HEADER + SLOTS * SLOT_BYTES;

/// Offset in the header of the count of running threads.
pub const ALIVE: usize = 0;
const BLOCKED: usize = 8;
const PROGRESS: usize = 16;
/// Set by the thread that finds the application deadlocked, so every blocked thread ends too.
const DEADLOCKED: usize = 32;
/// The application's poll word: a thread waiting for a page changes it, so compiled loops elsewhere
/// stop at a safe point (where a holder gives the page up once its lease has run).
const POLL: usize = 40;
/// How many lines of the application's input `in` instructions have taken.
const INPUT: usize = 48;

const KEY: usize = 0;
const MUTEX: usize = 8;
const SEM: usize = 16;
const BARRIER: usize = 24;
/// 0: free slot, 1: being claimed, 2: KEY holds the object's number.
const CLAIM: usize = 32;

/// Why a synchronisation instruction failed.
#[derive(Debug)]
pub enum SyncError {
    Backend(String),
    Deadlock,
    Stopped,
    /// The instruction is used wrongly (the message says how).
    Misuse(String),
}

impl From<String> for SyncError {
    fn from(s: String) -> SyncError {
        SyncError::Backend(s)
    }
}

/// The application's synchronisation table, as one node sees it.
pub struct SyncTable<'a> {
    b: &'a dyn Backend,
    t: usize,
    base: usize,
    slots: Mutex<HashMap<i64, usize>>,
}

fn hash(k: i64) -> usize {
    let x = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 40) as usize % SLOTS
}

impl<'a> SyncTable<'a> {
    /// The table at byte `base` of rank `t`'s window.
    pub fn new(b: &'a dyn Backend, t: usize, base: usize) -> SyncTable<'a> {
        SyncTable {
            b,
            t,
            base,
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, key: i64) -> Result<usize, SyncError> {
        if let Some(&s) = self.slots.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(s);
        }
        let mut i = hash(key);
        for _ in 0..SLOTS {
            let off = self.base + HEADER + i * SLOT_BYTES;
            let mut spins = 0;
            loop {
                match self.b.load(self.t, off + CLAIM)? {
                    0 => {
                        if self.b.cas(self.t, off + CLAIM, 0, 1)? == 0 {
                            self.b.store(self.t, off + KEY, key as u64)?;
                            self.b.store(self.t, off + CLAIM, 2)?;
                            self.slots.lock().unwrap_or_else(|p| p.into_inner()).insert(key, off);
                            return Ok(off);
                        }
                    }
                    1 => backoff(&mut spins), // being claimed: its key is on the way
                    _ => break,
                }
            }
            if self.b.load(self.t, off + KEY)? == key as u64 {
                self.slots.lock().unwrap_or_else(|p| p.into_inner()).insert(key, off);
                return Ok(off);
            }
            i = (i + 1) % SLOTS;
        }
        Err(SyncError::Misuse(format!("more than {SLOTS} synchronisation objects")))
    }

    /// The poll word, where it is mapped here.
    pub fn poll_word(&self) -> Option<&'a std::sync::atomic::AtomicU64> {
        let p = self.b.frame(self.t, self.base + POLL)?;
        if !(p as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: an aligned word of the table, mapped for as long as the backend lives.
        Some(unsafe { &*(p as *const std::sync::atomic::AtomicU64) })
    }

    /// The index of the next input line (each `in` of any node takes the next one).
    pub fn next_input(&self) -> BResult<u64> {
        self.b.fetch_add(self.t, self.base + INPUT, 1)
    }

    /// A thread starts running.
    pub fn thread_started(&self) -> BResult<()> {
        self.b.fetch_add(self.t, self.base + ALIVE, 1)?;
        self.progress()
    }

    /// A thread has ended.
    pub fn thread_ended(&self) -> BResult<()> {
        self.b.fetch_add(self.t, self.base + ALIVE, u64::MAX)?;
        self.progress()
    }

    /// Something happened that may unblock a thread.
    pub fn progress(&self) -> BResult<()> {
        self.b.fetch_add(self.t, self.base + PROGRESS, 1).map(|_| ())
    }

    /// Wait until `ready()` holds, counted as blocked, with deadlock detection.
    pub fn block(&self, stop: &AtomicBool, mut ready: impl FnMut() -> Result<bool, SyncError>) -> Result<(), SyncError> {
        if ready()? {
            return Ok(());
        }
        self.b.fetch_add(self.t, self.base + BLOCKED, 1)?;
        let r = self.block_counted(stop, &mut ready);
        self.b.fetch_add(self.t, self.base + BLOCKED, u64::MAX)?;
        r
    }

    fn block_counted(&self, stop: &AtomicBool, ready: &mut impl FnMut() -> Result<bool, SyncError>) -> Result<(), SyncError> {
        let mut spins = 0u32;
        let mut next_check = Instant::now() + Duration::from_millis(50);
        let mut suspect: Option<u64> = None;
        loop {
            if ready()? {
                return Ok(());
            }
            if stop.load(Ordering::Relaxed) {
                return Err(SyncError::Stopped);
            }
            backoff(&mut spins);
            let now = Instant::now();
            if now >= next_check {
                next_check = now + Duration::from_millis(50);
                let alive = self.b.load(self.t, self.base + ALIVE)?;
                let blocked = self.b.load(self.t, self.base + BLOCKED)?;
                let progress = self.b.load(self.t, self.base + PROGRESS)?;
                if self.b.load(self.t, self.base + DEADLOCKED)? != 0 {
                    return Err(SyncError::Deadlock);
                }
                if blocked >= alive && alive > 0 {
                    if suspect == Some(progress) && !ready()? {
                        self.b.store(self.t, self.base + DEADLOCKED, 1)?;
                        return Err(SyncError::Deadlock);
                    }
                    suspect = Some(progress);
                } else {
                    suspect = None;
                }
            }
        }
    }

    /// `lock d`.
    pub fn lock(&self, key: i64, me: u64, stop: &AtomicBool) -> Result<(), SyncError> {
        let s = self.slot(key)?;
        let cur = self.b.load(self.t, s + MUTEX)?;
        if cur == me {
            return Err(SyncError::Misuse(format!("mutex {key} is already held by this thread")));
        }
        self.block(stop, || Ok(self.b.cas(self.t, s + MUTEX, 0, me)? == 0))
    }

    /// `unlock d`.
    pub fn unlock(&self, key: i64, me: u64) -> Result<(), SyncError> {
        let s = self.slot(key)?;
        let prev = self.b.cas(self.t, s + MUTEX, me, 0)?;
        if prev != me {
            return Err(SyncError::Misuse(format!("unlock of mutex {key}, which this thread does not hold")));
        }
        self.progress()?;
        Ok(())
    }

    /// `signal d`: one more signal on d (never lost: a later `wait` takes it).
    pub fn signal(&self, key: i64) -> Result<(), SyncError> {
        let s = self.slot(key)?;
        self.b.fetch_add(self.t, s + SEM, 1)?;
        self.progress()?;
        Ok(())
    }

    /// `wait d`: take one signal of d, waiting for one if there is none.
    pub fn wait(&self, key: i64, stop: &AtomicBool) -> Result<(), SyncError> {
        let s = self.slot(key)?;
        self.block(stop, || {
            let v = self.b.load(self.t, s + SEM)?;
            Ok(v > 0 && self.b.cas(self.t, s + SEM, v, v - 1)? == v)
        })
    }

    /// `barr d n`: wait until n threads (of any nodes) have arrived at barrier d.
    pub fn barrier(&self, key: i64, n: i64, stop: &AtomicBool) -> Result<(), SyncError> {
        if n <= 0 {
            return Err(SyncError::Misuse(format!("barrier {key}: count {n} is not positive")));
        }
        if n > u32::MAX as i64 {
            return Err(SyncError::Misuse(format!("barrier {key}: count {n} is more than {}", u32::MAX)));
        }
        let s = self.slot(key)?;
        let gen = loop {
            let w = self.b.load(self.t, s + BARRIER)?;
            let (gen, arrived) = (w >> 32, w & 0xffff_ffff);
            let new = if arrived + 1 >= n as u64 { (gen + 1) << 32 } else { w + 1 };
            if self.b.cas(self.t, s + BARRIER, w, new)? == w {
                self.progress()?;
                if arrived + 1 >= n as u64 {
                    return Ok(());
                }
                break gen;
            }
        };
        self.block(stop, || Ok(self.b.load(self.t, s + BARRIER)? >> 32 != gen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Direct;
    use std::sync::atomic::AtomicU64;

    fn table() -> Vec<u64> {
        vec![0u64; TABLE_BYTES / 8]
    }

    #[test]
    fn mutex_excludes_and_signals_are_counted() {
        let mut m = table();
        let b = Direct::new(vec![(m.as_mut_ptr() as *mut u8, m.len() * 8)]);
        let t = SyncTable::new(&b, 0, 0);
        let stop = AtomicBool::new(false);
        let total = AtomicU64::new(0);
        for _ in 0..4 {
            t.thread_started().unwrap();
        }
        std::thread::scope(|s| {
            for id in 1..=4u64 {
                let (t, stop, total) = (&t, &stop, &total);
                s.spawn(move || {
                    for _ in 0..500 {
                        t.lock(7, id, stop).unwrap();
                        // a non-atomic read-modify-write under the mutex
                        let v = total.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        total.store(v + 1, Ordering::Relaxed);
                        t.unlock(7, id).unwrap();
                    }
                    t.signal(3).unwrap();
                    t.thread_ended().unwrap();
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 2000);
        for _ in 0..4 {
            t.wait(3, &stop).unwrap();
        }
        assert!(matches!(t.unlock(7, 1), Err(SyncError::Misuse(_))));
        t.lock(7, 1, &stop).unwrap();
        assert!(matches!(t.lock(7, 1, &stop), Err(SyncError::Misuse(_))));
    }

    #[test]
    fn barrier_releases_every_generation() {
        let mut m = table();
        let b = Direct::new(vec![(m.as_mut_ptr() as *mut u8, m.len() * 8)]);
        let t = SyncTable::new(&b, 0, 0);
        let stop = AtomicBool::new(false);
        let phase = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                let (t, stop, phase) = (&t, &stop, &phase);
                t.thread_started().unwrap();
                s.spawn(move || {
                    for g in 0..50u64 {
                        phase.fetch_add(1, Ordering::SeqCst);
                        t.barrier(-1, 3, stop).unwrap();
                        // nobody can be in the next phase before all three arrived here
                        assert!(phase.load(Ordering::SeqCst) >= 3 * (g + 1));
                        t.barrier(-2, 3, stop).unwrap();
                    }
                    t.thread_ended().unwrap();
                });
            }
        });
        assert!(matches!(t.barrier(1, 0, &stop), Err(SyncError::Misuse(_))));
    }

    #[test]
    fn every_thread_waiting_is_a_deadlock() {
        let mut m = table();
        let b = Direct::new(vec![(m.as_mut_ptr() as *mut u8, m.len() * 8)]);
        let t = SyncTable::new(&b, 0, 0);
        let stop = AtomicBool::new(false);
        t.thread_started().unwrap();
        t.thread_started().unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(|| t.wait(1, &stop));
            assert!(matches!(t.wait(2, &stop), Err(SyncError::Deadlock)));
            assert!(matches!(h.join().unwrap(), Err(SyncError::Deadlock)));
        });
    }

    #[test]
    fn many_keys_get_distinct_slots() {
        let mut m = table();
        let b = Direct::new(vec![(m.as_mut_ptr() as *mut u8, m.len() * 8)]);
        let t = SyncTable::new(&b, 0, 0);
        let mut seen = std::collections::HashSet::new();
        for k in [-1i64, 0, 1, i64::MIN, i64::MAX].into_iter().chain(2..300) {
            assert!(seen.insert(t.slot(k).unwrap()), "key {k}");
        }
        assert_eq!(t.slot(5).unwrap(), SyncTable::new(&b, 0, 0).slot(5).unwrap());
    }
}
