//! Data access (MPI 4.0 §14.4): every read and write form over one function, [`access`].
//!
//! An access turns the program's (buffer, count, datatype) into a stream in the view's data
//! representation, maps the stream's range onto file byte ranges with the view, and moves the bytes:
//! - independently: one `pwrite` per range; reads of many small ranges that lie close together read the
//!   span they cover in 4 MiB windows and pick the ranges out (data sieving);
//! - collectively (the `_all` and `_ordered` forms): when any rank's ranges are not contiguous, two-phase
//!   I/O as ROMIO's: the file range the ranks touch is cut into rounds of `cb_nodes` domains of
//!   `cb_buffer_size` bytes, every rank sends each aggregator the pieces of its domain (an alltoallv; over
//!   shared memory between co-resident ranks), and each aggregator writes its domain with one `pwrite` (a
//!   read-modify-write under a byte-range lock when the pieces leave holes), or reads it with one `pread`
//!   and sends the pieces back. Contiguous accesses go straight to the file.
//!
//! The nonblocking forms (`MPI_File_i*`) do the access at once and return a completed request; their
//! collective ones do it independently, which the standard allows (the data in the file are the same)
//! and which never waits for another rank.
use super::view::{ConvFn, Rep, View, MPI_BYTE, MPI_ERR_CONVERSION, MPI_ERR_IO};
use super::*;
use std::borrow::Cow;
use std::os::unix::fs::FileExt;

/// What an access needs of its file, copied out of the table (collective calls re-enter the library).
struct Ctx {
    fd: std::mem::ManuallyDrop<std::fs::File>,
    comm: MPI_Comm,
    rank: i32,
    size: i32,
    view: Rc<View>,
    atomic: bool,
    amode: c_int,
    shwin: c_int,
    cb: usize,
    naggr: usize,
    cb_read: Option<bool>,
    cb_write: Option<bool>,
}

fn ctx(fh: MPI_File) -> R<Ctx> {
    use std::os::unix::io::FromRawFd;
    let f = file(state()?, fh)?;
    Ok(Ctx {
        // SAFETY: a second handle on the file's descriptor that is never closed (ManuallyDrop); the file
        // object outlives the access (closing is collective and cannot overlap it).
        fd: std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(f.file.as_raw_fd()) }),
        comm: f.comm,
        rank: f.rank,
        size: f.size,
        view: f.view.clone(),
        atomic: f.atomic,
        amode: f.amode,
        shwin: f.shwin,
        // The hints as every rank has them (settled at open, set_view and set_info).
        cb: f.cb,
        naggr: f.naggr,
        cb_read: f.cb_read,
        cb_write: f.cb_write,
    })
}

/// Where an access starts.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Pos {
    /// An explicit offset, in etypes.
    At(MPI_Offset),
    /// The individual file pointer.
    Indiv,
    /// The shared file pointer (independent).
    Shared,
    /// The shared file pointer in rank order (collective).
    Ordered,
}

/// A byte-range lock (fcntl) held while it lives; atomic mode takes one around each access.
struct Lock<'a>(&'a std::fs::File, i64, i64);

impl<'a> Lock<'a> {
    fn take(f: &'a std::fs::File, write: bool, lo: i64, hi: i64) -> R<Option<Lock<'a>>> {
        if hi <= lo {
            return Ok(None);
        }
        Self::fcntl(f, if write { libc::F_WRLCK } else { libc::F_RDLCK }, lo, hi)?;
        Ok(Some(Lock(f, lo, hi)))
    }
    fn fcntl(f: &std::fs::File, kind: c_int, lo: i64, hi: i64) -> R {
        // SAFETY: plain fcntl byte-range locking on our own descriptor.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = lo;
        fl.l_len = hi - lo;
        loop {
            if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLKW, &fl) } == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(os_err(&e, "fcntl(F_SETLKW)"));
            }
        }
    }
}

impl Drop for Lock<'_> {
    fn drop(&mut self) {
        let _ = Self::fcntl(self.0, libc::F_UNLCK, self.1, self.2);
    }
}

/// Read up to `buf.len()` bytes at `off`; fewer only at the end of the file.
fn pread(f: &std::fs::File, buf: &mut [u8], off: i64) -> R<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], (off + got as i64) as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(os_err(&e, "pread")),
        }
    }
    Ok(got)
}

fn pwrite(f: &std::fs::File, buf: &[u8], off: i64) -> R {
    f.write_all_at(buf, off as u64)
        .map_err(|e| os_err(&e, "pwrite"))
}

fn span(pieces: &[(i64, usize)]) -> (i64, i64) {
    pieces
        .iter()
        .fold((i64::MAX, i64::MIN), |(lo, hi), &(o, l)| {
            (lo.min(o), hi.max(o + l as i64))
        })
}

/// Whether the pieces ascend without overlapping (what two-phase I/O and data sieving need).
fn ascending(pieces: &[(i64, usize)]) -> bool {
    pieces.windows(2).all(|w| w[0].0 + w[0].1 as i64 <= w[1].0)
}

/// Independent write of `data` to the pieces, in stream order.
fn write_pieces(c: &Ctx, pieces: &[(i64, usize)], data: &[u8]) -> R {
    let (lo, hi) = span(pieces);
    let _l = if c.atomic {
        Lock::take(&c.fd, true, lo, hi)?
    } else {
        None
    };
    let mut d = 0;
    for &(off, len) in pieces {
        pwrite(&c.fd, &data[d..d + len], off)?;
        d += len;
    }
    Ok(())
}

/// Window of data sieving for independent reads.
const SIEVE: usize = 4 << 20;

