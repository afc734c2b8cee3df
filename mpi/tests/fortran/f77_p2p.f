! f77_p2p.f -- fixed-form Fortran 77 with include 'mpif.h': point-to-point payloads of every Fortran
! datatype over a ring for many sizes (eager and rendezvous), status arrays (MPI_SOURCE, MPI_TAG,
! MPI_GET_COUNT), MPI_STATUS(ES)_IGNORE, wildcards, Waitany/Testany (1-based indices), Iprobe flags,
! MPI_WTIME/MPI_WTICK, MPI_GET_PROCESSOR_NAME and MPI_ERROR_STRING (hidden lengths), attributes
! (Fortran keyvals), error codes through ierror. Prints PASS on rank 0 when every rank passed.
      PROGRAM F77P2P
      IMPLICIT NONE
      INCLUDE 'mpif.h'
      INTEGER NMAX
      PARAMETER (NMAX=40000)
      INTEGER IERR, RANK, NPROC, NERR, NEXT, PREV, K, I, N, TAG
      INTEGER NSIZES, SIZES(7), ST(MPI_STATUS_SIZE), ALLERR, J
      INTEGER ISB(NMAX), IRB(NMAX)
      REAL RSB(NMAX), RRB(NMAX)
      DOUBLE PRECISION DSB(NMAX), DRB(NMAX)
      COMPLEX CSB(NMAX), CRB(NMAX)
      DOUBLE COMPLEX ZSB(NMAX), ZRB(NMAX)
      LOGICAL LSB(NMAX), LRB(NMAX), FLAG
      CHARACTER*1 HSB(NMAX), HRB(NMAX)
      DOUBLE PRECISION T0, T1, TICK
      CHARACTER*(MPI_MAX_PROCESSOR_NAME) PNAME
      CHARACTER*(MPI_MAX_ERROR_STRING) ESTR
      INTEGER PLEN, ELEN, ICLS, IERR2, REQ, REQS(3), IDX, V, SV
      INTEGER(KIND=MPI_ADDRESS_KIND) AVAL
      COMMON /ERRS/ NERR, RANK
      DATA SIZES /0, 1, 3, 100, 1000, 4096, 40000/
      NSIZES = 7
      NERR = 0
      CALL MPI_INIT(IERR)
      CALL CHECK(IERR .EQ. MPI_SUCCESS, 'init ierror')
      CALL MPI_COMM_RANK(MPI_COMM_WORLD, RANK, IERR)
      CALL MPI_COMM_SIZE(MPI_COMM_WORLD, NPROC, IERR)
      CALL MPI_INITIALIZED(FLAG, IERR)
      CALL CHECK(FLAG, 'initialized')
      CALL MPI_FINALIZED(FLAG, IERR)
      CALL CHECK(.NOT. FLAG, 'not finalized')
      CALL MPI_GET_VERSION(V, SV, IERR)
      CALL CHECK(V .EQ. 4 .AND. SV .EQ. 0, 'version')
      NEXT = MOD(RANK + 1, NPROC)
      PREV = MOD(RANK - 1 + NPROC, NPROC)
!     ---- time
      T0 = MPI_WTIME()
      TICK = MPI_WTICK()
      CALL CHECK(T0 .GT. 0D0, 'wtime positive')
      CALL CHECK(TICK .GT. 0D0 .AND. TICK .LT. 1D0, 'wtick')
!     ---- processor name (hidden length argument)
      PNAME = '#'
      CALL MPI_GET_PROCESSOR_NAME(PNAME, PLEN, IERR)
      CALL CHECK(IERR .EQ. MPI_SUCCESS, 'processor name ierror')
      CALL CHECK(PLEN .GT. 0 .AND. PLEN .LT. MPI_MAX_PROCESSOR_NAME,
     &     'processor name length')
      CALL CHECK(PNAME(PLEN+1:) .EQ. ' ', 'processor name padded')
      CALL CHECK(PNAME(1:1) .NE. ' ' .AND. PNAME(1:1) .NE. '#',
     &     'processor name set')
