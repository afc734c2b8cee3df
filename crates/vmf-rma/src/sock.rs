//! Socket writes that never raise SIGPIPE (a C MPI program keeps the default disposition, which would
//! kill it when a peer has gone): `sendmsg` with `MSG_NOSIGNAL`.
use std::io;
use std::os::fd::RawFd;

/// Write as much of `parts` (in order) as the socket takes now; returns the bytes written.
pub(crate) fn sendv(fd: RawFd, parts: &[&[u8]]) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    if iov.is_empty() {
        return Ok(0);
    }
    loop {
        // SAFETY: a zeroed msghdr is valid; it names our iovecs, which describe live buffers.
        let r = unsafe {
            let mut m: libc::msghdr = std::mem::zeroed();
            m.msg_iov = iov.as_ptr() as *mut libc::iovec;
            m.msg_iovlen = iov.len() as _;
            libc::sendmsg(fd, &m, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Write all of `buf` to a blocking socket (handshake messages).
pub(crate) fn send_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is a live slice.
        let r = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[r as usize..];
    }
    Ok(())
}
