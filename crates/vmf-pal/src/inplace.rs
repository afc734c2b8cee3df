//! Sharing private memory in place: the pages of a range of this process's private memory move into a
//! memfd mapped at the same addresses, with their contents, so that other processes of this kernel can map
//! them too (through the descriptor, as [`crate::shmem::SharedMem::open_peer`] does); when the sharing ends
//! the range becomes private anonymous memory again, still with its contents.
//!
//! This is how a one-sided window over memory the program allocated itself (`MPI_Win_create` on `malloc`
//! memory) becomes reachable with loads and stores by co-resident peers, instead of one system call per
//! access (`process_vm_writev`): what XPMEM does with a kernel module, done with `memfd_create` and
//! `mremap(MREMAP_FIXED)`, which replaces the pages of a range atomically.
//!
//! Only whole pages move, and only from mappings that are private and writable (anonymous memory, the
//! heap, the writable data of an executable or library), never the stack, another shared mapping or huge
//! pages. The move is done in chunks of [`CHUNK`] bytes (each copied into the memfd, then moved over the
//! original), so it needs no more than one chunk of extra memory; pages that hold only zeros are not
//! copied, so untouched memory stays unallocated. A write that another thread makes to a page between its
//! copy and its move is lost: callers share memory that nobody else writes meanwhile (a window being
//! created).
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// Bytes moved at a time.
pub const CHUNK: usize = 2 << 20;

const PAGE: usize = 4096;

/// Ranges of this process shared in place now (address, length): a range is shared once at most.
static SHARED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// A range of this process's memory shared in place; private again when dropped.
#[derive(Debug)]
pub struct InPlace {
    fd: OwnedFd,
    addr: usize,
    len: usize,
    restore: bool,
}

/// Is every byte of the page at `p` zero?
///
/// # Safety
/// `p` must be readable for a page and aligned to 8.
unsafe fn page_is_zero(p: *const u8) -> bool {
    let w = std::slice::from_raw_parts(p as *const u64, PAGE / 8);
    w.iter().fold(0u64, |a, &x| a | x) == 0
}

/// One mapping of `/proc/self/maps`.
struct MapEntry<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    offset: usize,
    inode: u64,
    /// The file, `[heap]`..., or empty for anonymous memory.
    path: &'a str,
    /// The file was deleted (`(deleted)` after its path).
    deleted: bool,
}

/// The mappings of this process, in address order, from the text of `/proc/self/maps`.
fn maps(text: &str) -> impl Iterator<Item = MapEntry<'_>> {
    text.lines().filter_map(|line| {
        let mut f = line.split_whitespace();
        let (range, perms, offset, _dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (a, b) = range.split_once('-')?;
        Some(MapEntry {
            start: usize::from_str_radix(a, 16).ok()?,
            end: usize::from_str_radix(b, 16).ok()?,
            perms,
            offset: usize::from_str_radix(offset, 16).ok()?,
            inode: inode.parse().ok()?,
            path: f.next().unwrap_or(""),
            deleted: line.ends_with("(deleted)"),
        })
    })
}

/// Can `[addr, addr + len)` move? Every byte must lie in a private writable mapping of a kind that may be
/// replaced (see the module docs); the answer reads `/proc/self/maps`.
pub fn movable(addr: usize, len: usize) -> io::Result<()> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    let end = addr
        .checked_add(len)
        .ok_or_else(|| io::Error::other("the range wraps around"))?;
    let mut covered = addr;
    for m in maps(&text) {
        let (a, b, path) = (m.start, m.end, m.path);
        if b <= covered || a >= end {
            continue;
        }
        if a > covered {
            return Err(io::Error::other(format!("{covered:#x} is not mapped")));
        }
        let kind_ok = path.is_empty()
            || path == "[heap]"
            || (path.starts_with('/')
                && !path.starts_with("/dev/")
                && !path.starts_with("/memfd:")
                && !path.starts_with("/anon_hugepage")
                && !m.deleted);
        if m.perms != "rw-p" || !kind_ok {
            return Err(io::Error::other(format!(
                "{a:#x}-{b:#x} is a mapping that stays where it is ({} {path})",
                m.perms
            )));
        }
        covered = b;
        if covered >= end {
            return Ok(());
        }
    }
    Err(io::Error::other(format!("{covered:#x} is not mapped")))
}

