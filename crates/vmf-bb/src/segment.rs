//! A shared memory segment: a file (normally under /dev/shm) or an existing mappable file or device (an
//! ivshmem PCI BAR such as `/sys/bus/pci/devices/*/resource2`), mapped `MAP_SHARED`.
//!
//! Nothing inside a segment is addressed by pointer: callers ask for typed views at offsets and every
//! request is checked against the mapping's bounds and the type's alignment.
use memmap2::MmapRaw;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Errors from creating, opening or addressing a segment.
#[derive(Debug, Error)]
pub enum SegmentError {
    /// The file could not be opened or created.
    #[error("Unable to open shared segment {path} since {source}")]
    Open {
        /// Path of the segment.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The file could not be sized or mapped.
    #[error("Unable to map shared segment {path} since {source}")]
    Map {
        /// Path of the segment.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A view was requested outside the mapping or misaligned.
    #[error("Unable to access offset {offset}+{len} of a {size}-byte segment since it is out of bounds or misaligned")]
    OutOfBounds {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Size of the mapping.
        size: u64,
    },
}

/// A mapped shared segment.
pub struct Segment {
    map: MmapRaw,
    path: PathBuf,
    _file: File,
}

// SAFETY: the mapping is process-shared memory accessed only through atomics or explicit copies.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Open `path`, creating it with mode 0600 if it does not exist, and make sure it is at least `size`
    /// bytes (a new file is sparse: pages cost memory only once touched). Returns the segment and whether
    /// this call created the file.
    pub fn open_or_create(path: &Path, size: u64) -> Result<(Segment, bool), SegmentError> {
        let open_err = |source| SegmentError::Open {
            path: path.to_owned(),
            source,
        };
        let (file, created) = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(f) => (f, true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => (
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(open_err)?,
                false,
            ),
            Err(e) => return Err(open_err(e)),
        };
        let map_err = |source| SegmentError::Map {
            path: path.to_owned(),
            source,
        };
        let cur = file.metadata().map_err(map_err)?.len();
        if cur < size {
            file.set_len(size).map_err(map_err)?;
        }
        let seg = Self::map(file, path, size.max(cur))?;
        Ok((seg, created))
    }

    /// Map an existing file or device as it is (no creation, no resizing). The size is taken from the file's
    /// metadata (for a sysfs PCI resource file, the BAR size).
    pub fn open_existing(path: &Path) -> Result<Segment, SegmentError> {
        let (file, len) = Self::existing(path)?;
        if len == 0 {
            return Err(SegmentError::Map {
                path: path.to_owned(),
                source: std::io::Error::other(
                    "file has size 0; give a pre-sized file or a PCI BAR",
                ),
            });
        }
        Self::map(file, path, len)
    }

    /// Map `len` bytes at `offset` (a multiple of the page size) of an existing file or device, which
    /// must hold them: a structure that lives inside another's segment (the emulated hardware in a
    /// window of an ivshmem BAR's region) gets a mapping of its own, bounded to its window, so an offset
    /// it computes can never reach the structure around it.
    pub fn open_window(path: &Path, offset: u64, len: u64) -> Result<Segment, SegmentError> {
        let map_err = |why: String| SegmentError::Map {
            path: path.to_owned(),
            source: std::io::Error::other(why),
        };
        if len == 0 || offset % 4096 != 0 {
            return Err(map_err(format!("a window of {len} bytes at {offset} is empty or not page-aligned")));
        }
        let (file, size) = Self::existing(path)?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(map_err(format!("a window of {len} bytes at {offset} overruns its {size} bytes")));
        }
        Self::map_at(file, path, offset, len)
    }