/// Independent read of the pieces into `out` (stream order); returns the stream bytes before the end of
/// the file.
fn read_pieces(c: &Ctx, pieces: &[(i64, usize)], out: &mut [u8]) -> R<usize> {
    let (lo, hi) = span(pieces);
    let _l = if c.atomic {
        Lock::take(&c.fd, false, lo, hi)?
    } else {
        None
    };
    let total: usize = pieces.iter().map(|p| p.1).sum();
    let sieve =
        pieces.len() > 2 && ascending(pieces) && ((hi - lo) as usize) <= total.saturating_mul(4);
    let mut d = 0;
    let mut avail = 0usize; // stream bytes that exist (counted until the first short piece)
    let mut short = false;
    let mut win: Vec<u8> = Vec::new();
    let (mut wlo, mut wlen) = (0i64, 0usize); // window start and bytes actually read into it
    for &(off, len) in pieces {
        let dst = &mut out[d..d + len];
        let got = if sieve && len < SIEVE {
            if off < wlo || off + len as i64 > wlo + win.len() as i64 {
                let n = SIEVE.min((hi - off) as usize).max(len);
                win.resize(n, 0);
                wlo = off;
                wlen = pread(&c.fd, &mut win, off)?;
            }
            let s = (off - wlo) as usize;
            let g = wlen.saturating_sub(s).min(len);
            dst[..g].copy_from_slice(&win[s..s + g]);
            g
        } else {
            pread(&c.fd, dst, off)?
        };
        if !short {
            avail += got;
            short = got < len;
        }
        d += len;
    }
    Ok(avail)
}

// ------------------------------------------------------------------------------------------------ two-phase

/// Aggregator `a`'s rank among `p` ranks with `n` aggregators (spread evenly).
fn aggr_rank(a: usize, p: usize, n: usize) -> usize {
    a * p / n
}

/// Collective two-phase I/O of the pieces (ascending, within [lo, hi) over all ranks): `buf` is the
/// stream (read into, or written from).
unsafe fn two_phase(
    c: &Ctx,
    pieces: &[(i64, usize)],
    buf: *mut u8,
    write: bool,
    lo: i64,
    hi: i64,
) -> R {
    let p = c.size as usize;
    let n = c.naggr;
    let cb = c.cb as i64;
    let round = n as i64 * cb;
    let (mut cur, mut used, mut doff) = (0usize, 0usize, 0usize);
    let mut res: R = Ok(());
    let mut store: Vec<u8> = Vec::new();
    loop {
        // The next round that holds data of some rank (rounds in between are skipped).
        let mut next = [pieces.get(cur).map_or(i64::MAX, |&(o, _)| o + used as i64)];
        allreduce(c.comm, &mut next, crate::op::MPI_MIN)?;
        if next[0] == i64::MAX || next[0] >= hi {
            break;
        }
        let rlo = lo + (next[0] - lo) / round * round;
        let rhi = (rlo + round).min(hi);
        // My pieces of this round, cut at domain boundaries: descriptors (offset, length) per aggregator.
        let mut desc: Vec<i64> = Vec::new();
        let mut cnt = vec![0i64; 2 * p]; // per rank: descriptor words, data bytes
        let mut first = vec![0 as MPI_Aint; p]; // per rank: where its data starts in my stream
        while cur < pieces.len() {
            let (off, len) = pieces[cur];
            let s0 = off + used as i64;
            if s0 >= rhi {
                break;
            }
            let e = (off + len as i64).min(rhi);
            let mut s = s0;
            while s < e {
                let a = ((s - rlo) / cb) as usize;
                let de = (rlo + (a as i64 + 1) * cb).min(e);
                let dst = aggr_rank(a, p, n);
                if cnt[2 * dst] == 0 {
                    first[dst] = doff as MPI_Aint;
                }
                desc.extend([s, de - s]);
                cnt[2 * dst] += 2;
                cnt[2 * dst + 1] += de - s;
                doff += (de - s) as usize;
                s = de;
            }
            used += (e - s0) as usize;
            if used == len {
                cur += 1;
                used = 0;
            }
        }
        let mut rcnt = vec![0i64; 2 * p];
        ck(
            crate::coll::PMPI_Alltoall(
                cnt.as_ptr() as *const c_void,
                2,
                MPI_INT64,
                rcnt.as_mut_ptr() as *mut c_void,
                2,
                MPI_INT64,
                c.comm,
            ),
            "alltoall",
        )?;
        // Column k of the per-rank (descriptor words, data bytes) pairs: counts and displacements.
        let column = |v: &[i64], k: usize| -> (Vec<MPI_Count>, Vec<MPI_Aint>) {
            let counts: Vec<MPI_Count> = (0..p).map(|i| v[2 * i + k]).collect();
            let displs = counts
                .iter()
                .scan(0, |acc, &x| {
                    let d = *acc;
                    *acc += x as MPI_Aint;
                    Some(d)
                })
                .collect();
            (counts, displs)
        };
        let (sw, swd) = column(&cnt, 0);
        let (rw, rwd) = column(&rcnt, 0);
        let mut rdesc = vec![0i64; rw.iter().sum::<i64>() as usize];
        ck(
            crate::bigcount::PMPI_Alltoallv_c(
                desc.as_ptr() as *const c_void,
                sw.as_ptr(),
                swd.as_ptr(),
                MPI_INT64,
                rdesc.as_mut_ptr() as *mut c_void,
                rw.as_ptr(),
                rwd.as_ptr(),
                MPI_INT64,
                c.comm,
            ),
            "alltoallv",
        )?;
        let (sb, _) = column(&cnt, 1);
        let (rb, rbd) = column(&rcnt, 1);
        // Reused across rounds: after the first, no page faults and no zeroing.
        let need = rb.iter().sum::<i64>() as usize;
        if store.len() < need {
            store.resize(need, 0);
        }
        let data = &mut store[..need];
        if write {
            ck(
                crate::bigcount::PMPI_Alltoallv_c(
                    buf as *const c_void,
                    sb.as_ptr(),
                    first.as_ptr(),
                    MPI_BYTE,
                    data.as_mut_ptr() as *mut c_void,
                    rb.as_ptr(),
                    rbd.as_ptr(),
                    MPI_BYTE,
                    c.comm,
                ),
                "alltoallv",
            )?;
            // Whoever receives pieces is an aggregator for them (the ranks agree on the hints).
            if !rdesc.is_empty() && res.is_ok() {
                res = aggregate(c, &rdesc, data, true);
            }
        } else {
            // Whoever receives pieces is an aggregator for them (the ranks agree on the hints).
            if !rdesc.is_empty() && res.is_ok() {
                res = aggregate(c, &rdesc, data, false);
            }
            ck(
                crate::bigcount::PMPI_Alltoallv_c(
                    data.as_ptr() as *const c_void,
                    rb.as_ptr(),
                    rbd.as_ptr(),
                    MPI_BYTE,
                    buf as *mut c_void,
                    sb.as_ptr(),
                    first.as_ptr(),
                    MPI_BYTE,
                    c.comm,
                ),
                "alltoallv",
            )?;
        }
    }
    res
}

