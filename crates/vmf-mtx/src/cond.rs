//! Process-shared condition variables with their mutex (002_* §3.2.2-3.2.3: a non-blocking condition
//! variable built from atomics, and a blocking one), on a shared file that processes and VMs map.
//!
//! The mutex is a word holding the owner's participant index + 1 (0: free); the condition is a sequence
//! word. [`Cond::wait`] (called with the mutex held) reads the sequence, releases the mutex, waits until
//! the sequence moves, and takes the mutex again; [`Cond::signal`] and [`Cond::broadcast`] advance the
//! sequence and wake one or every sleeper. How waiters wait is the [`CondKind`]: `Spin` busy-waits
//! (002_*'s non-blocking condition variable), `Block` sleeps at once (a futex within one kernel, bounded
//! sleeps between VMs, where 002_* needed virtio-serial and socat), `Adaptive` spins, yields, then sleeps.
//! As with POSIX condition variables, a waiter may wake without a signal (a signal that found several
//! spinning waiters wakes them all): callers re-check their predicate in a loop.
//!
//! Liveness: a waiter checks now and then that every participant is alive and that a dead process does
//! not hold the mutex; either is an error naming the participant, never a hang. The protected data of a
//! holder that died mid-section may be half updated, so the mutex is not handed on silently.
use crate::shared::{SharedFile, WaitKind};
use crate::{Error, Result};
use std::path::Path;
use std::sync::atomic::Ordering;

const MAGIC: u64 = u64::from_le_bytes(*b"VMFCND01");
const C_MUTEX: u64 = 64; // own cache line: the mutex word, then its sleepers
const C_MSLEEP: u64 = 68;
const C_SEQ: u64 = 128; // own cache line: the condition's sequence, then its sleepers
const C_CSLEEP: u64 = 132;
const C_PART: u64 = 192;

/// How condition and mutex waiters wait.
pub type CondKind = WaitKind;

/// One participant's handle on a shared condition variable and its mutex.
pub struct Cond {
    f: SharedFile,
    kind: CondKind,
    me: u32,
}

impl Cond {
    /// Create the file for `n` participants at `path` (which must not exist).
    pub fn create(path: &Path, n: usize) -> Result<()> {
        SharedFile::create(path, n, C_PART, MAGIC)
    }

    /// Open the condition variable at `path` as participant `index` (0..n), waiting `kind`'s way.
    pub fn open(path: &Path, index: usize, kind: CondKind) -> Result<Cond> {
        Ok(Cond {
            f: SharedFile::open(path, index, C_PART, MAGIC, "condition variable")?,
            kind,
            me: index as u32 + 1,
        })
    }

    /// Participants and the mutex holder alive?
    fn check(&self) -> Result<()> {
        self.f.check_participants("condition variable")?;
        let h = self.f.u32at(C_MUTEX).load(Ordering::Acquire);
        if h > self.f.n {
            return Err(Error::Corrupt(format!("mutex word {h} names no participant")));
        }
        if h != 0 {
            let (alive, pid) = self.f.alive(h as u64 - 1);
            if !alive {
                return Err(Error::InvalidArgument(format!(
                    "the mutex holder, condition variable participant {} (pid {pid}), died",
                    h - 1
                )));
            }
        }
        Ok(())
    }

    /// Take the mutex (waiting `kind`'s way while another participant holds it).
    pub fn lock(&self) -> Result<()> {
        let m = self.f.u32at(C_MUTEX);
        loop {
            match m.compare_exchange(0, self.me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(h) if h == self.me => {
                    return Err(Error::InvalidArgument("the mutex is already held by this participant".into()))
                }
                Err(h) if h > self.f.n => {
                    return Err(Error::Corrupt(format!("mutex word {h} names no participant")))
                }
                Err(h) => self.f.wait_change(C_MUTEX, C_MSLEEP, h, self.kind, || self.check())?,
            }
        }
    }

    /// Try once to take the mutex: `Ok(false)` if another participant holds it.
    pub fn try_lock(&self) -> Result<bool> {
        let m = self.f.u32at(C_MUTEX);
        Ok(m.compare_exchange(0, self.me, Ordering::Acquire, Ordering::Relaxed).is_ok())
    }

    /// Release the mutex (held by this participant).
    pub fn unlock(&self) -> Result<()> {
        let m = self.f.u32at(C_MUTEX);
        if m.compare_exchange(self.me, 0, Ordering::Release, Ordering::Relaxed).is_err() {
            return Err(Error::InvalidArgument("unlock of a mutex this participant does not hold".into()));
        }
        self.f.wake(C_MUTEX, C_MSLEEP, 1);
        Ok(())
    }

    /// With the mutex held: release it, wait for a signal or broadcast, take it again. On an error (a
    /// participant or the mutex holder died) the mutex is not held.
    pub fn wait(&self) -> Result<()> {
        let s = self.f.u32at(C_SEQ).load(Ordering::Acquire);
        self.unlock()
            .map_err(|_| Error::InvalidArgument("wait without holding the mutex".into()))?;
        self.f.wait_change(C_SEQ, C_CSLEEP, s, self.kind, || self.check())?;
        self.lock()
    }

