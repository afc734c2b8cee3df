//! Process identity that survives pid reuse: pid plus the kernel's start time of that process.
use std::io;

/// A process named by pid and start time (clock ticks since boot, field 22 of `/proc/PID/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessId {
    /// Process id.
    pub pid: i32,
    /// Start time in clock ticks since boot; 0 if unknown.
    pub start_time: u64,
}

impl ProcessId {
    /// The calling process.
    pub fn current() -> Self {
        let pid = std::process::id() as i32;
        ProcessId {
            pid,
            start_time: start_time(pid).unwrap_or(0),
        }
    }

    /// True while this exact process (not a later one with the same pid) exists and is not a zombie.
    pub fn is_alive(&self) -> bool {
        if self.pid <= 0 {
            return false;
        }
        match stat_fields(self.pid) {
            Ok((state, st)) => {
                state != 'Z' && state != 'X' && (self.start_time == 0 || st == self.start_time)
            }
            Err(_) => false,
        }
    }
}

/// Start time of `pid` in clock ticks since boot.
pub fn start_time(pid: i32) -> io::Result<u64> {
    stat_fields(pid).map(|(_, st)| st)
}

fn stat_fields(pid: i32) -> io::Result<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may contain spaces: parse after the last ')'.
    let rest = s
        .rfind(')')
        .map(|i| &s[i + 1..])
        .ok_or_else(|| io::Error::other("malformed /proc stat"))?;
    let mut it = rest.split_whitespace();
    let state = it
        .next()
        .and_then(|f| f.chars().next())
        .ok_or_else(|| io::Error::other("no state"))?;
    // Fields after ')' start at field 3 (state); start time is field 22, i.e. 19 more.
    let st = it
        .nth(18)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| io::Error::other("no start time"))?;
    Ok((state, st))
}

/// Ask the kernel to send `sig` to this process when its parent thread exits (`PR_SET_PDEATHSIG`).
pub fn set_parent_death_signal(sig: i32) -> io::Result<()> {
    // SAFETY: integer-only prctl.
    let r = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A 64-bit hash of this kernel's boot id: two processes with the same value run on the same kernel (so
/// futexes and membarrier reach across them); 0 if unknown.
pub fn kernel_id() -> u64 {
    // Read once: a process never changes kernels (a live-migrated VM keeps its own), and each read is a
    // file open that costs hundreds of microseconds in an emulated guest, on a migrating rank's switch.
    static ID: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") else {
            return 0;
        };
        let mut h: u64 = 0xcbf29ce484222325;
        for b in s.trim().bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h.max(1)
    })
}

/// Pin the calling thread (and the process, if single-threaded) to one CPU.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it (cpu checked against its capacity).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return Err(io::Error::other("cpu index out of range"));
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Threads of this process other than the caller that are runnable right now (state `R` in
/// `/proc/self/task/*/stat`): a math library's worker threads, say. One small file read per thread.
pub fn other_runnable_threads() -> usize {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::syscall(libc::SYS_gettid) }.to_string();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| e.file_name().to_str() != Some(me.as_str()))
        .filter(|e| {
            std::fs::read_to_string(e.path().join("stat")).is_ok_and(|st| {
                // The state follows the command name, which is in parentheses and may hold spaces.
                st.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("R")
            })
        })
        .count()
}

/// The CPU the calling thread runs on now (`sched_getcpu`, a vDSO call).
pub fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

