//! PCI devices seen through sysfs: finding an ivshmem device (QEMU's inter-VM shared memory, PCI vendor
//! 0x1af4, device 0x1110) whose BAR 2 is the memory the VMs of one host share.
use std::path::{Path, PathBuf};

/// Red Hat / virtio vendor id used by QEMU's ivshmem.
pub const IVSHMEM_VENDOR: u16 = 0x1af4;
/// ivshmem's device id (ivshmem-plain and ivshmem-doorbell alike).
pub const IVSHMEM_DEVICE: u16 = 0x1110;

/// An ivshmem device found in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IvshmemDevice {
    /// The device's sysfs directory, e.g. `/sys/bus/pci/devices/0000:00:04.0`.
    pub sysfs: PathBuf,
    /// Its PCI address (`0000:00:04.0`).
    pub address: String,
    /// BAR 2, mappable (`<sysfs>/resource2`): the shared memory.
    pub bar2: PathBuf,
    /// Size of BAR 2 in bytes.
    pub size: u64,
    /// True for ivshmem-doorbell (BAR 1 holds an MSI-X table, so the device has interrupts).
    pub doorbell: bool,
}

fn read_hex(p: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// The BARs of a device from its sysfs `resource` file: (start, end) per line, 0/0 when absent.
fn bars(dev: &Path) -> Vec<(u64, u64)> {
    let Ok(s) = std::fs::read_to_string(dev.join("resource")) else {
        return Vec::new();
    };
    s.lines()
        .map(|l| {
            let mut it = l.split_whitespace().map(|w| {
                u64::from_str_radix(w.trim_start_matches("0x"), 16).unwrap_or(0)
            });
            (it.next().unwrap_or(0), it.next().unwrap_or(0))
        })
        .collect()
}

/// Every ivshmem device under `root` (normally `/sys/bus/pci/devices`), in address order.
pub fn ivshmem_devices_in(root: &Path) -> Vec<IvshmemDevice> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut v: Vec<IvshmemDevice> = rd
        .flatten()
        .filter_map(|e| {
            let d = e.path();
            if read_hex(&d.join("vendor"))? != IVSHMEM_VENDOR as u64
                || read_hex(&d.join("device"))? != IVSHMEM_DEVICE as u64
            {
                return None;
            }
            // Just after a hot-plug the device's directory appears before its resource files.
            if !d.join("resource2").exists() {
                return None;
            }
            let b = bars(&d);
            let size = b.get(2).map_or(0, |&(s, e)| if e > s { e - s + 1 } else { 0 });
            let doorbell = b.get(1).is_some_and(|&(s, e)| e > s);
            Some(IvshmemDevice {
                address: e.file_name().to_string_lossy().into_owned(),
                bar2: d.join("resource2"),
                sysfs: d,
                size,
                doorbell,
            })
        })
        .collect();
    v.sort_by(|a, b| a.address.cmp(&b.address));
    v
}

/// The ivshmem devices of this machine (none outside a VM given one).
pub fn ivshmem_devices() -> Vec<IvshmemDevice> {
    ivshmem_devices_in(Path::new("/sys/bus/pci/devices"))
}

/// BAR 2 of an ivshmem-doorbell device below this size is taken for interrupts only (as `vmfabric vm
/// --doorbell` gives guests: a doorbell device beside the ivshmem-plain region), not for a region.
pub const DOORBELL_ONLY_MAX: u64 = 1 << 20;

impl IvshmemDevice {
    /// True for a doorbell device whose shared memory is too small to be a region (interrupts only).
    pub fn interrupts_only(&self) -> bool {
        self.doorbell && self.size < DOORBELL_ONLY_MAX
    }
}

/// Of `devs`, the one whose BAR 2 is the region: the first ivshmem-plain device, else the first
/// doorbell device with memory of region size (one device for memory and interrupts, as Nahanni had).
pub fn region_device_of(devs: &[IvshmemDevice]) -> Option<&IvshmemDevice> {
    devs.iter().find(|d| !d.doorbell).or_else(|| devs.iter().find(|d| !d.interrupts_only()))
}

/// Of `devs`, the one whose doorbell rings peers and whose interrupts wake this VM's ranks: the first
/// interrupts-only device, else the region's own device when it is a doorbell device.
pub fn doorbell_device_of(devs: &[IvshmemDevice]) -> Option<&IvshmemDevice> {
    devs.iter()
        .find(|d| d.interrupts_only())
        .or_else(|| region_device_of(devs).filter(|d| d.doorbell))
}

/// This VM's region device (see [`region_device_of`]).
pub fn region_device() -> Option<IvshmemDevice> {
    region_device_of(&ivshmem_devices()).cloned()
}

/// This VM's doorbell device (see [`doorbell_device_of`]).
pub fn doorbell_device() -> Option<IvshmemDevice> {
    doorbell_device_of(&ivshmem_devices()).cloned()
}

/// The registers of an `ivshmem-doorbell` device (BAR 0, mapped through sysfs `resource0`): its
/// IVPosition (the ID its peers ring it by) and the doorbell register. Ringing is one 32-bit store,
/// which QEMU turns into a write to the peer's eventfd for that vector: no system call in the guest.
pub struct IvshmemRegs {
    base: *mut u32,
}