/// An aggregator's part of a round: the pieces `desc` (offset, length pairs) with their data in `data`
/// (same order) are written to the file, or read from it into `data`.
fn aggregate(c: &Ctx, desc: &[i64], data: &mut [u8], write: bool) -> R {
    let mut items: Vec<(i64, usize, usize)> = Vec::with_capacity(desc.len() / 2);
    let mut d = 0usize;
    for w in desc.chunks_exact(2) {
        let (off, len) = (w[0], w[1]);
        if off < 0 || len < 0 || d + len as usize > data.len() {
            return err(MPI_ERR_INTERN, "two-phase I/O: inconsistent pieces");
        }
        items.push((off, len as usize, d));
        d += len as usize;
    }
    items.sort_by_key(|i| i.0);
    let lo = items[0].0;
    let hi = items.iter().map(|i| i.0 + i.1 as i64).max().unwrap();
    let span = (hi - lo) as usize;
    // Bytes of [lo, hi) the pieces cover.
    let (mut covered, mut end) = (0usize, lo);
    for &(o, l, _) in &items {
        let e = o + l as i64;
        if e > end {
            covered += (e - o.max(end)) as usize;
            end = e;
        }
    }
    // The pieces tile [lo, hi) exactly: one vectored call straight from (or into) the received data.
    if covered == span && items.iter().map(|i| i.1).sum::<usize>() == span {
        return vectored(&c.fd, &items, data, lo, write);
    }
    if write {
        if covered < span && covered * 2 < span {
            for &(o, l, d) in &items {
                pwrite(&c.fd, &data[d..d + l], o)?;
            }
            return Ok(());
        }
        let mut b = vec![0u8; span];
        let _l = if covered < span {
            let l = Lock::take(&c.fd, true, lo, hi)?;
            pread(&c.fd, &mut b, lo)?;
            l
        } else {
            None
        };
        for &(o, l, d) in &items {
            let s = (o - lo) as usize;
            b[s..s + l].copy_from_slice(&data[d..d + l]);
        }
        pwrite(&c.fd, &b, lo)
    } else {
        if covered * 4 < span {
            for &(o, l, d) in &items {
                let g = pread(&c.fd, &mut data[d..d + l], o)?;
                data[d + g..d + l].fill(0); // past the end of the file: zeros, not a previous round's bytes
            }
            return Ok(());
        }
        let mut b = vec![0u8; span];
        pread(&c.fd, &mut b, lo)?;
        for &(o, l, d) in &items {
            let s = (o - lo) as usize;
            data[d..d + l].copy_from_slice(&b[s..s + l]);
        }
        Ok(())
    }
}

/// `pwritev`/`preadv` of the pieces `items` (ascending, tiling the file from `lo`; data at their offsets
/// in `data`), IOV_MAX pieces per call.
fn vectored(f: &std::fs::File, items: &[(i64, usize, usize)], data: &mut [u8], lo: i64, write: bool) -> R {
    const IOV_MAX: usize = 1024;
    let base = data.as_mut_ptr();
    let mut off = lo;
    for chunk in items.chunks(IOV_MAX) {
        let mut iov: Vec<libc::iovec> = chunk
            .iter()
            // SAFETY: each piece lies within `data` (checked when the items were built).
            .map(|&(_, l, d)| libc::iovec { iov_base: unsafe { base.add(d) } as *mut c_void, iov_len: l })
            .collect();
        let mut first = 0;
        while first < iov.len() {
            let n = unsafe {
                let (p, k) = (iov[first..].as_ptr(), (iov.len() - first) as c_int);
                if write { libc::pwritev(f.as_raw_fd(), p, k, off) } else { libc::preadv(f.as_raw_fd(), p, k, off) }
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(os_err(&e, if write { "pwritev" } else { "preadv" }));
            }
            if n == 0 {
                if write {
                    return err(MPI_ERR_IO, "pwritev wrote nothing");
                }
                // The end of the file: the rest reads as zeros (the buffer may hold a previous round's bytes).
                for v in &iov[first..] {
                    // SAFETY: each iovec lies within `data`.
                    unsafe { std::ptr::write_bytes(v.iov_base as *mut u8, 0, v.iov_len) };
                }
                return Ok(());
            }
            // Skip what was done; a partly done piece continues where it stopped.
            let mut n = n as usize;
            off += n as i64;
            while n > 0 {
                let v = &mut iov[first];
                if n >= v.iov_len {
                    n -= v.iov_len;
                    first += 1;
                } else {
                    v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) } as *mut c_void;
                    v.iov_len -= n;
                    n = 0;
                }
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------ streams

/// The stream a write puts in the file: the buffer itself when it already is one, else packed and
/// converted to the view's representation.
unsafe fn encode<'a>(
    v: &View,
    buf: *const c_void,
    n: usize,
    dt: MPI_Datatype,
    len: usize,
) -> R<Cow<'a, [u8]>> {
    let native = || -> R<Cow<'a, [u8]>> {
        if crate::datatype::is_simple(dt) {
            if len == 0 {
                return Ok(Cow::Owned(Vec::new()));
            }
            if buf.is_null() {
                return err(MPI_ERR_BUFFER, "buffer is NULL");
            }
            return Ok(Cow::Borrowed(std::slice::from_raw_parts(
                buf as *const u8,
                len,
            )));
        }
        let bytes = crate::datatype::ext_size(dt)?.1 * n;
        Ok(Cow::Owned(crate::datatype::pack_vec(
            buf as *const u8,
            n,
            dt,
            bytes,
        )?))
    };
    match v.rep {
        Rep::Native => native(),
        Rep::External32 => {
            let nat = native()?;
            let mut out = vec![0u8; len];
            crate::datatype::external32_convert(dt, n, nat.as_ptr(), out.as_mut_ptr(), true)?;
            Ok(Cow::Owned(out))
        }
        Rep::User(i) => {
            let (f, extra) = {
                let d = &state()?.datareps[i];
                (d.write, d.extra)
            };
            let Some(f) = f else {
                let nat = native()?;
                if nat.len() != len {
                    return err(
                        MPI_ERR_CONVERSION,
                        "no write conversion function, and the file extents differ from memory's",
                    );
                }
                return Ok(nat);
            };
            let mut out = vec![0u8; len];
            convert(
                f,
                buf as *mut c_void,
                dt,
                n,
                out.as_mut_ptr() as *mut c_void,
                extra,
            )?;
            Ok(Cow::Owned(out))
        }
    }
}