!     ---- ring exchanges of every type and size
      DO 100 K = 1, NSIZES
         N = SIZES(K)
         DO 10 I = 1, N
            ISB(I) = RANK * 100000 + I + N
            RSB(I) = REAL(MOD(I * 7 + RANK, 1000)) * 0.5
            DSB(I) = DBLE(I) * 0.25D0 + DBLE(RANK) * 1000D0
            CSB(I) = CMPLX(REAL(I), REAL(-RANK))
            ZSB(I) = DCMPLX(DBLE(I) * 0.5D0, DBLE(RANK + N))
            LSB(I) = MOD(I + RANK, 3) .EQ. 0
            HSB(I) = CHAR(MOD(I + RANK, 26) + 65)
            IRB(I) = -1
            RRB(I) = -1.0
            DRB(I) = -1D0
            CRB(I) = (-1.0, -1.0)
            ZRB(I) = (-1D0, -1D0)
            LRB(I) = MOD(I + PREV, 3) .NE. 0
            HRB(I) = ' '
   10    CONTINUE
         TAG = 10 * K
         CALL XCHG(ISB, IRB, N, MPI_INTEGER, TAG + 1, NEXT, PREV)
         CALL XCHG(RSB, RRB, N, MPI_REAL, TAG + 2, NEXT, PREV)
         CALL XCHG(DSB, DRB, N, MPI_DOUBLE_PRECISION, TAG + 3, NEXT,
     &        PREV)
         CALL XCHG(CSB, CRB, N, MPI_COMPLEX, TAG + 4, NEXT, PREV)
         CALL XCHG(ZSB, ZRB, N, MPI_DOUBLE_COMPLEX, TAG + 5, NEXT,
     &        PREV)
         CALL XCHG(LSB, LRB, N, MPI_LOGICAL, TAG + 6, NEXT, PREV)
         CALL XCHG(HSB, HRB, N, MPI_CHARACTER, TAG + 7, NEXT, PREV)
         J = 0
         DO 20 I = 1, N
            IF (IRB(I) .NE. PREV * 100000 + I + N) J = J + 1
            IF (RRB(I) .NE. REAL(MOD(I * 7 + PREV, 1000)) * 0.5)
     &           J = J + 1
            IF (DRB(I) .NE. DBLE(I) * 0.25D0 + DBLE(PREV) * 1000D0)
     &           J = J + 1
            IF (CRB(I) .NE. CMPLX(REAL(I), REAL(-PREV))) J = J + 1
            IF (ZRB(I) .NE. DCMPLX(DBLE(I) * 0.5D0, DBLE(PREV + N)))
     &           J = J + 1
            IF (LRB(I) .NEQV. (MOD(I + PREV, 3) .EQ. 0)) J = J + 1
            IF (HRB(I) .NE. CHAR(MOD(I + PREV, 26) + 65)) J = J + 1
   20    CONTINUE
         IF (J .NE. 0) WRITE (*, *) 'rank', RANK, 'size', N,
     &        'wrong elements', J
         CALL CHECK(J .EQ. 0, 'payloads')
  100 CONTINUE
!     ---- wildcards: everyone sends (rank+1)*2 integers to rank 0
      IF (RANK .NE. 0) THEN
         DO 30 I = 1, (RANK + 1) * 2
            ISB(I) = RANK * 7 + I
   30    CONTINUE
         CALL MPI_SEND(ISB, (RANK + 1) * 2, MPI_INTEGER, 0, RANK * 3,
     &        MPI_COMM_WORLD, IERR)
      ELSE
         DO 40 K = 1, NPROC - 1
            CALL MPI_PROBE(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD,
     &           ST, IERR)
            CALL MPI_GET_COUNT(ST, MPI_INTEGER, N, IERR)
            J = ST(MPI_SOURCE)
            CALL CHECK(N .EQ. (J + 1) * 2, 'probe count')
            CALL CHECK(ST(MPI_TAG) .EQ. J * 3, 'probe tag')
            CALL MPI_RECV(IRB, NMAX, MPI_INTEGER, MPI_ANY_SOURCE,
     &           J * 3, MPI_COMM_WORLD, ST, IERR)
            CALL CHECK(ST(MPI_SOURCE) .EQ. J, 'any source status')
            DO 35 I = 1, N
               CALL CHECK(IRB(I) .EQ. J * 7 + I, 'wildcard payload')
   35       CONTINUE
   40    CONTINUE
      END IF
