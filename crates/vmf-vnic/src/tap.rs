//! A TAP interface (`/dev/net/tun`), created in the calling thread's network namespace.
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
// TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN
const OFFLOADS: libc::c_ulong = 0x1 | 0x2 | 0x4 | 0x8;
/// Bytes of the virtio-net header in front of every frame with offloads on.
pub const VNET_HDR: usize = 10;

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    _pad: [u8; 22],
}

/// An open TAP device: reads return one Ethernet frame, writes inject one.
pub struct Tap {
    file: File,
}

impl Tap {
    /// Create (or attach to) TAP interface `name`. With `offload`, frames carry a virtio-net header and
    /// the stack hands over (and accepts) TCP segments up to 64 KiB with checksums left to the receiver,
    /// as it does with veth and virtio-net.
    pub fn open(name: &str, offload: bool) -> io::Result<Tap> {
        if name.is_empty() || name.len() > 15 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "interface names are 1..15 bytes"));
        }
        let file = OpenOptions::new().read(true).write(true).open("/dev/net/tun")?;
        let mut req = IfReq {
            name: [0; 16],
            flags: IFF_TAP | IFF_NO_PI | if offload { IFF_VNET_HDR } else { 0 },
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes one struct ifreq, which `req` is (40 bytes, C layout).
        if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        if offload && unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD as _, OFFLOADS) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tap { file })
    }

    /// Make reads return `WouldBlock` instead of waiting (then wait with [`Tap::wait_readable`]).
    pub fn set_nonblocking(&self) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        // SAFETY: fcntl on our own descriptor.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wait until a frame can be read or `timeout_ms` passes.
    pub fn wait_readable(&self, timeout_ms: i32) {
        let mut p = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, timeout_ms) };
    }

    /// Read one frame into `len` bytes at `dst` (which may be shared memory).
    ///
    /// # Safety
    /// `dst` must be writable for `len` bytes.
    pub unsafe fn read_into(&self, dst: *mut u8, len: usize) -> io::Result<usize> {
        let r = libc::read(self.file.as_raw_fd(), dst.cast(), len);
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// Read one frame into `buf`.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is writable for its length.
        let r = unsafe { libc::read(self.file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// Inject one frame.
    pub fn write(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is readable for its length.
        let r = unsafe { libc::write(self.file.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}