/// Call a user conversion function on `n` elements (the `int` flavour takes at most INT_MAX of them).
unsafe fn convert(
    f: ConvFn,
    user: *mut c_void,
    dt: MPI_Datatype,
    n: usize,
    filebuf: *mut c_void,
    extra: *mut c_void,
) -> R {
    let rc = match f {
        ConvFn::Big(f) => f(user, dt, n as MPI_Count, filebuf, 0, extra),
        ConvFn::Int(f) => {
            if n > c_int::MAX as usize {
                return err(
                    MPI_ERR_COUNT,
                    "count too large for an int conversion function",
                );
            }
            f(user, dt, n as c_int, filebuf, 0, extra)
        }
    };
    if rc != MPI_SUCCESS {
        return err(rc, "the data representation's conversion function failed");
    }
    Ok(())
}

/// Where a read lands: straight in the buffer, or in a staging stream decoded afterwards.
enum Stage {
    Direct(*mut u8),
    Tmp(Vec<u8>),
}

impl Stage {
    fn ptr(&mut self) -> *mut u8 {
        match self {
            Stage::Direct(p) => *p,
            Stage::Tmp(v) => v.as_mut_ptr(),
        }
    }
}

unsafe fn stage(v: &View, buf: *mut c_void, dt: MPI_Datatype, len: usize) -> R<Stage> {
    if v.rep == Rep::Native && crate::datatype::is_simple(dt) && len > 0 {
        if buf.is_null() {
            return err(MPI_ERR_BUFFER, "buffer is NULL");
        }
        return Ok(Stage::Direct(buf as *mut u8));
    }
    Ok(Stage::Tmp(vec![0u8; len]))
}

/// Decode the `got` stream bytes of a read into the buffer; returns the status bytes (memory bytes).
unsafe fn decode(
    v: &View,
    s: Stage,
    got: usize,
    buf: *mut c_void,
    n: usize,
    dt: MPI_Datatype,
) -> R<usize> {
    let Stage::Tmp(tmp) = s else { return Ok(got) };
    let native1 = crate::datatype::ext_size(dt)?.1;
    match v.rep {
        Rep::Native => {
            crate::datatype::unpack_from(&tmp, got, buf as *mut u8, n, dt)?;
            Ok(got)
        }
        Rep::External32 => {
            let e1 = crate::datatype::external32_size(dt)?;
            let k = got.checked_div(e1).unwrap_or(0);
            let mut nat = vec![0u8; k * native1];
            crate::datatype::external32_convert(dt, k, tmp.as_ptr(), nat.as_mut_ptr(), false)?;
            crate::datatype::unpack_from(&nat, nat.len(), buf as *mut u8, k, dt)?;
            Ok(k * native1)
        }
        Rep::User(i) => {
            let (f, extra) = {
                let d = &state()?.datareps[i];
                (d.read, d.extra)
            };
            let e1 = v.stream_len(1, dt)?;
            let k = got.checked_div(e1).unwrap_or(0);
            match f {
                Some(f) => convert(f, buf, dt, k, tmp.as_ptr() as *mut c_void, extra)?,
                None => crate::datatype::unpack_from(&tmp, k * e1, buf as *mut u8, k, dt)?,
            }
            Ok(k * native1)
        }
    }
}

// ------------------------------------------------------------------------------------------------ shared pointer

/// Add `delta` etypes to the shared file pointer; returns its previous value.
pub(crate) unsafe fn shared_add(win: c_int, delta: i64) -> R<i64> {
    let mut old = 0i64;
    let op = if delta == 0 {
        crate::op::MPI_NO_OP
    } else {
        crate::op::MPI_SUM
    };
    ck(
        crate::rma::ops::PMPI_Fetch_and_op(
            &delta as *const i64 as *const c_void,
            &mut old as *mut i64 as *mut c_void,
            MPI_INT64,
            0,
            0,
            op,
            win,
        ),
        "MPI_Fetch_and_op (shared file pointer)",
    )?;
    ck(crate::rma::sync::PMPI_Win_flush(0, win), "MPI_Win_flush")?;
    Ok(old)
}

/// Set the shared file pointer.
pub(crate) unsafe fn shared_set(win: c_int, v: i64) -> R {
    let mut old = 0i64;
    ck(
        crate::rma::ops::PMPI_Fetch_and_op(
            &v as *const i64 as *const c_void,
            &mut old as *mut i64 as *mut c_void,
            MPI_INT64,
            0,
            0,
            crate::op::MPI_REPLACE,
            win,
        ),
        "MPI_Fetch_and_op (shared file pointer)",
    )?;
    ck(crate::rma::sync::PMPI_Win_flush(0, win), "MPI_Win_flush")
}

/// The absolute byte offset of view position `etypes`.
fn byte_offset(v: &View, etypes: i64) -> R<i64> {
    if v.ftsize == 0 {
        return Ok(v.disp);
    }
    Ok(v.pieces(etypes as u64 * v.esize as u64, 1)?[0].0)
}

/// The absolute byte offset of the shared file pointer (MPI_DISPLACEMENT_CURRENT).
pub(crate) unsafe fn shared_byte_offset(fh: MPI_File) -> R<i64> {
    let (win, v) = {
        let f = file(state()?, fh)?;
        (f.shwin, f.view.clone())
    };
    byte_offset(&v, shared_add(win, 0)?)
}

