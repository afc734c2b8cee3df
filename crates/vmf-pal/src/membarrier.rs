//! Asymmetric memory barriers (`membarrier(2)`), used by the sleep/wake protocol.
//!
//! A rank about to sleep publishes "I sleep" and must then see every message a sender published before
//! the sender looked at that flag. The symmetric solution puts a full fence on every send. Instead the
//! (rare) sleeper calls [`global_expedited`], which makes every running thread of every registered process
//! execute a full barrier, so senders get away with a plain load. Senders register with
//! [`register_global_expedited`]. Where the kernel lacks the command, callers fall back to fences.
use std::io;

const CMD_QUERY: libc::c_int = 0;
const CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

fn membarrier(cmd: libc::c_int) -> io::Result<libc::c_long> {
    // SAFETY: membarrier takes integer arguments only.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0u32, 0i32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Register this process for global expedited barriers. Returns false if the kernel cannot do it.
pub fn register_global_expedited() -> bool {
    // Once per process (a registration lasts for its life): a rank that moves between regions makes a
    // transport per move, and two system calls each time were part of its switch.
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| match membarrier(CMD_QUERY) {
        Ok(mask) if mask & CMD_GLOBAL_EXPEDITED as libc::c_long != 0 => {
            membarrier(CMD_REGISTER_GLOBAL_EXPEDITED).is_ok()
        }
        _ => false,
    })
}

/// Issue a barrier on every CPU running a registered process.
pub fn global_expedited() -> io::Result<()> {
    membarrier(CMD_GLOBAL_EXPEDITED).map(|_| ())
}

#[cfg(test)]
mod tests {
    #[test]
    fn register_then_barrier_works() {
        if super::register_global_expedited() {
            super::global_expedited().unwrap();
        }
    }
}
