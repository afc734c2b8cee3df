! f77_coll.f -- fixed-form, include 'mpif.h': Barrier, Bcast, Reduce and Allreduce of every Fortran
! datatype for several sizes and every root, with MPI_IN_PLACE, checked exactly (values chosen so sums
! are exact in floating point). Prints PASS on rank 0 when every rank passed.
! needs: MPI_Bcast MPI_Reduce MPI_Allreduce
      PROGRAM F77COLL
      IMPLICIT NONE
      INCLUDE 'mpif.h'
      INTEGER NMAX
      PARAMETER (NMAX=30000)
      INTEGER IERR, RANK, NPROC, NERR, K, I, N, ROOT, J, ALLERR
      INTEGER SIZES(4), NS
      INTEGER IA(NMAX), IB(NMAX)
      REAL RA(NMAX), RB(NMAX)
      DOUBLE PRECISION DA(NMAX), DB(NMAX), S
      COMPLEX CA(NMAX), CB(NMAX)
      DOUBLE COMPLEX ZA(NMAX), ZB(NMAX)
      LOGICAL LA(NMAX), LB(NMAX)
      CHARACTER*1 HA(NMAX)
      COMMON /ERRS/ NERR, RANK
      DATA SIZES /1, 7, 1000, 30000/
      NS = 4
      NERR = 0
      CALL MPI_INIT(IERR)
      CALL MPI_COMM_RANK(MPI_COMM_WORLD, RANK, IERR)
      CALL MPI_COMM_SIZE(MPI_COMM_WORLD, NPROC, IERR)
!     S = sum over ranks of (rank + 1) = nproc (nproc + 1) / 2
      S = DBLE(NPROC * (NPROC + 1) / 2)
      DO 200 K = 1, NS
         N = SIZES(K)
         DO 100 ROOT = 0, NPROC - 1
!           ---- Bcast of every type from ROOT
            DO 10 I = 1, N
               IF (RANK .EQ. ROOT) THEN
                  IA(I) = ROOT * 1000 + I
                  RA(I) = REAL(I) + 0.25
                  DA(I) = DBLE(I) * 0.125D0 + ROOT
                  CA(I) = CMPLX(REAL(ROOT), REAL(I))
                  ZA(I) = DCMPLX(DBLE(I), DBLE(-ROOT))
                  LA(I) = MOD(I + ROOT, 2) .EQ. 0
                  HA(I) = CHAR(MOD(I * 3 + ROOT, 26) + 97)
               ELSE
                  IA(I) = -1
                  RA(I) = -1.0
                  DA(I) = -1D0
                  CA(I) = (0.0, 0.0)
                  ZA(I) = (0D0, 0D0)
                  LA(I) = MOD(I + ROOT, 2) .NE. 0
                  HA(I) = ' '
               END IF
   10       CONTINUE
            CALL MPI_BCAST(IA, N, MPI_INTEGER, ROOT, MPI_COMM_WORLD,
     &           IERR)
            CALL CHECK(IERR .EQ. MPI_SUCCESS, 'bcast ierror')
            CALL MPI_BCAST(RA, N, MPI_REAL, ROOT, MPI_COMM_WORLD, IERR)
            CALL MPI_BCAST(DA, N, MPI_DOUBLE_PRECISION, ROOT,
     &           MPI_COMM_WORLD, IERR)
            CALL MPI_BCAST(CA, N, MPI_COMPLEX, ROOT, MPI_COMM_WORLD,
     &           IERR)
            CALL MPI_BCAST(ZA, N, MPI_DOUBLE_COMPLEX, ROOT,
     &           MPI_COMM_WORLD, IERR)
            CALL MPI_BCAST(LA, N, MPI_LOGICAL, ROOT, MPI_COMM_WORLD,
     &           IERR)
            CALL MPI_BCAST(HA, N, MPI_CHARACTER, ROOT, MPI_COMM_WORLD,
     &           IERR)
            J = 0
            DO 20 I = 1, N
               IF (IA(I) .NE. ROOT * 1000 + I) J = J + 1
               IF (RA(I) .NE. REAL(I) + 0.25) J = J + 1
               IF (DA(I) .NE. DBLE(I) * 0.125D0 + ROOT) J = J + 1
               IF (CA(I) .NE. CMPLX(REAL(ROOT), REAL(I))) J = J + 1
               IF (ZA(I) .NE. DCMPLX(DBLE(I), DBLE(-ROOT))) J = J + 1
               IF (LA(I) .NEQV. (MOD(I + ROOT, 2) .EQ. 0)) J = J + 1
               IF (HA(I) .NE. CHAR(MOD(I * 3 + ROOT, 26) + 97))
     &              J = J + 1
   20       CONTINUE
            CALL CHECK(J .EQ. 0, 'bcast payloads')
