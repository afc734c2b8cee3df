//! The guest's doorbell (in the agent): the MSI-X interrupts of its `ivshmem-doorbell` device, taken
//! from user space through VFIO ([`vmf_pal::vfio`]), one eventfd per vector. Vector v is lent to one
//! rank at a time: the rank inherits a descriptor of eventfd v (`VMF_IVSHMEM_BELL=<v>:<fd>`), publishes
//! (IVPosition, v) in its slot of the region when it goes to sleep and sleeps in `poll` on the eventfd;
//! a peer in another guest rings it by writing `IVPosition << 16 | v` to its own device's doorbell
//! register (sysfs `resource0`, one store). The device carries interrupts only and stays for the guest's
//! life: the region is another device (ivshmem-plain), which failover unplugs and plugs back.
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

struct Bell {
    eventfds: Vec<OwnedFd>,
    vfio: Option<vmf_pal::vfio::VfioMsix>,
    /// Vector lent to each rank's pid.
    lent: HashMap<i32, u16>,
    /// Why the interrupts are not available (shown by `info`).
    error: Option<String>,
}

static BELL: Mutex<Option<Bell>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Option<Bell>> {
    BELL.lock().unwrap_or_else(|p| p.into_inner())
}

fn sh(cmd: &str) {
    let _ = std::process::Command::new("/bin/sh")
        .args(["-c", cmd])
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .status();
}

/// Take the interrupts of this guest's doorbell device, if it has one (at boot).
pub fn up() {
    let Some(dev) = vmf_pal::pci::doorbell_device() else {
        return;
    };
    let mut g = lock();
    let b = g.get_or_insert_with(|| Bell { eventfds: Vec::new(), vfio: None, lent: HashMap::new(), error: None });
    if b.vfio.is_some() {
        return;
    }
    if b.eventfds.is_empty() {
        for _ in 0..crate::qemu::DOORBELL_VECTORS {
            // SAFETY: plain syscall; the descriptor is ours.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                b.error = Some(format!("eventfd: {}", std::io::Error::last_os_error()));
                return;
            }
            // SAFETY: a fresh descriptor.
            b.eventfds.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    // Without interrupt remapping (the emulated IOMMU has it off) VFIO's type-1 IOMMU refuses MSI
    // unless told that is acceptable: the device is QEMU's own, in this guest.
    sh("modprobe vfio_iommu_type1 allow_unsafe_interrupts=1 2>/dev/null; \
        echo 1 > /sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts 2>/dev/null; \
        modprobe vfio-pci 2>/dev/null");
    let fds: Vec<RawFd> = b.eventfds.iter().map(|f| f.as_raw_fd()).collect();
    match vmf_pal::vfio::VfioMsix::open(&dev.sysfs, &fds) {
        Ok(v) => {
            b.vfio = Some(v);
            b.error = None;
        }
        Err(e) => {
            eprintln!("vmfabric-guest: no doorbell interrupts ({e}); ranks here sleep in bounded steps");
            b.error = Some(e.to_string());
        }
    }
}

/// What `info` shows: vectors routed, or why none are.
pub fn describe() -> serde_json::Value {
    match lock().as_ref() {
        None => serde_json::Value::Null,
        Some(b) => serde_json::json!({
            "vectors": b.vfio.as_ref().map_or(0, |v| v.vectors()),
            "lent": b.lent.len(),
            "error": b.error,
        }),
    }
}

/// A vector and a descriptor of its eventfd (close-on-exec: the caller clears that in the rank's child
/// only, and closes it after the spawn) for a rank about to start; None without interrupts or when every
/// vector is lent. The vector is reserved at once (two jobs may start ranks at the same moment); confirm
/// with [`lent_to`] or give it back with [`unlend`].
pub fn lend() -> Option<(u16, OwnedFd)> {
    let mut g = lock();
    let b = g.as_mut()?;
    b.vfio.as_ref()?;
    let v = (0..b.eventfds.len() as u16).find(|v| !b.lent.values().any(|x| x == v))?;
    let fd = b.eventfds[v as usize].as_raw_fd();
    // Drain what an earlier rank left.
    vmf_pal::drain_eventfd(fd);
    // SAFETY: dup of our descriptor (close-on-exec); the copy is owned by the caller.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if d < 0 {
        return None;
    }
    b.lent.insert(reservation(v), v);
    // SAFETY: a fresh descriptor.
    Some((v, unsafe { OwnedFd::from_raw_fd(d) }))
}

/// The key a vector is reserved under between [`lend`] and [`lent_to`] (no pid is negative).
fn reservation(v: u16) -> i32 {
    -1 - i32::from(v)
}

/// Record that `pid` holds vector `v` (lent to it by [`lend`]).
pub fn lent_to(pid: i32, v: u16) {
    if let Some(b) = lock().as_mut() {
        b.lent.remove(&reservation(v));
        b.lent.insert(pid, v);
    }
}

/// A rank that did not start: its vector is free again.
pub fn unlend(v: u16) {
    if let Some(b) = lock().as_mut() {
        b.lent.remove(&reservation(v));
    }
}

/// The rank `pid` has ended: its vector is free again.
pub fn give_back(pid: i32) {
    if let Some(b) = lock().as_mut() {
        b.lent.remove(&pid);
    }
}