!     ---- Waitany/Testany (1-based), Iprobe, STATUS(ES)_IGNORE
      DO 50 I = 1, 3
         CALL MPI_IRECV(IRB(I), 1, MPI_INTEGER, RANK, 500 + I,
     &        MPI_COMM_WORLD, REQS(I), IERR)
   50 CONTINUE
      CALL MPI_TESTANY(3, REQS, IDX, FLAG, ST, IERR)
      CALL CHECK(.NOT. FLAG .AND. IDX .EQ. MPI_UNDEFINED, 'testany')
      ISB(1) = 42
      CALL MPI_SEND(ISB, 1, MPI_INTEGER, RANK, 502, MPI_COMM_WORLD,
     &     IERR)
      CALL MPI_WAITANY(3, REQS, IDX, ST, IERR)
      CALL CHECK(IDX .EQ. 2, 'waitany index is 1-based')
      CALL CHECK(ST(MPI_TAG) .EQ. 502 .AND. IRB(2) .EQ. 42, 'waitany')
      CALL CHECK(REQS(2) .EQ. MPI_REQUEST_NULL, 'waitany frees')
      CALL MPI_SEND(ISB, 1, MPI_INTEGER, RANK, 501, MPI_COMM_WORLD,
     &     IERR)
      CALL MPI_SEND(ISB, 1, MPI_INTEGER, RANK, 503, MPI_COMM_WORLD,
     &     IERR)
      CALL MPI_WAITALL(3, REQS, MPI_STATUSES_IGNORE, IERR)
      CALL CHECK(IERR .EQ. MPI_SUCCESS, 'waitall statuses ignore')
      CALL CHECK(MPI_STATUSES_IGNORE(MPI_TAG, 1) .EQ. 0 .AND.
     &     MPI_ERRCODES_IGNORE(1) .EQ. 0, 'statuses ignore untouched')
      CALL MPI_ISEND(ISB, 5, MPI_INTEGER, RANK, 7, MPI_COMM_WORLD,
     &     REQ, IERR)
      FLAG = .FALSE.
      DO 60 I = 1, 1000000
         CALL MPI_IPROBE(RANK, 7, MPI_COMM_WORLD, FLAG, ST, IERR)
         IF (FLAG) GO TO 61
   60 CONTINUE
   61 CALL CHECK(FLAG, 'iprobe flag')
      CALL MPI_RECV(IRB, 5, MPI_INTEGER, RANK, 7, MPI_COMM_WORLD,
     &     MPI_STATUS_IGNORE, IERR)
      CALL CHECK(IERR .EQ. MPI_SUCCESS, 'recv status ignore')
      CALL CHECK(MPI_STATUS_IGNORE(MPI_TAG) .EQ. 0 .AND.
     &     MPI_STATUS_IGNORE(MPI_SOURCE) .EQ. 0, 'status ignore kept')
      CALL MPI_WAIT(REQ, MPI_STATUS_IGNORE, IERR)
      CALL CHECK(REQ .EQ. MPI_REQUEST_NULL, 'wait frees request')
!     ---- attributes: Fortran keyvals
      CALL MPI_COMM_GET_ATTR(MPI_COMM_WORLD, MPI_TAG_UB, AVAL, FLAG,
     &     IERR)
      CALL CHECK(FLAG .AND. AVAL .GE. 32767, 'tag_ub attribute')
