//! A single-producer single-consumer ring of variable-length records in shared memory.
//!
//! Layout: a control block of [`RING_CTL_SIZE`] bytes (producer index on one 128-byte line, consumer index
//! on another) followed by `capacity` data bytes (a power of two). Records are 64-byte aligned:
//!
//! ```text
//! +0  stamp: u64   absolute ring position of this record + 1, stored last with Release
//! +8  body_len: u32
//! +12 flags: u32   bit 0 = padding record (skip to the ring's start)
//! +16 body ...     padded to a multiple of 64
//! ```
//!
//! The consumer never reads the producer index: it polls the stamp word at its own position, so a small
//! message costs one cache-line transfer (the idea of MPICH's and Open MPI's "fastboxes", generalised to a
//! ring). Because a position's stamp is unique forever, stale records from earlier laps are never mistaken
//! for new ones; the consumer zeroes the first word of every continuation line it consumes, so payload bytes
//! left from an earlier lap can never look like a valid stamp either (a record's first line needs no
//! zeroing: its first word is a stamp, smaller than any stamp looked for later).
//!
//! Everything read from the shared control block or a record header is validated: a corrupted or hostile
//! peer yields a [`RingError`], never an out-of-bounds access.
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use thiserror::Error;

/// Bytes of the control block that precedes the data area.
pub const RING_CTL_SIZE: usize = 384;
/// Records are aligned to this many bytes.
pub const REC_ALIGN: u64 = 64;
/// Bytes of the record header (stamp, length, flags).
pub const REC_HDR: usize = 16;
/// Smallest capacity a ring may have.
pub const MIN_CAPACITY: u64 = 4096;
const FLAG_PAD: u32 = 1;

/// The shared control block.
#[repr(C, align(128))]
pub struct RingCtl {
    /// Bytes produced so far (written by the producer only; advisory for the consumer).
    pub head: AtomicU64,
    /// Data capacity in bytes, written once by whoever creates the ring.
    pub capacity: AtomicU64,
    _p0: [u8; 112],
    /// Bytes consumed so far (written by the consumer only).
    pub tail: AtomicU64,
    /// Set by the consumer before it sleeps (used by the progress engine's blocking wait).
    pub consumer_sleeping: AtomicU32,
    _p1: [u8; 116],
    /// Room for the pair's [`crate::duplex`] box (the transport uses the one in the ring from the lower
    /// rank to the higher); zeroed by [`Ring::init`].
    _duplex: [u8; crate::duplex::DUPLEX_SIZE],
}
const _: () = assert!(std::mem::size_of::<RingCtl>() == RING_CTL_SIZE);

/// What went wrong with a ring. Every variant means the shared memory holds something an honest peer
/// never writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RingError {
    /// The capacity in the control block is not a power of two of at least [`MIN_CAPACITY`] bytes.
    #[error("ring capacity {0} is invalid")]
    BadCapacity(u64),
    /// The consumer index is behind what it has already claimed or beyond what was produced.
    #[error(
        "consumer index {tail} is inconsistent with producer index {head} (capacity {capacity})"
    )]
    BadTail {
        /// Value read.
        tail: u64,
        /// Producer's own index.
        head: u64,
        /// Ring capacity.
        capacity: u64,
    },
    /// A record header claims a length that does not fit the ring.
    #[error("record at position {pos} has invalid length {len}")]
    BadRecord {
        /// Absolute position.
        pos: u64,
        /// Claimed body length.
        len: u32,
    },
    /// A record larger than the ring was requested.
    #[error("record body of {0} bytes cannot fit the ring")]
    TooLarge(usize),
}

/// Constructors for the two ends of a ring living at some base address.
pub struct Ring;

impl Ring {
    /// The duplex-box area inside the control block of the ring at `base`.
    ///
    /// # Safety
    /// `base` must point to a ring's control block.
    pub unsafe fn duplex_area(base: *mut u8) -> *mut u8 {
        base.add(std::mem::offset_of!(RingCtl, _duplex))
    }

