! mpi_f08 collectives, user operators, attributes with the predefined f08 callbacks, derived datatypes and
! one-sided communication: MPI_IN_PLACE, Allreduce with an operator written against the mpi_f08
! MPI_User_function interface (TYPE(C_PTR) vectors), Bcast/Gather/Alltoall/Scatterv, a keyval copied by
! MPI_COMM_DUP_FN and dropped by MPI_COMM_NULL_COPY_FN, MPI_Type_vector, and MPI_Win_allocate whose base is a
! TYPE(C_PTR) turned into a Fortran array, with fence, put, get, accumulate, fetch_and_op and passive
! locks. Any number of ranks. Prints PASS or FAIL; built with our mpifort and with Debian's mpif90.mpich.
module f08_ops
    use mpi_f08
    use, intrinsic :: iso_c_binding
    implicit none
contains
    ! Element-wise: the value of larger magnitude.
    subroutine absmax(invec, inoutvec, len, datatype)
        type(c_ptr), value :: invec, inoutvec
        integer :: len
        type(MPI_Datatype) :: datatype
        integer, pointer :: a(:), b(:)
        integer :: i
        call c_f_pointer(invec, a, [len])
        call c_f_pointer(inoutvec, b, [len])
        do i = 1, len
            if (abs(a(i)) > abs(b(i))) b(i) = a(i)
        end do
    end subroutine
end module