    /// Wake at least one waiter.
    pub fn signal(&self) {
        self.f.u32at(C_SEQ).fetch_add(1, Ordering::SeqCst);
        self.f.wake(C_SEQ, C_CSLEEP, 1);
    }

    /// Wake every waiter.
    pub fn broadcast(&self) {
        self.f.u32at(C_SEQ).fetch_add(1, Ordering::SeqCst);
        self.f.wake(C_SEQ, C_CSLEEP, u32::MAX);
    }

    /// Number of participants.
    pub fn participants(&self) -> usize {
        self.f.n as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    use std::sync::Arc;

    fn tmp(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("vmf-cond-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// A bounded buffer of one slot between producers and consumers: every item is consumed exactly once,
    /// no consumer takes from an empty slot, for each kind, with more participants than CPUs too.
    #[test]
    fn producers_and_consumers_hand_over_every_item_for_every_kind_works() {
        for kind in [CondKind::Spin, CondKind::Block, CondKind::Adaptive] {
            let p = Arc::new(tmp(kind.name()));
            let n = 4; // 2 producers, 2 consumers
            Cond::create(&p, n).unwrap();
            // The protected data lives in this process (threads); the file carries mutex and condition.
            let slot = Arc::new(AtomicU64::new(0)); // 0 empty, else the item
            let sum = Arc::new(AtomicU64::new(0));
            let taken = Arc::new(AtomicUsize::new(0));
            let per = if kind == CondKind::Spin { 300 } else { 1000 };
            let hs: Vec<_> = (0..n)
                .map(|i| {
                    let (p, slot, sum, taken) = (p.clone(), slot.clone(), sum.clone(), taken.clone());
                    std::thread::spawn(move || {
                        let c = Cond::open(&p, i, kind).unwrap();
                        for k in 1..=per as u64 {
                            c.lock().unwrap();
                            if i < 2 {
                                while slot.load(Ordering::Relaxed) != 0 {
                                    c.wait().unwrap();
                                }
                                slot.store(k * 10 + i as u64, Ordering::Relaxed);
                            } else {
                                while slot.load(Ordering::Relaxed) == 0 {
                                    c.wait().unwrap();
                                }
                                sum.fetch_add(slot.swap(0, Ordering::Relaxed), Ordering::Relaxed);
                                taken.fetch_add(1, Ordering::Relaxed);
                            }
                            c.broadcast();
                            c.unlock().unwrap();
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let per = per as u64;
            let want: u64 = (1..=per).map(|k| k * 10).sum::<u64>() * 2 + per; // producer 1 adds 1 per item
            assert_eq!(taken.load(Ordering::Relaxed), 2 * per as usize, "{kind:?}");
            assert_eq!(sum.load(Ordering::Relaxed), want, "{kind:?}");
            std::fs::remove_file(&*p).unwrap();
        }
    }

    /// Mutual exclusion: a counter bumped non-atomically under the mutex loses no update.
    #[test]
    fn mutex_excludes_and_misuse_is_an_error_works() {
        let p = Arc::new(tmp("mutex"));
        Cond::create(&p, 3).unwrap();
        let ctr = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..3)
            .map(|i| {
                let (p, ctr) = (p.clone(), ctr.clone());
                std::thread::spawn(move || {
                    let c = Cond::open(&p, i, CondKind::Adaptive).unwrap();
                    for _ in 0..5000 {
                        c.lock().unwrap();
                        let v = ctr.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        ctr.store(v + 1, Ordering::Relaxed);
                        c.unlock().unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(ctr.load(Ordering::Relaxed), 15000);
        let c = Cond::open(&p, 0, CondKind::Block).unwrap();
        assert!(c.unlock().is_err(), "unlock without holding");
        assert!(c.wait().is_err(), "wait without holding");
        c.lock().unwrap();
        assert!(c.lock().is_err(), "relock by the holder");
        let d = Cond::open(&p, 1, CondKind::Spin).unwrap();
        assert!(!d.try_lock().unwrap());
        c.unlock().unwrap();
        assert!(d.try_lock().unwrap());
        d.unlock().unwrap();
        assert!(Cond::open(&p, 3, CondKind::Spin).is_err());
        std::fs::remove_file(&*p).unwrap();
    }

    /// A mutex held by a process that died is an error for its waiters, not a hang.
    #[test]
    fn a_dead_mutex_holder_is_an_error_not_a_hang_fails() {
        let p = tmp("dead");
        Cond::create(&p, 2).unwrap();
        let c = Cond::open(&p, 0, CondKind::Block).unwrap();
        c.f.register_exited(1);
        c.f.u32at(C_MUTEX).store(2, Ordering::Release); // participant 1 holds it
        let e = c.lock().unwrap_err();
        assert!(e.to_string().contains("participant 1"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }
}