    /// Initialise the control block of a fresh ring (all bytes zero) with its capacity.
    ///
    /// # Safety
    /// `base` must point to `RING_CTL_SIZE + capacity` writable bytes, 128-byte aligned, that no one else uses yet.
    pub unsafe fn init(base: *mut u8, capacity: u64) -> Result<(), RingError> {
        check_capacity(capacity)?;
        std::ptr::write_bytes(base, 0, RING_CTL_SIZE + capacity as usize);
        (*(base as *const RingCtl))
            .capacity
            .store(capacity, Ordering::Release);
        Ok(())
    }

    /// The producer end. `capacity` is the caller's own record of the capacity (never re-read from shared memory).
    ///
    /// # Safety
    /// `base` must point to a ring of `capacity` data bytes that stays mapped while the producer lives; only
    /// one producer may exist per ring.
    pub unsafe fn producer(base: *mut u8, capacity: u64) -> Result<Producer, RingError> {
        check_capacity(capacity)?;
        let ctl = base as *const RingCtl;
        let head = (*ctl).head.load(Ordering::Acquire);
        let tail = (*ctl).tail.load(Ordering::Acquire);
        if tail > head || head - tail > capacity || head % REC_ALIGN != 0 {
            return Err(RingError::BadTail {
                tail,
                head,
                capacity,
            });
        }
        Ok(Producer {
            ctl,
            data: base.add(RING_CTL_SIZE),
            cap: capacity,
            head,
            cached_tail: tail,
        })
    }

    /// The consumer end.
    ///
    /// # Safety
    /// As for [`Ring::producer`], with one consumer per ring.
    pub unsafe fn consumer(base: *mut u8, capacity: u64) -> Result<Consumer, RingError> {
        check_capacity(capacity)?;
        let ctl = base as *const RingCtl;
        let tail = (*ctl).tail.load(Ordering::Acquire);
        if tail % REC_ALIGN != 0 {
            return Err(RingError::BadTail {
                tail,
                head: 0,
                capacity,
            });
        }
        Ok(Consumer {
            ctl,
            data: base.add(RING_CTL_SIZE),
            cap: capacity,
            tail,
            done: tail,
        })
    }
}

fn check_capacity(c: u64) -> Result<(), RingError> {
    if c.is_power_of_two() && (MIN_CAPACITY..=(1 << 40)).contains(&c) {
        Ok(())
    } else {
        Err(RingError::BadCapacity(c))
    }
}

#[inline(always)]
fn rec_len(body: usize) -> u64 {
    crate::align_up((REC_HDR + body) as u64, REC_ALIGN)
}

/// The writing end of a ring.
pub struct Producer {
    ctl: *const RingCtl,
    data: *mut u8,
    cap: u64,
    head: u64,
    cached_tail: u64,
}

// SAFETY: a Producer is the unique writer of its ring; moving it between threads is fine.
unsafe impl Send for Producer {}

/// Space reserved in the ring, to be filled and then [`Producer::commit`]ted.
#[must_use]
pub struct WriteSlot {
    body: *mut u8,
    len: usize,
    pos: u64,
    rec: u64,
}

impl WriteSlot {
    /// Pointer to the body.
    pub fn ptr(&self) -> *mut u8 {
        self.body
    }
    /// Length of the body.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length body.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Copy `src` into the body at `offset`.
    ///
    /// # Safety
    /// `offset + src.len()` must not exceed [`WriteSlot::len`].
    #[inline(always)]
    pub unsafe fn write(&self, offset: usize, src: &[u8]) {
        debug_assert!(offset + src.len() <= self.len);
        std::ptr::copy_nonoverlapping(src.as_ptr(), self.body.add(offset), src.len());
    }
}

impl Producer {
    /// Data capacity.
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// Largest body [`Producer::reserve`] accepts.
    pub fn max_body(&self) -> usize {
        (self.cap as usize) - REC_HDR
    }

