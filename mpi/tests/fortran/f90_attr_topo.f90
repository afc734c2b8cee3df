! f90_attr_topo.f90 -- attribute caching with Fortran callbacks (Comm_create_keyval with user copy/delete
! subroutines and with the predefined MPI_COMM_DUP_FN / MPI_COMM_NULL_COPY_FN / MPI_COMM_NULL_DELETE_FN,
! MPI-1 Keyval_create/Attr_put/Attr_get with INTEGER values, predefined Fortran keyvals), communicator names
! and info objects (input and output strings with hidden lengths), a periodic Cartesian topology (LOGICAL arrays), and a
! ring as an unweighted distributed graph (MPI_UNWEIGHTED, a common-block sentinel).
! needs: MPI_Comm_create_keyval MPI_Comm_set_attr MPI_Comm_get_attr MPI_Comm_delete_attr MPI_Comm_free_keyval MPI_Comm_dup MPI_Comm_free MPI_Keyval_create MPI_Keyval_free MPI_Attr_put MPI_Attr_get MPI_Comm_set_name MPI_Comm_get_name MPI_Dims_create MPI_Cart_create MPI_Cart_coords MPI_Cart_shift MPI_Cart_rank MPI_Dist_graph_create_adjacent MPI_Dist_graph_neighbors_count MPI_Dist_graph_neighbors MPI_Allreduce MPI_Info_create MPI_Info_set MPI_Info_get MPI_Info_get_nkeys MPI_Info_get_valuelen MPI_Info_get_nthkey MPI_Info_free
module cbs
    use mpi
    implicit none
    integer :: copies = 0, deletes = 0, badextra = 0
contains
    subroutine my_copy(oldcomm, keyval, extra, valin, valout, flag, ierr)
        integer :: oldcomm, keyval, ierr
        integer(kind=MPI_ADDRESS_KIND) :: extra, valin, valout
        logical :: flag
        copies = copies + 1
        if (extra /= 123456789012_MPI_ADDRESS_KIND) badextra = badextra + 1
        valout = valin + 1
        flag = .true.
        ierr = MPI_SUCCESS
    end subroutine
    subroutine my_delete(comm, keyval, val, extra, ierr)
        integer :: comm, keyval, ierr
        integer(kind=MPI_ADDRESS_KIND) :: val, extra
        deletes = deletes + 1
        if (extra /= 123456789012_MPI_ADDRESS_KIND) badextra = badextra + 1
        ierr = MPI_SUCCESS
    end subroutine
end module cbs