!     ---- error codes through ierror
      CALL MPI_COMM_SET_ERRHANDLER(MPI_COMM_WORLD, MPI_ERRORS_RETURN,
     &     IERR)
      CALL MPI_SEND(ISB, 1, MPI_INTEGER, NPROC + 5, 0, MPI_COMM_WORLD,
     &     IERR)
      CALL CHECK(IERR .NE. MPI_SUCCESS, 'invalid rank fails')
      CALL MPI_ERROR_CLASS(IERR, ICLS, IERR2)
      CALL CHECK(ICLS .EQ. MPI_ERR_RANK, 'error class MPI_ERR_RANK')
      ESTR = '#'
      CALL MPI_ERROR_STRING(IERR, ESTR, ELEN, IERR2)
      CALL CHECK(IERR2 .EQ. MPI_SUCCESS .AND. ELEN .GT. 0, 'errstring')
      CALL CHECK(ESTR(ELEN+1:) .EQ. ' ' .AND. ESTR(1:1) .NE. '#',
     &     'error string padded')
      CALL MPI_ISEND(ISB, 10, MPI_INTEGER, RANK, 9, MPI_COMM_WORLD,
     &     REQ, IERR)
      CALL MPI_RECV(IRB, 5, MPI_INTEGER, RANK, 9, MPI_COMM_WORLD, ST,
     &     IERR)
      CALL MPI_ERROR_CLASS(IERR, ICLS, IERR2)
      CALL CHECK(ICLS .EQ. MPI_ERR_TRUNCATE, 'truncate')
      CALL MPI_WAIT(REQ, ST, IERR)
      CALL MPI_SEND(ISB, 1, 12345, NEXT, 0, MPI_COMM_WORLD, IERR)
      CALL MPI_ERROR_CLASS(IERR, ICLS, IERR2)
      CALL CHECK(ICLS .EQ. MPI_ERR_TYPE, 'invalid datatype')
      CALL MPI_COMM_SET_ERRHANDLER(MPI_COMM_WORLD,
     &     MPI_ERRORS_ARE_FATAL, IERR)
      T1 = MPI_WTIME()
      CALL CHECK(T1 .GE. T0, 'wtime monotonic')
!     ---- collect the verdict on rank 0
      CALL MPI_BARRIER(MPI_COMM_WORLD, IERR)
      IF (RANK .EQ. 0) THEN
         ALLERR = NERR
         DO 70 I = 1, NPROC - 1
            CALL MPI_RECV(J, 1, MPI_INTEGER, I, 999, MPI_COMM_WORLD,
     &           ST, IERR)
            ALLERR = ALLERR + J
   70    CONTINUE
         IF (ALLERR .EQ. 0) THEN
            WRITE (*, '(A,I2,A)') 'f77_p2p: PASS (', NPROC, ' ranks)'
         ELSE
            WRITE (*, *) 'f77_p2p: FAIL', ALLERR, 'errors'
         END IF
      ELSE
         CALL MPI_SEND(NERR, 1, MPI_INTEGER, 0, 999, MPI_COMM_WORLD,
     &        IERR)
      END IF
      CALL MPI_FINALIZE(IERR)
      CALL MPI_FINALIZED(FLAG, IERR2)
      IF (.NOT. FLAG .OR. IERR .NE. MPI_SUCCESS) THEN
         WRITE (*, *) 'f77_p2p: FAIL finalize'
      END IF
      END

!     Ring exchange: nonblocking send to NEXT, blocking receive from PREV, status checks.
      SUBROUTINE XCHG(SBUF, RBUF, N, DTYPE, TAG, NEXT, PREV)
      IMPLICIT NONE
      INCLUDE 'mpif.h'
      INTEGER SBUF(*), RBUF(*), N, DTYPE, TAG, NEXT, PREV
      INTEGER REQ, IERR, CNT, ST(MPI_STATUS_SIZE), ST2(MPI_STATUS_SIZE)
      CALL MPI_ISEND(SBUF, N, DTYPE, NEXT, TAG, MPI_COMM_WORLD, REQ,
     &     IERR)
      CALL CHECK(IERR .EQ. MPI_SUCCESS, 'isend ierror')
      ST(MPI_SOURCE) = -7
      ST(MPI_TAG) = -7
      CALL MPI_RECV(RBUF, N, DTYPE, PREV, TAG, MPI_COMM_WORLD, ST,
     &     IERR)
      CALL CHECK(IERR .EQ. MPI_SUCCESS, 'recv ierror')
      CALL CHECK(ST(MPI_SOURCE) .EQ. PREV, 'status MPI_SOURCE')
      CALL CHECK(ST(MPI_TAG) .EQ. TAG, 'status MPI_TAG')
      CALL MPI_GET_COUNT(ST, DTYPE, CNT, IERR)
      CALL CHECK(CNT .EQ. N, 'MPI_GET_COUNT')
      CALL MPI_WAIT(REQ, ST2, IERR)
      CALL CHECK(IERR .EQ. MPI_SUCCESS, 'wait ierror')
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