    /// Bytes produced so far.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The shared control block (for the progress engine's sleep/wake protocol).
    pub fn ctl(&self) -> &RingCtl {
        // SAFETY: valid while the producer lives (constructor contract).
        unsafe { &*self.ctl }
    }

    #[inline(always)]
    fn free(&self) -> u64 {
        self.cap - (self.head - self.cached_tail)
    }

    #[inline]
    fn refresh_tail(&mut self) -> Result<(), RingError> {
        // SAFETY: ctl valid (constructor contract).
        let t = unsafe { (*self.ctl).tail.load(Ordering::Acquire) };
        if t < self.cached_tail || t > self.head || self.head - t > self.cap || t % REC_ALIGN != 0 {
            return Err(RingError::BadTail {
                tail: t,
                head: self.head,
                capacity: self.cap,
            });
        }
        self.cached_tail = t;
        Ok(())
    }

    /// Reserve a record with a `body_len`-byte body. `Ok(None)` means the ring is full right now (retry after
    /// the consumer has made progress); it never blocks.
    #[inline]
    pub fn reserve(&mut self, body_len: usize) -> Result<Option<WriteSlot>, RingError> {
        let rec = rec_len(body_len);
        if rec > self.cap {
            return Err(RingError::TooLarge(body_len));
        }
        let off = self.head & (self.cap - 1);
        if off + rec > self.cap {
            // Not enough room before the end: fill the rest with a padding record and start the next lap.
            let pad = self.cap - off;
            if self.free() < pad {
                self.refresh_tail()?;
                if self.free() < pad {
                    return Ok(None);
                }
            }
            // SAFETY: [off, cap) is free (checked) and inside the data area.
            unsafe {
                let p = self.data.add(off as usize);
                *(p.add(8) as *mut u32) = (pad as usize - REC_HDR) as u32;
                *(p.add(12) as *mut u32) = FLAG_PAD;
                (*(p as *const AtomicU64)).store(self.head + 1, Ordering::Release);
            }
            self.head += pad;
        }
        if self.free() < rec {
            self.refresh_tail()?;
            if self.free() < rec {
                return Ok(None);
            }
        }
        let off = self.head & (self.cap - 1);
        // SAFETY: [off, off+rec) is free and inside the data area.
        let p = unsafe { self.data.add(off as usize) };
        Ok(Some(WriteSlot {
            body: unsafe { p.add(REC_HDR) },
            len: body_len,
            pos: self.head,
            rec,
        }))
    }

    /// Publish a filled record.
    #[inline]
    pub fn commit(&mut self, slot: WriteSlot) {
        debug_assert_eq!(slot.pos, self.head);
        // SAFETY: the slot was reserved from this ring and is still exclusively ours.
        unsafe {
            let p = slot.body.sub(REC_HDR);
            *(p.add(8) as *mut u32) = slot.len as u32;
            *(p.add(12) as *mut u32) = 0;
            (*(p as *const AtomicU64)).store(slot.pos + 1, Ordering::Release);
            self.head += slot.rec;
            (*self.ctl).head.store(self.head, Ordering::Release);
        }
    }
}

/// The reading end of a ring.
pub struct Consumer {
    ctl: *const RingCtl,
    data: *mut u8,
    cap: u64,
    tail: u64,
    /// Position after the last record released (padding skipped since then not included).
    done: u64,
}

// SAFETY: a Consumer is the unique reader of its ring.
unsafe impl Send for Consumer {}

/// A record returned by [`Consumer::peek`]; its memory stays valid until [`Consumer::release`].
#[must_use]
#[derive(Debug)]
pub struct ReadRecord {
    body: *const u8,
    len: usize,
    rec: u64,
}

