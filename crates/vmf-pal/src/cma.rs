//! Cross-memory attach: single-copy reads from and writes to another process's address space
//! (`process_vm_readv`, `process_vm_writev`).
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

/// Copy `local` to address `remote` in process `pid` (`process_vm_writev`), looping over partial
/// transfers. As for [`read_from`], the remote address is only interpreted by the kernel.
pub fn write_to(pid: i32, remote: u64, local: &[u8]) -> io::Result<()> {
    // SAFETY: the kernel only reads `local`, which holds exactly the piece's length.
    unsafe { scatter(pid, local.as_ptr() as *mut u8, &[(remote, local.len())], true) }
}

/// Largest number of iovecs one call takes (the kernel's `UIO_MAXIOV`).
const MAX_IOV: usize = 1024;

/// Move bytes between the contiguous local buffer at `local` and the remote pieces `remote` (address,
/// length) of process `pid`, in order: `write` copies the buffer out to the pieces, otherwise the pieces
/// are read into the buffer. The buffer holds the sum of the pieces' lengths.
///
/// The remote side is only interpreted by the kernel (a bad address yields `EFAULT`).
///
/// # Safety
/// `local` must be valid for reads (`write`) or writes (otherwise) of the pieces' total length.
pub unsafe fn scatter(pid: i32, local: *mut u8, remote: &[(u64, usize)], write: bool) -> io::Result<()> {
    let total: usize = remote.iter().map(|r| r.1).sum();
    let mut done = 0usize;
    // Position in `remote`: piece index and bytes of it already moved.
    let (mut pi, mut pdone) = (0usize, 0usize);
    let mut riov: Vec<libc::iovec> = Vec::with_capacity(remote.len().min(MAX_IOV));
    while done < total {
        riov.clear();
        let (mut i, mut off) = (pi, pdone);
        let mut batch = 0usize;
        while i < remote.len() && riov.len() < MAX_IOV {
            let (a, l) = remote[i];
            if l > off {
                riov.push(libc::iovec {
                    iov_base: (a as usize + off) as *mut libc::c_void,
                    iov_len: l - off,
                });
                batch += l - off;
            }
            i += 1;
            off = 0;
        }
        let liov = libc::iovec {
            // SAFETY: done < total, inside the caller's buffer.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: batch,
        };
        // SAFETY: liov describes the caller's buffer; riov is only dereferenced by the kernel in `pid`.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, &liov, 1, riov.as_ptr(), riov.len() as _, 0)
            } else {
                libc::process_vm_readv(pid, &liov, 1, riov.as_ptr(), riov.len() as _, 0)
            }
        };
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
                "process_vm_readv/writev transferred nothing",
            ));
        }
        // Advance the position by n bytes.
        let mut left = n as usize;
        done += left;
        while left > 0 {
            let rest = remote[pi].1 - pdone;
            if left >= rest {
                left -= rest;
                pi += 1;
                pdone = 0;
            } else {
                pdone += left;
                left = 0;
            }
        }
        while pi < remote.len() && remote[pi].1 == 0 {
            pi += 1;
        }
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
    fn write_and_scatter_own_memory_works() {
        let mut dst = vec![0u8; 64];
        let src: Vec<u8> = (1..=24).collect();
        let base = dst.as_mut_ptr() as u64;
        let me = std::process::id() as i32;
        match write_to(me, base + 8, &src[..4]) {
            Ok(()) => {
                assert_eq!(&dst[8..12], &src[..4]);
                // Pieces of 0, 10, 0 and 10 bytes: the buffer is read out in order.
                let pieces = [(base + 20, 0), (base + 20, 10), (base + 40, 0), (base + 50, 10)];
                // SAFETY: the pieces add up to 20 bytes, inside `src` and `back`.
                unsafe { scatter(me, src.as_ptr() as *mut u8, &pieces, true) }.unwrap();
                assert_eq!(&dst[20..30], &src[..10]);
                assert_eq!(&dst[50..60], &src[10..20]);
                let mut back = vec![0u8; 20];
                unsafe { scatter(me, back.as_mut_ptr(), &pieces, false) }.unwrap();
                assert_eq!(&back[..], &src[..20]);
            }
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