program fattr
    use mpi
    use cbs
    implicit none
    integer :: ierr, rank, nproc, nerr, allerr, kv1, kv2, kv3, kv4, c1, c2, ival, nlen
    integer :: cart, dims(2), coords(2), src, dst, r
    integer(kind=MPI_ADDRESS_KIND) :: val
    integer :: dg, indeg, outdeg, srcs(1), dsts(1)
    logical :: weighted
    logical :: flag, periods(2)
    character(len=MPI_MAX_OBJECT_NAME) :: name
    integer :: info, nk, vlen
    character(len=64) :: ival_s, key_s
    nerr = 0
    call MPI_Init(ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)

    ! ---- keyvals with Fortran callbacks
    call MPI_Comm_create_keyval(my_copy, my_delete, kv1, 123456789012_MPI_ADDRESS_KIND, ierr)
    call MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, kv2, 0_MPI_ADDRESS_KIND, ierr)
    call MPI_Comm_create_keyval(MPI_COMM_DUP_FN, MPI_COMM_NULL_DELETE_FN, kv3, 0_MPI_ADDRESS_KIND, ierr)
    call chk(ierr == MPI_SUCCESS, 'create_keyval')
    call MPI_Comm_dup(MPI_COMM_WORLD, c1, ierr)
    call MPI_Comm_set_attr(c1, kv1, 42_MPI_ADDRESS_KIND, ierr)
    call MPI_Comm_set_attr(c1, kv2, 7_MPI_ADDRESS_KIND, ierr)
    call MPI_Comm_set_attr(c1, kv3, 9876543210_MPI_ADDRESS_KIND, ierr)
    call MPI_Comm_get_attr(c1, kv1, val, flag, ierr)
    call chk(flag .and. val == 42, 'get_attr user keyval')
    call MPI_Comm_dup(c1, c2, ierr)
    call chk(copies == 1, 'copy callback called once')
    call MPI_Comm_get_attr(c2, kv1, val, flag, ierr)
    call chk(flag .and. val == 43, 'copied attribute from Fortran callback')
    call MPI_Comm_get_attr(c2, kv2, val, flag, ierr)
    call chk(.not. flag, 'MPI_COMM_NULL_COPY_FN does not copy')
    call MPI_Comm_get_attr(c2, kv3, val, flag, ierr)
    call chk(flag .and. val == 9876543210_MPI_ADDRESS_KIND, 'MPI_COMM_DUP_FN copies')
    call MPI_Comm_delete_attr(c1, kv1, ierr)
    call chk(deletes == 1, 'delete callback on delete_attr')
    call MPI_Comm_get_attr(c1, kv1, val, flag, ierr)
    call chk(.not. flag, 'deleted attribute gone')
    call MPI_Comm_free(c2, ierr)
    call chk(deletes == 2, 'delete callback on comm_free')
    call chk(badextra == 0, 'extra_state passed to callbacks')
    call MPI_Comm_free(c1, ierr)
    call MPI_Comm_free_keyval(kv1, ierr)
    call MPI_Comm_free_keyval(kv2, ierr)
    call MPI_Comm_free_keyval(kv3, ierr)
    call chk(kv1 == MPI_KEYVAL_INVALID, 'free_keyval')

    ! ---- MPI-1 attributes: INTEGER values, predefined MPI_DUP_FN
    call MPI_Keyval_create(MPI_DUP_FN, MPI_NULL_DELETE_FN, kv4, 0, ierr)
    call MPI_Comm_dup(MPI_COMM_WORLD, c1, ierr)
    call MPI_Attr_put(c1, kv4, 31337, ierr)
    call MPI_Comm_dup(c1, c2, ierr)
    ival = 0
    call MPI_Attr_get(c2, kv4, ival, flag, ierr)
    call chk(flag .and. ival == 31337, 'attr_get after MPI_DUP_FN')
    call MPI_Attr_get(MPI_COMM_WORLD, MPI_TAG_UB, ival, flag, ierr)
    call chk(flag .and. ival >= 32767, 'attr_get MPI_TAG_UB')
    call MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_WTIME_IS_GLOBAL, val, flag, ierr)
    call chk(.not. flag .or. val == 0 .or. val == 1, 'MPI_WTIME_IS_GLOBAL')
    call MPI_Comm_free(c2, ierr)
    call MPI_Comm_free(c1, ierr)
    call MPI_Keyval_free(kv4, ierr)

    ! ---- names
    call MPI_Comm_dup(MPI_COMM_WORLD, c1, ierr)
    call MPI_Comm_set_name(c1, 'fortran comm   ', ierr)
    name = '#'
    call MPI_Comm_get_name(c1, name, nlen, ierr)
    call chk(ierr == MPI_SUCCESS .and. name == 'fortran comm' .and. nlen == 12, 'comm name round trip')
    call MPI_Comm_get_name(MPI_COMM_WORLD, name, nlen, ierr)
    call chk(name == 'MPI_COMM_WORLD' .and. nlen == 14, 'MPI_COMM_WORLD name')
    call MPI_Comm_free(c1, ierr)

    ! ---- info objects: trailing blanks of keys and values are not part of them
    call MPI_Info_create(info, ierr)
    call MPI_Info_set(info, 'fkey   ', 'a value   ', ierr)
    call MPI_Info_set(info, 'other', 'x', ierr)
    call MPI_Info_get_nkeys(info, nk, ierr)
    ival_s = '#'
    call MPI_Info_get(info, 'fkey', 32, ival_s, flag, ierr)
    call chk(ierr == MPI_SUCCESS .and. flag .and. ival_s == 'a value' .and. nk == 2, 'info set/get')
    call MPI_Info_get_valuelen(info, 'fkey ', vlen, flag, ierr)
    call chk(flag .and. vlen == 7, 'info valuelen')
    call MPI_Info_get(info, 'nokey', 32, ival_s, flag, ierr)
    call chk(.not. flag, 'info missing key')
    call MPI_Info_get_nthkey(info, 1, key_s, ierr)
    call chk(key_s == 'other', 'info nthkey')
    call MPI_Info_free(info, ierr)
    call chk(info == MPI_INFO_NULL, 'info free')

    ! ---- periodic 2-D Cartesian topology
    dims = 0
    call MPI_Dims_create(nproc, 2, dims, ierr)
    call chk(dims(1) * dims(2) == nproc .and. dims(1) >= dims(2), 'dims_create')
    periods = (/ .true., .false. /)
    call MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, .false., cart, ierr)
    call MPI_Cart_coords(cart, rank, 2, coords, ierr)
    call chk(coords(1) == rank / dims(2) .and. coords(2) == mod(rank, dims(2)), 'cart_coords (row major)')
    call MPI_Cart_shift(cart, 0, 1, src, dst, ierr)
    call MPI_Cart_rank(cart, (/ mod(coords(1) + 1, dims(1)), coords(2) /), r, ierr)
    call chk(dst == r, 'cart_shift periodic dimension')
    call MPI_Cart_shift(cart, 1, 1, src, dst, ierr)
    if (coords(2) == dims(2) - 1) call chk(dst == MPI_PROC_NULL, 'cart_shift non-periodic edge')
    call MPI_Comm_free(cart, ierr)

    ! ---- ring as an unweighted distributed graph
    call MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 1, (/ mod(rank - 1 + nproc, nproc) /), MPI_UNWEIGHTED, &
                                        1, (/ mod(rank + 1, nproc) /), MPI_UNWEIGHTED, MPI_INFO_NULL, .false., dg, ierr)
    call chk(ierr == MPI_SUCCESS, 'dist_graph_create_adjacent')
    call MPI_Dist_graph_neighbors_count(dg, indeg, outdeg, weighted, ierr)
    call chk(indeg == 1 .and. outdeg == 1 .and. .not. weighted, 'MPI_UNWEIGHTED graph is unweighted')
    call MPI_Dist_graph_neighbors(dg, 1, srcs, MPI_UNWEIGHTED, 1, dsts, MPI_UNWEIGHTED, ierr)
    call chk(srcs(1) == mod(rank - 1 + nproc, nproc) .and. dsts(1) == mod(rank + 1, nproc), 'dist_graph_neighbors')
    call MPI_Comm_free(dg, ierr)

    call MPI_Allreduce(nerr, allerr, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (rank == 0) then
        if (allerr == 0) then
            write (*, '(a,i0,a)') 'f90_attr_topo: PASS (', nproc, ' ranks)'
        else
            write (*, *) 'f90_attr_topo: FAIL', allerr, 'errors'
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
