//! Process-shared futex wait/wake on a 32-bit word (which may live in a shared mapping).
//!
//! The words used here live in a `MAP_SHARED` region, so the non-private futex operations are used: they
//! work between processes that map the same file, but not between virtual machines (different kernels).
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Outcome of [`wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Woken by [`wake`] (or spuriously).
    Woken,
    /// The word did not hold the expected value when the kernel checked it.
    ValueChanged,
    /// The timeout elapsed.
    TimedOut,
    /// Interrupted by a signal.
    Interrupted,
}

/// Sleep while `*word == expected`, at most `timeout`.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> WaitOutcome {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; the kernel only reads it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            tsp,
            0usize,
            0u32,
        )
    };
    if r == 0 {
        return WaitOutcome::Woken;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => WaitOutcome::ValueChanged,
        Some(libc::ETIMEDOUT) => WaitOutcome::TimedOut,
        Some(libc::EINTR) => WaitOutcome::Interrupted,
        _ => WaitOutcome::Woken,
    }
}

/// Wake up to `n` waiters sleeping on `word` (`n` above `i32::MAX` is taken as all of them: the kernel
/// reads it as a signed count). Returns how many were woken.
pub fn wake(word: &AtomicU32, n: u32) -> usize {
    let n = n.min(i32::MAX as u32);
    // SAFETY: `word` is a valid aligned u32; FUTEX_WAKE does not access it beyond its address.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n,
            0usize,
            0usize,
            0u32,
        )
    };
    if r < 0 {
        0
    } else {
        r as usize
    }
}

/// Whether futexes work on `word`'s memory: not in a PCI BAR (an ivshmem region in a VM), where the
/// kernel cannot pin the page and every futex call fails with EFAULT, so a wait would return at once.
pub fn usable(word: &AtomicU32) -> bool {
    // SAFETY: as in `wake`; waking nobody (n = 0) only resolves the word's futex key.
    let r = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 0, 0usize, 0usize, 0u32) };
    r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EFAULT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn wait_with_changed_value_returns_immediately() {
        let w = AtomicU32::new(1);
        assert_eq!(
            wait(&w, 0, Some(Duration::from_secs(5))),
            WaitOutcome::ValueChanged
        );
    }

    #[test]
    fn usable_on_ordinary_and_shared_memory_works() {
        assert!(usable(&AtomicU32::new(0)));
        let p = std::env::temp_dir().join(format!("vmf-futex-usable-{}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
        f.set_len(4096).unwrap();
        // SAFETY: a fresh shared mapping of the file's one page, unmapped below.
        let m = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&f), 0) };
        assert_ne!(m, libc::MAP_FAILED);
        // SAFETY: the page is mapped and 4-byte aligned.
        assert!(usable(unsafe { &*(m as *const AtomicU32) }));
        // SAFETY: our mapping.
        unsafe { libc::munmap(m, 4096) };
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn wait_times_out() {
        let w = AtomicU32::new(0);
        assert_eq!(
            wait(&w, 0, Some(Duration::from_millis(10))),
            WaitOutcome::TimedOut
        );
    }

    #[test]
    fn wake_releases_waiter() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                wait(&w2, 0, Some(Duration::from_secs(5)));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(1, Ordering::Release);
        wake(&w, 1);
        t.join().unwrap();
    }
}
