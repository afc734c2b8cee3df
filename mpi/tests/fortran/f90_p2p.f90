! f90_p2p.f90 -- free-form Fortran 90 with `use mpi`: Init_thread, type sizes of the Fortran datatypes,
! Sendrecv of array sections, Sendrecv_replace, persistent requests with status arrays, Ssend with
! Testsome/Waitsome (1-based indices), matched probe, Bsend with Buffer_attach/detach, Cancel, user error
! classes/codes/strings (input strings with hidden lengths), a Fortran error handler procedure, the library
! version string, MPI_SIZEOF. Every check counts errors; rank 0 prints PASS when no rank found any.
module checks
    implicit none
    integer :: nerr = 0, myrank = -1, handler_calls = 0, handler_code = 0
contains
    subroutine check(ok, what)
        logical, intent(in) :: ok
        character(len=*), intent(in) :: what
        if (.not. ok) then
            nerr = nerr + 1
            if (nerr < 20) print *, 'rank', myrank, 'FAILED: ', what
        end if
    end subroutine
end module checks

subroutine my_handler(comm, code)
    use checks
    implicit none
    integer :: comm, code
    handler_calls = handler_calls + 1
    handler_code = code
end subroutine

program f90p2p
    use mpi
    use checks
    implicit none
    integer, parameter :: nmax = 20000, ncol = 3
    integer :: ierr, ierr2, provided, nproc, next, prev, i, j, k, n, cnt, flag_i
    integer :: st(MPI_STATUS_SIZE), sts(MPI_STATUS_SIZE, 4), reqs(4), idx(4), outcount, done
    integer :: sizes(6) = (/ 0, 1, 5, 333, 5000, 20000 /)
    double precision, allocatable :: a(:, :), b(:, :)
    complex, allocatable :: c(:)
    integer, allocatable :: ib(:), ir(:)
    logical :: flag
    integer :: tsize, msg, bsize, req, newclass, newcode, eclass, handler, total
    character(len=MPI_MAX_ERROR_STRING) :: estr
    character(len=MPI_MAX_LIBRARY_VERSION_STRING) :: ver
    integer :: elen, vlen
    character, allocatable :: bbuf(:)
    external my_handler

    call MPI_Init_thread(MPI_THREAD_FUNNELED, provided, ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, myrank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)
    call check(ierr == MPI_SUCCESS .and. provided == MPI_THREAD_FUNNELED, 'init_thread provided')
    call MPI_Query_thread(provided, ierr)
    call check(provided == MPI_THREAD_FUNNELED, 'query_thread')
    call MPI_Is_thread_main(flag, ierr)
    call check(flag, 'is_thread_main')
    next = mod(myrank + 1, nproc)
    prev = mod(myrank - 1 + nproc, nproc)

    ! ---- sizes of the Fortran datatypes
    call MPI_Type_size(MPI_INTEGER, tsize, ierr);          call check(tsize == 4, 'size INTEGER')
    call MPI_Type_size(MPI_REAL, tsize, ierr);             call check(tsize == 4, 'size REAL')
    call MPI_Type_size(MPI_DOUBLE_PRECISION, tsize, ierr); call check(tsize == 8, 'size DOUBLE PRECISION')
    call MPI_Type_size(MPI_COMPLEX, tsize, ierr);          call check(tsize == 8, 'size COMPLEX')
    call MPI_Type_size(MPI_DOUBLE_COMPLEX, tsize, ierr);   call check(tsize == 16, 'size DOUBLE COMPLEX')
    call MPI_Type_size(MPI_LOGICAL, tsize, ierr);          call check(tsize == 4, 'size LOGICAL')
    call MPI_Type_size(MPI_CHARACTER, tsize, ierr);        call check(tsize == 1, 'size CHARACTER')

    allocate(a(nmax, ncol), b(nmax, ncol), c(nmax), ib(nmax), ir(nmax))
    ! ---- MPI_SIZEOF (generic of the module: scalars and vectors)
    call MPI_Sizeof(a(1, 1), tsize, ierr);   call check(tsize == 8 .and. ierr == MPI_SUCCESS, 'MPI_SIZEOF double')
    call MPI_Sizeof(ib, tsize, ierr);        call check(tsize == 4, 'MPI_SIZEOF integer vector')
    call MPI_Sizeof(c(1), tsize, ierr);      call check(tsize == 8, 'MPI_SIZEOF complex')
    call MPI_Sizeof(flag, tsize, ierr);      call check(tsize == 4, 'MPI_SIZEOF logical')
    do k = 1, size(sizes)
        n = sizes(k)
        ! ---- Sendrecv of columns (contiguous sections) around the ring
        do j = 1, ncol
            do i = 1, n
                a(i, j) = myrank * 1.0d6 + j * 1.0d4 + i
            end do
        end do
        b = -1d0
        do j = 1, ncol
            call MPI_Sendrecv(a(1, j), n, MPI_DOUBLE_PRECISION, next, j, &
                              b(1, ncol + 1 - j), n, MPI_DOUBLE_PRECISION, prev, j, MPI_COMM_WORLD, st, ierr)
            call check(ierr == MPI_SUCCESS .and. st(MPI_SOURCE) == prev .and. st(MPI_TAG) == j, 'sendrecv status')
            call MPI_Get_count(st, MPI_DOUBLE_PRECISION, cnt, ierr)
            call check(cnt == n, 'sendrecv count')
        end do
        do j = 1, ncol
            do i = 1, n
                if (b(i, ncol + 1 - j) /= prev * 1.0d6 + j * 1.0d4 + i) then
                    call check(.false., 'sendrecv payload')
                    exit
                end if
            end do
        end do
        ! ---- Sendrecv_replace of COMPLEX
        do i = 1, n
            c(i) = cmplx(real(myrank), real(i))
        end do
        call MPI_Sendrecv_replace(c, n, MPI_COMPLEX, next, 77, prev, 77, MPI_COMM_WORLD, st, ierr)
        call check(ierr == MPI_SUCCESS .and. st(MPI_SOURCE) == prev, 'sendrecv_replace status')
        do i = 1, n
            if (c(i) /= cmplx(real(prev), real(i))) then
                call check(.false., 'sendrecv_replace payload')
                exit
            end if
        end do
        ! ---- Ssend + Irecv, completed with Testsome / Waitsome
        do i = 1, n
            ib(i) = myrank + 3 * i
        end do
        ir = -1
        call MPI_Irecv(ir, n, MPI_INTEGER, prev, 5, MPI_COMM_WORLD, reqs(1), ierr)
        call MPI_Irecv(flag_i, 1, MPI_INTEGER, MPI_ANY_SOURCE, 12345, MPI_COMM_WORLD, reqs(2), ierr)
        call MPI_Issend(ib, n, MPI_INTEGER, next, 5, MPI_COMM_WORLD, reqs(3), ierr)
        done = 0
        do while (done < 2)
            call MPI_Testsome(3, reqs, outcount, idx, sts, ierr)
            call check(ierr == MPI_SUCCESS, 'testsome ierror')
            do i = 1, outcount
                call check(idx(i) == 1 .or. idx(i) == 3, 'testsome index 1-based')
                if (idx(i) == 1) call check(sts(MPI_SOURCE, i) == prev .and. sts(MPI_TAG, i) == 5, 'testsome status')
            end do
            if (outcount /= MPI_UNDEFINED) done = done + outcount
        end do
        call check(reqs(1) == MPI_REQUEST_NULL .and. reqs(3) == MPI_REQUEST_NULL, 'testsome frees')
        call MPI_Send(next, 1, MPI_INTEGER, myrank, 12345, MPI_COMM_WORLD, ierr)
        call MPI_Waitsome(3, reqs, outcount, idx, MPI_STATUSES_IGNORE, ierr)
        call check(outcount == 1 .and. idx(1) == 2 .and. flag_i == next, 'waitsome')
        call MPI_Waitsome(3, reqs, outcount, idx, sts, ierr)
        call check(outcount == MPI_UNDEFINED, 'waitsome all inactive')
        call check(all(ir(1:n) == (/ (prev + 3 * i, i = 1, n) /)), 'ssend payload')
    end do

    ! ---- persistent requests, three rounds, status array
    call MPI_Recv_init(ir, 4, MPI_INTEGER, prev, 9, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Send_init(ib, 4, MPI_INTEGER, next, 9, MPI_COMM_WORLD, reqs(2), ierr)
    do k = 1, 3
        ib(1:4) = (/ myrank, k, 2 * k, 3 * k /)
        call MPI_Startall(2, reqs, ierr)
        call MPI_Waitall(2, reqs, sts, ierr)
        call check(ierr == MPI_SUCCESS .and. sts(MPI_SOURCE, 1) == prev .and. sts(MPI_TAG, 1) == 9, 'persistent status')
        call check(all(ir(1:4) == (/ prev, k, 2 * k, 3 * k /)), 'persistent payload')
        call check(reqs(1) /= MPI_REQUEST_NULL, 'persistent request stays')
    end do
    call MPI_Request_free(reqs(1), ierr)
    call MPI_Request_free(reqs(2), ierr)
    call check(reqs(1) == MPI_REQUEST_NULL, 'request_free')

    ! ---- matched probe
    ib(1:3) = (/ 11, 22, myrank /)
    call MPI_Isend(ib, 3, MPI_INTEGER, next, 31, MPI_COMM_WORLD, req, ierr)
    call MPI_Mprobe(prev, 31, MPI_COMM_WORLD, msg, st, ierr)
    call MPI_Get_count(st, MPI_INTEGER, cnt, ierr)
    call check(cnt == 3 .and. msg /= MPI_MESSAGE_NULL, 'mprobe')
    call MPI_Mrecv(ir, cnt, MPI_INTEGER, msg, st, ierr)
    call check(all(ir(1:3) == (/ 11, 22, prev /)) .and. msg == MPI_MESSAGE_NULL, 'mrecv')
    call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)

    ! ---- Bsend through an attached buffer
    bsize = 4 * 100 + 2 * MPI_BSEND_OVERHEAD
    allocate(bbuf(bsize))
    call MPI_Buffer_attach(bbuf, bsize, ierr)
    ib(1:100) = (/ (myrank + i, i = 1, 100) /)
    call MPI_Bsend(ib, 100, MPI_INTEGER, next, 41, MPI_COMM_WORLD, ierr)
    call check(ierr == MPI_SUCCESS, 'bsend')
    call MPI_Recv(ir, 100, MPI_INTEGER, prev, 41, MPI_COMM_WORLD, st, ierr)
    call check(all(ir(1:100) == (/ (prev + i, i = 1, 100) /)), 'bsend payload')
    call MPI_Get_elements(st, MPI_INTEGER, cnt, ierr)
    call check(cnt == 100, 'get_elements')
    call MPI_Buffer_detach(bbuf, bsize, ierr)
    call check(ierr == MPI_SUCCESS .and. bsize == 4 * 100 + 2 * MPI_BSEND_OVERHEAD, 'buffer_detach size')

    ! ---- cancel an unmatched receive; request_get_status
    call MPI_Irecv(ir, 1, MPI_INTEGER, MPI_ANY_SOURCE, 4242, MPI_COMM_WORLD, req, ierr)
    call MPI_Request_get_status(req, flag, st, ierr)
    call check(.not. flag, 'request_get_status pending')
    call MPI_Cancel(req, ierr)
    call MPI_Wait(req, st, ierr)
    call MPI_Test_cancelled(st, flag, ierr)
    call check(flag, 'test_cancelled')

    ! ---- user error classes, codes and strings; a Fortran error handler procedure
    call MPI_Add_error_class(newclass, ierr)
    call MPI_Add_error_code(newclass, newcode, ierr)
    call MPI_Add_error_string(newcode, 'vmfabric fortran error   ', ierr)
    call check(ierr == MPI_SUCCESS, 'add_error_string')
    call MPI_Error_string(newcode, estr, elen, ierr)
    call check(estr == 'vmfabric fortran error' .and. elen == 22, 'error string trimmed and padded')
    call MPI_Error_class(newcode, eclass, ierr)
    call check(eclass == newclass, 'error_class of user code')
    call MPI_Comm_create_errhandler(my_handler, handler, ierr)
    call MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler, ierr)
    call MPI_Comm_call_errhandler(MPI_COMM_WORLD, newcode, ierr)
    call check(handler_calls == 1 .and. handler_code == newcode, 'fortran handler via call_errhandler')
    call MPI_Send(ib, 1, MPI_INTEGER, MPI_ANY_SOURCE, 0, MPI_COMM_WORLD, ierr)
    call MPI_Error_class(ierr, eclass, ierr2)
    call check(handler_calls == 2 .and. eclass == MPI_ERR_RANK, 'fortran handler on error')
    call MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL, ierr)
    call MPI_Errhandler_free(handler, ierr)
    call check(handler == MPI_ERRHANDLER_NULL, 'errhandler_free')

    ! ---- library version (output string, hidden length)
    ver = '#'
    call MPI_Get_library_version(ver, vlen, ierr)
    call check(ierr == MPI_SUCCESS .and. vlen > 0 .and. vlen < MPI_MAX_LIBRARY_VERSION_STRING, 'library version')
    call check(ver(vlen + 1:) == ' ' .and. ver(1:1) /= '#', 'library version padded')
    if (myrank == 0) write (*, '(2a)') 'library: ', ver(1:min(vlen, 60))

    ! ---- verdict
    call MPI_Barrier(MPI_COMM_WORLD, ierr)
    if (myrank == 0) then
        total = nerr
        do i = 1, nproc - 1
            call MPI_Recv(k, 1, MPI_INTEGER, i, 999, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
            total = total + k
        end do
        if (total == 0) then
            write (*, '(a,i0,a)') 'f90_p2p: PASS (', nproc, ' ranks)'
        else
            write (*, *) 'f90_p2p: FAIL', total, 'errors'
        end if
    else
        call MPI_Send(nerr, 1, MPI_INTEGER, 0, 999, MPI_COMM_WORLD, ierr)
    end if
    call MPI_Finalize(ierr)
end program