program f08_coll_rma
    use mpi_f08
    use f08_ops
    use, intrinsic :: iso_c_binding
    implicit none
    integer :: rank, size, i, j, n, fails, root
    integer :: v(8), w(8)
    integer, allocatable :: gath(:), counts(:), displs(:), recv(:)
    type(MPI_Op) :: op
    type(MPI_Comm) :: dup1
    integer :: kv_dup, kv_null
    integer(kind=MPI_ADDRESS_KIND) :: val
    logical :: flag
    type(MPI_Datatype) :: vec
    integer :: mat(4, 6), got(4, 6)
    type(MPI_Win) :: win
    type(c_ptr) :: base
    integer, pointer :: wbuf(:)
    integer(kind=MPI_ADDRESS_KIND) :: wsize, disp
    integer :: one, old, tgt, mine

    fails = 0
    call MPI_Init()
    call MPI_Comm_rank(MPI_COMM_WORLD, rank)
    call MPI_Comm_size(MPI_COMM_WORLD, size)

    ! User operator and MPI_IN_PLACE.
    call MPI_Op_create(absmax, .true., op)
    v = [(merge(-1, 1, mod(rank + i, 2) == 0) * (rank * 10 + i), i = 1, 8)]
    call MPI_Allreduce(MPI_IN_PLACE, v, 8, MPI_INTEGER, op, MPI_COMM_WORLD)
    do i = 1, 8
        call check(v(i) == merge(-1, 1, mod(size - 1 + i, 2) == 0) * ((size - 1) * 10 + i), 'absmax')
    end do
    call MPI_Op_free(op)
    call check(op == MPI_OP_NULL, 'op freed')
    v = rank
    call MPI_Allreduce(v, w, 8, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    call check(all(w == size * (size - 1) / 2), 'allreduce sum')

    ! Bcast, Gather, Alltoall, Scatterv.
    root = size - 1
    v = merge([(i * 3, i = 1, 8)], [(0, i = 1, 8)], rank == root)
    call MPI_Bcast(v, 8, MPI_INTEGER, root, MPI_COMM_WORLD)
    call check(all(v == [(i * 3, i = 1, 8)]), 'bcast')
    allocate(gath(2 * size), counts(size), displs(size), recv(size))
    call MPI_Gather([rank, -rank], 2, MPI_INTEGER, gath, 2, MPI_INTEGER, 0, MPI_COMM_WORLD)
    if (rank == 0) call check(all(gath(1:2 * size:2) == [(i, i = 0, size - 1)]) .and. &
                              all(gath(2:2 * size:2) == [(-i, i = 0, size - 1)]), 'gather')
    call MPI_Alltoall([(rank * 100 + i, i = 0, size - 1)], 1, MPI_INTEGER, recv, 1, MPI_INTEGER, MPI_COMM_WORLD)
    call check(all(recv == [(i * 100 + rank, i = 0, size - 1)]), 'alltoall')
    counts = [(i + 1, i = 0, size - 1)]
    displs = [(i * (i + 1) / 2, i = 0, size - 1)]
    deallocate(gath)
    allocate(gath(size * (size + 1) / 2))
    gath = [(i, i = 1, size * (size + 1) / 2)]
    w = -1
    call MPI_Scatterv(gath, counts, displs, MPI_INTEGER, w, rank + 1, MPI_INTEGER, 0, MPI_COMM_WORLD)
    call check(all(w(1:rank + 1) == [(displs(rank + 1) + i, i = 1, rank + 1)]), 'scatterv')

    ! Attributes: MPI_COMM_DUP_FN copies on dup, MPI_COMM_NULL_COPY_FN does not.
    call MPI_Comm_create_keyval(MPI_COMM_DUP_FN, MPI_COMM_NULL_DELETE_FN, kv_dup, 0_MPI_ADDRESS_KIND)
    call MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, kv_null, 0_MPI_ADDRESS_KIND)
    call MPI_Comm_set_attr(MPI_COMM_WORLD, kv_dup, 4242_MPI_ADDRESS_KIND)
    call MPI_Comm_set_attr(MPI_COMM_WORLD, kv_null, 77_MPI_ADDRESS_KIND)
    call MPI_Comm_dup(MPI_COMM_WORLD, dup1)
    call MPI_Comm_get_attr(dup1, kv_dup, val, flag)
    call check(flag .and. val == 4242, 'MPI_COMM_DUP_FN copied')
    call MPI_Comm_get_attr(dup1, kv_null, val, flag)
    call check(.not. flag, 'MPI_COMM_NULL_COPY_FN not copied')
    call MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, val, flag)
    call check(flag .and. val >= 32767, 'MPI_TAG_UB')
    call MPI_Comm_free(dup1)
    call MPI_Comm_free_keyval(kv_dup)
    call MPI_Comm_free_keyval(kv_null)

    ! A vector type: row 2 of a 4x6 matrix (stride 4), sent to oneself.
    mat = reshape([(i, i = 1, 24)], [4, 6])
    got = 0
    call MPI_Type_vector(6, 1, 4, MPI_INTEGER, vec)
    call MPI_Type_commit(vec)
    call MPI_Sendrecv(mat(2, 1), 1, vec, rank, 9, got(3, 1), 1, vec, rank, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE)
    call check(all(got(3, :) == mat(2, :)) .and. all(got(1:2, :) == 0) .and. all(got(4, :) == 0), 'vector type')
    call MPI_Type_free(vec)
    call check(vec == MPI_DATATYPE_NULL, 'type freed')

    ! One-sided: a window of size+2 integers per rank from MPI_Win_allocate (TYPE(C_PTR) base).
    n = size + 2
    wsize = 4 * n
    call MPI_Win_allocate(wsize, 4, MPI_INFO_NULL, MPI_COMM_WORLD, base, win)
    call c_f_pointer(base, wbuf, [n])
    wbuf = 0
    call MPI_Win_fence(0, win)
    tgt = mod(rank + 1, size)
    disp = rank
    mine = rank + 1000  ! (an origin buffer must live until the fence: not an array constructor)
    call MPI_Put(mine, 1, MPI_INTEGER, tgt, disp, 1, MPI_INTEGER, win)
    one = 1
    call MPI_Accumulate(one, 1, MPI_INTEGER, 0, int(size, MPI_ADDRESS_KIND), 1, MPI_INTEGER, MPI_SUM, win)
    call MPI_Win_fence(0, win)
    j = mod(rank - 1 + size, size)
    call check(wbuf(j + 1) == j + 1000, 'put landed')
    if (rank == 0) call check(wbuf(size + 1) == size, 'accumulate')
    ! passive target: fetch_and_op on rank 0's last slot, then get it back
    call MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win)
    call MPI_Fetch_and_op(one, old, MPI_INTEGER, 0, int(size + 1, MPI_ADDRESS_KIND), MPI_SUM, win)
    call MPI_Win_unlock(0, win)
    call check(old >= 0 .and. old < size, 'fetch_and_op old value')
    call MPI_Barrier(MPI_COMM_WORLD)
    call MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win)
    call MPI_Get(old, 1, MPI_INTEGER, 0, int(size + 1, MPI_ADDRESS_KIND), 1, MPI_INTEGER, win)
    call MPI_Win_unlock(0, win)
    call check(old == size, 'get after fetch_and_op')
    call MPI_Win_free(win)
    call check(win == MPI_WIN_NULL, 'win freed')

    call MPI_Allreduce(MPI_IN_PLACE, fails, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    if (rank == 0) then
        if (fails == 0) then
            print '(a)', 'PASS'
        else
            print '(a,i0)', 'FAIL failures: ', fails
        end if
    end if
    call MPI_Finalize()
contains
    subroutine check(ok, what)
        logical, intent(in) :: ok
        character(len=*), intent(in) :: what
        if (.not. ok) then
            fails = fails + 1
            print '(a,i0,a,a)', 'FAIL rank ', rank, ': ', what
        end if
    end subroutine
end program
