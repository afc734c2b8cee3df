//! Reduction operations: the predefined ops on every type the standard allows them on (and MPI_SUM etc.
//! on MPI_CHAR/MPI_BYTE, as MPICH accepts), MINLOC/MAXLOC on the pair types, and user-defined ops
//! (MPI_Op_create/free, commutative or not), plus MPI_Reduce_local and MPI_Op_commutative.
use crate::*;
use std::ffi::{c_int, c_void};
use vmf_rma::reduce::{Elem, ROp};

pub type MPI_Op = c_int;
pub type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut MPI_Datatype);
/// MPI 4.0's large-count form (`MPI_Op_create_c`): the length is an `MPI_Count`.
pub type UserFnC =
    unsafe extern "C" fn(*mut c_void, *mut c_void, *mut MPI_Count, *mut MPI_Datatype);

/// A user function, in either form.
#[derive(Clone, Copy)]
pub(crate) enum UserCall {
    Int(UserFn),
    Big(UserFnC),
}

pub const MPI_OP_NULL: MPI_Op = 0x1800_0000;
pub const MPI_MAX: MPI_Op = 0x5800_0001;
pub const MPI_MIN: MPI_Op = 0x5800_0002;
pub const MPI_SUM: MPI_Op = 0x5800_0003;
pub const MPI_PROD: MPI_Op = 0x5800_0004;
pub const MPI_LAND: MPI_Op = 0x5800_0005;
pub const MPI_BAND: MPI_Op = 0x5800_0006;
pub const MPI_LOR: MPI_Op = 0x5800_0007;
pub const MPI_BOR: MPI_Op = 0x5800_0008;
pub const MPI_LXOR: MPI_Op = 0x5800_0009;
pub const MPI_BXOR: MPI_Op = 0x5800_000a;
pub const MPI_MINLOC: MPI_Op = 0x5800_000b;
pub const MPI_MAXLOC: MPI_Op = 0x5800_000c;
pub const MPI_REPLACE: MPI_Op = 0x5800_000d;
pub const MPI_NO_OP: MPI_Op = 0x5800_000e;
const OP_BASE: u32 = 0x9800_0000;

/// A user-defined operation.
#[derive(Clone, Copy)]
pub(crate) struct UserOp {
    pub f: UserCall,
    pub commute: bool,
}

/// A resolved reduction: what to apply to runs of `elem`-byte elements.
#[derive(Clone, Copy)]
pub(crate) struct Red {
    pub op: MPI_Op,
    /// The datatype passed to the user function / the basic type for predefined ops.
    pub dt: MPI_Datatype,
    /// Bytes of one element: the extent, or for packed pair types (`coll::red_packed`) the size.
    pub elem: usize,
    pub user: Option<UserCall>,
    pub commute: bool,
}

/// Resolve (op, datatype) for a reduction of `count` elements; returns the reduction and the element
/// count in its units (a contiguous derived type of one basic type reduces as that basic type).
pub(crate) fn resolve(st: &State, op: MPI_Op, dt: MPI_Datatype, count: usize) -> R<(Red, usize)> {
    let u = op as u32;
    if u & 0xfc00_0000 == OP_BASE {
        let o = st
            .ops
            .get((u & 0x03ff_ffff) as usize)
            .copied()
            .flatten()
            .ok_or_else(|| MpiErr {
                code: MPI_ERR_OP,
                msg: format!("invalid op {op:#x}"),
            })?;
        if crate::bigcount::is_wide(st, dt) {
            return err(
                MPI_ERR_COUNT,
                "user-defined reductions of more than INT_MAX elements are not supported (the function would be handed a stand-in datatype)",
            );
        }
        let (ext, _) = if datatype::is_derived(dt) {
            let d = datatype::get(st, dt)?;
            (d.extent() as usize, d.size)
        } else {
            let s = type_extent(dt)?;
            (s, s)
        };
        return Ok((
            Red {
                op,
                dt,
                elem: ext,
                user: Some(o.f),
                commute: o.commute,
            },
            count,
        ));
    }
    if !(MPI_MAX..=MPI_NO_OP).contains(&op) {
        return err(MPI_ERR_OP, format!("invalid op {op:#x}"));
    }
    let (basic, n) = if datatype::is_derived(dt) {
        let d = datatype::get(st, dt)?;
        if d.basic == MPI_DATATYPE_NULL || !d.dense || d.nbasic == 0 {
            return err(MPI_ERR_OP, "predefined reduction on a derived datatype that is not a contiguous run of one basic type");
        }
        (d.basic, count * d.nbasic)
    } else {
        (dt, count)
    };
    let elem = type_extent(basic)?;
    if kind(basic).is_none() || !allowed(op, kind(basic).unwrap()) {
        return err(
            MPI_ERR_OP,
            format!("op {op:#x} is not defined on datatype {basic:#x}"),
        );
    }
    Ok((
        Red {
            op,
            dt: basic,
            elem,
            user: None,
            commute: true,
        },
        n,
    ))
}

