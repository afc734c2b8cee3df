//! The C types and constants the library uses, with MPICH 4.0's values (`mpi/include/mpi.h` has them all;
//! `tests/mpi_c.rs` checks both against MPICH's header).
use std::ffi::c_int;

pub type MPI_Comm = c_int;
pub type MPI_Datatype = c_int;
pub type MPI_Request = c_int;
pub type MPI_Message = c_int;
pub type MPI_Errhandler = c_int;
pub type MPI_Info = c_int;
pub type MPI_Fint = c_int;
pub type MPI_Aint = isize;
pub type MPI_Count = i64;

/// MPICH's status layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MPI_Status {
    pub count_lo: c_int,
    pub count_hi_and_cancelled: c_int,
    pub MPI_SOURCE: c_int,
    pub MPI_TAG: c_int,
    pub MPI_ERROR: c_int,
}

pub const MPI_COMM_WORLD: MPI_Comm = 0x4400_0000;
pub const MPI_COMM_SELF: MPI_Comm = 0x4400_0001;
pub const MPI_COMM_NULL: MPI_Comm = 0x0400_0000;
pub const MPI_DATATYPE_NULL: MPI_Datatype = 0x0c00_0000;
pub const MPI_REQUEST_NULL: MPI_Request = 0x2c00_0000;
pub const MPI_MESSAGE_NULL: MPI_Message = 0x2c00_0000;
pub const MPI_MESSAGE_NO_PROC: MPI_Message = 0x6c00_0000;
pub const MPI_ERRHANDLER_NULL: MPI_Errhandler = 0x1400_0000;
pub const MPI_ERRORS_ARE_FATAL: MPI_Errhandler = 0x5400_0000;
pub const MPI_ERRORS_RETURN: MPI_Errhandler = 0x5400_0001;
pub const MPI_ERRORS_ABORT: MPI_Errhandler = 0x5400_0003;
pub const MPI_2INT: MPI_Datatype = 0x4c00_0816;

pub const MPI_PROC_NULL: c_int = -1;
pub const MPI_ANY_SOURCE: c_int = -2;
pub const MPI_ANY_TAG: c_int = -1;
pub const MPI_UNDEFINED: c_int = -32766;

pub const MPI_TAG_UB: c_int = 0x6440_0001;
pub const MPI_HOST: c_int = 0x6440_0003;
pub const MPI_IO: c_int = 0x6440_0005;
pub const MPI_WTIME_IS_GLOBAL: c_int = 0x6440_0007;
pub const MPI_UNIVERSE_SIZE: c_int = 0x6440_0009;
pub const MPI_LASTUSEDCODE: c_int = 0x6440_000b;
pub const MPI_APPNUM: c_int = 0x6440_000d;

pub const MPI_THREAD_SINGLE: c_int = 0;
pub const MPI_THREAD_FUNNELED: c_int = 1;
pub const MPI_THREAD_SERIALIZED: c_int = 2;
pub const MPI_THREAD_MULTIPLE: c_int = 3;

pub const MPI_MAX_PROCESSOR_NAME: usize = 128;
pub const MPI_MAX_LIBRARY_VERSION_STRING: usize = 8192;
pub const MPI_MAX_ERROR_STRING: usize = 512;
pub const MPI_BSEND_OVERHEAD: usize = 96;
/// The largest tag (the engine takes any non-negative `i32`).
pub const TAG_UB: c_int = 0x7fff_ffff;

pub const MPI_SUCCESS: c_int = 0;
pub const MPI_ERR_BUFFER: c_int = 1;
pub const MPI_ERR_COUNT: c_int = 2;
pub const MPI_ERR_TYPE: c_int = 3;
pub const MPI_ERR_TAG: c_int = 4;
pub const MPI_ERR_COMM: c_int = 5;
pub const MPI_ERR_RANK: c_int = 6;
pub const MPI_ERR_ROOT: c_int = 7;
pub const MPI_ERR_GROUP: c_int = 8;
pub const MPI_ERR_OP: c_int = 9;
pub const MPI_ERR_TOPOLOGY: c_int = 10;
pub const MPI_ERR_DIMS: c_int = 11;
pub const MPI_ERR_ARG: c_int = 12;
pub const MPI_ERR_UNKNOWN: c_int = 13;
pub const MPI_ERR_TRUNCATE: c_int = 14;
pub const MPI_ERR_OTHER: c_int = 15;
pub const MPI_ERR_INTERN: c_int = 16;
pub const MPI_ERR_IN_STATUS: c_int = 17;
pub const MPI_ERR_PENDING: c_int = 18;
pub const MPI_ERR_REQUEST: c_int = 19;
pub const MPI_ERR_INFO: c_int = 28;
pub const MPI_ERR_INFO_KEY: c_int = 29;
pub const MPI_ERR_INFO_VALUE: c_int = 30;
pub const MPI_ERR_INFO_NOKEY: c_int = 31;
pub const MPI_ERR_NO_MEM: c_int = 34;
pub const MPI_ERR_SESSION: c_int = 75;
pub const MPI_ERR_KEYVAL: c_int = 48;
pub const MPI_ERR_LASTCODE: c_int = 0x3fff_ffff;
pub const MPICH_ERR_LAST_CLASS: c_int = 78;
pub const MPIX_ERR_PROC_FAILED: c_int = 101;
pub const MPIX_ERR_REVOKED: c_int = 103;
pub const MPICH_ERR_LAST_MPIX: c_int = 105;
