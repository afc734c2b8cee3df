! f90_dtype.f90 -- derived datatypes from Fortran: a matrix row (strided in column-major order) as
! MPI_Type_vector, and a struct of two separate variables described by absolute addresses
! (MPI_Get_address, MPI_Type_create_struct) sent from and received into MPI_BOTTOM -- the binding must map
! the address of the MPI_BOTTOM common-block variable to C's MPI_BOTTOM.
! needs: MPI_Type_vector MPI_Type_commit MPI_Type_free MPI_Get_address MPI_Type_create_struct MPI_Allreduce
program fdtype
    use mpi
    implicit none
    integer, parameter :: nr = 7, nc = 5
    integer :: ierr, rank, nproc, nerr, allerr, next, prev, rowt, st(MPI_STATUS_SIZE), i, j, tsize, cnt
    double precision :: a(nr, nc), row(nc)
    integer :: xs, xr, stype, rtype, blens(2), types(2)
    double precision :: ys(3), yr(3)
    integer(kind=MPI_ADDRESS_KIND) :: disp(2)
    nerr = 0
    call MPI_Init(ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)
    next = mod(rank + 1, nproc)
    prev = mod(rank - 1 + nproc, nproc)
    do j = 1, nc
        do i = 1, nr
            a(i, j) = rank * 100d0 + i * 10d0 + j
        end do
    end do
    call MPI_Type_vector(nc, 1, nr, MPI_DOUBLE_PRECISION, rowt, ierr)
    call MPI_Type_commit(rowt, ierr)
    call MPI_Type_size(rowt, tsize, ierr)
    call chk(tsize == 8 * nc, 'vector type size')
    ! send row 3 as one strided element, receive it contiguous
    call MPI_Sendrecv(a(3, 1), 1, rowt, next, 1, row, nc, MPI_DOUBLE_PRECISION, prev, 1, MPI_COMM_WORLD, st, ierr)
    call chk(all(row == (/ (prev * 100d0 + 30d0 + j, j = 1, nc) /)), 'row via vector type')
    call MPI_Get_count(st, MPI_DOUBLE_PRECISION, cnt, ierr)
    call chk(cnt == nc, 'count of received row')
    call MPI_Type_free(rowt, ierr)
    call chk(rowt == MPI_DATATYPE_NULL, 'type_free')

    xs = 1000 + rank
    ys = (/ 1d0, 2d0, 3d0 /) * (rank + 1)
    xr = -1
    yr = -1d0
    blens = (/ 1, 3 /)
    types = (/ MPI_INTEGER, MPI_DOUBLE_PRECISION /)
    call MPI_Get_address(xs, disp(1), ierr)
    call MPI_Get_address(ys, disp(2), ierr)
    call MPI_Type_create_struct(2, blens, disp, types, stype, ierr)
    call MPI_Type_commit(stype, ierr)
    call MPI_Get_address(xr, disp(1), ierr)
    call MPI_Get_address(yr, disp(2), ierr)
    call MPI_Type_create_struct(2, blens, disp, types, rtype, ierr)
    call MPI_Type_commit(rtype, ierr)
    call MPI_Sendrecv(MPI_BOTTOM, 1, stype, next, 2, MPI_BOTTOM, 1, rtype, prev, 2, MPI_COMM_WORLD, st, ierr)
    call chk(ierr == MPI_SUCCESS, 'sendrecv from/to MPI_BOTTOM')
    call chk(xr == 1000 + prev .and. all(yr == (/ 1d0, 2d0, 3d0 /) * (prev + 1)), 'MPI_BOTTOM struct payload')
    call MPI_Type_free(stype, ierr)
    call MPI_Type_free(rtype, ierr)

    call MPI_Allreduce(nerr, allerr, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (rank == 0) then
        if (allerr == 0) then
            write (*, '(a,i0,a)') 'f90_dtype: PASS (', nproc, ' ranks)'
        else
            write (*, *) 'f90_dtype: FAIL', allerr, 'errors'
        end if
    end if
    call MPI_Finalize(ierr)
contains
    subroutine chk(ok, what)
        logical, intent(in) :: ok
        character(len=*), intent(in) :: what
        if (.not. ok) then
            nerr = nerr + 1
            print *, 'rank', rank, 'FAILED: ', what
        end if
    end subroutine
end program