/// The element kind of a predefined datatype for reductions (the kernels live in `vmf_rma::reduce`, which
/// one-sided accumulates share).
pub(crate) fn kind(dt: MPI_Datatype) -> Option<Elem> {
    let u = dt as u32;
    if u & 0xffff_fff8 == 0x8c00_0000 {
        return match u & 7 {
            0 => Some(Elem::PFI),
            1 => Some(Elem::PDI),
            2 => Some(Elem::PLI),
            3 => Some(Elem::PSI),
            4 => Some(Elem::Pldi),
            _ => None,
        };
    }
    if u & 0xffff_0000 != 0x4c00_0000 {
        return None;
    }
    Some(match u & 0xff {
        0x01 | 0x18 | 0x37 | 0x2d => Elem::I8,
        0x03 | 0x38 | 0x2f => Elem::I16,
        0x05 | 0x39 | 0x1b | 0x30 | 0x0e | 0x1d => Elem::I32,
        0x07 | 0x09 | 0x3a | 0x31 | 0x43 | 0x44 | 0x45 => Elem::I64,
        0x02 | 0x3b | 0x0d | 0x1a | 0x3f | 0x33 | 0x0f => Elem::U8,
        0x04 | 0x3c => Elem::U16,
        0x06 | 0x3d => Elem::U32,
        0x08 | 0x19 | 0x3e => Elem::U64,
        0x0a | 0x1c | 0x27 => Elem::F32,
        0x0b | 0x1f | 0x29 => Elem::F64,
        0x1e | 0x28 | 0x40 | 0x34 => Elem::C32,
        0x22 | 0x2a | 0x41 | 0x35 => Elem::C64,
        0x16 | 0x20 => Elem::P2I,
        0x21 => Elem::P2F,
        0x23 => Elem::P2D,
        0x0c => Elem::F80,
        0x42 | 0x36 => Elem::C80,
        _ => return None,
    })
}

/// The predefined operation of handle `op`.
#[inline]
pub(crate) fn rop(op: MPI_Op) -> Option<ROp> {
    Some(match op {
        MPI_MAX => ROp::Max,
        MPI_MIN => ROp::Min,
        MPI_SUM => ROp::Sum,
        MPI_PROD => ROp::Prod,
        MPI_LAND => ROp::Land,
        MPI_BAND => ROp::Band,
        MPI_LOR => ROp::Lor,
        MPI_BOR => ROp::Bor,
        MPI_LXOR => ROp::Lxor,
        MPI_BXOR => ROp::Bxor,
        MPI_MINLOC => ROp::MinLoc,
        MPI_MAXLOC => ROp::MaxLoc,
        MPI_REPLACE => ROp::Replace,
        MPI_NO_OP => ROp::NoOp,
        _ => return None,
    })
}

fn allowed(op: MPI_Op, k: Elem) -> bool {
    rop(op).is_some_and(|o| vmf_rma::reduce::allowed(o, k))
}

