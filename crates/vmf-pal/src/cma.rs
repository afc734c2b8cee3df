//! Cross-memory attach: single-copy reads from another process's address space (`process_vm_readv`).
//!
//! Allowed by the kernel when the caller may ptrace the target (same user and a permissive Yama policy, or
//! the target called [`allow_any_ptracer`]). Not available between virtual machines.
use std::io;

/// Let any process of this user read our memory with `process_vm_readv`, even under Yama
/// `ptrace_scope = 1` (where by default only ancestors may). Returns an error if prctl fails.
pub fn allow_any_ptracer() -> io::Result<()> {
    // SAFETY: PR_SET_PTRACER takes an integer argument and touches no memory.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_PTRACER,
            libc::PR_SET_PTRACER_ANY as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // EINVAL: no Yama in this kernel, nothing to allow.
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Copy `local.len()` bytes from address `remote` in process `pid` into `local`.
///
/// Loops over partial transfers. The remote address is only interpreted by the kernel, which checks it
/// against the target's mappings: a bad address yields `EFAULT`, never a fault in this process.
pub fn read_from(pid: i32, remote: u64, local: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < local.len() {
        let liov = libc::iovec {
            iov_base: local[done..].as_mut_ptr().cast(),
            iov_len: local.len() - done,
        };
        let riov = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: local.len() - done,
        };
        // SAFETY: liov describes memory we own mutably; riov is only dereferenced by the kernel in `pid`.
        let n = unsafe { libc::process_vm_readv(pid, &liov, 1, &riov, 1, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv transferred nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_own_memory_works() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        match read_from(std::process::id() as i32, src.as_ptr() as u64, &mut dst) {
            Ok(()) => assert_eq!(src, dst),
            // Some sandboxes forbid CMA entirely; the fabric then uses the pipelined path.
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::ENOSYS)),
                "{e}"
            ),
        }
    }

    #[test]
    fn read_bad_address_fails() {
        let mut dst = [0u8; 16];
        assert!(read_from(std::process::id() as i32, 8, &mut dst).is_err());
    }
}
