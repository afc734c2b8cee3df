! f90_userop.f90 -- reduction operators written in Fortran (MPI_Op_create with a Fortran subroutine: the C
! library calls it with Fortran's by-reference convention): a commutative elementwise operation on DOUBLE
! PRECISION (checked exactly, and the datatype handle the callback receives), and a non-commutative one
! ("keep the left operand") whose result must be the lowest rank's value, as MPI's ordering rule demands.
! needs: MPI_Op_create MPI_Op_free MPI_Allreduce MPI_Reduce
module userops
    use mpi
    implicit none
    integer :: calls = 0, badtype = 0
contains
    subroutine sumsq(invec, inoutvec, len, dtype)
        integer :: len, dtype, i
        double precision :: invec(len), inoutvec(len)
        calls = calls + 1
        if (dtype /= MPI_DOUBLE_PRECISION) badtype = badtype + 1
        do i = 1, len
            inoutvec(i) = invec(i) + inoutvec(i)
        end do
    end subroutine
    subroutine keepleft(invec, inoutvec, len, dtype)
        integer :: len, dtype, i
        integer :: invec(len), inoutvec(len)
        do i = 1, len
            inoutvec(i) = invec(i)
        end do
    end subroutine
end module userops

program fuserop
    use mpi
    use userops
    implicit none
    integer, parameter :: n = 1000
    integer :: ierr, rank, nproc, nerr, allerr, op1, op2, i, root
    double precision :: a(n), b(n)
    integer :: ia(n), ib(n)
    nerr = 0
    call MPI_Init(ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)
    call MPI_Op_create(sumsq, .true., op1, ierr)
    call chk(ierr == MPI_SUCCESS .and. op1 /= MPI_OP_NULL, 'op_create commutative')
    call MPI_Op_create(keepleft, .false., op2, ierr)
    call chk(ierr == MPI_SUCCESS .and. op2 /= MPI_OP_NULL, 'op_create non-commutative')
    do i = 1, n
        a(i) = dble(rank + 1) * dble(i)
    end do
    call MPI_Allreduce(a, b, n, MPI_DOUBLE_PRECISION, op1, MPI_COMM_WORLD, ierr)
    call chk(all(b == (/ (dble(nproc * (nproc + 1) / 2) * i, i = 1, n) /)), 'allreduce with Fortran op')
    call chk(badtype == 0, 'callback receives the datatype handle')
    call MPI_Allreduce(calls, i, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (nproc > 1) call chk(i > 0, 'callback called')
    do root = 0, nproc - 1
        ia = rank + 7
        ib = -1
        call MPI_Reduce(ia, ib, n, MPI_INTEGER, op2, root, MPI_COMM_WORLD, ierr)
        if (rank == root) call chk(all(ib == 7), 'non-commutative op keeps rank order')
    end do
    call MPI_Op_free(op1, ierr)
    call MPI_Op_free(op2, ierr)
    call chk(op1 == MPI_OP_NULL, 'op_free')
    call MPI_Allreduce(nerr, allerr, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (rank == 0) then
        if (allerr == 0) then
            write (*, '(a,i0,a)') 'f90_userop: PASS (', nproc, ' ranks)'
        else
            write (*, *) 'f90_userop: FAIL', allerr, 'errors'
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