/// `b = a op b` over `n` elements (a is the left operand: the lower ranks' contribution).
pub(crate) unsafe fn apply(r: &Red, a: *const u8, b: *mut u8, n: usize) {
    if n == 0 {
        return;
    }
    if let Some(f) = r.user {
        let mut dt = r.dt;
        match f {
            UserCall::Int(f) => {
                // Element counts never exceed INT_MAX (a larger count is MPI_ERR_COUNT at the call).
                let mut len = n as c_int;
                f(a as *mut c_void, b as *mut c_void, &mut len, &mut dt);
            }
            UserCall::Big(f) => {
                let mut len = n as MPI_Count;
                f(a as *mut c_void, b as *mut c_void, &mut len, &mut dt);
            }
        }
        return;
    }
    let (Some(o), Some(k)) = (rop(r.op), kind(r.dt)) else {
        return; // checked by resolve
    };
    // Pairs are laid out as in memory (`elem` is the extent) or packed (`elem` is the size).
    vmf_rma::reduce::apply(o, k, a, b, n, r.elem);
}

/// How the `n` contributions of a reduction are grouped. Every step combines two adjacent groups as
/// `left op right`, the lower ranks on the left, so the operands always come in rank order (as
/// non-commutative ops need) and only the parenthesization differs between trees.
///
/// These are the groupings of MPICH's default small-message algorithms (recursive doubling for
/// MPI_Allreduce, the binomial tree for MPI_Reduce), which our tree schedules in `coll.rs` follow as well.
/// The one-hop schedules and the shared-memory collectives fold with them too, so a reduction gives the
/// same bits whichever of these paths serves it, and floating-point sums and products give the same bits
/// as under MPICH. The standard leaves the grouping free, but codes validated under MPICH can depend on
/// it: a right fold `x0 + (x1 + x2)` rounds differently from MPICH's `(x0 + x1) + x2`, and with it
/// ScaLAPACK's xdsep (a 27x27 matrix with a 26-fold eigenvalue cluster, on 3 ranks of 4) failed its
/// orthogonality check in most runs; MPICH fails it as well once its sums are folded from the right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tree {
    /// Recursive doubling (allreduce): with `p` the largest power of two `<= n`, ranks `2i` and `2i + 1`
    /// pair up for `i < n - p`, and the `p` resulting groups combine as a balanced binary tree:
    /// 3 ranks `(0 1) 2`, 4 ranks `(0 1) (2 3)`, 5 ranks `((0 1) 2) (3 4)`.
    Doubling,
    /// Binomial tree (rooted reduce, on ranks counted from the tree's root): each group is an aligned
    /// power-of-two block of ranks: 5 ranks `((0 1) (2 3)) 4`.
    Binomial,
}

/// A step of a [`Plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FoldStep {
    /// Copy a contribution into a buffer.
    Copy,
    /// `b = a op b`.
    Apply,
}

/// What a step of a [`Plan`] reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Operand {
    /// The contribution of rank `v` (counted from the tree's first rank); only ever read.
    X(usize),
    /// The result.
    Out,
    /// Scratch buffer `k` (`k < Plan::scratch`), of the reduction's size.
    Tmp(usize),
}

impl Tree {
    /// Where the group of ranks `lo..hi` (at least two) splits into its left and right parts.
    fn split(self, n: usize, lo: usize, hi: usize) -> usize {
        match self {
            // The largest power of two below the group's size.
            Tree::Binomial => lo + (1 << (usize::BITS - 1 - (hi - lo - 1).leading_zeros())),
            Tree::Doubling => {
                let p = 1 << (usize::BITS - 1 - n.leading_zeros());
                let rem = n - p;
                // Rank -> leaf of the balanced tree (the first `rem` leaves are pairs), and back.
                let leaf = |x: usize| if x < 2 * rem { x / 2 } else { x - rem };
                let first = |y: usize| if y < rem { 2 * y } else { y + rem };
                let (a, b) = (leaf(lo), leaf(hi));
                if b - a == 1 {
                    lo + 1
                } else {
                    first((a + b) / 2)
                }
            }
        }
    }
}

