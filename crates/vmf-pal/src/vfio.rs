//! A PCI device's MSI-X interrupts in user space through VFIO (type-1 IOMMU), as a guest's agent takes
//! the interrupts of its `ivshmem-doorbell` device: each vector signals an eventfd.
//!
//! What the device needs: an IOMMU group (in a QEMU guest, `-device intel-iommu` and `intel_iommu=on`;
//! Debian's kernel has no VFIO no-IOMMU mode), the `vfio-pci` driver (bound here through
//! `driver_override`), and, without interrupt remapping, `vfio_iommu_type1 allow_unsafe_interrupts=1`.
//! Only the interrupts and the config space are used: the BARs are left to sysfs `resourceN` mappings
//! (with `CONFIG_IO_STRICT_DEVMEM` a BAR that VFIO has claimed can no longer be mapped there).
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

const VFIO_TYPE: u64 = b';' as u64;
const fn io(nr: u64) -> u64 {
    (VFIO_TYPE << 8) | (100 + nr)
}
const GET_API_VERSION: u64 = io(0);
const CHECK_EXTENSION: u64 = io(1);
const SET_IOMMU: u64 = io(2);
const GROUP_GET_STATUS: u64 = io(3);
const GROUP_SET_CONTAINER: u64 = io(4);
const GROUP_GET_DEVICE_FD: u64 = io(6);
const DEVICE_GET_REGION_INFO: u64 = io(8);
const DEVICE_GET_IRQ_INFO: u64 = io(9);
const DEVICE_SET_IRQS: u64 = io(10);
const TYPE1V2_IOMMU: u64 = 3;
const API_VERSION: i32 = 0;
const GROUP_FLAGS_VIABLE: u32 = 1;
const PCI_CONFIG_REGION_INDEX: u32 = 7;
const PCI_MSIX_IRQ_INDEX: u32 = 2;
const IRQ_SET_DATA_NONE: u32 = 1;
const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
const PCI_COMMAND: u64 = 4;
const PCI_COMMAND_MASTER: u16 = 4;

#[repr(C)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

#[repr(C)]
struct IrqInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    count: u32,
}