!           ---- Reduce (SUM, MAX, LAND) to ROOT; MPI_IN_PLACE at the root
            DO 30 I = 1, N
               IA(I) = (RANK + 1) * I
               RA(I) = REAL(RANK + 1) * 0.5
               DA(I) = DBLE(RANK + 1) * DBLE(I)
               CA(I) = CMPLX(REAL(RANK + 1), REAL(-I))
               ZA(I) = DCMPLX(DBLE(RANK + 1), DBLE(I) * 0.5D0)
               LA(I) = RANK .NE. MOD(I, NPROC + 1)
               IB(I) = -7
   30       CONTINUE
            CALL MPI_REDUCE(IA, IB, N, MPI_INTEGER, MPI_SUM, ROOT,
     &           MPI_COMM_WORLD, IERR)
            CALL CHECK(IERR .EQ. MPI_SUCCESS, 'reduce ierror')
            IF (RANK .EQ. ROOT) THEN
               CALL MPI_REDUCE(MPI_IN_PLACE, RA, N, MPI_REAL, MPI_SUM,
     &              ROOT, MPI_COMM_WORLD, IERR)
               CALL MPI_REDUCE(MPI_IN_PLACE, DA, N,
     &              MPI_DOUBLE_PRECISION, MPI_MAX, ROOT,
     &              MPI_COMM_WORLD, IERR)
               CALL MPI_REDUCE(MPI_IN_PLACE, CA, N, MPI_COMPLEX,
     &              MPI_SUM, ROOT, MPI_COMM_WORLD, IERR)
               CALL MPI_REDUCE(MPI_IN_PLACE, ZA, N, MPI_DOUBLE_COMPLEX,
     &              MPI_SUM, ROOT, MPI_COMM_WORLD, IERR)
               CALL MPI_REDUCE(MPI_IN_PLACE, LA, N, MPI_LOGICAL,
     &              MPI_LAND, ROOT, MPI_COMM_WORLD, IERR)
               J = 0
               DO 40 I = 1, N
                  IF (IB(I) .NE. I * NPROC * (NPROC + 1) / 2) J = J + 1
                  IF (RA(I) .NE. REAL(S) * 0.5) J = J + 1
                  IF (DA(I) .NE. DBLE(NPROC) * DBLE(I)) J = J + 1
                  IF (CA(I) .NE. CMPLX(REAL(S), REAL(-I * NPROC)))
     &                 J = J + 1
                  IF (ZA(I) .NE. DCMPLX(S, DBLE(I * NPROC) * 0.5D0))
     &                 J = J + 1
                  IF (LA(I) .NEQV. (MOD(I, NPROC + 1) .EQ. NPROC))
     &                 J = J + 1
   40          CONTINUE
               CALL CHECK(J .EQ. 0, 'reduce results at root')
            ELSE
               CALL MPI_REDUCE(RA, RB, N, MPI_REAL, MPI_SUM, ROOT,
     &              MPI_COMM_WORLD, IERR)
               CALL MPI_REDUCE(DA, DB, N, MPI_DOUBLE_PRECISION, MPI_MAX,
     &              ROOT, MPI_COMM_WORLD, IERR)
               CALL MPI_REDUCE(CA, CB, N, MPI_COMPLEX, MPI_SUM, ROOT,
     &              MPI_COMM_WORLD, IERR)
               CALL MPI_REDUCE(ZA, ZB, N, MPI_DOUBLE_COMPLEX, MPI_SUM,
     &              ROOT, MPI_COMM_WORLD, IERR)
               CALL MPI_REDUCE(LA, LB, N, MPI_LOGICAL, MPI_LAND, ROOT,
     &              MPI_COMM_WORLD, IERR)
               CALL CHECK(IB(1) .EQ. -7, 'reduce leaves non-root')
            END IF
  100    CONTINUE