/// The steps that reduce `n` contributions (`n >= 1`) into [`Operand::Out`] as a [`Tree`] groups them,
/// with the scratch buffers they need (none for up to 2 contributions, one for 3 or 4). Each
/// contribution is read once and never written. Built once per communicator or call and then run by
/// mapping each operand to a buffer.
#[derive(Debug)]
pub(crate) struct Plan {
    pub steps: Vec<(FoldStep, Operand, Operand)>,
    pub scratch: usize,
}

impl Plan {
    pub(crate) fn new(tree: Tree, n: usize) -> Plan {
        // Group `lo..hi` into `dst`: its right part into `dst` itself, then its left part (unless a
        // single contribution, used where it lies) into the scratch buffer of this depth, combined from
        // the left.
        fn group(
            t: Tree,
            n: usize,
            lo: usize,
            hi: usize,
            dst: Operand,
            depth: usize,
            p: &mut Plan,
        ) {
            if hi - lo == 1 {
                return p.steps.push((FoldStep::Copy, Operand::X(lo), dst));
            }
            let mid = t.split(n, lo, hi);
            group(t, n, mid, hi, dst, depth, p);
            if mid - lo == 1 {
                p.steps.push((FoldStep::Apply, Operand::X(lo), dst));
            } else {
                p.scratch = p.scratch.max(depth + 1);
                group(t, n, lo, mid, Operand::Tmp(depth), depth + 1, p);
                p.steps.push((FoldStep::Apply, Operand::Tmp(depth), dst));
            }
        }
        let mut p = Plan {
            steps: Vec::with_capacity(2 * n),
            scratch: 0,
        };
        group(tree, n, 0, n, Operand::Out, 0, &mut p);
        p
    }
}

/// MPI_Op_create(_c): a user-defined operation.
unsafe fn create(f: Option<UserCall>, commute: c_int, op: *mut MPI_Op) -> R {
    let st = state()?;
    let f = f.ok_or_else(|| MpiErr {
        code: MPI_ERR_ARG,
        msg: "user function is NULL".into(),
    })?;
    if op.is_null() {
        return err(MPI_ERR_ARG, "op is NULL");
    }
    let i = put_in_free_slot(
        &mut st.ops,
        0,
        UserOp {
            f,
            commute: commute != 0,
        },
    );
    *op = (OP_BASE | i as u32) as c_int;
    Ok(())
}

