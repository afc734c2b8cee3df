//! Reduction operations: the predefined ops on every type the standard allows them on (and MPI_SUM etc.
//! on MPI_CHAR/MPI_BYTE, as MPICH accepts), MINLOC/MAXLOC on the pair types, and user-defined ops
//! (MPI_Op_create/free, commutative or not), plus MPI_Reduce_local and MPI_Op_commutative.
use crate::*;
use std::ffi::{c_int, c_void};

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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(clippy::upper_case_acronyms)] // the pair kinds are named after MPI's types
enum K {
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F32,
    F64,
    C32,
    C64,
    /// Pairs (value, index): FLOAT_INT, DOUBLE_INT, LONG_INT, SHORT_INT, 2INT, 2REAL, 2DOUBLE
    PFI,
    PDI,
    PLI,
    PSI,
    P2I,
    P2F,
    P2D,
    /// long double (x87 extended), its complex, and (long double, int) pairs: see `ldouble.rs`.
    F80,
    C80,
    Pldi,
}

fn kind(dt: MPI_Datatype) -> Option<K> {
    let u = dt as u32;
    if u & 0xffff_fff8 == 0x8c00_0000 {
        return match u & 7 {
            0 => Some(K::PFI),
            1 => Some(K::PDI),
            2 => Some(K::PLI),
            3 => Some(K::PSI),
            4 => Some(K::Pldi),
            _ => None,
        };
    }
    if u & 0xffff_0000 != 0x4c00_0000 {
        return None;
    }
    Some(match u & 0xff {
        0x01 | 0x18 | 0x37 | 0x2d => K::I8,
        0x03 | 0x38 | 0x2f => K::I16,
        0x05 | 0x39 | 0x1b | 0x30 | 0x0e | 0x1d => K::I32,
        0x07 | 0x09 | 0x3a | 0x31 | 0x43 | 0x44 | 0x45 => K::I64,
        0x02 | 0x3b | 0x0d | 0x1a | 0x3f | 0x33 | 0x0f => K::U8,
        0x04 | 0x3c => K::U16,
        0x06 | 0x3d => K::U32,
        0x08 | 0x19 | 0x3e => K::U64,
        0x0a | 0x1c | 0x27 => K::F32,
        0x0b | 0x1f | 0x29 => K::F64,
        0x1e | 0x28 | 0x40 | 0x34 => K::C32,
        0x22 | 0x2a | 0x41 | 0x35 => K::C64,
        0x16 | 0x20 => K::P2I,
        0x21 => K::P2F,
        0x23 => K::P2D,
        0x0c => K::F80,
        0x42 | 0x36 => K::C80,
        _ => return None,
    })
}

fn allowed(op: MPI_Op, k: K) -> bool {
    use K::*;
    let int = matches!(k, I8 | I16 | I32 | I64 | U8 | U16 | U32 | U64);
    let float = matches!(k, F32 | F64 | F80);
    let cplx = matches!(k, C32 | C64 | C80);
    let pair = matches!(k, PFI | PDI | PLI | PSI | P2I | P2F | P2D | Pldi);
    match op {
        MPI_MAX | MPI_MIN => int || float,
        MPI_SUM | MPI_PROD => int || float || cplx,
        // Logical ops on floating types are an MPICH extension (its oplxor test relies on it).
        MPI_LAND | MPI_LOR | MPI_LXOR => int || float,
        MPI_BAND | MPI_BOR | MPI_BXOR => int,
        MPI_MINLOC | MPI_MAXLOC => pair,
        MPI_REPLACE | MPI_NO_OP => true,
        _ => false,
    }
}