!        ---- Allreduce: SUM / MIN / PROD / LOR, separate and in place
         DO 50 I = 1, N
            IA(I) = RANK - I
            DA(I) = DBLE(RANK + 1) * 0.5D0
            ZA(I) = DCMPLX(DBLE(I), DBLE(RANK))
            LA(I) = RANK .EQ. MOD(I, NPROC)
            RA(I) = 1.0
            IF (RANK .LT. 3) RA(I) = 2.0
   50    CONTINUE
         CALL MPI_ALLREDUCE(IA, IB, N, MPI_INTEGER, MPI_MIN,
     &        MPI_COMM_WORLD, IERR)
         CALL CHECK(IERR .EQ. MPI_SUCCESS, 'allreduce ierror')
         CALL MPI_ALLREDUCE(MPI_IN_PLACE, IA, N, MPI_INTEGER, MPI_MAX,
     &        MPI_COMM_WORLD, IERR)
         CALL MPI_ALLREDUCE(MPI_IN_PLACE, DA, N, MPI_DOUBLE_PRECISION,
     &        MPI_SUM, MPI_COMM_WORLD, IERR)
         CALL MPI_ALLREDUCE(MPI_IN_PLACE, ZA, N, MPI_DOUBLE_COMPLEX,
     &        MPI_SUM, MPI_COMM_WORLD, IERR)
         CALL MPI_ALLREDUCE(LA, LB, N, MPI_LOGICAL, MPI_LOR,
     &        MPI_COMM_WORLD, IERR)
         CALL MPI_ALLREDUCE(MPI_IN_PLACE, RA, N, MPI_REAL, MPI_PROD,
     &        MPI_COMM_WORLD, IERR)
         J = 0
         DO 60 I = 1, N
            IF (IB(I) .NE. -I) J = J + 1
            IF (IA(I) .NE. NPROC - 1 - I) J = J + 1
            IF (DA(I) .NE. S * 0.5D0) J = J + 1
            IF (ZA(I) .NE. DCMPLX(DBLE(I * NPROC),
     &           DBLE(NPROC * (NPROC - 1) / 2))) J = J + 1
            IF (.NOT. LB(I)) J = J + 1
            IF (RA(I) .NE. REAL(2 ** MIN(NPROC, 3))) J = J + 1
   60    CONTINUE
         CALL CHECK(J .EQ. 0, 'allreduce results')
         CALL MPI_BARRIER(MPI_COMM_WORLD, IERR)
  200 CONTINUE
      CALL MPI_ALLREDUCE(NERR, ALLERR, 1, MPI_INTEGER, MPI_SUM,
     &     MPI_COMM_WORLD, IERR)
      IF (RANK .EQ. 0) THEN
         IF (ALLERR .EQ. 0) THEN
            WRITE (*, '(A,I2,A)') 'f77_coll: PASS (', NPROC, ' ranks)'
         ELSE
            WRITE (*, *) 'f77_coll: FAIL', ALLERR, 'errors'
         END IF
      END IF
      CALL MPI_FINALIZE(IERR)
      END

      SUBROUTINE CHECK(OK, WHAT)
      LOGICAL OK
      CHARACTER*(*) WHAT
      INTEGER NERR, RANK
      COMMON /ERRS/ NERR, RANK
      IF (.NOT. OK) THEN
         NERR = NERR + 1
         IF (NERR .LT. 20) WRITE (*, *) 'rank', RANK, 'FAILED: ', WHAT
      END IF
      END