// SAFETY: the mapping is process-wide MMIO; stores to it are single volatile 32-bit writes.
unsafe impl Send for IvshmemRegs {}
// SAFETY: as above; ringing from several threads is several independent stores.
unsafe impl Sync for IvshmemRegs {}

const REG_IVPOSITION: usize = 2;
const REG_DOORBELL: usize = 3;
const REGS_MAP: usize = 4096;

impl IvshmemRegs {
    /// Map the registers of `dev`.
    pub fn map(dev: &IvshmemDevice) -> std::io::Result<IvshmemRegs> {
        use std::os::fd::AsRawFd;
        let p = dev.sysfs.join("resource0");
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&p)?;
        let len = std::fs::metadata(&p)?.len();
        if len < 16 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "BAR 0 is smaller than the ivshmem registers"));
        }
        // SAFETY: a shared mapping of the device's register page; only 32-bit accesses are made.
        let m = unsafe {
            libc::mmap(std::ptr::null_mut(), REGS_MAP, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
        };
        if m == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(IvshmemRegs { base: m.cast() })
    }

    /// This device's ID among the peers of its ivshmem server.
    pub fn position(&self) -> u32 {
        // SAFETY: within the mapped page; an aligned 32-bit MMIO read.
        unsafe { std::ptr::read_volatile(self.base.add(REG_IVPOSITION)) }
    }

    /// Raise interrupt `vector` at the device with ID `peer` (possibly this one).
    #[inline]
    pub fn ring(&self, peer: u16, vector: u16) {
        // SAFETY: within the mapped page; an aligned 32-bit MMIO write.
        unsafe { std::ptr::write_volatile(self.base.add(REG_DOORBELL), (u32::from(peer) << 16) | u32::from(vector)) }
    }
}

impl Drop for IvshmemRegs {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.base.cast(), REGS_MAP) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(root: &Path, addr: &str, vendor: &str, device: &str, resource: &str) {
        let d = root.join(addr);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), vendor).unwrap();
        std::fs::write(d.join("device"), device).unwrap();
        std::fs::write(d.join("resource"), resource).unwrap();
        std::fs::write(d.join("resource2"), "").unwrap();
    }

    #[test]
    fn finds_ivshmem_among_other_devices_and_reads_bar2_size() {
        let root = std::env::temp_dir().join(format!("vmf-pci-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let z = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        fake(&root, "0000:00:03.0", "0x1af4\n", "0x1009\n", z);
        // ivshmem-plain: BAR0 registers, no BAR1, BAR2 64 MiB.
        let plain = format!(
            "0x00000000fe000000 0x00000000fe0000ff 0x40200\n{z}0x0000000400000000 0x0000000403ffffff 0x14220c\n"
        );
        fake(&root, "0000:00:05.0", "0x1af4\n", "0x1110\n", &plain);
        let bell = "0x00000000fe000000 0x00000000fe0000ff 0x40200\n0x00000000fe001000 0x00000000fe001fff 0x40200\n0x0000000800000000 0x00000008000fffff 0x14220c\n";
        fake(&root, "0000:00:04.0", "0x1af4\n", "0x1110\n", bell);
        fake(&root, "0000:00:06.0", "garbage", "0x1110\n", &plain);
        let v = ivshmem_devices_in(&root);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].address, "0000:00:04.0");
        assert!(v[0].doorbell);
        assert_eq!(v[0].size, 1 << 20);
        assert_eq!(v[1].size, 64 << 20);
        assert!(!v[1].doorbell);
        assert_eq!(v[1].bar2, root.join("0000:00:05.0/resource2"));
        assert!(ivshmem_devices_in(&root.join("missing")).is_empty());
        // The region is the plain device even where a doorbell device sorts first; a 1 MiB doorbell
        // device is a region of its own kind, not an interrupts-only one, so nothing rings here.
        assert_eq!(region_device_of(&v).unwrap().address, "0000:00:05.0");
        assert!(doorbell_device_of(&v).is_none());
        // Alone, the 1 MiB doorbell device is both the region and the doorbell (Nahanni's one device).
        assert_eq!(region_device_of(&v[..1]).unwrap().address, "0000:00:04.0");
        assert_eq!(doorbell_device_of(&v[..1]).unwrap().address, "0000:00:04.0");
        // `vmfabric vm --doorbell`: a 4 KiB doorbell device beside the plain region.
        let small = "0x00000000fe000000 0x00000000fe0000ff 0x40200\n0x00000000fe001000 0x00000000fe001fff 0x40200\n0x0000000800000000 0x0000000800000fff 0x14220c\n";
        fake(&root, "0000:00:02.0", "0x1af4\n", "0x1110\n", small);
        let v = ivshmem_devices_in(&root);
        assert_eq!(v.len(), 3);
        assert!(v[0].interrupts_only());
        assert_eq!(region_device_of(&v).unwrap().address, "0000:00:05.0");
        assert_eq!(doorbell_device_of(&v).unwrap().address, "0000:00:02.0");
        // An interrupts-only device never becomes the region.
        assert!(region_device_of(&v[..1]).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