/// Apply elementwise `b[i] = f(a[i], b[i])` over `n` elements of type `T`.
#[inline(always)]
unsafe fn zip<T: Copy>(a: *const u8, b: *mut u8, n: usize, f: impl Fn(T, T) -> T) {
    let (a, b) = (a as *const T, b as *mut T);
    let al = std::mem::align_of::<T>();
    if (a as usize) % al == 0 && (b as usize) % al == 0 {
        let a = std::slice::from_raw_parts(a, n);
        let b = std::slice::from_raw_parts_mut(b, n);
        for (x, y) in a.iter().zip(b.iter_mut()) {
            *y = f(*x, *y);
        }
    } else {
        for i in 0..n {
            let x = a.add(i).read_unaligned();
            let y = b.add(i).read_unaligned();
            b.add(i).write_unaligned(f(x, y));
        }
    }
}

macro_rules! int_op {
    ($t:ty, $op:expr, $a:expr, $b:expr, $n:expr) => {
        match $op {
            MPI_SUM => zip::<$t>($a, $b, $n, |x, y| x.wrapping_add(y)),
            MPI_PROD => zip::<$t>($a, $b, $n, |x, y| x.wrapping_mul(y)),
            MPI_MAX => zip::<$t>($a, $b, $n, |x, y| if x > y { x } else { y }),
            MPI_MIN => zip::<$t>($a, $b, $n, |x, y| if x < y { x } else { y }),
            MPI_LAND => zip::<$t>($a, $b, $n, |x, y| ((x != 0) && (y != 0)) as $t),
            MPI_LOR => zip::<$t>($a, $b, $n, |x, y| ((x != 0) || (y != 0)) as $t),
            MPI_LXOR => zip::<$t>($a, $b, $n, |x, y| ((x != 0) != (y != 0)) as $t),
            MPI_BAND => zip::<$t>($a, $b, $n, |x, y| x & y),
            MPI_BOR => zip::<$t>($a, $b, $n, |x, y| x | y),
            MPI_BXOR => zip::<$t>($a, $b, $n, |x, y| x ^ y),
            _ => {}
        }
    };
}

macro_rules! float_op {
    ($t:ty, $op:expr, $a:expr, $b:expr, $n:expr) => {
        match $op {
            MPI_SUM => zip::<$t>($a, $b, $n, |x, y| x + y),
            MPI_PROD => zip::<$t>($a, $b, $n, |x, y| x * y),
            MPI_MAX => zip::<$t>($a, $b, $n, |x, y| if x > y { x } else { y }),
            MPI_MIN => zip::<$t>($a, $b, $n, |x, y| if x < y { x } else { y }),
            // Logical ops on floating values, as MPICH allows: any nonzero value is true.
            MPI_LAND => zip::<$t>($a, $b, $n, |x, y| ((x != 0.0) && (y != 0.0)) as u8 as $t),
            MPI_LOR => zip::<$t>($a, $b, $n, |x, y| ((x != 0.0) || (y != 0.0)) as u8 as $t),
            MPI_LXOR => zip::<$t>($a, $b, $n, |x, y| ((x != 0.0) != (y != 0.0)) as u8 as $t),
            _ => {}
        }
    };
}

macro_rules! cplx_op {
    ($t:ty, $op:expr, $a:expr, $b:expr, $n:expr) => {
        match $op {
            MPI_SUM => zip::<$t>($a, $b, 2 * $n, |x, y| x + y),
            MPI_PROD => zip::<[$t; 2]>($a, $b, $n, |x, y| {
                [x[0] * y[0] - x[1] * y[1], x[0] * y[1] + x[1] * y[0]]
            }),
            _ => {}
        }
    };
}