fn err(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn ioctl(fd: RawFd, req: u64, arg: *mut libc::c_void) -> io::Result<i32> {
    // SAFETY: the callers pass a request and an argument of the layout the kernel expects for it.
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A device opened through VFIO whose MSI-X vectors signal eventfds. Dropping it disables the
/// interrupts and releases the device (the kernel can then unbind or remove it).
pub struct VfioMsix {
    _container: File,
    _group: File,
    device: File,
    vectors: usize,
}

impl VfioMsix {
    /// Bind the PCI device at `sysfs` (e.g. `/sys/bus/pci/devices/0000:01:00.0`) to vfio-pci if it
    /// is not yet, open it, enable bus mastering (MSI messages are memory writes of the device) and
    /// route MSI-X vector i to `eventfds[i]`.
    pub fn open(sysfs: &Path, eventfds: &[RawFd]) -> io::Result<VfioMsix> {
        let addr = sysfs
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a PCI device directory"))?
            .to_owned();
        let driver = std::fs::read_link(sysfs.join("driver")).ok();
        if !driver.as_ref().is_some_and(|d| d.ends_with("vfio-pci")) {
            if driver.is_some() {
                std::fs::write(sysfs.join("driver/unbind"), &addr).map_err(|e| err("unbinding its driver", e))?;
            }
            std::fs::write(sysfs.join("driver_override"), "vfio-pci").map_err(|e| err("driver_override", e))?;
            std::fs::write("/sys/bus/pci/drivers_probe", &addr).map_err(|e| err("binding vfio-pci", e))?;
        }
        let group = std::fs::read_link(sysfs.join("iommu_group")).map_err(|e| {
            err("the device has no IOMMU group (a guest needs an IOMMU: intel_iommu=on)", e)
        })?;
        let group = group
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad iommu_group link"))?
            .to_owned();
        let rw = |p: &str| std::fs::OpenOptions::new().read(true).write(true).open(p);
        let container = rw("/dev/vfio/vfio").map_err(|e| err("/dev/vfio/vfio", e))?;
        if ioctl(container.as_raw_fd(), GET_API_VERSION, std::ptr::null_mut())? != API_VERSION {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "unknown VFIO API version"));
        }
        if ioctl(container.as_raw_fd(), CHECK_EXTENSION, TYPE1V2_IOMMU as *mut libc::c_void)? == 0 {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "no VFIO type-1 IOMMU"));
        }
        let gpath = format!("/dev/vfio/{group}");
        let gfile = rw(&gpath).map_err(|e| err(&gpath, e))?;
        let mut st = [8u32, 0u32];
        ioctl(gfile.as_raw_fd(), GROUP_GET_STATUS, st.as_mut_ptr().cast())?;
        if st[1] & GROUP_FLAGS_VIABLE == 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("IOMMU group {group} is not viable (another device in it has a driver)"),
            ));
        }
        let mut cfd: i32 = container.as_raw_fd();
        ioctl(gfile.as_raw_fd(), GROUP_SET_CONTAINER, (&mut cfd as *mut i32).cast())
            .map_err(|e| err("VFIO_GROUP_SET_CONTAINER", e))?;
        ioctl(container.as_raw_fd(), SET_IOMMU, TYPE1V2_IOMMU as *mut libc::c_void).map_err(|e| {
            err("VFIO_SET_IOMMU (without interrupt remapping: vfio_iommu_type1 allow_unsafe_interrupts=1)", e)
        })?;
        let cname = std::ffi::CString::new(addr.clone()).expect("no NUL in a PCI address");
        let dfd = ioctl(gfile.as_raw_fd(), GROUP_GET_DEVICE_FD, cname.as_ptr() as *mut libc::c_void)
            .map_err(|e| err("VFIO_GROUP_GET_DEVICE_FD", e))?;
        // SAFETY: a fresh descriptor the kernel handed us.
        let device = File::from(unsafe { OwnedFd::from_raw_fd(dfd) });
        let mut irq = IrqInfo {
            argsz: std::mem::size_of::<IrqInfo>() as u32,
            flags: 0,
            index: PCI_MSIX_IRQ_INDEX,
            count: 0,
        };
        ioctl(device.as_raw_fd(), DEVICE_GET_IRQ_INFO, (&mut irq as *mut IrqInfo).cast())?;
        if (irq.count as usize) < eventfds.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the device has {} MSI-X vectors, {} wanted", irq.count, eventfds.len()),
            ));
        }
        // Bus mastering: without it QEMU drops the device's MSI writes.
        let mut cfg = RegionInfo {
            argsz: std::mem::size_of::<RegionInfo>() as u32,
            flags: 0,
            index: PCI_CONFIG_REGION_INDEX,
            cap_offset: 0,
            size: 0,
            offset: 0,
        };
        ioctl(device.as_raw_fd(), DEVICE_GET_REGION_INFO, (&mut cfg as *mut RegionInfo).cast())?;
        let mut cmd = [0u8; 2];
        device.read_exact_at(&mut cmd, cfg.offset + PCI_COMMAND)?;
        let c = u16::from_le_bytes(cmd) | PCI_COMMAND_MASTER;
        device.write_all_at(&c.to_le_bytes(), cfg.offset + PCI_COMMAND)?;
        let v = VfioMsix {
            _container: container,
            _group: gfile,
            device,
            vectors: eventfds.len(),
        };
        v.set_irqs(eventfds)?;
        Ok(v)
    }

    fn set_irqs(&self, eventfds: &[RawFd]) -> io::Result<()> {
        let n = eventfds.len();
        let mut buf: Vec<u32> = vec![
            (20 + 4 * n) as u32,
            if n == 0 { IRQ_SET_DATA_NONE } else { IRQ_SET_DATA_EVENTFD } | IRQ_SET_ACTION_TRIGGER,
            PCI_MSIX_IRQ_INDEX,
            0,
            n as u32,
        ];
        buf.extend(eventfds.iter().map(|&f| f as u32));
        ioctl(self.device.as_raw_fd(), DEVICE_SET_IRQS, buf.as_mut_ptr().cast())
            .map_err(|e| err("VFIO_DEVICE_SET_IRQS (MSI-X)", e))?;
        Ok(())
    }

    /// MSI-X vectors routed.
    pub fn vectors(&self) -> usize {
        self.vectors
    }
}

impl Drop for VfioMsix {
    fn drop(&mut self) {
        let _ = self.set_irqs(&[]);
    }
}
