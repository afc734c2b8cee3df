//! Platform abstraction layer (layer 0 of vmfabric).
//!
//! Every system call the fabric makes goes through this crate, so the layers above stay free of `unsafe`
//! libc calls and the hot path's syscall budget (none for small messages) can be audited in one place.
//! Linux only.
//!
//! # Examples
//! ```
//! let me = vmf_pal::process::ProcessId::current();
//! assert!(me.is_alive());
//! ```
#![warn(missing_docs)]

pub mod cma;
pub mod fdpass;
pub mod futex;
pub mod hostid;
pub mod inplace;
pub mod membarrier;
pub mod pci;
pub mod process;
pub mod vfio;
pub mod shmem;

/// Hint to the CPU that we are in a spin loop.
#[inline(always)]
pub fn cpu_relax() {
    core::hint::spin_loop();
}

/// Sleep until `fd` is readable or `timeout` passes (`poll`).
pub fn wait_readable(fd: std::os::fd::RawFd, timeout: std::time::Duration) {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd on the stack.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
}

/// Consume the count of a nonblocking eventfd (after a sleep on it, or before lending it out); a zero
/// count is left as it is.
pub fn drain_eventfd(fd: std::os::fd::RawFd) {
    let mut b = [0u8; 8];
    // SAFETY: reading 8 bytes into a local buffer; a nonblocking eventfd never blocks here.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) };
}

/// Tasks runnable on this machine right now, this one included (the kernel's `nr_running`, from
/// `/proc/loadavg`), and the CPUs online: `None` when that file cannot be read. A few system calls.
pub fn runnable_tasks() -> Option<(usize, usize)> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    let running = s.split_whitespace().nth(3)?.split('/').next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    Some((running, usize::try_from(online).ok()?.max(1)))
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of this kernel (a vDSO call, no system
/// call).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Give the CPU to another runnable thread (`sched_yield`).
#[inline]
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe {
        libc::sched_yield();
    }
}

/// Number of CPUs this process may run on (its affinity mask), at least 1.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Bytes available to unprivileged users in the file system holding `path` (`statvfs`).
pub fn fs_available(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut v = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c is a NUL-terminated path; v is written by the kernel on success.
    if unsafe { libc::statvfs(c.as_ptr(), v.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded.
    let v = unsafe { v.assume_init() };
    // The field types differ between architectures (u64 on x86_64, c_ulong elsewhere).
    #[allow(clippy::unnecessary_cast)]
    Some(v.f_bavail as u64 * v.f_frsize as u64)
}
