! f90_kernels.f90 -- NPB-style kernels with `use mpi`, results checked:
!  * EP (NAS Parallel Benchmarks "embarrassingly parallel", class S: 2^24 Gaussian pairs from the NPB
!    linear congruential generator randlc, batches spread over the ranks, sums combined with Allreduce and
!    Reduce) verified against NPB's published class S sums (relative 1e-8) and exact annulus counts;
!  * CG (conjugate gradient on a distributed 1-D Poisson matrix: halo exchange with Sendrecv and
!    MPI_PROC_NULL, dot products with Allreduce/MPI_IN_PLACE, broadcast parameters) verified against the
!    same iteration run serially on every rank (residuals 1e-8, solution 1e-10 relative), plus MPI_WTIME timing via Reduce/MPI_MAX.
! needs: MPI_Bcast MPI_Reduce MPI_Allreduce
module npbrand
    implicit none
contains
    double precision function randlc(x, a)
        double precision, intent(inout) :: x
        double precision, intent(in) :: a
        double precision, parameter :: r23 = 0.5d0**23, r46 = r23 * r23, t23 = 2d0**23, t46 = t23 * t23
        double precision :: t1, t2, t3, t4, a1, a2, x1, x2, z
        t1 = r23 * a
        a1 = int(t1)
        a2 = a - t23 * a1
        t1 = r23 * x
        x1 = int(t1)
        x2 = x - t23 * x1
        t1 = a1 * x2 + a2 * x1
        t2 = int(r23 * t1)
        z = t1 - t23 * t2
        t3 = t23 * z + a2 * x2
        t4 = int(r46 * t3)
        x = t3 - t46 * t4
        randlc = r46 * x
    end function
end module npbrand