mpi_api! {
    fn MPI_Op_create / PMPI_Op_create(user_fn: Option<UserFn>, commute: c_int, op: *mut MPI_Op) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Op_create", create(user_fn.map(UserCall::Int), commute, op))
    }
    fn MPI_Op_create_c / PMPI_Op_create_c(user_fn: Option<UserFnC>, commute: c_int, op: *mut MPI_Op) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Op_create_c", create(user_fn.map(UserCall::Big), commute, op))
    }
    fn MPI_Op_free / PMPI_Op_free(op: *mut MPI_Op) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if op.is_null() {
                return err(MPI_ERR_ARG, "op is NULL");
            }
            let u = *op as u32;
            let i = (u & 0x03ff_ffff) as usize;
            if u & 0xfc00_0000 != OP_BASE || st.ops.get(i).is_none_or(|o| o.is_none()) {
                return err(MPI_ERR_OP, "MPI_Op_free of a predefined or invalid op");
            }
            st.ops[i] = None;
            *op = MPI_OP_NULL;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Op_free", r)
    }
    fn MPI_Op_commutative / PMPI_Op_commutative(op: MPI_Op, commute: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if commute.is_null() {
                return err(MPI_ERR_ARG, "commute is NULL");
            }
            let u = op as u32;
            *commute = if u & 0xfc00_0000 == OP_BASE {
                st.ops.get((u & 0x03ff_ffff) as usize).copied().flatten().ok_or_else(|| MpiErr { code: MPI_ERR_OP, msg: "invalid op".into() })?.commute as c_int
            } else if (MPI_MAX..=MPI_NO_OP).contains(&op) {
                1
            } else {
                return err(MPI_ERR_OP, format!("invalid op {op:#x}"));
            };
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Op_commutative", r)
    }
    fn MPI_Reduce_local / PMPI_Reduce_local(inbuf: *const c_void, inoutbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if count < 0 {
                return err(MPI_ERR_COUNT, "count is negative");
            }
            let (red, n) = resolve(st, op, datatype, count as usize)?;
            apply(&red, inbuf as *const u8, inoutbuf as *mut u8, n);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Reduce_local", r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The grouping a [`Plan`] produces for `n` contributions, as a parenthesized string of ranks.
    fn shape(tree: Tree, n: usize) -> String {
        let plan = Plan::new(tree, n);
        let mut bufs: HashMap<Operand, String> = HashMap::new();
        for &(s, a, b) in &plan.steps {
            assert!(!matches!(b, Operand::X(_)), "a contribution was written");
            if let Operand::Tmp(k) = a {
                assert!(k < plan.scratch);
            }
            if let Operand::Tmp(k) = b {
                assert!(k < plan.scratch);
            }
            let left = match a {
                Operand::X(v) => v.to_string(),
                o => bufs[&o].clone(),
            };
            let v = match s {
                FoldStep::Copy => left,
                FoldStep::Apply => format!("({left} {})", bufs[&b]),
            };
            bufs.insert(b, v);
        }
        bufs[&Operand::Out].clone()
    }

    /// MPICH's recursive-doubling allreduce (order-preserving form), simulated on strings.
    fn mpich_doubling(n: usize) -> String {
        let mut buf: Vec<String> = (0..n).map(|r| r.to_string()).collect();
        let p2 = 1 << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - p2;
        for r in (1..2 * rem).step_by(2) {
            buf[r] = format!("({} {})", buf[r - 1], buf[r]);
        }
        let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };
        let mut mask = 1;
        while mask < p2 {
            let old = buf.clone();
            for v in 0..p2 {
                let pv = v ^ mask;
                let (mine, theirs) = (&old[real(v)], &old[real(pv)]);
                buf[real(v)] = if pv < v {
                    format!("({theirs} {mine})")
                } else {
                    format!("({mine} {theirs})")
                };
            }
            mask <<= 1;
        }
        buf[real(0)].clone()
    }

    /// MPICH's binomial reduce (relative ranks), simulated on strings.
    fn mpich_binomial(n: usize) -> String {
        let mut acc: Vec<String> = (0..n).map(|r| r.to_string()).collect();
        let mut mask = 1;
        while mask < n {
            for v in (0..n).step_by(2 * mask) {
                if v + mask < n {
                    acc[v] = format!("({} {})", acc[v], acc[v + mask]);
                }
            }
            mask <<= 1;
        }
        acc[0].clone()
    }

    #[test]
    fn fold_groups_as_mpich() {
        assert_eq!(shape(Tree::Doubling, 1), "0");
        assert_eq!(shape(Tree::Doubling, 2), "(0 1)");
        assert_eq!(shape(Tree::Doubling, 3), "((0 1) 2)");
        assert_eq!(shape(Tree::Doubling, 4), "((0 1) (2 3))");
        assert_eq!(shape(Tree::Doubling, 5), "(((0 1) 2) (3 4))");
        assert_eq!(shape(Tree::Binomial, 5), "(((0 1) (2 3)) 4)");
        assert_eq!(Plan::new(Tree::Doubling, 2).scratch, 0);
        assert_eq!(Plan::new(Tree::Doubling, 3).scratch, 1);
        assert_eq!(Plan::new(Tree::Doubling, 4).scratch, 1);
        for n in 1..=64 {
            assert_eq!(shape(Tree::Doubling, n), mpich_doubling(n), "{n} ranks");
            assert_eq!(shape(Tree::Binomial, n), mpich_binomial(n), "{n} ranks");
        }
    }
}
