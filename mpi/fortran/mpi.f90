! The `mpi` module of vmfabric's Fortran binding: MPICH 4.0's constants, the special variables in MPICH's
! common blocks (MPI_BOTTOM, MPI_IN_PLACE, MPI_STATUS_IGNORE, ...), MPI_WTIME/MPI_WTICK as DOUBLE PRECISION
! functions and the predefined callbacks -- everything of mpif.h -- plus the generic MPI_SIZEOF. Routines are
! called through implicit interfaces, so choice buffers of any type and rank work (mpif90 passes
! -fallow-argument-mismatch, as MPICH's wrapper does). Compiled by mpi/fortran/build.sh into
! target/release/include/{mpi,mpi_sizeofs}.mod with the installed gfortran; only the .mod files are used.

! MPI_SIZEOF's specific procedures. Their bodies are never linked: gfortran names them
! __mpi_sizeofs_MOD_mpi_sizeof_<x>, the symbols libmpichfort.so.12 exports (as MPICH's does), so calls land in
! the library whichever of the two modules a program was compiled with.
module mpi_sizeofs
    implicit none
    private
    public :: MPI_SIZEOF
    interface MPI_SIZEOF
        module procedure mpi_sizeof_ch, mpi_sizeof_chv, mpi_sizeof_cx, mpi_sizeof_cxv, mpi_sizeof_d, &
            mpi_sizeof_dv, mpi_sizeof_i, mpi_sizeof_iv, mpi_sizeof_i1, mpi_sizeof_i1v, mpi_sizeof_i2, &
            mpi_sizeof_i2v, mpi_sizeof_i8, mpi_sizeof_i8v, mpi_sizeof_l, mpi_sizeof_lv, mpi_sizeof_r, mpi_sizeof_rv
    end interface
contains
    subroutine mpi_sizeof_ch(x, size, ierror)
        character(len=*) :: x
        integer :: size, ierror
        size = 1; ierror = 0
    end subroutine
    subroutine mpi_sizeof_chv(x, size, ierror)
        character(len=*) :: x(*)
        integer :: size, ierror
        size = 1; ierror = 0
    end subroutine
    subroutine mpi_sizeof_cx(x, size, ierror)
        complex :: x
        integer :: size, ierror
        size = 8; ierror = 0
    end subroutine
    subroutine mpi_sizeof_cxv(x, size, ierror)
        complex :: x(*)
        integer :: size, ierror
        size = 8; ierror = 0
    end subroutine
    subroutine mpi_sizeof_d(x, size, ierror)
        double precision :: x
        integer :: size, ierror
        size = 8; ierror = 0
    end subroutine
    subroutine mpi_sizeof_dv(x, size, ierror)
        double precision :: x(*)
        integer :: size, ierror
        size = 8; ierror = 0
    end subroutine
    subroutine mpi_sizeof_i(x, size, ierror)
        integer :: x
        integer :: size, ierror
        size = 4; ierror = 0
    end subroutine
    subroutine mpi_sizeof_iv(x, size, ierror)
        integer :: x(*)
        integer :: size, ierror
        size = 4; ierror = 0
    end subroutine
    subroutine mpi_sizeof_i1(x, size, ierror)
        integer(kind=1) :: x
        integer :: size, ierror
        size = 1; ierror = 0
    end subroutine
    subroutine mpi_sizeof_i1v(x, size, ierror)
        integer(kind=1) :: x(*)
        integer :: size, ierror
        size = 1; ierror = 0
    end subroutine
    subroutine mpi_sizeof_i2(x, size, ierror)
        integer(kind=2) :: x
        integer :: size, ierror
        size = 2; ierror = 0
    end subroutine
    subroutine mpi_sizeof_i2v(x, size, ierror)
        integer(kind=2) :: x(*)
        integer :: size, ierror
        size = 2; ierror = 0
    end subroutine
    subroutine mpi_sizeof_i8(x, size, ierror)
        integer(kind=8) :: x
        integer :: size, ierror
        size = 8; ierror = 0
    end subroutine
    subroutine mpi_sizeof_i8v(x, size, ierror)
        integer(kind=8) :: x(*)
        integer :: size, ierror
        size = 8; ierror = 0
    end subroutine
    subroutine mpi_sizeof_l(x, size, ierror)
        logical :: x
        integer :: size, ierror
        size = 4; ierror = 0
    end subroutine
    subroutine mpi_sizeof_lv(x, size, ierror)
        logical :: x(*)
        integer :: size, ierror
        size = 4; ierror = 0
    end subroutine
    subroutine mpi_sizeof_r(x, size, ierror)
        real :: x
        integer :: size, ierror
        size = 4; ierror = 0
    end subroutine
    subroutine mpi_sizeof_rv(x, size, ierror)
        real :: x(*)
        integer :: size, ierror
        size = 4; ierror = 0
    end subroutine
end module mpi_sizeofs

module mpi
    use mpi_sizeofs
    implicit none
    include 'mpif.h'
end module mpi