program kernels
    use mpi
    use npbrand
    implicit none
    integer :: ierr, rank, nproc, nerr, allerr
    nerr = 0
    call MPI_Init(ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)
    call ep(rank, nproc, nerr)
    call cg(rank, nproc, nerr)
    call MPI_Allreduce(nerr, allerr, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (rank == 0) then
        if (allerr == 0) then
            write (*, '(a,i0,a)') 'f90_kernels: PASS (', nproc, ' ranks)'
        else
            write (*, *) 'f90_kernels: FAIL', allerr, 'errors'
        end if
    end if
    call MPI_Finalize(ierr)
contains
    subroutine fail(what, nerr)
        character(len=*), intent(in) :: what
        integer, intent(inout) :: nerr
        nerr = nerr + 1
        print *, 'rank', rank, 'FAILED: ', what
    end subroutine

    subroutine ep(rank, nproc, nerr)
        integer, intent(in) :: rank, nproc
        integer, intent(inout) :: nerr
        integer, parameter :: m = 24, mk = 16, nk = 2**mk, nn = 2**(m - mk)
        double precision, parameter :: a = 1220703125d0, s = 271828183d0
        double precision, parameter :: sx_ref = -3.247834652034740d3, sy_ref = -6.958407078382297d3
        double precision :: x(2 * nk), q(0:9), sums(2), an, t1, t2, t3, t4, x1, x2, tm, tmax
        integer :: k, kk, ik, i, l, np, npall, iq(0:9), iqall(0:9)
        tm = MPI_Wtime()
        q = 0d0
        sums = 0d0
        np = 0
        ! an = a^(2 nk) mod 2^46
        t1 = a
        do i = 1, mk + 1
            t2 = randlc(t1, t1)
        end do
        an = t1
        do k = rank + 1, nn, nproc
            kk = k - 1
            t1 = s
            t2 = an
            do i = 1, 100
                ik = kk / 2
                if (2 * ik /= kk) t3 = randlc(t1, t2)
                if (ik == 0) exit
                t3 = randlc(t2, t2)
                kk = ik
            end do
            do i = 1, 2 * nk
                x(i) = randlc(t1, a)
            end do
            do i = 1, nk
                x1 = 2d0 * x(2 * i - 1) - 1d0
                x2 = 2d0 * x(2 * i) - 1d0
                t1 = x1 * x1 + x2 * x2
                if (t1 <= 1d0) then
                    t2 = sqrt(-2d0 * log(t1) / t1)
                    t3 = x1 * t2
                    t4 = x2 * t2
                    l = int(max(abs(t3), abs(t4)))
                    q(l) = q(l) + 1d0
                    sums(1) = sums(1) + t3
                    sums(2) = sums(2) + t4
                    np = np + 1
                end if
            end do
        end do
        iq = int(q)
        call MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
        call MPI_Allreduce(MPI_IN_PLACE, q, 10, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
        call MPI_Allreduce(iq, iqall, 10, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
        call MPI_Reduce(np, npall, 1, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
        if (abs((sums(1) - sx_ref) / sx_ref) > 1d-8 .or. abs((sums(2) - sy_ref) / sy_ref) > 1d-8) then
            call fail('EP sums differ from the NPB class S reference', nerr)
            print *, sums, sx_ref, sy_ref
        end if
        if (any(dble(iqall) /= q)) call fail('EP integer and double counts differ', nerr)
        if (rank == 0 .and. npall /= sum(iqall)) call fail('EP pair count (Reduce)', nerr)
        tm = MPI_Wtime() - tm
        call MPI_Reduce(tm, tmax, 1, MPI_DOUBLE_PRECISION, MPI_MAX, 0, MPI_COMM_WORLD, ierr)
        if (rank == 0 .and. (tmax < tm .or. tmax <= 0d0)) call fail('EP time Reduce/MAX', nerr)
    end subroutine

    ! y = A x for A = tridiag(-1, 2 + shift, -1), rows lo..hi of x held locally with halo x(lo-1), x(hi+1)
    subroutine matvec(lo, hi, n, shift, x, y)
        integer, intent(in) :: lo, hi, n
        double precision, intent(in) :: shift, x(lo - 1:hi + 1)
        double precision, intent(out) :: y(lo:hi)
        integer :: i
        do i = lo, hi
            y(i) = (2d0 + shift) * x(i)
            if (i > 1) y(i) = y(i) - x(i - 1)
            if (i < n) y(i) = y(i) - x(i + 1)
        end do
    end subroutine

    subroutine cg(rank, nproc, nerr)
        integer, intent(in) :: rank, nproc
        integer, intent(inout) :: nerr
        integer :: n, niter, lo, hi, i, it, left, right, ip(2)
        double precision :: shift, rho, rho0, alpha, beta, pq, dp(1), rnorm, rnorm_s
        double precision, allocatable :: x(:), r(:), p(:), q(:), xs(:), rs(:), ps(:), qs(:)
        ! rank 0 decides the problem and broadcasts it
        if (rank == 0) then
            ip = (/ 2003, 30 /)
            shift = 0.5d0
        end if
        call MPI_Bcast(ip, 2, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
        call MPI_Bcast(shift, 1, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, ierr)
        n = ip(1)
        niter = ip(2)
        lo = rank * n / nproc + 1
        hi = (rank + 1) * n / nproc
        left = rank - 1
        right = rank + 1
        if (left < 0) left = MPI_PROC_NULL
        if (right >= nproc) right = MPI_PROC_NULL
        allocate(x(lo:hi), r(lo:hi), p(lo - 1:hi + 1), q(lo:hi))
        allocate(xs(n), rs(n), ps(0:n + 1), qs(n))
        ! b = r0 = (1, 2, ..., n) / n, x0 = 0
        do i = lo, hi
            r(i) = dble(mod(i * 37, 101)) / 101d0
        end do
        x = 0d0
        p = 0d0
        p(lo:hi) = r
        dp(1) = sum(r * r)
        call MPI_Allreduce(MPI_IN_PLACE, dp, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
        rho = dp(1)
        ! serial reference
        do i = 1, n
            rs(i) = dble(mod(i * 37, 101)) / 101d0
        end do
        xs = 0d0
        ps = 0d0
        ps(1:n) = rs
        rho0 = sum(rs * rs)
        if (abs(rho - rho0) > 1d-12 * rho0) call fail('CG initial dot product', nerr)
        do it = 1, niter
            ! halo exchange: send my first row left and last row right
            call MPI_Sendrecv(p(hi), 1, MPI_DOUBLE_PRECISION, right, 1, p(lo - 1), 1, MPI_DOUBLE_PRECISION, &
                              left, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
            call MPI_Sendrecv(p(lo), 1, MPI_DOUBLE_PRECISION, left, 2, p(hi + 1), 1, MPI_DOUBLE_PRECISION, &
                              right, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
            if (left == MPI_PROC_NULL) p(lo - 1) = 0d0
            if (right == MPI_PROC_NULL) p(hi + 1) = 0d0
            call matvec(lo, hi, n, shift, p, q)
            dp(1) = sum(p(lo:hi) * q)
            call MPI_Allreduce(MPI_IN_PLACE, dp, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
            pq = dp(1)
            alpha = rho / pq
            x = x + alpha * p(lo:hi)
            r = r - alpha * q
            dp(1) = sum(r * r)
            call MPI_Allreduce(MPI_IN_PLACE, dp, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
            beta = dp(1) / rho
            rho = dp(1)
            p(lo:hi) = r + beta * p(lo:hi)
            ! serial
            call matvec(1, n, n, shift, ps, qs)
            alpha = rho0 / sum(ps(1:n) * qs)
            xs = xs + alpha * ps(1:n)
            rs = rs - alpha * qs
            beta = sum(rs * rs) / rho0
            rho0 = sum(rs * rs)
            ps(1:n) = rs + beta * ps(1:n)
            if (abs(rho - rho0) > 1d-8 * rho0) then
                call fail('CG residual history differs from serial', nerr)
                exit
            end if
        end do
        rnorm = sqrt(rho)
        rnorm_s = sqrt(rho0)
        if (rnorm > 1d-6 .or. rnorm_s > 1d-6) call fail('CG did not converge', nerr)
        if (maxval(abs(x - xs(lo:hi))) > 1d-10 * maxval(abs(xs))) call fail('CG solution differs from serial', nerr)
    end subroutine
end program