impl ReadRecord {
    /// Pointer to the body.
    pub fn ptr(&self) -> *const u8 {
        self.body
    }
    /// Body length (validated to lie inside the ring).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty body.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The body as a slice.
    ///
    /// # Safety
    /// Valid until the record is released. The producer does not touch it meanwhile (unless hostile, in which
    /// case the bytes may change under the reader but stay in bounds).
    pub unsafe fn body(&self) -> &[u8] {
        std::slice::from_raw_parts(self.body, self.len)
    }
}

impl Consumer {
    /// Data capacity.
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// Bytes consumed so far (including padding skipped by [`Consumer::peek`]).
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Position just after the last record released; `done..tail` is padding only. A producer position
    /// taken anywhere in that span lies between the same two records.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// The shared control block.
    pub fn ctl(&self) -> &RingCtl {
        // SAFETY: valid while the consumer lives (constructor contract).
        unsafe { &*self.ctl }
    }

    /// The next record, if one has been committed. Never blocks.
    #[inline]
    pub fn peek(&mut self) -> Result<Option<ReadRecord>, RingError> {
        loop {
            let off = self.tail & (self.cap - 1);
            // SAFETY: off < cap and 64-aligned, so the 16-byte header is inside the data area.
            let p = unsafe { self.data.add(off as usize) };
            let stamp = unsafe { (*(p as *const AtomicU64)).load(Ordering::Acquire) };
            if stamp != self.tail + 1 {
                return Ok(None);
            }
            // SAFETY: header is in bounds (above); values are validated before use.
            let (len, flags) = unsafe { (*(p.add(8) as *const u32), *(p.add(12) as *const u32)) };
            let rec = rec_len(len as usize);
            if len as u64 > self.cap
                || off + rec > self.cap
                || (flags & FLAG_PAD != 0 && off + rec != self.cap)
            {
                return Err(RingError::BadRecord {
                    pos: self.tail,
                    len,
                });
            }
            if flags & FLAG_PAD != 0 {
                self.consume(off, rec);
                continue;
            }
            return Ok(Some(ReadRecord {
                body: unsafe { p.add(REC_HDR) },
                len: len as usize,
                rec,
            }));
        }
    }

    /// Free a record returned by [`Consumer::peek`].
    #[inline]
    pub fn release(&mut self, rec: ReadRecord) {
        let off = self.tail & (self.cap - 1);
        self.consume(off, rec.rec);
        self.done = self.tail;
    }

    #[inline(always)]
    fn consume(&mut self, off: u64, rec: u64) {
        // Zero the first word of every continuation line of the record, so payload bytes left there can
        // never pose as a future stamp. The first line needs nothing: its first word is a stamp, and stamps
        // left from earlier laps are always smaller than any stamp the consumer will look for. Not writing
        // the first line keeps a one-line (small) message's line shared instead of taking it over, so the
        // producer's next write to it costs an invalidation, not a transfer back.
        let mut o = off + REC_ALIGN;
        while o < off + rec {
            // SAFETY: [off, off+rec) was validated to lie inside the data area.
            unsafe {
                (*(self.data.add(o as usize) as *const AtomicU64)).store(0, Ordering::Relaxed)
            };
            o += REC_ALIGN;
        }
        self.tail += rec;
        // SAFETY: ctl valid.
        unsafe { (*self.ctl).tail.store(self.tail, Ordering::Release) };
    }