/// Map `n` bytes (`fd` at `off` shared, or private anonymous memory when `fd` is `None`) somewhere, copy
/// the nonzero pages of `[addr, addr + n)` into it (with `fd`: only the file's data ranges, read with
/// `SEEK_DATA`), and move it over `addr`.
///
/// # Safety
/// `[addr, addr + n)` must be mapped readable; `n` a multiple of the page size.
unsafe fn move_chunk(fd: Option<(RawFd, usize)>, addr: usize, n: usize, src_fd: Option<(RawFd, usize)>) -> io::Result<()> {
    let (flags, mfd, off) = match fd {
        Some((f, o)) => (libc::MAP_SHARED, f, o as libc::off_t),
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0),
    };
    let tmp = libc::mmap(std::ptr::null_mut(), n, libc::PROT_READ | libc::PROT_WRITE, flags, mfd, off);
    if tmp == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let tmp = tmp as *mut u8;
    let copy_page = |k: usize| {
        let s = (addr + k) as *const u8;
        if !page_is_zero(s) {
            std::ptr::copy_nonoverlapping(s, tmp.add(k), PAGE);
        }
    };
    match src_fd {
        // The source is the memfd: copy its data ranges only (reading a hole would allocate a page).
        Some((sfd, soff)) => {
            let mut k = 0usize;
            while k < n {
                let d = libc::lseek(sfd, (soff + k) as libc::off_t, libc::SEEK_DATA);
                if d < 0 {
                    break; // ENXIO: no data past here
                }
                let d = (d as usize).saturating_sub(soff) / PAGE * PAGE;
                if d >= n {
                    break;
                }
                let h = libc::lseek(sfd, (soff + d) as libc::off_t, libc::SEEK_HOLE);
                let h = if h < 0 { n } else { ((h as usize).saturating_sub(soff)).div_ceil(PAGE) * PAGE };
                let h = h.min(n);
                let mut q = d;
                while q < h {
                    copy_page(q);
                    q += PAGE;
                }
                k = h.max(d + PAGE);
            }
        }
        None => {
            let mut k = 0;
            while k < n {
                copy_page(k);
                k += PAGE;
            }
        }
    }
    let r = libc::mremap(
        tmp as *mut libc::c_void,
        n,
        n,
        libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
        addr as *mut libc::c_void,
    );
    if r == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        libc::munmap(tmp as *mut libc::c_void, n);
        return Err(e);
    }
    Ok(())
}

impl InPlace {
    /// Share `[addr, addr + len)` in place (page-aligned, whole pages of private writable memory, not
    /// overlapping a range shared already). On error nothing has changed.
    ///
    /// # Safety
    /// Nobody may write to the range while this runs (a write made between a page's copy and its move
    /// would be lost).
    pub unsafe fn share(addr: *mut u8, len: usize) -> io::Result<InPlace> {
        let addr = addr as usize;
        if len == 0 || addr % PAGE != 0 || len % PAGE != 0 {
            return Err(io::Error::other("only whole pages can be shared in place"));
        }
        let mut reg = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if reg.iter().any(|&(a, l)| a < addr + len && addr < a + l) {
            return Err(io::Error::other("the range is shared in place already"));
        }
        movable(addr, len)?;
        let c = c"vmf-inplace";
        let fd = libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut off = 0;
        while off < len {
            let n = CHUNK.min(len - off);
            if let Err(e) = move_chunk(Some((fd.as_raw_fd(), off)), addr + off, n, None) {
                // Put back what moved so far.
                let _ = restore(fd.as_raw_fd(), addr, off, false);
                return Err(e);
            }
            off += n;
        }
        reg.push((addr, len));
        Ok(InPlace {
            fd,
            addr,
            len,
            restore: true,
        })
    }