/// The end of the file in etypes of the view (rounded up).
fn eof_etypes(c: &Ctx) -> R<i64> {
    let size = c.fd.metadata().map_err(|e| os_err(&e, "fstat"))?.len() as i64;
    let s = c.view.stream_before(size);
    Ok(s.div_ceil(c.view.esize as u64) as i64)
}

// ------------------------------------------------------------------------------------------------ access

/// Checks and sizes of an access: (elements, stream bytes).
fn check(c: &Ctx, pos: Pos, write: bool, count: i64, dt: MPI_Datatype) -> R<(usize, usize)> {
    if write && c.amode & MPI_MODE_RDONLY != 0 {
        return err(MPI_ERR_READ_ONLY, "the file is open read-only");
    }
    if !write && c.amode & MPI_MODE_WRONLY != 0 {
        return err(MPI_ERR_ACCESS, "the file is open write-only");
    }
    if c.amode & MPI_MODE_SEQUENTIAL != 0 && matches!(pos, Pos::At(_) | Pos::Indiv) {
        return err(
            MPI_ERR_UNSUPPORTED_OPERATION,
            "only shared file pointers work on a file opened with MPI_MODE_SEQUENTIAL",
        );
    }
    if let Pos::At(o) = pos {
        if o < 0 {
            return err(MPI_ERR_ARG, format!("offset {o} is negative"));
        }
    }
    if count < 0 {
        return err(MPI_ERR_COUNT, format!("count {count} is negative"));
    }
    if crate::datatype::is_derived(dt) && !crate::datatype::desc(state()?, dt)?.committed {
        return err(MPI_ERR_TYPE, "datatype is not committed");
    }
    let n = count as usize;
    let len = c.view.stream_len(n, dt)?;
    if len % c.view.esize != 0 {
        return err(
            MPI_ERR_IO,
            format!(
                "{len} bytes are not a whole number of etypes ({} bytes)",
                c.view.esize
            ),
        );
    }
    Ok((n, len))
}

/// Read or write `count` elements of `dt` at `buf`, from `pos`, independently or collectively; returns
/// the status bytes.
pub(crate) unsafe fn access(
    fh: MPI_File,
    pos: Pos,
    write: bool,
    coll: bool,
    buf: *mut c_void,
    count: i64,
    dt: MPI_Datatype,
) -> R<usize> {
    let c = ctx(fh)?;
    // Everything this rank can fail on by itself, before the ranks agree (a collective call must fail on
    // every rank, or the others would wait in the exchange).
    let local = check(&c, pos, write, count, dt).and_then(|(n, len)| {
        if c.view.ftsize == 0 && len > 0 {
            return err(MPI_ERR_IO, "the file view's filetype holds no data");
        }
        if coll && file(state()?, fh)?.split.is_some() {
            return err(MPI_ERR_IO, "a split collective is in progress on this file");
        }
        let data = if write {
            Some(encode(&c.view, buf, n, dt, len)?)
        } else {
            None
        };
        let staged = if write { None } else { Some(stage(&c.view, buf, dt, len)?) };
        Ok((n, len, data, staged))
    });
    if coll {
        agree(c.comm, local.as_ref().map(drop).map_err(|e| e.clone()))?;
    }
    let (n, len, data, staged) = local?;
    let es = c.view.esize as i64;
    let etypes = (len / c.view.esize) as i64;
    let start = match pos {
        Pos::At(o) => o,
        Pos::Indiv => file(state()?, fh)?.pos,
        Pos::Shared => shared_add(c.shwin, etypes)?,
        Pos::Ordered => {
            let mut pre = 0i64;
            ck(
                crate::coll::PMPI_Exscan(
                    &etypes as *const i64 as *const c_void,
                    &mut pre as *mut i64 as *mut c_void,
                    1,
                    MPI_INT64,
                    crate::op::MPI_SUM,
                    c.comm,
                ),
                "exscan",
            )?;
            if c.rank == 0 {
                pre = 0;
            }
            let mut total = [etypes];
            allreduce(c.comm, &mut total, crate::op::MPI_SUM)?;
            // [base, error class]: rank 0's failure reaches every rank.
            let mut base = [0i64, 0];
            if c.rank == 0 {
                match shared_add(c.shwin, total[0]) {
                    Ok(b) => base[0] = b,
                    Err(e) => base[1] = e.code.max(1) as i64,
                }
            }
            ck(
                crate::coll::PMPI_Bcast(base.as_mut_ptr() as *mut c_void, 2, MPI_INT64, 0, c.comm),
                "bcast",
            )?;
            if base[1] != 0 {
                return err(base[1] as c_int, "the shared file pointer could not be moved (on rank 0)");
            }
            base[0] + pre
        }
    };
    let pieces = c.view.pieces((start * es) as u64, len)?;
    if pos == Pos::Indiv {
        // Writes move the pointer by what they asked for; reads by what they found (below).
        file(state()?, fh)?.pos = start + etypes;
    }
    let two = if coll {
        let (lo, hi) = span(&pieces);
        let mut v = [
            lo.wrapping_neg(),
            hi,
            (pieces.len() > 1) as i64,
            (!ascending(&pieces)) as i64,
        ];
        if pieces.is_empty() {
            v[0] = i64::MIN + 1;
        }
        allreduce(c.comm, &mut v, crate::op::MPI_MAX)?;
        let (glo, ghi) = (v[0].wrapping_neg(), v[1]);
        let force = if write { c.cb_write } else { c.cb_read };
        let wanted = force.unwrap_or(v[2] != 0);
        (wanted && !c.atomic && v[3] == 0 && ghi > glo).then_some((glo, ghi))
    } else {
        None
    };
    let res = if write {
        let data = data.unwrap();
        match two {
            Some((lo, hi)) => two_phase(&c, &pieces, data.as_ptr() as *mut u8, true, lo, hi),
            None => write_pieces(&c, &pieces, &data),
        }
        .map(|()| crate::datatype::ext_size(dt).map_or(0, |(_, s)| s * n))
    } else {
        let mut s = staged.unwrap();
        let got = match two {
            Some((lo, hi)) => {
                let size = c.fd.metadata().map_or(i64::MAX, |m| m.len() as i64);
                two_phase(&c, &pieces, s.ptr(), false, lo, hi).map(|()| {
                    // The stream bytes before the end of the file.
                    let mut a = 0;
                    for &(o, l) in &pieces {
                        let g = (size - o).clamp(0, l as i64) as usize;
                        a += g;
                        if g < l {
                            break;
                        }
                    }
                    a
                })
            }
            None => read_pieces(&c, &pieces, std::slice::from_raw_parts_mut(s.ptr(), len)),
        };
        match got {
            Ok(got) => {
                if pos == Pos::Indiv {
                    file(state()?, fh)?.pos = start + (got / c.view.esize) as i64;
                }
                decode(&c.view, s, got, buf, n, dt)
            }
            Err(e) => Err(e),
        }
    };
    if coll {
        agree(c.comm, res.as_ref().map(drop).map_err(|e| e.clone()))?;
    }
    res
}

