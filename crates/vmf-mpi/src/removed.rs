//! MPI-1 functions removed in MPI-3.0. MPICH 4's header no longer declares them but its library still
//! exports them, so binaries built against older MPICH releases keep working; these do the same, each
//! mapped onto its MPI-2 replacement.
use crate::*;
use std::ffi::{c_int, c_void};

mpi_api! {
    fn MPI_Address / PMPI_Address(location: *const c_void, address: *mut MPI_Aint) -> c_int {
        crate::datatype::PMPI_Get_address(location, address)
    }
    fn MPI_Type_extent / PMPI_Type_extent(datatype: MPI_Datatype, extent: *mut MPI_Aint) -> c_int {
        let mut lb: MPI_Aint = 0;
        crate::datatype::PMPI_Type_get_extent(datatype, &mut lb, extent)
    }
    fn MPI_Type_lb / PMPI_Type_lb(datatype: MPI_Datatype, displacement: *mut MPI_Aint) -> c_int {
        let mut ext: MPI_Aint = 0;
        crate::datatype::PMPI_Type_get_extent(datatype, displacement, &mut ext)
    }
    fn MPI_Type_ub / PMPI_Type_ub(datatype: MPI_Datatype, displacement: *mut MPI_Aint) -> c_int {
        let (mut lb, mut ext): (MPI_Aint, MPI_Aint) = (0, 0);
        let rc = crate::datatype::PMPI_Type_get_extent(datatype, &mut lb, &mut ext);
        if rc == MPI_SUCCESS {
            if displacement.is_null() {
                return raise(MPI_COMM_WORLD, "MPI_Type_ub", MpiErr { code: MPI_ERR_ARG, msg: "displacement is NULL".into() });
            }
            *displacement = lb + ext;
        }
        rc
    }
    fn MPI_Type_hvector / PMPI_Type_hvector(count: c_int, blocklength: c_int, stride: MPI_Aint, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        crate::datatype::PMPI_Type_create_hvector(count, blocklength, stride, oldtype, newtype)
    }
    fn MPI_Type_hindexed / PMPI_Type_hindexed(count: c_int, array_of_blocklengths: *const c_int, array_of_displacements: *const MPI_Aint, oldtype: MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        crate::datatype::PMPI_Type_create_hindexed(count, array_of_blocklengths, array_of_displacements, oldtype, newtype)
    }
    fn MPI_Type_struct / PMPI_Type_struct(count: c_int, array_of_blocklengths: *const c_int, array_of_displacements: *const MPI_Aint, array_of_types: *const MPI_Datatype, newtype: *mut MPI_Datatype) -> c_int {
        crate::datatype::PMPI_Type_create_struct(count, array_of_blocklengths, array_of_displacements, array_of_types, newtype)
    }
    fn MPI_Errhandler_create / PMPI_Errhandler_create(function: Option<CommErrFn>, errhandler: *mut MPI_Errhandler) -> c_int {
        crate::env::PMPI_Comm_create_errhandler(function, errhandler)
    }
    fn MPI_Errhandler_set / PMPI_Errhandler_set(comm: MPI_Comm, errhandler: MPI_Errhandler) -> c_int {
        crate::env::PMPI_Comm_set_errhandler(comm, errhandler)
    }
    fn MPI_Errhandler_get / PMPI_Errhandler_get(comm: MPI_Comm, errhandler: *mut MPI_Errhandler) -> c_int {
        crate::env::PMPI_Comm_get_errhandler(comm, errhandler)
    }
}