/// MINLOC/MAXLOC on (value, index) pairs laid out as a C struct of `size` bytes with the index at `ioff`.
unsafe fn loc<V: Copy + PartialOrd, I: Copy + Ord>(
    op: MPI_Op,
    a: *const u8,
    b: *mut u8,
    n: usize,
    size: usize,
    ioff: usize,
) {
    for k in 0..n {
        let pa = a.add(k * size);
        let pb = b.add(k * size);
        let (va, ia) = (
            (pa as *const V).read_unaligned(),
            (pa.add(ioff) as *const I).read_unaligned(),
        );
        let (vb, ib) = (
            (pb as *const V).read_unaligned(),
            (pb.add(ioff) as *const I).read_unaligned(),
        );
        let take_a = if op == MPI_MINLOC {
            va < vb || (va == vb && ia < ib)
        } else {
            va > vb || (va == vb && ia < ib)
        };
        if take_a {
            (pb as *mut V).write_unaligned(va);
            (pb.add(ioff) as *mut I).write_unaligned(ia);
        }
    }
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
    match r.op {
        MPI_REPLACE => {
            std::ptr::copy(a, b, n * r.elem);
            return;
        }
        MPI_NO_OP => return,
        _ => {}
    }
    let op = r.op;
    match kind(r.dt).expect("checked by resolve") {
        K::I8 => int_op!(i8, op, a, b, n),
        K::I16 => int_op!(i16, op, a, b, n),
        K::I32 => int_op!(i32, op, a, b, n),
        K::I64 => int_op!(i64, op, a, b, n),
        K::U8 => int_op!(u8, op, a, b, n),
        K::U16 => int_op!(u16, op, a, b, n),
        K::U32 => int_op!(u32, op, a, b, n),
        K::U64 => int_op!(u64, op, a, b, n),
        K::F32 => float_op!(f32, op, a, b, n),
        K::F64 => float_op!(f64, op, a, b, n),
        K::C32 => cplx_op!(f32, op, a, b, n),
        K::C64 => cplx_op!(f64, op, a, b, n),
        // Pairs as in memory (`elem` is the extent) or packed (`elem` is the size: no padding).
        K::PFI => loc::<f32, i32>(op, a, b, n, 8, 4),
        K::PDI => loc::<f64, i32>(op, a, b, n, r.elem, 8),
        K::PLI => loc::<i64, i32>(op, a, b, n, r.elem, 8),
        K::PSI => loc::<i16, i32>(op, a, b, n, r.elem, r.elem - 4),
        K::P2I => loc::<i32, i32>(op, a, b, n, 8, 4),
        K::P2F => locf::<f32>(op, a, b, n),
        K::P2D => locf::<f64>(op, a, b, n),
        K::F80 | K::C80 | K::Pldi => {
            use crate::ldouble::{self as ld, LOp};
            let o = match op {
                MPI_SUM => LOp::Sum,
                MPI_PROD => LOp::Prod,
                MPI_MAX => LOp::Max,
                MPI_MIN => LOp::Min,
                MPI_MINLOC => LOp::MinLoc,
                MPI_MAXLOC => LOp::MaxLoc,
                MPI_LAND => LOp::Land,
                MPI_LOR => LOp::Lor,
                _ => LOp::Lxor,
            };
            match kind(r.dt) {
                Some(K::F80) => ld::real(o, a, b, n),
                Some(K::C80) => ld::complex(o, a, b, n),
                _ => ld::loc(o, a, b, n, r.elem),
            }
        }
    }
}

/// MINLOC/MAXLOC on Fortran pairs of one float type (the index is a float too).
unsafe fn locf<V: Copy + PartialOrd>(op: MPI_Op, a: *const u8, b: *mut u8, n: usize) {
    let s = std::mem::size_of::<V>();
    for k in 0..n {
        let pa = a.add(2 * k * s) as *const V;
        let pb = b.add(2 * k * s) as *mut V;
        let (va, ia, vb, ib) = (
            pa.read_unaligned(),
            pa.add(1).read_unaligned(),
            pb.read_unaligned(),
            pb.add(1).read_unaligned(),
        );
        let take_a = if op == MPI_MINLOC {
            va < vb || (va == vb && ia < ib)
        } else {
            va > vb || (va == vb && ia < ib)
        };
        if take_a {
            pb.write_unaligned(va);
            pb.add(1).write_unaligned(ia);
        }
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
