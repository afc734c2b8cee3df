! f90_datarep.f90 -- a data representation registered from Fortran (MPI_REGISTER_DATAREP with Fortran
! conversion and extent subroutines, called by reference): every rank writes ten INTEGERs through a view in
! representation 'vmfplus' (the file holds value + EXTRA_STATE), reads them back through it, and reads the
! raw file through 'native'; a representation registered with MPI_CONVERSION_FN_NULL behaves as native; a
! second registration of a name fails with MPI_ERR_DUP_DATAREP. Written with mpif.h (whose EXTERNAL
! MPI_CONVERSION_FN_NULL both MPICH's and ours declare; MPICH's mpi module does not).
! needs: MPI_Register_datarep MPI_File_open MPI_File_set_view MPI_File_write_at_all MPI_File_read_at_all MPI_File_close MPI_File_delete
module dreps
    implicit none
    include 'mpif.h'
    integer :: wcalls = 0, rcalls = 0, ecalls = 0, badtype = 0
contains
    subroutine wconv(userbuf, datatype, count, filebuf, position, extra_state, ierror)
        integer :: datatype, count, ierror, i
        integer :: userbuf(*), filebuf(*)
        integer(kind=MPI_OFFSET_KIND) :: position
        integer(kind=MPI_ADDRESS_KIND) :: extra_state
        if (datatype /= MPI_INTEGER) badtype = badtype + 1
        do i = 1, count
            filebuf(i) = userbuf(position + i) + int(extra_state)
        end do
        wcalls = wcalls + 1
        ierror = MPI_SUCCESS
    end subroutine
    subroutine rconv(userbuf, datatype, count, filebuf, position, extra_state, ierror)
        integer :: datatype, count, ierror, i
        integer :: userbuf(*), filebuf(*)
        integer(kind=MPI_OFFSET_KIND) :: position
        integer(kind=MPI_ADDRESS_KIND) :: extra_state
        if (datatype /= MPI_INTEGER) badtype = badtype + 1
        do i = 1, count
            userbuf(position + i) = filebuf(i) - int(extra_state)
        end do
        rcalls = rcalls + 1
        ierror = MPI_SUCCESS
    end subroutine
    subroutine extent(datatype, file_extent, extra_state, ierror)
        integer :: datatype, ierror
        integer(kind=MPI_ADDRESS_KIND) :: file_extent, extra_state
        file_extent = 4
        ecalls = ecalls + 1
        ierror = MPI_SUCCESS
    end subroutine
end module dreps

program fdatarep
    use dreps
    implicit none
    integer :: ierr, rank, nproc, nerr, allerr, fh, i, stamp
    integer :: a(10), b(10), c(10)
    integer(kind=MPI_ADDRESS_KIND) :: extra
    integer(kind=MPI_OFFSET_KIND) :: disp, off
    character(len=64) :: fname
    nerr = 0
    call MPI_Init(ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)
    ! A file name of this run (rank 0's clock, shared).
    stamp = int(mod(MPI_Wtime() * 1000.0d0, 1.0d9))
    call MPI_Bcast(stamp, 1, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
    write (fname, '(a,i0)') '/tmp/vmf-f90-datarep-', stamp
    extra = 1000
    call MPI_Register_datarep('vmfplus', rconv, wconv, extent, extra, ierr)
    call chk(ierr == MPI_SUCCESS, 'register_datarep')
    call MPI_Register_datarep('vmfplus', rconv, wconv, extent, extra, ierr)
    call chk(ierr /= MPI_SUCCESS, 'a second registration of a name fails')
    call MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN, ierr)
    call MPI_Register_datarep('vmfnull', MPI_CONVERSION_FN_NULL, MPI_CONVERSION_FN_NULL, extent, extra, ierr)
    call chk(ierr == MPI_SUCCESS, 'register_datarep with MPI_CONVERSION_FN_NULL')
    do i = 1, 10
        a(i) = rank * 100 + i
    end do
    call MPI_File_open(MPI_COMM_WORLD, fname, MPI_MODE_CREATE + MPI_MODE_RDWR, MPI_INFO_NULL, fh, ierr)
    call chk(ierr == MPI_SUCCESS, 'file_open')
    disp = 0
    off = rank * 10
    call MPI_File_set_view(fh, disp, MPI_INTEGER, MPI_INTEGER, 'vmfplus', MPI_INFO_NULL, ierr)
    call chk(ierr == MPI_SUCCESS, 'set_view vmfplus')
    call MPI_File_write_at_all(fh, off, a, 10, MPI_INTEGER, MPI_STATUS_IGNORE, ierr)
    call chk(ierr == MPI_SUCCESS, 'write through vmfplus')
    b = -1
    call MPI_File_read_at_all(fh, off, b, 10, MPI_INTEGER, MPI_STATUS_IGNORE, ierr)
    call chk(all(b == a), 'read back through vmfplus')
    call chk(wcalls > 0 .and. rcalls > 0, 'the Fortran conversions were called')
    call chk(badtype == 0, 'the conversions receive the datatype handle')
    call MPI_File_set_view(fh, disp, MPI_INTEGER, MPI_INTEGER, 'native', MPI_INFO_NULL, ierr)
    c = -1
    call MPI_File_read_at_all(fh, off, c, 10, MPI_INTEGER, MPI_STATUS_IGNORE, ierr)
    call chk(all(c == a + 1000), 'the file holds what the write conversion made')
    call MPI_File_set_view(fh, disp, MPI_INTEGER, MPI_INTEGER, 'vmfnull', MPI_INFO_NULL, ierr)
    call chk(ierr == MPI_SUCCESS, 'set_view vmfnull')
    c = -1
    call MPI_File_read_at_all(fh, off, c, 10, MPI_INTEGER, MPI_STATUS_IGNORE, ierr)
    call chk(all(c == a + 1000), 'MPI_CONVERSION_FN_NULL reads the bytes as they are')
    call MPI_File_close(fh, ierr)
    call MPI_Barrier(MPI_COMM_WORLD, ierr)
    if (rank == 0) call MPI_File_delete(fname, MPI_INFO_NULL, ierr)
    call MPI_Allreduce(nerr, allerr, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (rank == 0) then
        if (allerr == 0) then
            write (*, '(a,i0,a)') 'f90_datarep: PASS (', nproc, ' ranks)'
        else
            write (*, *) 'f90_datarep: FAIL', allerr, 'errors'
        end if
    end if
    call MPI_Finalize(ierr)
contains
    subroutine chk(ok, what)
        logical :: ok
        character(len=*) :: what
        if (.not. ok) then
            write (*, '(a,i0,2a)') 'rank ', rank, ': FAILED ', what
            nerr = nerr + 1
        end if
    end subroutine
end program
