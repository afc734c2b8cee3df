/* Error classes with MPI_ERRORS_RETURN, user error handlers and classes, and the environment queries. */
#include "check.h"
#include <unistd.h>

static int handler_calls = 0, handler_code = 0;
static void my_handler(MPI_Comm *comm, int *code, ...)
{
    handler_calls++;
    handler_code = *code;
    CHECK(*comm == MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    int rank, size, provided = -1, flag = 0;
    MPI_Initialized(&flag);
    CHECK(!flag);
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    CHECK(provided == MPI_THREAD_MULTIPLE); /* granted as asked: the library lock of mt.rs */
    int q = -1;
    MPI_Query_thread(&q);
    CHECK(q == provided);
    MPI_Is_thread_main(&flag);
    CHECK(flag);
    MPI_Initialized(&flag);
    CHECK(flag);
    MPI_Finalized(&flag);
    CHECK(!flag);

    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
    CHECK(eh == MPI_ERRORS_ARE_FATAL);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
    CHECK(eh == MPI_ERRORS_RETURN);

    int buf[16] = {0};
    MPI_Status st;
    CHECK_RC(MPI_Send(buf, 1, MPI_INT, size, 0, MPI_COMM_WORLD), MPI_ERR_RANK);
    CHECK_RC(MPI_Send(buf, 1, MPI_INT, -7, 0, MPI_COMM_WORLD), MPI_ERR_RANK);
    CHECK_RC(MPI_Send(buf, 1, MPI_INT, MPI_ANY_SOURCE, 0, MPI_COMM_WORLD), MPI_ERR_RANK);
    CHECK_RC(MPI_Recv(buf, 1, MPI_INT, size + 3, 0, MPI_COMM_WORLD, &st), MPI_ERR_RANK);
    CHECK_RC(MPI_Send(buf, 1, MPI_INT, 0, -5, MPI_COMM_WORLD), MPI_ERR_TAG);
    CHECK_RC(MPI_Send(buf, 1, MPI_INT, 0, MPI_ANY_TAG, MPI_COMM_WORLD), MPI_ERR_TAG);
    CHECK_RC(MPI_Recv(buf, 1, MPI_INT, 0, -9, MPI_COMM_WORLD, &st), MPI_ERR_TAG);
    CHECK_RC(MPI_Send(buf, -1, MPI_INT, 0, 0, MPI_COMM_WORLD), MPI_ERR_COUNT);
    CHECK_RC(MPI_Send(buf, 1, (MPI_Datatype)0x12345678, 0, 0, MPI_COMM_WORLD), MPI_ERR_TYPE);
    CHECK_RC(MPI_Send(buf, 1, MPI_DATATYPE_NULL, 0, 0, MPI_COMM_WORLD), MPI_ERR_TYPE);
    CHECK_RC(MPI_Send(buf, 1, MPI_INT, 0, 0, MPI_COMM_NULL), MPI_ERR_COMM);
    CHECK_RC(MPI_Send(buf, 1, MPI_INT, 0, 0, (MPI_Comm)0x44000077), MPI_ERR_COMM);
    CHECK_RC(MPI_Send(NULL, 4, MPI_INT, 0, 0, MPI_COMM_WORLD), MPI_ERR_BUFFER);
    MPI_Request bad = (MPI_Request)0x12345, rq;
    CHECK_RC(MPI_Wait(&bad, &st), MPI_ERR_REQUEST);
    CHECK_RC(MPI_Isend(buf, 1, MPI_INT, size, 0, MPI_COMM_WORLD, &rq), MPI_ERR_RANK);
    int tub_flag = 0, *tub = NULL;
    CHECK_RC(MPI_Comm_get_attr(MPI_COMM_WORLD, 0x12345, &tub, &tub_flag), MPI_ERR_KEYVAL);

    /* Truncation: status still says what arrived. */
    int big[16];
    for (int i = 0; i < 16; i++) big[i] = i;
    MPI_Request sq;
    MPI_Isend(big, 16, MPI_INT, rank, 9, MPI_COMM_WORLD, &sq);
    CHECK_RC(MPI_Recv(buf, 4, MPI_INT, rank, 9, MPI_COMM_WORLD, &st), MPI_ERR_TRUNCATE);
    CHECK(st.MPI_SOURCE == rank && st.MPI_TAG == 9 && buf[3] == 3);
    MPI_Wait(&sq, MPI_STATUS_IGNORE);
    /* ... and through Waitall it is MPI_ERR_IN_STATUS with the per-request class. */
    MPI_Request two[2];
    MPI_Isend(big, 16, MPI_INT, rank, 10, MPI_COMM_WORLD, &two[0]);
    MPI_Irecv(buf, 2, MPI_INT, rank, 10, MPI_COMM_WORLD, &two[1]);
    MPI_Status sts[2];
    CHECK_RC(MPI_Waitall(2, two, sts), MPI_ERR_IN_STATUS);
    CHECK(sts[0].MPI_ERROR == MPI_SUCCESS && sts[1].MPI_ERROR == MPI_ERR_TRUNCATE);

    /* Error strings and classes. */
    char str[MPI_MAX_ERROR_STRING];
    int len = 0, cls = -1;
    MPI_Error_string(MPI_ERR_TRUNCATE, str, &len);
    CHECK(len > 0 && strstr(str, "truncat") != NULL);
    MPI_Error_class(MPI_ERR_RANK, &cls);
    CHECK(cls == MPI_ERR_RANK);
    int myclass, mycode;
    MPI_Add_error_class(&myclass);
    MPI_Add_error_code(myclass, &mycode);
    MPI_Add_error_string(mycode, "my special error");
    MPI_Error_class(mycode, &cls);
    CHECK(cls == myclass);
    MPI_Error_string(mycode, str, &len);
    CHECK(strcmp(str, "my special error") == 0);
    int *lastused = NULL;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_LASTUSEDCODE, &lastused, &flag);
    CHECK(flag && *lastused >= mycode && *lastused >= MPI_ERR_LASTCODE);
    /* MPICH 4.0's MPIX_Delete_error_*: a class goes only once its codes are gone; many add/delete
     * cycles do not exhaust anything. */
    CHECK(MPIX_Delete_error_class(myclass) != MPI_SUCCESS);
    CHECK(MPIX_Delete_error_class(MPI_ERR_RANK) != MPI_SUCCESS);
    for (int k = 0; k < 20000; k++) {
        int c2, e2;
        CHECK(MPI_Add_error_class(&c2) == MPI_SUCCESS && MPI_Add_error_code(c2, &e2) == MPI_SUCCESS);
        CHECK(MPI_Add_error_string(e2, "transient") == MPI_SUCCESS);
        CHECK(MPIX_Delete_error_string(e2) == MPI_SUCCESS && MPIX_Delete_error_string(e2) != MPI_SUCCESS);
        CHECK(MPIX_Delete_error_code(e2) == MPI_SUCCESS && MPIX_Delete_error_class(c2) == MPI_SUCCESS);
        CHECK(MPI_Error_class(e2, &cls) != MPI_SUCCESS);
    }
    MPI_Error_class(mycode, &cls);
    CHECK(cls == myclass);
    MPI_Error_string(mycode, str, &len);
    CHECK(strcmp(str, "my special error") == 0);

    /* A user error handler gets called with the code. */
    MPI_Errhandler mine;
    MPI_Comm_create_errhandler(my_handler, &mine);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, mine);
    MPI_Comm_call_errhandler(MPI_COMM_WORLD, mycode);
    CHECK(handler_calls == 1 && handler_code == mycode);
    int rc = MPI_Send(buf, 1, MPI_INT, size, 0, MPI_COMM_WORLD);
    CHECK(handler_calls == 2 && handler_code == rc);
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_RANK);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Errhandler_free(&mine);
    CHECK(mine == MPI_ERRHANDLER_NULL);

    /* Attributes of MPI_COMM_WORLD. */
    int *v = NULL;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
    CHECK(flag && *v >= 32767);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_HOST, &v, &flag);
    CHECK(flag && *v == MPI_PROC_NULL);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_IO, &v, &flag);
    CHECK(flag);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_WTIME_IS_GLOBAL, &v, &flag);
    CHECK(flag && (*v == 0 || *v == 1));
    /* Set only when the launcher knows it (vmfabric run --universe-size, mpiexec -usize), as MPICH does. */
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_UNIVERSE_SIZE, &v, &flag);
    CHECK(!flag || *v >= size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &v, &flag);
    CHECK(flag && *v == 0);

    /* Time, names, versions, memory. */
    double t0 = MPI_Wtime();
    usleep(10000);
    double t1 = MPI_Wtime();
    CHECK(t1 - t0 >= 0.009 && t1 - t0 < 5.0);
    CHECK(MPI_Wtick() > 0 && MPI_Wtick() < 0.01);
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Get_processor_name(name, &len);
    CHECK(len > 0 && (int)strlen(name) == len);
    int ver, sub;
    MPI_Get_version(&ver, &sub);
    CHECK(ver == MPI_VERSION && sub == MPI_SUBVERSION);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(lib, &len);
    CHECK(strstr(lib, "vmfabric") != NULL);
    void *mem = NULL;
    MPI_Alloc_mem(1 << 20, MPI_INFO_NULL, &mem);
    CHECK(mem != NULL);
    memset(mem, 1, 1 << 20);
    MPI_Free_mem(mem);

    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("errors: PASS (%d ranks)\n", size);
    MPI_Finalize();
    MPI_Finalized(&flag);
    CHECK(flag);
    return 0;
}
