//! Passing file descriptors over Unix sockets (`SCM_RIGHTS`), as QEMU's ivshmem protocol does: each
//! message is a little-endian `i64` with at most one descriptor beside it.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Send `v` (8 bytes, little endian) with `fd` attached when given.
pub fn send_i64(s: &UnixStream, v: i64, fd: Option<RawFd>) -> io::Result<()> {
    let data = v.to_le_bytes();
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // Room for one descriptor, aligned as cmsghdr wants.
    let mut cbuf = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; the fields are filled below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_* compute sizes and pointers inside `cbuf`, which is large enough for one int.
        unsafe {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    loop {
        // SAFETY: msg points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n == data.len() as isize {
            return Ok(());
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short sendmsg"));
    }
}

/// Receive one message sent by [`send_i64`]: its value and the descriptor that came with it. Ok(None) at
/// the end of the stream.
pub fn recv_i64(s: &UnixStream) -> io::Result<Option<(i64, Option<OwnedFd>)>> {
    let mut data = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: as in send_i64.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: msg points at live buffers.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break n as usize;
    };
    let mut fd = None;
    // SAFETY: walking the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let f = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>().add(i));
                    let owned = OwnedFd::from_raw_fd(f);
                    if fd.is_none() {
                        fd = Some(owned);
                    } // extra descriptors are closed as they drop
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 {
        return Ok(None);
    }
    if n != 8 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a message shorter than 8 bytes"));
    }
    Ok(Some((i64::from_le_bytes(data), fd)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn a_value_and_a_descriptor_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = tempfile_in_shm();
        f.write_all(b"hello").unwrap();
        send_i64(&a, -1, Some(f.as_raw_fd())).unwrap();
        send_i64(&a, 42, None).unwrap();
        let (v, fd) = recv_i64(&b).unwrap().unwrap();
        assert_eq!(v, -1);
        let mut g = std::fs::File::from(fd.expect("a descriptor"));
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        let (v, fd) = recv_i64(&b).unwrap().unwrap();
        assert_eq!((v, fd.is_none()), (42, true));
        drop(a);
        assert!(recv_i64(&b).unwrap().is_none());
    }

    fn tempfile_in_shm() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("vmf-fdpass-{}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }
}
