//! Where an operation's bytes lie in a target window: `count` elements `extent` bytes apart, each made of
//! runs of equal blocks (the flattened form of an MPI datatype), relative to a displacement.
//!
//! A contiguous range is one run of one block. Layouts travel to a target's agent in a compact form (one
//! 32-byte record per run, whatever the count), so a vector of a million elements costs 32 bytes.

/// `reps` byte blocks of `len` bytes, the first at `off` and each `stride` bytes after the previous one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Offset of the first block from the element's start.
    pub off: isize,
    /// Bytes per block.
    pub len: usize,
    /// Number of blocks.
    pub reps: usize,
    /// Distance between consecutive blocks.
    pub stride: isize,
}

/// Bytes of one encoded run.
pub const RUN_WIRE: usize = 32;

/// A target layout.
#[derive(Clone, Copy, Debug)]
pub struct Layout<'a> {
    /// Blocks of one element, in order.
    pub runs: &'a [Run],
    /// Number of elements.
    pub count: usize,
    /// Distance between elements.
    pub extent: isize,
}

/// The one run of a contiguous range of `len` bytes.
pub fn contig_run(len: usize) -> [Run; 1] {
    [Run {
        off: 0,
        len,
        reps: 1,
        stride: 0,
    }]
}

impl<'a> Layout<'a> {
    /// A contiguous range (`runs` from [`contig_run`]).
    pub fn contig(runs: &'a [Run; 1]) -> Layout<'a> {
        Layout {
            runs,
            count: 1,
            extent: runs[0].len as isize,
        }
    }

    /// Bytes the layout covers (what is moved).
    pub fn bytes(&self) -> usize {
        self.count
            .saturating_mul(self.runs.iter().map(|r| r.len.saturating_mul(r.reps)).sum())
    }

    /// True if the layout is one contiguous block starting at offset 0.
    pub fn is_contig(&self) -> bool {
        let blocks = self.runs.iter().filter(|r| r.len > 0 && r.reps > 0).count();
        match self.runs.iter().find(|r| r.len > 0 && r.reps > 0) {
            None => true,
            Some(r) => {
                blocks == 1
                    && r.off == 0
                    && (r.reps == 1 || r.stride == r.len as isize)
                    && (self.count <= 1 || self.extent == (r.len * r.reps) as isize)
            }
        }
    }

    /// The byte range `[lo, hi)` the layout touches relative to its displacement, or `None` when it is
    /// empty. Computed from the runs' end points, so it costs O(runs), not O(blocks).
    pub fn span(&self) -> Option<(i128, i128)> {
        let mut lo = i128::MAX;
        let mut hi = i128::MIN;
        for r in self.runs {
            if r.len == 0 || r.reps == 0 {
                continue;
            }
            let first = r.off as i128;
            let last = first + (r.reps as i128 - 1) * r.stride as i128;
            lo = lo.min(first.min(last));
            hi = hi.max(first.max(last) + r.len as i128);
        }
        if lo > hi || self.count == 0 {
            return None;
        }
        let shift = (self.count as i128 - 1) * self.extent as i128;
        Some((lo + shift.min(0), hi + shift.max(0)))
    }

    /// Call `f(offset, len)` for every block in order (offsets relative to the displacement).
    pub fn for_each_block(&self, mut f: impl FnMut(isize, usize)) {
        for k in 0..self.count as isize {
            let base = k.wrapping_mul(self.extent);
            for r in self.runs {
                let mut p = base.wrapping_add(r.off);
                for _ in 0..r.reps {
                    if r.len > 0 {
                        f(p, r.len);
                    }
                    p = p.wrapping_add(r.stride);
                }
            }
        }
    }

    /// Encode the runs (count and extent travel in the request header).
    pub fn encode_runs(&self, out: &mut Vec<u8>) {
        for r in self.runs {
            out.extend_from_slice(&(r.off as i64).to_le_bytes());
            out.extend_from_slice(&(r.len as u64).to_le_bytes());
            out.extend_from_slice(&(r.reps as u64).to_le_bytes());
            out.extend_from_slice(&(r.stride as i64).to_le_bytes());
        }
    }
}

/// Decode `n` runs from `b` (exactly `n * RUN_WIRE` bytes); `None` if a field does not fit this machine.
pub fn decode_runs(b: &[u8], n: usize, out: &mut Vec<Run>) -> Option<()> {
    if b.len() != n.checked_mul(RUN_WIRE)? {
        return None;
    }
    out.clear();
    for c in b.chunks_exact(RUN_WIRE) {
        let f = |i: usize| u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap());
        out.push(Run {
            off: isize::try_from(f(0) as i64).ok()?,
            len: usize::try_from(f(1)).ok()?,
            reps: usize::try_from(f(2)).ok()?,
            stride: isize::try_from(f(3) as i64).ok()?,
        });
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_span_blocks_and_wire_round_trip_work() {
        // 3 elements of a vector: 2 blocks of 4 bytes 12 apart; extent 24.
        let runs = [Run {
            off: 4,
            len: 4,
            reps: 2,
            stride: 12,
        }];
        let l = Layout {
            runs: &runs,
            count: 3,
            extent: 24,
        };
        assert_eq!(l.bytes(), 24);
        assert_eq!(l.span(), Some((4, 4 + 48 + 16)));
        let mut blocks = Vec::new();
        l.for_each_block(|o, n| blocks.push((o, n)));
        assert_eq!(blocks, vec![(4, 4), (16, 4), (28, 4), (40, 4), (52, 4), (64, 4)]);
        assert!(!l.is_contig());
        let mut w = Vec::new();
        l.encode_runs(&mut w);
        let mut back = Vec::new();
        decode_runs(&w, 1, &mut back).unwrap();
        assert_eq!(back, runs);
        assert!(decode_runs(&w[..31], 1, &mut back).is_none());
    }

    #[test]
    fn negative_strides_and_contiguous_ranges_work() {
        let runs = [Run {
            off: 0,
            len: 8,
            reps: 3,
            stride: -16,
        }];
        let l = Layout {
            runs: &runs,
            count: 2,
            extent: -100,
        };
        assert_eq!(l.span(), Some((-32 - 100, 8)));
        let c = contig_run(40);
        let l = Layout::contig(&c);
        assert!(l.is_contig());
        assert_eq!(l.span(), Some((0, 40)));
        let e = contig_run(0);
        assert_eq!(Layout::contig(&e).span(), None);
    }
}