    /// Whether dropping this makes the range private again (default: yes). Set it when no other thread
    /// can write to the range then (see the type's `Drop`).
    pub fn set_restore(&mut self, restore: bool) {
        self.restore = restore;
    }

    /// The memfd (what a peer names to map the range).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Start of the range.
    pub fn addr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range (never: at least a page is shared).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Make `[addr, addr + len)`, shared in place from `fd`, private anonymous memory again; with `check`,
/// only the chunks that are still this mapping of `fd` (the program may have unmapped the memory, or
/// freed it and had something else mapped there).
///
/// # Safety
/// The range must have been the shared mapping of `fd` from offset 0, and nobody may write to the chunks
/// still mapped while this runs.
unsafe fn restore(fd: RawFd, addr: usize, len: usize, check: bool) -> io::Result<()> {
    let ours = if check { Some(Mapping::read(fd, addr, len)?) } else { None };
    let mut off = 0;
    while off < len {
        let n = CHUNK.min(len - off);
        if ours.as_ref().is_none_or(|m| m.covers(addr + off, n)) {
            move_chunk(None, addr + off, n, Some((fd, off)))?;
        }
        off += n;
    }
    Ok(())
}

/// The parts of a range that are still the shared mapping of a memfd at the matching offsets.
struct Mapping(Vec<(usize, usize)>);

impl Mapping {
    fn read(fd: RawFd, addr: usize, len: usize) -> io::Result<Mapping> {
        let ino = crate::shmem::inode(fd)?;
        let text = std::fs::read_to_string("/proc/self/maps")?;
        let v = maps(&text)
            .filter(|m| {
                m.path.starts_with("/memfd:vmf-inplace")
                    && m.perms == "rw-s"
                    && m.inode == ino
                    && m.start >= addr
                    && m.end <= addr + len
                    && m.start - addr == m.offset
            })
            .map(|m| (m.start, m.end))
            .collect();
        Ok(Mapping(v))
    }