/// A blocking access that fills `status`.
unsafe fn blocking(
    fh: MPI_File,
    pos: Pos,
    write: bool,
    coll: bool,
    buf: *mut c_void,
    count: i64,
    dt: MPI_Datatype,
    status: *mut MPI_Status,
) -> R {
    if file(state()?, fh)?.split.is_some() && coll {
        return err(MPI_ERR_IO, "a split collective is in progress on this file");
    }
    let bytes = access(fh, pos, write, coll, buf, count, dt)?;
    St { bytes, ..St::EMPTY }.write(status);
    Ok(())
}

/// A nonblocking access: done now, returned as a completed request.
unsafe fn nonblocking(
    fh: MPI_File,
    pos: Pos,
    write: bool,
    buf: *mut c_void,
    count: i64,
    dt: MPI_Datatype,
    request: *mut MPI_Request,
) -> R {
    if request.is_null() {
        return err(MPI_ERR_ARG, "request is NULL");
    }
    let bytes = access(fh, pos, write, false, buf, count, dt)?;
    let st = state()?;
    let ci = comm_index(file(st, fh)?.comm).expect("file communicator");
    *request = crate::p2p::new_req(
        st,
        MReq {
            fin: Some(St { bytes, ..St::EMPTY }),
            ..MReq::on(ci)
        },
    );
    Ok(())
}

/// The first half of a split collective: the whole access (as ROMIO does); `_end` hands out the status.
unsafe fn begin(
    fh: MPI_File,
    pos: Pos,
    write: bool,
    buf: *mut c_void,
    count: i64,
    dt: MPI_Datatype,
) -> R {
    if file(state()?, fh)?.split.is_some() {
        return err(
            MPI_ERR_IO,
            "a split collective is in progress on this file already",
        );
    }
    let bytes = access(fh, pos, write, true, buf, count, dt)?;
    file(state()?, fh)?.split = Some((!write, bytes));
    Ok(())
}

unsafe fn end(fh: MPI_File, write: bool, status: *mut MPI_Status) -> R {
    let f = file(state()?, fh)?;
    match f.split {
        Some((read, bytes)) if read != write => {
            f.split = None;
            St { bytes, ..St::EMPTY }.write(status);
            Ok(())
        }
        Some(_) => err(
            MPI_ERR_IO,
            "the split collective in progress is of the other direction",
        ),
        None => err(
            MPI_ERR_IO,
            "no split collective is in progress on this file",
        ),
    }
}

unsafe fn seek(fh: MPI_File, offset: MPI_Offset, whence: c_int) -> R {
    let c = ctx(fh)?;
    if c.amode & MPI_MODE_SEQUENTIAL != 0 {
        return err(
            MPI_ERR_UNSUPPORTED_OPERATION,
            "MPI_File_seek on a file opened with MPI_MODE_SEQUENTIAL",
        );
    }
    let cur = file(state()?, fh)?.pos;
    let new = match whence {
        MPI_SEEK_SET => offset,
        MPI_SEEK_CUR => cur + offset,
        MPI_SEEK_END => eof_etypes(&c)? + offset,
        w => return err(MPI_ERR_ARG, format!("invalid whence {w}")),
    };
    if new < 0 {
        return err(MPI_ERR_ARG, format!("the new position {new} is negative"));
    }
    file(state()?, fh)?.pos = new;
    Ok(())
}

unsafe fn seek_shared(fh: MPI_File, offset: MPI_Offset, whence: c_int) -> R {
    let c = ctx(fh)?;
    same(c.comm, &[offset, whence as i64], "offset or whence")?;
    let local = (|| -> R {
        if c.rank != 0 {
            return Ok(());
        }
        let new = match whence {
            MPI_SEEK_SET => offset,
            MPI_SEEK_CUR => shared_add(c.shwin, 0)? + offset,
            MPI_SEEK_END => eof_etypes(&c)? + offset,
            w => return err(MPI_ERR_ARG, format!("invalid whence {w}")),
        };
        if new < 0 {
            return err(MPI_ERR_ARG, format!("the new position {new} is negative"));
        }
        shared_set(c.shwin, new)
    })();
    agree(c.comm, local)
}

/// Explicit-offset forms: (fh, offset, buf, count, datatype, status | request).
macro_rules! io_at {
    ($($name:literal $cname:literal $kind:ident $write:literal $coll:literal ; fn $mpi:ident / $pmpi:ident, $mpic:ident / $pmpic:ident)*) => {$(
        io_at!(@one $kind $name $write $coll $mpi $pmpi c_int);
        io_at!(@one $kind $cname $write $coll $mpic $pmpic MPI_Count);
    )*};
    (@one status $name:literal $write:literal $coll:literal $mpi:ident $pmpi:ident $ct:ty) => { mpi_api! {
        fn $mpi / $pmpi(fh: MPI_File, offset: MPI_Offset, buf: *mut c_void, count: $ct, datatype: MPI_Datatype, status: *mut MPI_Status) -> c_int {
            fin_file(fh, $name, blocking(fh, Pos::At(offset), $write, $coll, buf, count as i64, datatype, status))
        }
    }};
    (@one request $name:literal $write:literal $coll:literal $mpi:ident $pmpi:ident $ct:ty) => { mpi_api! {
        fn $mpi / $pmpi(fh: MPI_File, offset: MPI_Offset, buf: *mut c_void, count: $ct, datatype: MPI_Datatype, request: *mut MPI_Request) -> c_int {
            fin_file(fh, $name, nonblocking(fh, Pos::At(offset), $write, buf, count as i64, datatype, request))
        }
    }};
    (@one begin $name:literal $write:literal $coll:literal $mpi:ident $pmpi:ident $ct:ty) => { mpi_api! {
        fn $mpi / $pmpi(fh: MPI_File, offset: MPI_Offset, buf: *mut c_void, count: $ct, datatype: MPI_Datatype) -> c_int {
            fin_file(fh, $name, begin(fh, Pos::At(offset), $write, buf, count as i64, datatype))
        }
    }};
}