    /// True if a record may be waiting (cheap check used before sleeping).
    pub fn has_data(&self) -> bool {
        let off = self.tail & (self.cap - 1);
        // SAFETY: in bounds as in peek.
        let stamp =
            unsafe { (*(self.data.add(off as usize) as *const AtomicU64)).load(Ordering::Acquire) };
        stamp == self.tail + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heap memory for a test ring, 128-byte aligned.
    struct Mem(Vec<u64>);
    impl Mem {
        fn new(cap: u64) -> Self {
            Mem(vec![0u64; (RING_CTL_SIZE + cap as usize) / 8 + 16])
        }
        fn base(&mut self) -> *mut u8 {
            let p = self.0.as_mut_ptr() as *mut u8;
            unsafe { p.add((128 - (p as usize % 128)) % 128) }
        }
    }

    fn pair(m: &mut Mem, cap: u64) -> (Producer, Consumer) {
        let b = m.base();
        unsafe {
            Ring::init(b, cap).unwrap();
            (
                Ring::producer(b, cap).unwrap(),
                Ring::consumer(b, cap).unwrap(),
            )
        }
    }

    #[test]
    fn send_receive_in_order_with_wraparound_works() {
        let cap = 4096;
        let mut m = Mem::new(cap);
        let (mut tx, mut rx) = pair(&mut m, cap);
        for i in 0..10_000u32 {
            let n = (i as usize * 37) % 700;
            let body: Vec<u8> = (0..n).map(|k| (k as u32 ^ i) as u8).collect();
            let s = tx.reserve(n).unwrap().unwrap();
            unsafe { s.write(0, &body) };
            tx.commit(s);
            let r = rx.peek().unwrap().unwrap();
            assert_eq!(unsafe { r.body() }, &body[..]);
            rx.release(r);
            assert!(rx.peek().unwrap().is_none());
        }
    }

    #[test]
    fn full_ring_reports_no_space_works() {
        let cap = 4096;
        let mut m = Mem::new(cap);
        let (mut tx, mut rx) = pair(&mut m, cap);
        let mut n = 0;
        while let Some(s) = tx.reserve(100).unwrap() {
            tx.commit(s);
            n += 1;
        }
        assert_eq!(n, 4096 / 128);
        let r = rx.peek().unwrap().unwrap();
        rx.release(r);
        assert!(tx.reserve(100).unwrap().is_some());
    }

    #[test]
    fn too_large_fails() {
        let cap = 4096;
        let mut m = Mem::new(cap);
        let (mut tx, _rx) = pair(&mut m, cap);
        assert_eq!(tx.reserve(5000).err(), Some(RingError::TooLarge(5000)));
    }

    #[test]
    fn corrupted_tail_fails() {
        let cap = 4096;
        let mut m = Mem::new(cap);
        let (mut tx, _rx) = pair(&mut m, cap);
        tx.ctl().tail.store(1 << 50, Ordering::Release);
        let mut err = None;
        for _ in 0..100 {
            match tx.reserve(200) {
                Ok(Some(s)) => tx.commit(s),
                Ok(None) => panic!("corruption went unnoticed"),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        assert!(matches!(err, Some(RingError::BadTail { .. })));
    }

    #[test]
    fn corrupted_record_length_fails() {
        let cap = 4096;
        let mut m = Mem::new(cap);
        let (mut tx, mut rx) = pair(&mut m, cap);
        let s = tx.reserve(8).unwrap().unwrap();
        let hdr = unsafe { s.ptr().sub(REC_HDR) };
        tx.commit(s);
        unsafe { *(hdr.add(8) as *mut u32) = 0xFFFF_FFF0 };
        assert!(matches!(rx.peek(), Err(RingError::BadRecord { .. })));
        unsafe { *(hdr.add(8) as *mut u32) = 4080 + 64 };
        assert!(matches!(rx.peek(), Err(RingError::BadRecord { .. })));
    }

    /// A peer that scribbles over the ring (control block, record headers, bodies; random words,
    /// plausible stamps, lengths and padding flags) makes the consumer and producer fail or carry on, but
    /// every record they hand out lies inside the data area.
    #[test]
    fn scribbled_rings_never_lend_memory_outside_the_data_area() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let cap = 4096u64;
        let (mut errors, mut records) = (0, 0);
        for case in 0..3000 {
            let mut m = Mem::new(cap);
            let base = m.base();
            let (mut tx, mut rx) = pair(&mut m, cap);
            // Some honest traffic first, so the ring has laps, records and padding behind it.
            for _ in 0..rnd() % 40 {
                let n = (rnd() % 1500) as usize;
                if let Ok(Some(s)) = tx.reserve(n) {
                    tx.commit(s);
                }
                if rnd() % 2 == 0 {
                    if let Ok(Some(r)) = rx.peek() {
                        rx.release(r);
                    }
                }
            }
            let pos = tx.head();
            for _ in 0..1 + rnd() % 4 {
                let at = (rnd() % ((RING_CTL_SIZE as u64 + cap) / 8)) as usize * 8;
                let near = pos.wrapping_sub(rnd() % 8 * REC_ALIGN).wrapping_add(rnd() % 16 * REC_ALIGN);
                let v = match rnd() % 5 {
                    0 => rnd(),
                    1 => near + 1,
                    2 => (rnd() % 6000) | ((rnd() % 3) << 32),
                    3 => near,
                    _ => rnd() % (cap * 4),
                };
                // SAFETY: inside the ring's memory (control block + data area).
                unsafe { (base.add(at) as *mut u64).write_volatile(v) };
            }
            let data = base as usize + RING_CTL_SIZE;
            for _ in 0..64 {
                match rx.peek() {
                    Ok(Some(r)) => {
                        // SAFETY: the consumer lent this body until release.
                        let b = unsafe { r.body() };
                        let (lo, hi) = (b.as_ptr() as usize, b.as_ptr() as usize + b.len());
                        assert!(
                            lo >= data && hi <= data + cap as usize,
                            "case {case}: a record of {} bytes at {:#x} outside the data area [{data:#x}, +{cap})",
                            b.len(),
                            lo
                        );
                        records += 1;
                        rx.release(r);
                    }
                    Ok(None) => break,
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
            for _ in 0..8 {
                match tx.reserve((rnd() % 2000) as usize) {
                    Ok(Some(s)) => tx.commit(s),
                    Ok(None) => break,
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
        }
        assert!(errors > 20 && records > 1000, "{errors} errors, {records} records");
    }

    #[test]
    fn stale_payload_is_not_a_stamp_works() {
        // Fill records whose payload is full of "future stamps"; the consumer must never see phantom records.
        let cap = 4096;
        let mut m = Mem::new(cap);
        let (mut tx, mut rx) = pair(&mut m, cap);
        for round in 0..200u64 {
            let n = 1000;
            let s = tx.reserve(n).unwrap().unwrap();
            let pos = tx.head();
            let body: Vec<u8> = (0..n / 8)
                .flat_map(|k| (pos + 1 + (k as u64 * 8)).to_le_bytes())
                .collect();
            unsafe { s.write(0, &body) };
            tx.commit(s);
            let r = rx.peek().unwrap().unwrap();
            rx.release(r);
            assert!(
                rx.peek().unwrap().is_none(),
                "phantom record in round {round}"
            );
        }
    }

    #[test]
    fn concurrent_stress_works() {
        let cap = 8192;
        let mut m = Mem::new(cap);
        let (mut tx, mut rx) = pair(&mut m, cap);
        const N: u64 = 200_000;
        let prod = std::thread::spawn(move || {
            let mut i = 0u64;
            while i < N {
                let n = 8 + (i as usize * 131) % 1500;
                match tx.reserve(n).unwrap() {
                    Some(s) => {
                        let mut b = vec![(i % 251) as u8; n];
                        b[..8].copy_from_slice(&i.to_le_bytes());
                        unsafe { s.write(0, &b) };
                        tx.commit(s);
                        i += 1;
                    }
                    None => std::hint::spin_loop(),
                }
            }
        });
        let mut i = 0u64;
        while i < N {
            if let Some(r) = rx.peek().unwrap() {
                let b = unsafe { r.body() };
                assert_eq!(b.len(), 8 + (i as usize * 131) % 1500);
                assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), i);
                assert!(b[8..].iter().all(|&x| x == (i % 251) as u8));
                rx.release(r);
                i += 1;
            } else {
                std::hint::spin_loop();
            }
        }
        prod.join().unwrap();
    }
}
