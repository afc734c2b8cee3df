! f90_comm.f90 -- communicators and the all-to-all family as NPB uses them (BT/SP/LU split and dup the
! world, FT/IS exchange with Alltoall/Alltoallv): Comm_split (keys reorder ranks, MPI_UNDEFINED gives
! MPI_COMM_NULL), Comm_dup, Comm_free, Alltoall, Alltoallv, Allgather, Gather, Scatter, Allreduce on
! subcommunicators, and MPICH's fault-tolerance calls (MPIX_Comm_revoke/agree/shrink). Every result is
! checked exactly; rank 0 prints PASS when no rank failed.
! needs: MPI_Comm_split MPI_Comm_dup MPI_Comm_free MPI_Alltoall MPI_Alltoallv MPI_Allgather MPI_Gather MPI_Scatter MPI_Allreduce MPIX_Comm_revoke MPIX_Comm_agree MPIX_Comm_shrink
program fcomm
    use mpi
    implicit none
    integer :: ierr, rank, nproc, nerr, allerr, i, j, k
    integer :: sub, dup, none, srank, ssize, expect, total, ftc, ftn, flag
    double precision, allocatable :: sd(:), rd(:)
    integer, allocatable :: si(:), ri(:), scount(:), sdispl(:), rcount(:), rdispl(:), g(:)
    real, allocatable :: gr(:)
    complex :: cs(4), cr(4)
    complex, allocatable :: call_(:)
    real :: myr
    nerr = 0
    call MPI_Init(ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)

    ! ---- split by parity, reversed order inside each half
    call MPI_Comm_split(MPI_COMM_WORLD, mod(rank, 2), -rank, sub, ierr)
    call MPI_Comm_rank(sub, srank, ierr)
    call MPI_Comm_size(sub, ssize, ierr)
    expect = 0
    total = 0
    do i = 0, nproc - 1
        if (mod(i, 2) == mod(rank, 2)) then
            total = total + 1
            if (i > rank) expect = expect + 1
        end if
    end do
    call chk(ssize == total .and. srank == expect, 'split size/rank')
    call MPI_Comm_dup(sub, dup, ierr)
    call MPI_Allreduce(rank, k, 1, MPI_INTEGER, MPI_SUM, dup, ierr)
    expect = 0
    do i = mod(rank, 2), nproc - 1, 2
        expect = expect + i
    end do
    call chk(k == expect, 'allreduce on dup of split')
    call MPI_Comm_free(dup, ierr)
    call chk(dup == MPI_COMM_NULL, 'comm_free nulls the handle')
    call MPI_Comm_free(sub, ierr)
    j = 1
    if (rank == 0) j = MPI_UNDEFINED
    call MPI_Comm_split(MPI_COMM_WORLD, j, 0, none, ierr)
    if (rank == 0) then
        call chk(none == MPI_COMM_NULL, 'split MPI_UNDEFINED')
    else
        call MPI_Comm_size(none, ssize, ierr)
        call chk(ssize == nproc - 1, 'split size without rank 0')
        call MPI_Comm_free(none, ierr)
    end if

    ! ---- Alltoall: 3 doubles to every rank
    allocate(sd(3 * nproc), rd(3 * nproc))
    do j = 0, nproc - 1
        do k = 1, 3
            sd(3 * j + k) = rank * 1000d0 + j * 10d0 + k
        end do
    end do
    rd = -1d0
    call MPI_Alltoall(sd, 3, MPI_DOUBLE_PRECISION, rd, 3, MPI_DOUBLE_PRECISION, MPI_COMM_WORLD, ierr)
    do i = 0, nproc - 1
        do k = 1, 3
            if (rd(3 * i + k) /= i * 1000d0 + rank * 10d0 + k) then
                call chk(.false., 'alltoall')
                exit
            end if
        end do
    end do

    ! ---- Alltoallv: rank r sends j+1 integers to rank j, receives r+1 from each
    allocate(scount(nproc), sdispl(nproc), rcount(nproc), rdispl(nproc))
    k = 0
    do j = 0, nproc - 1
        scount(j + 1) = j + 1
        sdispl(j + 1) = k
        k = k + j + 1
    end do
    allocate(si(k))
    do j = 0, nproc - 1
        do i = 1, j + 1
            si(sdispl(j + 1) + i) = rank * 100 + j * 10 + i
        end do
    end do
    do i = 0, nproc - 1
        rcount(i + 1) = rank + 1
        rdispl(i + 1) = i * (rank + 1)
    end do
    allocate(ri(nproc * (rank + 1)))
    ri = -1
    call MPI_Alltoallv(si, scount, sdispl, MPI_INTEGER, ri, rcount, rdispl, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    do i = 0, nproc - 1
        do k = 1, rank + 1
            if (ri(rdispl(i + 1) + k) /= i * 100 + rank * 10 + k) then
                call chk(.false., 'alltoallv')
                exit
            end if
        end do
    end do

    ! ---- Allgather of pairs, Gather of REAL to the last rank, Scatter of COMPLEX from rank 0
    allocate(g(2 * nproc), gr(nproc), call_(4 * nproc))
    call MPI_Allgather((/ rank, -rank /), 2, MPI_INTEGER, g, 2, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call chk(all(g(1::2) == (/ (i, i = 0, nproc - 1) /)) .and. all(g(2::2) == (/ (-i, i = 0, nproc - 1) /)), 'allgather')
    myr = rank * 0.5
    gr = -1.0
    call MPI_Gather(myr, 1, MPI_REAL, gr, 1, MPI_REAL, nproc - 1, MPI_COMM_WORLD, ierr)
    if (rank == nproc - 1) call chk(all(gr == (/ (i * 0.5, i = 0, nproc - 1) /)), 'gather')
    if (rank == 0) then
        do i = 1, 4 * nproc
            call_(i) = cmplx(real(i), real(-i))
        end do
    end if
    cr = (0.0, 0.0)
    call MPI_Scatter(call_, 4, MPI_COMPLEX, cr, 4, MPI_COMPLEX, 0, MPI_COMM_WORLD, ierr)
    do k = 1, 4
        cs(k) = cmplx(real(4 * rank + k), real(-(4 * rank + k)))
    end do
    call chk(all(cr == cs), 'scatter')

    ! ---- fault tolerance: agree (bitwise AND), revoke, shrink the revoked communicator
    call MPI_Comm_dup(MPI_COMM_WORLD, ftc, ierr)
    call MPI_Comm_set_errhandler(ftc, MPI_ERRORS_RETURN, ierr)
    flag = 7
    if (rank == nproc - 1) flag = 6
    call MPIX_Comm_agree(ftc, flag, ierr)
    call chk(ierr == MPI_SUCCESS .and. flag == 6, 'MPIX_Comm_agree')
    call MPIX_Comm_revoke(ftc, ierr)
    call chk(ierr == MPI_SUCCESS, 'MPIX_Comm_revoke')
    call MPI_Barrier(ftc, ierr)
    call chk(ierr /= MPI_SUCCESS, 'barrier on a revoked communicator fails')
    call MPIX_Comm_shrink(ftc, ftn, ierr)
    call chk(ierr == MPI_SUCCESS, 'MPIX_Comm_shrink')
    total = rank
    call MPI_Allreduce(MPI_IN_PLACE, total, 1, MPI_INTEGER, MPI_SUM, ftn, ierr)
    call chk(ierr == MPI_SUCCESS .and. total == nproc * (nproc - 1) / 2, 'allreduce on the shrunk communicator')
    call MPI_Comm_free(ftn, ierr)
    call MPI_Comm_free(ftc, ierr)

    call MPI_Allreduce(nerr, allerr, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (rank == 0) then
        if (allerr == 0) then
            write (*, '(a,i0,a)') 'f90_comm: PASS (', nproc, ' ranks)'
        else
            write (*, *) 'f90_comm: FAIL', allerr, 'errors'
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