/// File-pointer forms: (fh, buf, count, datatype, status | request).
macro_rules! io_ptr {
    ($($name:literal $cname:literal $kind:ident $pos:ident $write:literal $coll:literal ; fn $mpi:ident / $pmpi:ident, $mpic:ident / $pmpic:ident)*) => {$(
        io_ptr!(@one $kind $name $pos $write $coll $mpi $pmpi c_int);
        io_ptr!(@one $kind $cname $pos $write $coll $mpic $pmpic MPI_Count);
    )*};
    (@one status $name:literal $pos:ident $write:literal $coll:literal $mpi:ident $pmpi:ident $ct:ty) => { mpi_api! {
        fn $mpi / $pmpi(fh: MPI_File, buf: *mut c_void, count: $ct, datatype: MPI_Datatype, status: *mut MPI_Status) -> c_int {
            fin_file(fh, $name, blocking(fh, Pos::$pos, $write, $coll, buf, count as i64, datatype, status))
        }
    }};
    (@one request $name:literal $pos:ident $write:literal $coll:literal $mpi:ident $pmpi:ident $ct:ty) => { mpi_api! {
        fn $mpi / $pmpi(fh: MPI_File, buf: *mut c_void, count: $ct, datatype: MPI_Datatype, request: *mut MPI_Request) -> c_int {
            fin_file(fh, $name, nonblocking(fh, Pos::$pos, $write, buf, count as i64, datatype, request))
        }
    }};
    (@one begin $name:literal $pos:ident $write:literal $coll:literal $mpi:ident $pmpi:ident $ct:ty) => { mpi_api! {
        fn $mpi / $pmpi(fh: MPI_File, buf: *mut c_void, count: $ct, datatype: MPI_Datatype) -> c_int {
            fin_file(fh, $name, begin(fh, Pos::$pos, $write, buf, count as i64, datatype))
        }
    }};
}

io_at! {
    "MPI_File_read_at" "MPI_File_read_at_c" status false false ;
    fn MPI_File_read_at / PMPI_File_read_at, MPI_File_read_at_c / PMPI_File_read_at_c
    "MPI_File_write_at" "MPI_File_write_at_c" status true false ;
    fn MPI_File_write_at / PMPI_File_write_at, MPI_File_write_at_c / PMPI_File_write_at_c
    "MPI_File_read_at_all" "MPI_File_read_at_all_c" status false true ;
    fn MPI_File_read_at_all / PMPI_File_read_at_all, MPI_File_read_at_all_c / PMPI_File_read_at_all_c
    "MPI_File_write_at_all" "MPI_File_write_at_all_c" status true true ;
    fn MPI_File_write_at_all / PMPI_File_write_at_all, MPI_File_write_at_all_c / PMPI_File_write_at_all_c
    "MPI_File_iread_at" "MPI_File_iread_at_c" request false false ;
    fn MPI_File_iread_at / PMPI_File_iread_at, MPI_File_iread_at_c / PMPI_File_iread_at_c
    "MPI_File_iwrite_at" "MPI_File_iwrite_at_c" request true false ;
    fn MPI_File_iwrite_at / PMPI_File_iwrite_at, MPI_File_iwrite_at_c / PMPI_File_iwrite_at_c
    "MPI_File_iread_at_all" "MPI_File_iread_at_all_c" request false true ;
    fn MPI_File_iread_at_all / PMPI_File_iread_at_all, MPI_File_iread_at_all_c / PMPI_File_iread_at_all_c
    "MPI_File_iwrite_at_all" "MPI_File_iwrite_at_all_c" request true true ;
    fn MPI_File_iwrite_at_all / PMPI_File_iwrite_at_all, MPI_File_iwrite_at_all_c / PMPI_File_iwrite_at_all_c
    "MPI_File_read_at_all_begin" "MPI_File_read_at_all_begin_c" begin false true ;
    fn MPI_File_read_at_all_begin / PMPI_File_read_at_all_begin, MPI_File_read_at_all_begin_c / PMPI_File_read_at_all_begin_c
    "MPI_File_write_at_all_begin" "MPI_File_write_at_all_begin_c" begin true true ;
    fn MPI_File_write_at_all_begin / PMPI_File_write_at_all_begin, MPI_File_write_at_all_begin_c / PMPI_File_write_at_all_begin_c
}