    fn covers(&self, a: usize, n: usize) -> bool {
        let mut at = a;
        for &(x, y) in &self.0 {
            if x <= at && at < y {
                at = y;
            }
        }
        // (the lines come sorted by address)
        at >= a + n
    }
}

impl Drop for InPlace {
    fn drop(&mut self) {
        // Private again only where the range is still ours and while no other thread can write to it:
        // otherwise the program may have freed the memory and another thread be using it now, and the
        // range stays shared (the same contents at the same addresses, only not private; the memfd goes
        // with the last mapping). If moving a chunk back fails (no memory), it stays shared too.
        if self.restore {
            // SAFETY: chunks still our mapping of the memfd, written by nobody meanwhile (see `restore`).
            let _ = unsafe { restore(self.fd.as_raw_fd(), self.addr, self.len, true) };
        }
        let mut reg = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|&(a, _)| a != self.addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping_of(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find(|l| {
                let r = l.split_whitespace().next().unwrap();
                let (a, b) = r.split_once('-').unwrap();
                let (a, b) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap());
                a <= addr && addr < b
            })
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn memory_shared_in_place_keeps_its_contents_and_is_private_again_after_works() {
        // 3 chunks and a bit, in an anonymous mapping with pages of data and untouched pages.
        let len = 3 * CHUNK + 5 * PAGE;
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE,
                       libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        let touched = [0usize, 1, 511, 512, 1500, len / PAGE - 1];
        for &k in &touched {
            // SAFETY: inside the mapping.
            unsafe { *p.add(k * PAGE + 7) = (k % 251) as u8 + 1 };
        }
        // SAFETY: nobody else writes the range.
        let s = unsafe { InPlace::share(p, len) }.unwrap();
        assert!(mapping_of(p as usize).contains("memfd:vmf-inplace"), "{}", mapping_of(p as usize));
        for &k in &touched {
            // SAFETY: inside the mapping.
            assert_eq!(unsafe { *p.add(k * PAGE + 7) }, (k % 251) as u8 + 1);
        }
        // Untouched pages were not copied into the memfd.
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat of our descriptor.
        assert_eq!(unsafe { libc::fstat(s.raw_fd(), st.as_mut_ptr()) }, 0);
        // SAFETY: written by fstat.
        let blocks = unsafe { st.assume_init() }.st_blocks as usize;
        assert!(blocks * 512 <= touched.len() * PAGE * 2, "{blocks} blocks allocated");
        // A second mapping of the descriptor (what a peer makes) sees and makes the same bytes.
        let peer = crate::shmem::SharedMem::open_peer(std::process::id() as i32, s.raw_fd(), len);
        if let Ok(m) = &peer {
            // SAFETY: inside both mappings.
            unsafe {
                assert_eq!(*m.as_ptr().add(1500 * PAGE + 7), (1500 % 251) as u8 + 1);
                *m.as_ptr().add(700 * PAGE) = 99;
                assert_eq!(*p.add(700 * PAGE), 99);
                *p.add(701 * PAGE) = 98;
                assert_eq!(*m.as_ptr().add(701 * PAGE), 98);
            }
        }
        // A range shared already cannot be shared again.
        // SAFETY: as above.
        assert!(unsafe { InPlace::share(p.add(PAGE), PAGE) }.is_err());
        drop(peer);
        drop(s);
        assert!(!mapping_of(p as usize).contains("memfd"), "{}", mapping_of(p as usize));
        for &k in &touched {
            // SAFETY: inside the mapping.
            assert_eq!(unsafe { *p.add(k * PAGE + 7) }, (k % 251) as u8 + 1);
        }
        // SAFETY: as above.
        unsafe {
            assert_eq!(*p.add(700 * PAGE), 99);
            assert_eq!(*p.add(701 * PAGE), 98);
            *p.add(702 * PAGE) = 1; // writable, private
            libc::munmap(p as *mut libc::c_void, len);
        }
    }

    #[test]
    fn memory_freed_while_shared_is_left_alone_at_the_end_works() {
        let len = 3 * CHUNK;
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE,
                       libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        // SAFETY: nobody else writes the range.
        let s = unsafe { InPlace::share(p, len) }.unwrap();
        // SAFETY: inside the mapping; then the program frees the middle and something else is mapped there.
        unsafe {
            *p = 1;
            *p.add(2 * CHUNK) = 3;
            libc::munmap(p.add(CHUNK) as *mut libc::c_void, CHUNK);
            let q = libc::mmap(p.add(CHUNK) as *mut libc::c_void, CHUNK, libc::PROT_READ | libc::PROT_WRITE,
                               libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0);
            assert_eq!(q as *mut u8, p.add(CHUNK));
            *p.add(CHUNK + 5) = 0x77;
        }
        drop(s);
        assert!(!mapping_of(p as usize).contains("memfd"));
        assert!(!mapping_of(p as usize + 2 * CHUNK).contains("memfd"));
        // SAFETY: inside the mappings.
        unsafe {
            assert_eq!((*p, *p.add(CHUNK + 5), *p.add(2 * CHUNK)), (1, 0x77, 3));
            libc::munmap(p as *mut libc::c_void, len);
        }
    }

    #[test]
    fn shared_and_unmapped_ranges_do_not_move_works() {
        let m = crate::shmem::SharedMem::create("vmf-test", PAGE).unwrap();
        assert!(movable(m.as_ptr() as usize, PAGE).is_err(), "a shared mapping");
        // SAFETY: refused before anything moves.
        assert!(unsafe { InPlace::share(m.as_ptr(), PAGE) }.is_err());
        assert!(unsafe { InPlace::share(m.as_ptr().add(1), PAGE) }.is_err(), "unaligned");
        drop(m);
        assert!(movable(4096, PAGE).is_err(), "unmapped");
    }
}
