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
        std::fs::remove_dir_all(&root).unwrap();
    }
}