/// Move the calling thread off `cpu` at once (to another of `allowed`, the thread's mask, which it keeps):
/// its affinity excludes `cpu` for a moment, which makes the kernel migrate it before the call returns.
pub fn leave_cpu(cpu: usize, allowed: &[usize]) -> io::Result<()> {
    let set = |cpus: &mut dyn Iterator<Item = usize>| -> io::Result<()> {
        // SAFETY: cpu_set_t is plain data; CPU_SET writes within it (indices checked).
        unsafe {
            let mut s: libc::cpu_set_t = std::mem::zeroed();
            for c in cpus.filter(|&c| c < 8 * std::mem::size_of::<libc::cpu_set_t>()) {
                libc::CPU_SET(c, &mut s);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &s) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    if !allowed.iter().any(|&c| c != cpu) {
        return Err(io::Error::other("no other CPU allowed"));
    }
    set(&mut allowed.iter().copied().filter(|&c| c != cpu))?;
    set(&mut allowed.iter().copied())
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills the set; CPU_ISSET reads within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..8 * std::mem::size_of::<libc::cpu_set_t>())
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The CPU of `cpus` for the rank at position `pos` among the `n` ranks that share them: one each while
/// there are enough, else blocks of consecutive ranks (4 ranks on 2 CPUs: 0 and 1 on the first, 2 and 3
/// on the second), so that ranks that talk most (neighbours) share a CPU's cache and each CPU holds
/// as few ranks as possible. The launcher (`--bind core`) and the fabric (`VMF_BIND`) both use it.
pub fn cpu_for_rank(pos: usize, n: usize, cpus: &[usize]) -> Option<usize> {
    if cpus.is_empty() || n == 0 {
        return None;
    }
    let pos = pos.min(n - 1);
    Some(if n <= cpus.len() {
        cpus[pos]
    } else {
        cpus[pos * cpus.len() / n]
    })
}

/// CPU time (user + system) consumed so far by the calling process, in seconds.
pub fn cpu_time_s() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    #[test]
    fn runnable_counts_see_this_process_and_a_spinning_thread() {
        let (running, online) = crate::runnable_tasks().expect("/proc/loadavg");
        assert!(running >= 1 && online >= 1, "{running} {online}");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        // The spinner is runnable whenever we look (on one CPU it may be waiting its turn: still `R`).
        let seen = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            other_runnable_threads() >= 1
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        t.join().unwrap();
        assert!(seen, "a spinning thread was never seen runnable");
    }

    use super::*;

    #[test]
    fn ranks_get_a_cpu_each_or_blocks_of_consecutive_ranks() {
        let c = [0, 1];
        let got: Vec<_> = (0..4).map(|p| cpu_for_rank(p, 4, &c).unwrap()).collect();
        assert_eq!(got, [0, 0, 1, 1]);
        let got: Vec<_> = (0..5).map(|p| cpu_for_rank(p, 5, &c).unwrap()).collect();
        assert_eq!(got, [0, 0, 0, 1, 1]);
        let c = [2, 5, 7];
        let got: Vec<_> = (0..2).map(|p| cpu_for_rank(p, 2, &c).unwrap()).collect();
        assert_eq!(got, [2, 5]);
        assert_eq!(cpu_for_rank(0, 1, &[]), None);
    }

    #[test]
    fn pinning_a_thread_narrows_its_affinity_to_that_cpu() {
        let cpus = allowed_cpus();
        let last = *cpus.last().unwrap();
        // A thread of its own, so that the test harness keeps every CPU.
        let seen = std::thread::spawn(move || {
            pin_to_cpu(last).unwrap();
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![last]);
        assert_eq!(allowed_cpus(), cpus);
        assert!(pin_to_cpu(1 << 20).is_err());
    }

    #[test]
    fn current_process_is_alive() {
        let me = ProcessId::current();
        assert!(me.start_time > 0);
        assert!(me.is_alive());
    }

    #[test]
    fn reused_pid_is_not_alive() {
        let mut me = ProcessId::current();
        me.start_time += 1;
        assert!(!me.is_alive());
    }

    #[test]
    fn kernel_id_is_stable_works() {
        assert_eq!(kernel_id(), kernel_id());
        assert!(!allowed_cpus().is_empty());
    }

    #[test]
    fn exited_child_is_not_alive() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessId {
            pid: c.id() as i32,
            start_time: 0,
        };
        c.wait().unwrap();
        assert!(!id.is_alive());
    }
}
