//! Anonymous shared memory that other processes of this kernel map: a `memfd`, mapped `MAP_SHARED`.
//!
//! A peer maps it by taking a duplicate of the owner's descriptor with `pidfd_getfd(2)` (Linux 5.6+; the
//! kernel allows it where the caller may ptrace the owner, as for `process_vm_readv`: same user and the
//! owner called [`crate::cma::allow_any_ptracer`]), or, where that call is missing, by opening
//! `/proc/PID/fd/N`. Nothing appears in any file system, so nothing is left behind when a process dies:
//! the memory goes with the last mapping. Between virtual machines (different kernels) neither works;
//! callers then use the region's pool instead.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A shared mapping of a memfd (created here or taken from a peer).
#[derive(Debug)]
pub struct SharedMem {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; synchronising accesses to it is the users' business.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `len` rounded up to whole pages (at least one page).
pub fn page_round(len: usize) -> usize {
    let p = page();
    len.max(1).div_ceil(p) * p
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh shared mapping of a descriptor we hold; the kernel checks everything else.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p as *mut u8)
    }
}

fn file_len(fd: &OwnedFd) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: st is written by the kernel on success.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded.
    Ok(unsafe { st.assume_init() }.st_size as u64)
}

impl SharedMem {
    /// A new zero-filled shared memory object of `len` bytes (rounded up to pages), mapped here.
    pub fn create(name: &str, len: usize) -> io::Result<SharedMem> {
        let len = page_round(len);
        let c = std::ffi::CString::new(name).map_err(|_| io::Error::other("name contains NUL"))?;
        // SAFETY: a NUL-terminated name; memfd_create returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain ftruncate of our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let ptr = map(&fd, len)?;
        Ok(SharedMem { fd, ptr, len })
    }

    /// Map the memory object that process `pid` holds as descriptor `fd`, checking that it has at least
    /// `len` bytes (a peer that names a smaller object, or another file, gets an error, never a mapping
    /// shorter than what it claims).
    pub fn open_peer(pid: i32, fd: RawFd, len: usize) -> io::Result<SharedMem> {
        let len = page_round(len);
        let own = match pidfd_getfd(pid, fd) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(format!("/proc/{pid}/fd/{fd}"))?;
                OwnedFd::from(f)
            }
            Err(e) => return Err(e),
        };
        let have = file_len(&own)?;
        if have < len as u64 {
            return Err(io::Error::other(format!(
                "the shared object of process {pid} has {have} bytes, not the {len} it announced"
            )));
        }
        let ptr = map(&own, len)?;
        Ok(SharedMem { fd: own, ptr, len })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing is mapped (never: at least one page is).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The descriptor (what a peer names in [`SharedMem::open_peer`]).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// The inode number of the file behind descriptor `fd`.
pub fn inode(fd: RawFd) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: st is written by the kernel on success.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded.
    Ok(unsafe { st.assume_init() }.st_ino)
}

/// A duplicate of descriptor `fd` of process `pid` (`pidfd_open` + `pidfd_getfd`).
pub fn pidfd_getfd(pid: i32, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: integer-only system call.
    let pfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let pfd = unsafe { OwnedFd::from_raw_fd(pfd as RawFd) };
    // SAFETY: integer-only system call.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pfd.as_raw_fd(), fd, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_and_map_own_descriptor_works() {
        let a = SharedMem::create("vmf-test", 10_000).unwrap();
        assert_eq!(a.len() % 4096, 0);
        assert!(a.len() >= 10_000);
        // SAFETY: inside the mapping.
        unsafe { *a.as_ptr().add(9_999) = 42 };
        match SharedMem::open_peer(std::process::id() as i32, a.raw_fd(), 10_000) {
            Ok(b) => {
                // SAFETY: inside the second mapping of the same object.
                assert_eq!(unsafe { *b.as_ptr().add(9_999) }, 42);
                unsafe { *b.as_ptr() = 7 };
                assert_eq!(unsafe { *a.as_ptr() }, 7);
            }
            // Sandboxes may forbid pidfd_getfd; callers fall back to the pool.
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)),
                "{e}"
            ),
        }
    }

    #[test]
    fn a_peer_object_smaller_than_announced_fails() {
        let a = SharedMem::create("vmf-test", 4096).unwrap();
        let r = SharedMem::open_peer(std::process::id() as i32, a.raw_fd(), 1 << 20);
        assert!(r.is_err());
    }
}