    /// An existing file or device opened read-write, and its size (a BAR's, for a sysfs resource file).
    fn existing(path: &Path) -> Result<(File, u64), SegmentError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| SegmentError::Open {
                path: path.to_owned(),
                source,
            })?;
        let len = file
            .metadata()
            .map_err(|source| SegmentError::Map {
                path: path.to_owned(),
                source,
            })?
            .len();
        Ok((file, len))
    }

    fn map(file: File, path: &Path, len: u64) -> Result<Segment, SegmentError> {
        Self::map_at(file, path, 0, len)
    }

    fn map_at(file: File, path: &Path, offset: u64, len: u64) -> Result<Segment, SegmentError> {
        let map = memmap2::MmapOptions::new()
            .offset(offset)
            .len(len as usize)
            .map_raw(&file)
            .map_err(|source| SegmentError::Map {
                path: path.to_owned(),
                source,
            })?;
        Ok(Segment {
            map,
            path: path.to_owned(),
            _file: file,
        })
    }

    /// Size of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// True if the mapping is empty (never, for a successfully opened segment).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Path the segment was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Check that `[offset, offset+len)` lies inside the mapping and `offset` is `align`-aligned.
    pub fn check(&self, offset: u64, len: u64, align: u64) -> Result<(), SegmentError> {
        let size = self.len();
        let ok = offset % align == 0 && offset.checked_add(len).is_some_and(|end| end <= size);
        if ok {
            Ok(())
        } else {
            Err(SegmentError::OutOfBounds { offset, len, size })
        }
    }

    /// A typed reference at `offset`, bounds- and alignment-checked. `T` must be valid for any bit pattern
    /// (atomics and plain integers only): the other side of the mapping may write anything.
    pub fn at<T: ShmSafe>(&self, offset: u64) -> Result<&T, SegmentError> {
        self.check(
            offset,
            std::mem::size_of::<T>() as u64,
            std::mem::align_of::<T>() as u64,
        )?;
        // SAFETY: in bounds and aligned (checked above); T: ShmSafe is valid for every bit pattern and only
        // accessed through atomics; the mapping lives as long as &self.
        Ok(unsafe { &*(self.map.as_mut_ptr().add(offset as usize) as *const T) })
    }

    /// Raw pointer to `[offset, offset+len)`, bounds-checked.
    pub fn ptr(&self, offset: u64, len: u64) -> Result<*mut u8, SegmentError> {
        self.check(offset, len, 1)?;
        // SAFETY: in bounds (checked above).
        Ok(unsafe { self.map.as_mut_ptr().add(offset as usize) })
    }
}

/// Marker for types that may be viewed in shared memory: every bit pattern is a valid value and all
/// mutation happens through atomics.
///
/// # Safety
/// Implement only for `#[repr(C)]` types made of atomics and padding.
pub unsafe trait ShmSafe {}
// SAFETY: atomics accept any bit pattern.
unsafe impl ShmSafe for std::sync::atomic::AtomicU64 {}
// SAFETY: as above.
unsafe impl ShmSafe for std::sync::atomic::AtomicU32 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("vmf-seg-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn create_then_open_shares_memory_works() {
        let p = tmp("share");
        let (a, created) = Segment::open_or_create(&p, 8192).unwrap();
        assert!(created);
        let (b, created2) = Segment::open_or_create(&p, 8192).unwrap();
        assert!(!created2);
        a.at::<AtomicU64>(4096)
            .unwrap()
            .store(42, Ordering::Release);
        assert_eq!(b.at::<AtomicU64>(4096).unwrap().load(Ordering::Acquire), 42);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn out_of_bounds_and_misaligned_fail() {
        let p = tmp("oob");
        let (a, _) = Segment::open_or_create(&p, 4096).unwrap();
        assert!(a.at::<AtomicU64>(4096).is_err());
        assert!(a.at::<AtomicU64>(4092).is_err());
        assert!(a.at::<AtomicU64>(3).is_err());
        assert!(a.ptr(u64::MAX - 2, 8).is_err());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_window_sees_its_part_of_the_file_and_nothing_beyond_works() {
        let p = tmp("win");
        let (whole, _) = Segment::open_or_create(&p, 4 * 4096).unwrap();
        let w = Segment::open_window(&p, 2 * 4096, 4096).unwrap();
        assert_eq!(w.len(), 4096);
        w.at::<AtomicU64>(8).unwrap().store(7, Ordering::Release);
        assert_eq!(whole.at::<AtomicU64>(2 * 4096 + 8).unwrap().load(Ordering::Acquire), 7);
        assert!(w.at::<AtomicU64>(4096).is_err());
        // Past the end, unaligned, empty: refused.
        assert!(Segment::open_window(&p, 3 * 4096, 8192).is_err());
        assert!(Segment::open_window(&p, 100, 4096).is_err());
        assert!(Segment::open_window(&p, 0, 0).is_err());
        assert!(Segment::open_window(&p, u64::MAX - 4095, 4096).is_err());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn open_existing_uses_file_size_works() {
        let p = tmp("dev");
        std::fs::File::create(&p).unwrap().set_len(65536).unwrap();
        let s = Segment::open_existing(&p).unwrap();
        assert_eq!(s.len(), 65536);
        std::fs::remove_file(&p).unwrap();
        assert!(Segment::open_existing(&p).is_err());
    }
}
