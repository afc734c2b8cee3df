/* MPI-IO: open modes and errors, views (strided, external32, a user data representation), explicit
 * offsets, individual and shared file pointers, ordered and split collectives, two-phase collective I/O
 * (forced on and off, several rounds), nonblocking forms, sizes, info, error handlers. Any rank count. */
#include "check.h"
#include <unistd.h>

static int rank, nproc;
static char path[256];

static void reopen(MPI_File *fh, int amode, MPI_Info info)
{
    CHECK(MPI_File_open(MPI_COMM_WORLD, path, amode, info, fh) == MPI_SUCCESS);
}

/* Rank r's view: ints r, r+n, r+2n, ... (a resized one-int filetype, displaced by r ints). */
static MPI_Datatype strided(void)
{
    MPI_Datatype t;
    MPI_Type_create_resized(MPI_INT, 0, (MPI_Aint)sizeof(int) * nproc, &t);
    MPI_Type_commit(&t);
    return t;
}

static int err_calls;
static void file_handler(MPI_File *fh, int *code, ...)
{
    (void)fh;
    (void)code;
    err_calls++;
}

/* A user representation: 4-byte ints stored with their bytes reversed and complemented. */
static int conv_write(void *user, MPI_Datatype dt, int count, void *filebuf, MPI_Offset pos, void *extra)
{
    (void)extra;
    CHECK(dt == MPI_INT && pos == 0);
    unsigned char *u = user, *f = filebuf;
    for (int i = 0; i < count; i++)
        for (int b = 0; b < 4; b++)
            f[4 * i + b] = (unsigned char)~u[4 * i + 3 - b];
    return MPI_SUCCESS;
}
static int conv_read(void *user, MPI_Datatype dt, int count, void *filebuf, MPI_Offset pos, void *extra)
{
    (void)extra;
    CHECK(dt == MPI_INT && pos == 0);
    unsigned char *u = user, *f = filebuf;
    for (int i = 0; i < count; i++)
        for (int b = 0; b < 4; b++)
            u[4 * i + 3 - b] = (unsigned char)~f[4 * i + b];
    return MPI_SUCCESS;
}
static int conv_extent(MPI_Datatype dt, MPI_Aint *extent, void *extra)
{
    (void)extra;
    MPI_Aint lb;
    return MPI_Type_get_extent(dt, &lb, extent);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nproc);
    check_rank = rank;
    int tag = (int)getpid();
    MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "/tmp/vmf-io-test-%d", tag);
    MPI_File fh;
    MPI_Status st;
    int count, flag;
    MPI_Offset off, size;

    /* Errors are returned on files by default; opening what does not exist fails on every rank. */
    CHECK_RC(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &fh), MPI_ERR_NO_SUCH_FILE);
    CHECK(fh == MPI_FILE_NULL);
    CHECK_RC(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDONLY | MPI_MODE_CREATE, MPI_INFO_NULL, &fh), MPI_ERR_AMODE);
    CHECK_RC(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDWR | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh), MPI_ERR_AMODE);

    /* 1. Explicit offsets, contiguous: rank r writes 1000 ints at r*1000. */
    reopen(&fh, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL);
    int amode;
    MPI_File_get_amode(fh, &amode);
    CHECK(amode == (MPI_MODE_CREATE | MPI_MODE_RDWR));
    CHECK(MPI_File_c2f(fh) != 0 && MPI_File_f2c(MPI_File_c2f(fh)) == fh);
    MPI_Group g;
    int gs;
    MPI_File_get_group(fh, &g);
    MPI_Group_size(g, &gs);
    CHECK(gs == nproc);
    MPI_Group_free(&g);
    enum { N = 1000 };
    int buf[N], in[N];
    for (int i = 0; i < N; i++)
        buf[i] = rank * N + i;
    CHECK(MPI_File_write_at(fh, (MPI_Offset)rank * N * sizeof(int), buf, N, MPI_INT, &st) == MPI_SUCCESS);
    MPI_Get_count(&st, MPI_INT, &count);
    CHECK(count == N);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_get_size(fh, &size);
    CHECK(size == (MPI_Offset)nproc * N * sizeof(int));
    int peer = (rank + 1) % nproc;
    CHECK(MPI_File_read_at(fh, (MPI_Offset)peer * N * sizeof(int), in, N, MPI_INT, &st) == MPI_SUCCESS);
    for (int i = 0; i < N; i++)
        CHECK(in[i] == peer * N + i);
    /* Reading past the end returns what there is. */
    CHECK(MPI_File_read_at(fh, size - 2 * sizeof(int), in, N, MPI_INT, &st) == MPI_SUCCESS);
    MPI_Get_count(&st, MPI_INT, &count);
    CHECK(count == 2 && in[1] == nproc * N - 1);

    /* 2. Strided views, collective: interleaved ints, with two-phase I/O on and off, over many rounds. */
    const char *modes[] = {"enable", "disable", "automatic"};
    for (int m = 0; m < 3; m++) {
        MPI_Info info;
        MPI_Info_create(&info);
        MPI_Info_set(info, "romio_cb_write", modes[m]);
        MPI_Info_set(info, "romio_cb_read", modes[m]);
        MPI_Info_set(info, "cb_buffer_size", "4096");
        MPI_Datatype ft = strided();
        MPI_File_set_size(fh, 0);
        CHECK(MPI_File_set_view(fh, (MPI_Offset)rank * sizeof(int), MPI_INT, ft, "native", info) == MPI_SUCCESS);
        for (int i = 0; i < N; i++)
            buf[i] = i * nproc + rank + m;
        CHECK(MPI_File_write_all(fh, buf, N, MPI_INT, &st) == MPI_SUCCESS);
        MPI_Get_count(&st, MPI_INT, &count);
        CHECK(count == N);
        MPI_File_get_position(fh, &off);
        CHECK(off == N);
        MPI_File_get_byte_offset(fh, 3, &off);
        CHECK(off == (MPI_Offset)(rank + 3 * nproc) * sizeof(int));
        MPI_File_seek(fh, 0, MPI_SEEK_SET);
        memset(in, 0, sizeof in);
        CHECK(MPI_File_read_all(fh, in, N, MPI_INT, &st) == MPI_SUCCESS);
        for (int i = 0; i < N; i++)
            CHECK(in[i] == i * nproc + rank + m);
        /* The whole file, seen contiguously by every rank. */
        MPI_File_sync(fh);
        MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL);
        int *all = malloc(sizeof(int) * N * nproc);
        CHECK(MPI_File_read_at_all(fh, 0, all, N * nproc, MPI_INT, &st) == MPI_SUCCESS);
        for (int i = 0; i < N * nproc; i++)
            CHECK(all[i] == i + m);
        free(all);
        MPI_File_seek(fh, 0, MPI_SEEK_END);
        MPI_File_get_position(fh, &off);
        CHECK(off == (MPI_Offset)N * nproc * sizeof(int));
        MPI_Type_free(&ft);
        MPI_Info_free(&info);
    }

    /* 3. A derived memory type (every other int of a buffer) through a strided view. */
    {
        MPI_Datatype mt, ft = strided();
        MPI_Type_vector(N / 2, 1, 2, MPI_INT, &mt);
        MPI_Type_commit(&mt);
        MPI_File_set_view(fh, (MPI_Offset)rank * sizeof(int), MPI_INT, ft, "native", MPI_INFO_NULL);
        for (int i = 0; i < N; i++)
            buf[i] = (i % 2) ? -1 : 7 * i + rank;
        CHECK(MPI_File_write_at_all(fh, 0, buf, 1, mt, &st) == MPI_SUCCESS);
        for (int i = 0; i < N; i++)
            in[i] = -2;
        CHECK(MPI_File_read_at_all(fh, 0, in, 1, mt, &st) == MPI_SUCCESS);
        MPI_Get_count(&st, mt, &count);
        CHECK(count == 1);
        for (int i = 0; i < N; i++)
            CHECK(in[i] == ((i % 2) ? -2 : 7 * i + rank));
        MPI_Offset d;
        MPI_Datatype e, f;
        char rep[MPI_MAX_DATAREP_STRING];
        MPI_File_get_view(fh, &d, &e, &f, rep);
        CHECK(d == (MPI_Offset)rank * sizeof(int) && e == MPI_INT && strcmp(rep, "native") == 0);
        MPI_Aint lb, ext;
        MPI_Type_get_extent(f, &lb, &ext);
        CHECK(ext == (MPI_Aint)sizeof(int) * nproc);
        MPI_Type_free(&f);
        MPI_Type_free(&mt);
        MPI_Type_free(&ft);
    }

    /* 4. Shared file pointer: every rank appends 10 ints of its rank; each block lands whole, once. */
    MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "native", MPI_INFO_NULL);
    MPI_File_set_size(fh, 0);
    for (int i = 0; i < 10; i++)
        buf[i] = rank;
    CHECK(MPI_File_write_shared(fh, buf, 10, MPI_INT, &st) == MPI_SUCCESS);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_get_position_shared(fh, &off);
    CHECK(off == 10 * nproc);
    {
        int *all = malloc(sizeof(int) * 10 * nproc), seen = 0;
        CHECK(MPI_File_read_at(fh, 0, all, 10 * nproc, MPI_INT, &st) == MPI_SUCCESS);
        for (int b = 0; b < nproc; b++) {
            for (int i = 1; i < 10; i++)
                CHECK(all[10 * b + i] == all[10 * b]);
            seen |= 1 << all[10 * b];
        }
        CHECK(seen == (1 << nproc) - 1);
        free(all);
    }
    /* Ordered: rank r writes r+1 ints after what is there, in rank order; read back in order too. */
    for (int i = 0; i <= rank; i++)
        buf[i] = 100 + rank;
    CHECK(MPI_File_write_ordered(fh, buf, rank + 1, MPI_INT, &st) == MPI_SUCCESS);
    MPI_File_get_position_shared(fh, &off);
    CHECK(off == 10 * nproc + nproc * (nproc + 1) / 2);
    MPI_File_seek_shared(fh, 10 * nproc, MPI_SEEK_SET);
    memset(in, 0, sizeof in);
    CHECK(MPI_File_read_ordered(fh, in, rank + 1, MPI_INT, &st) == MPI_SUCCESS);
    for (int i = 0; i <= rank; i++)
        CHECK(in[i] == 100 + rank);
    {
        int first = 10 * nproc + rank * (rank + 1) / 2;
        CHECK(MPI_File_read_at(fh, first, in, rank + 1, MPI_INT, &st) == MPI_SUCCESS);
        for (int i = 0; i <= rank; i++)
            CHECK(in[i] == 100 + rank);
    }

    /* 5. Nonblocking and split collective forms. */
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Request rq;
    for (int i = 0; i < N; i++)
        buf[i] = -i - rank;
    CHECK(MPI_File_iwrite_at(fh, (MPI_Offset)rank * N, buf, N, MPI_INT, &rq) == MPI_SUCCESS);
    MPI_Wait(&rq, &st);
    MPI_Get_count(&st, MPI_INT, &count);
    CHECK(count == N);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(MPI_File_iread_at_all(fh, (MPI_Offset)peer * N, in, N, MPI_INT, &rq) == MPI_SUCCESS);
    flag = 0;
    while (!flag)
        MPI_Test(&rq, &flag, &st);
    for (int i = 0; i < N; i++)
        CHECK(in[i] == -i - peer);
    MPI_File_seek(fh, (MPI_Offset)rank * N, MPI_SEEK_SET);
    for (int i = 0; i < N; i++)
        buf[i] = 3 * i + rank;
    CHECK(MPI_File_write_all_begin(fh, buf, N, MPI_INT) == MPI_SUCCESS);
    CHECK_RC(MPI_File_write_all_begin(fh, buf, N, MPI_INT), MPI_ERR_IO);
    CHECK(MPI_File_write_all_end(fh, buf, &st) == MPI_SUCCESS);
    MPI_Get_count(&st, MPI_INT, &count);
    CHECK(count == N);
    CHECK(MPI_File_read_at_all_begin(fh, (MPI_Offset)peer * N, in, N, MPI_INT) == MPI_SUCCESS);
    CHECK(MPI_File_read_at_all_end(fh, in, &st) == MPI_SUCCESS);
    for (int i = 0; i < N; i++)
        CHECK(in[i] == 3 * i + peer);

    /* 6. Sizes, atomicity, info. */
    CHECK(MPI_File_preallocate(fh, 1 << 20) == MPI_SUCCESS);
    MPI_File_get_size(fh, &size);
    CHECK(size >= 1 << 20);
    CHECK(MPI_File_set_size(fh, 4096) == MPI_SUCCESS);
    MPI_File_get_size(fh, &size);
    CHECK(size == 4096);
    MPI_File_set_atomicity(fh, 1);
    MPI_File_get_atomicity(fh, &flag);
    CHECK(flag == 1);
    CHECK(MPI_File_write_at(fh, rank, buf, 1, MPI_INT, &st) == MPI_SUCCESS);
    MPI_File_set_atomicity(fh, 0);
    {
        MPI_Info used;
        char v[MPI_MAX_INFO_VAL + 1];
        MPI_File_get_info(fh, &used);
        MPI_Info_get(used, "cb_buffer_size", MPI_MAX_INFO_VAL, v, &flag);
        CHECK(flag && atoi(v) > 0);
        MPI_Info_free(&used);
    }

    /* 7. external32: big-endian in the file. */
    MPI_File_set_size(fh, 0);
    MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "external32", MPI_INFO_NULL);
    int x = 0x01020304 + rank;
    CHECK(MPI_File_write_at(fh, rank, &x, 1, MPI_INT, &st) == MPI_SUCCESS);
    MPI_Aint ext;
    MPI_File_get_type_extent(fh, MPI_INT, &ext);
    CHECK(ext == 4);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL);
    unsigned char raw[4];
    CHECK(MPI_File_read_at(fh, (MPI_Offset)rank * 4, raw, 4, MPI_BYTE, &st) == MPI_SUCCESS);
    CHECK(raw[0] == 1 && raw[1] == 2 && raw[2] == 3 && raw[3] == 4 + rank);
    MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "external32", MPI_INFO_NULL);
    x = 0;
    CHECK(MPI_File_read_at(fh, rank, &x, 1, MPI_INT, &st) == MPI_SUCCESS);
    CHECK(x == 0x01020304 + rank);

    /* 8. A user data representation: the conversion functions run both ways. */
    CHECK(MPI_Register_datarep("vmf-flip", conv_read, conv_write, conv_extent, NULL) == MPI_SUCCESS);
    CHECK_RC(MPI_Register_datarep("vmf-flip", conv_read, conv_write, conv_extent, NULL), MPI_ERR_DUP_DATAREP);
    CHECK_RC(MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "no-such-rep", MPI_INFO_NULL), MPI_ERR_UNSUPPORTED_DATAREP);
    MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "vmf-flip", MPI_INFO_NULL);
    x = 0x11223344;
    CHECK(MPI_File_write_at(fh, rank, &x, 1, MPI_INT, &st) == MPI_SUCCESS);
    x = 0;
    CHECK(MPI_File_read_at(fh, rank, &x, 1, MPI_INT, &st) == MPI_SUCCESS);
    CHECK(x == 0x11223344);
    MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL);
    CHECK(MPI_File_read_at(fh, (MPI_Offset)rank * 4, raw, 4, MPI_BYTE, &st) == MPI_SUCCESS);
    CHECK(raw[0] == (unsigned char)~0x11 && raw[3] == (unsigned char)~0x44);

    /* 9. Error handlers: a file's own, and MPI_FILE_NULL's for opens. */
    MPI_Errhandler eh;
    MPI_File_create_errhandler(file_handler, &eh);
    MPI_File_set_errhandler(fh, eh);
    CHECK(MPI_File_read_at(fh, -1, in, 1, MPI_INT, &st) != MPI_SUCCESS);
    CHECK(err_calls == 1);
    MPI_File_call_errhandler(fh, MPI_ERR_IO);
    CHECK(err_calls == 2);
    CHECK(MPI_File_close(&fh) == MPI_SUCCESS);
    CHECK(fh == MPI_FILE_NULL);
    MPI_File_set_errhandler(MPI_FILE_NULL, eh);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_EXCL | MPI_MODE_RDWR, MPI_INFO_NULL, &fh) != MPI_SUCCESS);
    CHECK(err_calls == 3);
    MPI_File_set_errhandler(MPI_FILE_NULL, MPI_ERRORS_RETURN);
    MPI_Errhandler_free(&eh);

    /* 9b. One rank's own mistake fails a collective call on every rank (nobody is left waiting), and
     * collective-buffering hints that differ between ranks are rank 0's everywhere (no data lost). */
    if (nproc > 1) {
        reopen(&fh, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL);
        MPI_Datatype ft = strided(), empty;
        MPI_File_set_view(fh, (MPI_Offset)rank * sizeof(int), MPI_INT, ft, "native", MPI_INFO_NULL);
        int rc = MPI_File_read_all(fh, rank == 1 ? NULL : in, 16, MPI_INT, &st);
        CHECK(rc != MPI_SUCCESS);
        MPI_Type_contiguous(0, MPI_INT, &empty);
        MPI_Type_commit(&empty);
        CHECK(MPI_File_set_view(fh, 0, MPI_INT, rank == 1 ? empty : MPI_INT, "native", MPI_INFO_NULL) == MPI_SUCCESS);
        CHECK(MPI_File_write_all(fh, buf, 8, MPI_INT, &st) != MPI_SUCCESS);
        MPI_Type_free(&empty);
        MPI_Info hi;
        MPI_Info_create(&hi);
        MPI_Info_set(hi, rank == 0 ? "cb_buffer_size" : "cb_nodes", rank == 0 ? "64" : "1");
        if (rank == nproc - 1)
            MPI_Info_set(hi, "romio_cb_write", "disable");
        CHECK(MPI_File_set_info(fh, hi) == MPI_SUCCESS);
        MPI_Info_free(&hi);
        MPI_File_set_size(fh, 0);
        MPI_File_set_view(fh, (MPI_Offset)rank * sizeof(int), MPI_INT, ft, "native", MPI_INFO_NULL);
        for (int i = 0; i < 64; i++)
            buf[i] = i * nproc + rank;
        CHECK(MPI_File_write_all(fh, buf, 64, MPI_INT, &st) == MPI_SUCCESS);
        MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "native", MPI_INFO_NULL);
        int *all = malloc(sizeof(int) * 64 * nproc);
        CHECK(MPI_File_read_at_all(fh, 0, all, 64 * nproc, MPI_INT, &st) == MPI_SUCCESS);
        for (int i = 0; i < 64 * nproc; i++)
            CHECK(all[i] == i);
        free(all);
        MPI_Type_free(&ft);
        MPI_File_close(&fh);
        /* A bad info handle on one rank fails the open on all. */
        CHECK(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDWR, rank == 1 ? (MPI_Info)0x1234 : MPI_INFO_NULL, &fh) != MPI_SUCCESS);
        CHECK(fh == MPI_FILE_NULL);
        MPI_Barrier(MPI_COMM_WORLD);
    }

    /* 10. Read-only, append and delete-on-close. */
    reopen(&fh, MPI_MODE_RDONLY, MPI_INFO_NULL);
    CHECK_RC(MPI_File_write_at(fh, 0, buf, 1, MPI_INT, &st), MPI_ERR_READ_ONLY);
    MPI_File_get_size(fh, &size);
    MPI_File_close(&fh);
    reopen(&fh, MPI_MODE_WRONLY | MPI_MODE_APPEND | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL);
    MPI_File_get_position(fh, &off);
    CHECK(off == size);
    CHECK_RC(MPI_File_read_at(fh, 0, in, 1, MPI_INT, &st), MPI_ERR_ACCESS);
    MPI_File_close(&fh);
    CHECK(access(path, F_OK) != 0); /* gone when MPI_File_close returns, on every rank */
    MPI_Barrier(MPI_COMM_WORLD);   /* before rank 0 makes a file of that name again */
    if (rank == 0) {
        CHECK_RC(MPI_File_delete(path, MPI_INFO_NULL), MPI_ERR_NO_SUCH_FILE);
        FILE *f = fopen(path, "w");
        fclose(f);
        CHECK(MPI_File_delete(path, MPI_INFO_NULL) == MPI_SUCCESS);
        CHECK(access(path, F_OK) != 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("PASS\n");
    MPI_Finalize();
    return 0;
}