io_ptr! {
    "MPI_File_read" "MPI_File_read_c" status Indiv false false ;
    fn MPI_File_read / PMPI_File_read, MPI_File_read_c / PMPI_File_read_c
    "MPI_File_write" "MPI_File_write_c" status Indiv true false ;
    fn MPI_File_write / PMPI_File_write, MPI_File_write_c / PMPI_File_write_c
    "MPI_File_read_all" "MPI_File_read_all_c" status Indiv false true ;
    fn MPI_File_read_all / PMPI_File_read_all, MPI_File_read_all_c / PMPI_File_read_all_c
    "MPI_File_write_all" "MPI_File_write_all_c" status Indiv true true ;
    fn MPI_File_write_all / PMPI_File_write_all, MPI_File_write_all_c / PMPI_File_write_all_c
    "MPI_File_read_shared" "MPI_File_read_shared_c" status Shared false false ;
    fn MPI_File_read_shared / PMPI_File_read_shared, MPI_File_read_shared_c / PMPI_File_read_shared_c
    "MPI_File_write_shared" "MPI_File_write_shared_c" status Shared true false ;
    fn MPI_File_write_shared / PMPI_File_write_shared, MPI_File_write_shared_c / PMPI_File_write_shared_c
    "MPI_File_read_ordered" "MPI_File_read_ordered_c" status Ordered false true ;
    fn MPI_File_read_ordered / PMPI_File_read_ordered, MPI_File_read_ordered_c / PMPI_File_read_ordered_c
    "MPI_File_write_ordered" "MPI_File_write_ordered_c" status Ordered true true ;
    fn MPI_File_write_ordered / PMPI_File_write_ordered, MPI_File_write_ordered_c / PMPI_File_write_ordered_c
    "MPI_File_iread" "MPI_File_iread_c" request Indiv false false ;
    fn MPI_File_iread / PMPI_File_iread, MPI_File_iread_c / PMPI_File_iread_c
    "MPI_File_iwrite" "MPI_File_iwrite_c" request Indiv true false ;
    fn MPI_File_iwrite / PMPI_File_iwrite, MPI_File_iwrite_c / PMPI_File_iwrite_c
    "MPI_File_iread_all" "MPI_File_iread_all_c" request Indiv false true ;
    fn MPI_File_iread_all / PMPI_File_iread_all, MPI_File_iread_all_c / PMPI_File_iread_all_c
    "MPI_File_iwrite_all" "MPI_File_iwrite_all_c" request Indiv true true ;
    fn MPI_File_iwrite_all / PMPI_File_iwrite_all, MPI_File_iwrite_all_c / PMPI_File_iwrite_all_c
    "MPI_File_iread_shared" "MPI_File_iread_shared_c" request Shared false false ;
    fn MPI_File_iread_shared / PMPI_File_iread_shared, MPI_File_iread_shared_c / PMPI_File_iread_shared_c
    "MPI_File_iwrite_shared" "MPI_File_iwrite_shared_c" request Shared true false ;
    fn MPI_File_iwrite_shared / PMPI_File_iwrite_shared, MPI_File_iwrite_shared_c / PMPI_File_iwrite_shared_c
    "MPI_File_read_all_begin" "MPI_File_read_all_begin_c" begin Indiv false true ;
    fn MPI_File_read_all_begin / PMPI_File_read_all_begin, MPI_File_read_all_begin_c / PMPI_File_read_all_begin_c
    "MPI_File_write_all_begin" "MPI_File_write_all_begin_c" begin Indiv true true ;
    fn MPI_File_write_all_begin / PMPI_File_write_all_begin, MPI_File_write_all_begin_c / PMPI_File_write_all_begin_c
    "MPI_File_read_ordered_begin" "MPI_File_read_ordered_begin_c" begin Ordered false true ;
    fn MPI_File_read_ordered_begin / PMPI_File_read_ordered_begin, MPI_File_read_ordered_begin_c / PMPI_File_read_ordered_begin_c
    "MPI_File_write_ordered_begin" "MPI_File_write_ordered_begin_c" begin Ordered true true ;
    fn MPI_File_write_ordered_begin / PMPI_File_write_ordered_begin, MPI_File_write_ordered_begin_c / PMPI_File_write_ordered_begin_c
}

/// The second halves of the split collectives: (fh, buf, status), the buffer unused (the data moved in
/// `_begin`).
macro_rules! io_end {
    ($($name:literal $write:literal ; fn $mpi:ident / $pmpi:ident)*) => { mpi_api! {$(
        fn $mpi / $pmpi(fh: MPI_File, buf: *mut c_void, status: *mut MPI_Status) -> c_int {
            let _ = buf;
            fin_file(fh, $name, end(fh, $write, status))
        }
    )*}};
}

io_end! {
    "MPI_File_read_at_all_end" false ;
    fn MPI_File_read_at_all_end / PMPI_File_read_at_all_end
    "MPI_File_write_at_all_end" true ;
    fn MPI_File_write_at_all_end / PMPI_File_write_at_all_end
    "MPI_File_read_all_end" false ;
    fn MPI_File_read_all_end / PMPI_File_read_all_end
    "MPI_File_write_all_end" true ;
    fn MPI_File_write_all_end / PMPI_File_write_all_end
    "MPI_File_read_ordered_end" false ;
    fn MPI_File_read_ordered_end / PMPI_File_read_ordered_end
    "MPI_File_write_ordered_end" true ;
    fn MPI_File_write_ordered_end / PMPI_File_write_ordered_end
}

mpi_api! {
    fn MPI_File_seek / PMPI_File_seek(fh: MPI_File, offset: MPI_Offset, whence: c_int) -> c_int {
        fin_file(fh, "MPI_File_seek", seek(fh, offset, whence))
    }
    fn MPI_File_get_position / PMPI_File_get_position(fh: MPI_File, offset: *mut MPI_Offset) -> c_int {
        let r = (|| -> R {
            let f = file(state()?, fh)?;
            if f.amode & MPI_MODE_SEQUENTIAL != 0 {
                return err(MPI_ERR_UNSUPPORTED_OPERATION, "MPI_File_get_position on a file opened with MPI_MODE_SEQUENTIAL");
            }
            out(offset, f.pos, "offset")
        })();
        fin_file(fh, "MPI_File_get_position", r)
    }
    fn MPI_File_get_byte_offset / PMPI_File_get_byte_offset(fh: MPI_File, offset: MPI_Offset, disp: *mut MPI_Offset) -> c_int {
        let r = (|| -> R {
            let f = file(state()?, fh)?;
            if offset < 0 {
                return err(MPI_ERR_ARG, format!("offset {offset} is negative"));
            }
            let b = byte_offset(&f.view.clone(), offset)?;
            out(disp, b, "disp")
        })();
        fin_file(fh, "MPI_File_get_byte_offset", r)
    }
    fn MPI_File_seek_shared / PMPI_File_seek_shared(fh: MPI_File, offset: MPI_Offset, whence: c_int) -> c_int {
        fin_file(fh, "MPI_File_seek_shared", seek_shared(fh, offset, whence))
    }
    fn MPI_File_get_position_shared / PMPI_File_get_position_shared(fh: MPI_File, offset: *mut MPI_Offset) -> c_int {
        let r = (|| -> R {
            let win = file(state()?, fh)?.shwin;
            let p = shared_add(win, 0)?;
            out(offset, p, "offset")
        })();
        fin_file(fh, "MPI_File_get_position_shared", r)
    }
}
