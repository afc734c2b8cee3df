//! The ivshmem server of a host group: hands the group's shared file and the interrupt eventfds to the
//! `ivshmem-doorbell` devices of its guests, speaking QEMU's ivshmem client-server protocol (QEMU's
//! docs/specs/ivshmem-spec.rst; Debian ships no server).
//!
//! Per connecting device (a QEMU, or the same QEMU again after a hot-plug) the server picks an ID (the
//! guest reads it from its IVPosition register), makes one eventfd per vector, and sends, each as an
//! 8-byte little-endian number with at most one descriptor: the protocol version 0; the ID; -1 with the
//! shared file; the other devices' ID once per vector with their eventfds (for ringing them); and its own
//! ID once per vector with its own eventfds (for being rung). The devices already there are told the
//! newcomer's ID and eventfds; when a device disconnects they are not told (the protocol's "ID alone"
//! message would crash QEMU 7.2 at their own unplug, see [`serve`]), and its ID is never given again. A device then rings
//! peer P's vector V by writing `P << 16 | V` to its doorbell register: QEMU writes P's eventfd V, and P's
//! QEMU raises MSI-X vector V in its guest. The server itself is not on that path.
//!
//! It runs as its own process (`vmfabric vm ivshmem-server`, started by [`crate::cluster`]), so guests
//! kept up by `vmfabric vm up` can be hot-plugged again later.
use crate::VmError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Most interrupt vectors a device gets (the doorbell register's vector field has 16 bits; each
/// vector is an MSI-X interrupt in the guest).
pub const MAX_VECTORS: u16 = 64;

struct Client {
    id: u16,
    s: UnixStream,
    fds: Vec<OwnedFd>,
}

fn memory() -> std::io::Result<std::fs::File> {
    // SAFETY: a NUL-terminated name; the descriptor is ours.
    let fd = unsafe { libc::memfd_create(c"vmfabric-ivshmem-server".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.set_len(MEMORY)?;
    Ok(f)
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; the descriptor is ours.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Size of the memory the server hands out: the devices it serves carry interrupts only (the region is
/// another device), and the protocol requires some memory.
pub const MEMORY: u64 = 4096;

/// Serve the devices that connect to `socket` with `vectors` interrupt vectors each (and [`MEMORY`]
/// bytes of memory of the server's own), until the socket file is removed or the process is killed.
pub fn serve(socket: &Path, vectors: u16) -> Result<(), VmError> {
    if vectors == 0 || vectors > MAX_VECTORS {
        return Err(VmError::Usage(format!("--vectors {vectors} is not within 1..={MAX_VECTORS}")));
    }
    let mem = memory().map_err(|e| VmError::Setup(format!("cannot make the server's memory ({e})")))?;
    let _ = std::fs::remove_file(socket);
    let l = UnixListener::bind(socket)
        .map_err(|e| VmError::Setup(format!("cannot listen on {} ({e})", socket.display())))?;
    let mut clients: Vec<Client> = Vec::new();
    let mut next: Option<u16> = Some(0);
    loop {
        let mut pfds: Vec<libc::pollfd> = std::iter::once(l.as_raw_fd())
            .chain(clients.iter().map(|c| c.s.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: pfds is a live array of pollfd.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 1000) };
        if !socket.exists() {
            return Ok(());
        }
        if n <= 0 {
            continue;
        }
        // Disconnections first (a device sends nothing: any readable event is the end of its stream).
        let mut gone = Vec::new();
        for (i, p) in pfds.iter().enumerate().skip(1) {
            if p.revents != 0 {
                gone.push(i - 1);
            }
        }
        // The others are not told (the protocol's "ID alone" message): QEMU 7.2 frees the peer's
        // eventfd array when told and frees it again when its own device is unplugged, a double free
        // that kills that QEMU. Untold, a device keeps the departed peer's eventfds, whose other ends
        // are closed here: ringing them wakes nobody. IDs are never reused (see below), so a stale
        // entry is never mistaken for a newcomer.
        for &i in gone.iter().rev() {
            clients.remove(i);
        }
        if pfds[0].revents & libc::POLLIN != 0 {
            let Ok((s, _)) = l.accept() else { continue };
            // A fresh ID per connection: the devices keep departed peers' entries (see above).
            let Some(id) = next else {
                eprintln!("vmfabric ivshmem-server: every device ID has been used; refusing a new device");
                drop(s);
                continue;
            };
            next = id.checked_add(1);
            let fds: Vec<OwnedFd> = match (0..vectors).map(|_| eventfd()).collect() {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("vmfabric ivshmem-server: no eventfd for a new device ({e})");
                    continue;
                }
            };
            let c = Client { id, s, fds };
            if let Err(e) = welcome(&c, &clients, mem.as_raw_fd()) {
                eprintln!("vmfabric ivshmem-server: device {id} left during its setup ({e})");
                continue;
            }
            clients.push(c);
        }
    }
}

/// Steps 1-5 of the protocol for newcomer `c`, and its announcement to the others.
fn welcome(c: &Client, others: &[Client], mem: i32) -> std::io::Result<()> {
    use vmf_pal::fdpass::send_i64;
    send_i64(&c.s, 0, None)?;
    send_i64(&c.s, i64::from(c.id), None)?;
    send_i64(&c.s, -1, Some(mem))?;
    for o in others {
        for f in &o.fds {
            send_i64(&c.s, i64::from(o.id), Some(f.as_raw_fd()))?;
        }
    }
    for o in others {
        for f in &c.fds {
            // A peer that fails here is dropped at its next poll.
            let _ = send_i64(&o.s, i64::from(c.id), Some(f.as_raw_fd()));
        }
    }
    for f in &c.fds {
        send_i64(&c.s, i64::from(c.id), Some(f.as_raw_fd()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmf_pal::fdpass::recv_i64;

    fn next(s: &UnixStream) -> (i64, Option<OwnedFd>) {
        recv_i64(s).unwrap().expect("a message")
    }

    /// Two devices connect, one leaves: each sees the protocol's messages in order, and the eventfd the
    /// first got for ringing the second is the one the second listens on.
    #[test]
    fn devices_get_ids_the_shared_file_and_each_others_eventfds() {
        let dir = std::env::temp_dir().join(format!("vmf-ivs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s");
        let s2 = sock.clone();
        let t = std::thread::spawn(move || serve(&s2, 2));
        while !sock.exists() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let a = UnixStream::connect(&sock).unwrap();
        assert_eq!(next(&a).0, 0, "version");
        assert_eq!(next(&a).0, 0, "the first ID is 0");
        let (v, f) = next(&a);
        assert_eq!(v, -1);
        let mem = std::fs::File::from(f.expect("the shared file"));
        assert_eq!(mem.metadata().unwrap().len(), MEMORY);
        let a_own: Vec<OwnedFd> = (0..2).map(|_| { let (v, f) = next(&a); assert_eq!(v, 0); f.unwrap() }).collect();
        let b = UnixStream::connect(&sock).unwrap();
        assert_eq!(next(&b).0, 0);
        assert_eq!(next(&b).0, 1);
        assert_eq!(next(&b).0, -1);
        let to_a: Vec<OwnedFd> = (0..2).map(|_| { let (v, f) = next(&b); assert_eq!(v, 0); f.unwrap() }).collect();
        let _b_own: Vec<OwnedFd> = (0..2).map(|_| { let (v, f) = next(&b); assert_eq!(v, 1); f.unwrap() }).collect();
        let _to_b: Vec<OwnedFd> = (0..2).map(|_| { let (v, f) = next(&a); assert_eq!(v, 1); f.unwrap() }).collect();
        // b rings a's vector 1: a's own eventfd 1 counts it.
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 bytes to an eventfd.
        assert_eq!(unsafe { libc::write(to_a[1].as_raw_fd(), one.as_ptr().cast(), 8) }, 8);
        let mut got = [0u8; 8];
        // SAFETY: 8 bytes from an eventfd.
        assert_eq!(unsafe { libc::read(a_own[1].as_raw_fd(), got.as_mut_ptr().cast(), 8) }, 8);
        assert_eq!(u64::from_ne_bytes(got), 1);
        // b leaves and another device comes: it gets a fresh ID (2, not 1), and a hears of the
        // newcomer, not of b's departure (QEMU 7.2 would free b's entry twice).
        drop(b);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let c = UnixStream::connect(&sock).unwrap();
        assert_eq!(next(&c).0, 0);
        assert_eq!(next(&c).0, 2, "IDs are not reused");
        assert_eq!(next(&c).0, -1);
        for _ in 0..2 {
            assert_eq!(next(&c).0, 0, "c can ring a");
        }
        let (v, f) = next(&a);
        assert_eq!((v, f.is_some()), (2, true), "a hears of c, with an eventfd");
        std::fs::remove_file(&sock).unwrap();
        drop(a);
        t.join().unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
